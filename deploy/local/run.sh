#!/usr/bin/env bash
# `make run`: the whole local stack with the embedded defaults.
# Its own redis-server under ./data (AOF on), the backend on SQLite
# (./data/flashgate.db), the demo shop, and the gateway. Secrets are made
# once and kept in ./data/secrets.env. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p data
BIN=target/release
CONFIG=config/flashgate.toml
REDIS_PORT=6390

# Each secret missing from the file (an older file included) is added:
# 32 random bytes, hex.
(
  umask 077
  for name in FLASHGATE_JWT_SECRET FLASHGATE_ADMIN_TOKEN FLASHGATE_INTERNAL_TOKEN FLASHGATE_SHOP_TOKEN; do
    grep -q "^$name=" data/secrets.env 2>/dev/null ||
      printf '%s=%s\n' "$name" "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >> data/secrets.env
  done
)
set -a; source data/secrets.env; set +a

pids=()
stop() {
  trap - INT TERM EXIT
  echo; echo "stopping..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; return 1; }

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$PWD/data" --appendonly yes --appendfsync everysec \
  --save "" --logfile "$PWD/data/redis.log" & pids+=($!)
wait_port "$REDIS_PORT"
"$BIN/demo-shop" 127.0.0.1:8000 > data/shop.log 2>&1 & pids+=($!)
"$BIN/flashgate-backend" --config "$CONFIG" > data/backend.log 2>&1 & pids+=($!)
wait_port 9090
"$BIN/flashgate" --config "$CONFIG" serve > data/gateway.log 2>&1 & pids+=($!)
wait_port 8080

TOKEN=$("$BIN/flashgate" --config "$CONFIG" token --user demo-user --ttl 12h)
cat <<MSG

Flashgate is running (logs in ./data/*.log):
  sale page      http://127.0.0.1:8080/sales/demo
  sale state     http://127.0.0.1:8080/api/sales/demo
  shop (proxied) http://127.0.0.1:8080/
  admin API      http://127.0.0.1:9091/admin/sales/demo   (Bearer \$FLASHGATE_ADMIN_TOKEN, in data/secrets.env)
  shop payments  POST http://127.0.0.1:9090/internal/orders/ORDER_ID/pay   (Bearer \$FLASHGATE_SHOP_TOKEN)

Buy as demo-user:
  curl -i -X POST http://127.0.0.1:8080/api/sales/demo/buy \\
    -H 'Authorization: Bearer $TOKEN' -H "Idempotency-Key: \$(date +%s%N)"

Ctrl-C stops everything.
MSG
wait -n "${pids[@]}"
