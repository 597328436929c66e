#!/usr/bin/env bash
# Installs what building and running Flashgate needs on Debian or Ubuntu,
# skipping what is already there: redis-server, cmake (pingora's zlib-ng
# build needs it), pkg-config and libssl-dev (TLS: pingora links Debian's
# OpenSSL, see .cargo/config.toml), curl (the TLS tests drive it too).
# With --test (what `make test` passes) also what the tests need: Debian's
# chromium, node and npm and playwright-core in tests/browser (from its
# package-lock.json) for the sale page's browser test and http-cache-tests (npm) in
# tests/cache-tests for the HTTP caching test suite (cache_conformance); promtool and
# docker-compose (client only) for the metrics and deploy-file checks; and a
# PostgreSQL server answering on 127.0.0.1:5432 with a database `test` (the
# backend's store tests use it); a MariaDB server answering on 127.0.0.1:3306
# to root without a password (the store tests make a database each) and a
# RabbitMQ server on 127.0.0.1:5672 with guest/guest (the order events test);
# Debian's python3 with venv: tests/shop/oscar.sh installs the real shop's
# django-oscar from PyPI into one (the real-shop test), and the checkout test
# runs PyJWT and standardwebhooks from PyPI as a shop would.
set -euo pipefail

want=()
command -v redis-server >/dev/null || want+=(redis-server)
command -v cmake >/dev/null || want+=(cmake)
command -v pkg-config >/dev/null || want+=(pkg-config)
dpkg -s libssl-dev >/dev/null 2>&1 || want+=(libssl-dev)
command -v curl >/dev/null || want+=(curl)
# Test-only tools: promtool validates metrics and alert rules, docker-compose
# validates deploy/docker-compose.yml (client only, no engine needed).
testing=false
[[ "${1:-}" == "--test" ]] && testing=true
if $testing; then
  command -v promtool >/dev/null || want+=(prometheus)
  command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || want+=(docker-compose)
  [[ -x /usr/bin/chromium ]] || want+=(chromium)
  command -v node >/dev/null || want+=(nodejs)
  command -v npm >/dev/null || want+=(npm)
  command -v pg_ctlcluster >/dev/null || want+=(postgresql)
  command -v mariadbd >/dev/null || command -v mysqld >/dev/null || want+=(mariadb-server)
  command -v rabbitmq-server >/dev/null || want+=(rabbitmq-server)
  [[ -x /usr/bin/python3 ]] || want+=(python3)
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || want+=(python3-venv)
fi

sudo_() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

if ((${#want[@]})); then
  echo "installing: ${want[*]}"
  sudo_ apt-get update -qq
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
fi

browser_dir="$(dirname "$0")/../../tests/browser"
if $testing && [[ ! -d "$browser_dir/node_modules/playwright-core" ]]; then
  echo "installing playwright-core in tests/browser"
  (cd "$browser_dir" && npm ci --no-audit --no-fund --silent)
fi

# The HTTP caching test suite, from the npm registry (package-lock.json
# pins http-cache-tests and its dependencies).
cache_tests_dir="$(dirname "$0")/../../tests/cache-tests"
if $testing && [[ ! -d "$cache_tests_dir/node_modules/http-cache-tests" ]]; then
  echo "installing http-cache-tests in tests/cache-tests"
  (cd "$cache_tests_dir" && npm ci --no-audit --no-fund --silent)
fi

if $testing; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    ver=$(ls /etc/postgresql | sort -V | tail -n1)
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    # Local test server only: trust loopback connections.
    grep -q '^host all all 127.0.0.1/32 trust' "$hba" || sudo_ sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    sudo_ pg_ctlcluster --skip-systemctl-redirect "$ver" main start
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
  fi
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null
fi

# MariaDB and RabbitMQ for the tests: started when nothing answers on their
# ports (a machine that runs them as services already has them up).
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if $testing; then
  if ! port_open 3306; then
    sudo_ service mariadb start >/dev/null
    for _ in $(seq 100); do port_open 3306 && break; sleep 0.2; done
  fi
  # Local test server only: root over loopback TCP without a password.
  if ! mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1; then
    sudo_ mariadb -u root -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;"
  fi
  if ! port_open 5672; then
    sudo_ service rabbitmq-server start >/dev/null
    for _ in $(seq 150); do port_open 5672 && break; sleep 0.2; done
  fi
fi
