#!/usr/bin/env bash
# Installs what building and running Flashgate needs on Debian or Ubuntu,
# skipping what is already there: redis-server, cmake (pingora's zlib-ng
# build needs it), pkg-config and libssl-dev (TLS: pingora links Debian's
# OpenSSL, see .cargo/config.toml), curl (the TLS tests drive it too).
# With --test (what `make test` passes) also what the tests need: Debian's
# chromium, node and npm and playwright-core in tests/browser (from its
# package-lock.json) for the sale page's browser test; promtool and
# docker-compose (client only) for the metrics and deploy-file checks; and a
# PostgreSQL server answering on 127.0.0.1:5432 with a database `test` (the
# backend's store tests use it).
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
