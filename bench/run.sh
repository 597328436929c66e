#!/usr/bin/env bash
# `make bench`: builds the release binaries, makes sure the peers' packages
# and PostgreSQL are there, then runs `flashgate-bench run`, which starts
# Flashgate and the peers on loopback ports of their own, runs every
# scenario in alternating rounds and writes bench/REPORT.md and
# bench/bench.png. Extra arguments go to `flashgate-bench run`
# (e.g. `bash bench/run.sh --secs 3 --rounds 1`).
#
# Env: PEERS_DIR (../shared/peers), BENCH_TIMEOUT (1500 s cap for the run),
#      KEEP_WORK=1 keeps the temp dir with configs and logs.
set -Eeuo pipefail
cd "$(dirname "$0")/.."

PEERS_DIR=${PEERS_DIR:-../shared/peers}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-1500}
CARGO=${CARGO:-cargo}

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# The peers' packages (see $PEERS_DIR/README.md).
missing=()
[[ -x /usr/sbin/nginx ]] || missing+=(nginx)
[[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] || missing+=(libnginx-mod-http-lua libnginx-mod-http-ndk lua-nginx-redis)
[[ -d /usr/share/lua/5.1/resty/core ]] || missing+=(lua-resty-core lua-resty-lrucache)
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || missing+=(redis-server)
command -v wrk >/dev/null || missing+=(wrk)
# h2load drives the HTTPS rows (both sides).
command -v h2load >/dev/null || missing+=(nghttp2-client)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  if ! apt-get install -y nginx libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core \
      lua-resty-lrucache lua-nginx-redis redis-server wrk nghttp2-client >/dev/null; then
    apt-get update >/dev/null
    apt-get install -y nginx libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core \
      lua-resty-lrucache lua-nginx-redis redis-server wrk nghttp2-client >/dev/null
  fi
fi
[[ -x "$PEERS_DIR/redis-evalsha" ]] || { echo "bench: peers not found in $PEERS_DIR (set PEERS_DIR)" >&2; exit 1; }

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  log "PostgreSQL is not answering on 127.0.0.1:5432; starting the local cluster"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
# MariaDB for the drain into MySQL (installed and started as for the tests).
if ! (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null; then
  log "MariaDB is not answering on 127.0.0.1:3306; installing/starting it"
  bash "$(dirname "$0")/../deploy/local/install-deps.sh" --test
fi

log "building release binaries"
"$CARGO" build --release -p flashgate -p flashgate-backend -p flashgate-bench --bins

# What verifying a proof-of-work solution costs per buy, quoted in the report.
log "measuring proof-of-work verification"
"$CARGO" bench -p flashgate --bench challenge_verify > target/challenge_verify.txt
# What verifying a buyer's token costs, remembered or not, quoted too.
"$CARGO" bench -p flashgate --bench token_verify > target/token_verify.txt
# What a buy's per-user bucket costs, made or found, quoted too.
"$CARGO" bench -p flashgate --bench user_buckets > target/user_buckets.txt

log "load before the run: $(uptime)"
timeout --signal=TERM --kill-after=30 "$BENCH_TIMEOUT" \
  target/release/flashgate-bench run --peers-dir "$PEERS_DIR" --bin-dir target/release --out-dir bench \
  --challenge-verify target/challenge_verify.txt --token-verify target/token_verify.txt \
  --user-buckets target/user_buckets.txt "$@" &
pid=$!
# The bench stops everything it started when it gets SIGTERM.
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' INT TERM
trap 'kill -TERM "$pid" 2>/dev/null || true' EXIT
wait "$pid"
log "load after the run: $(uptime)"
