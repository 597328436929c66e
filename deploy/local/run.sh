#!/usr/bin/env bash
# `make run`: the whole local stack with the embedded defaults.
# Its own redis-server under ./data (AOF on), the backend on SQLite
# (./data/flashgate.db), the demo shop (with its demo sign-in on), and the
# gateway. Secrets are made
# once and kept in ./data/secrets.env; a secret already set in the
# environment wins over the file. Every process starts at once (each waits
# for what it needs); this script then waits until the backend and the
# gateway say they are ready, and says what they wait for when it takes
# longer than a second (e.g. Redis loading a large AOF). Ctrl-C stops
# everything.
#
# Overrides (defaults match config/flashgate.toml), for tests and for
# running a second stack beside the first:
#   FLASHGATE_BIN_DIR (target/release), FLASHGATE_CONFIG, FLASHGATE_DATA_DIR (data),
#   FLASHGATE_REDIS_PORT (6390), FLASHGATE_SHOP_ADDR (127.0.0.1:8000),
#   FLASHGATE_GATEWAY_ADDR (127.0.0.1:8080), FLASHGATE_GATEWAY_ADMIN_ADDR (127.0.0.1:9092),
#   FLASHGATE_BACKEND_ADDR (127.0.0.1:9090), FLASHGATE_BACKEND_ADMIN_ADDR (127.0.0.1:9091),
#   FLASHGATE_READY_TIMEOUT (seconds, 600).
set -euo pipefail
# Everything this script creates (secrets, the database, Redis's AOF, the
# logs) is readable by the user alone.
umask 077
cd "$(dirname "$0")/../.."
BIN=${FLASHGATE_BIN_DIR:-target/release}
CONFIG=${FLASHGATE_CONFIG:-config/flashgate.toml}
DATA=${FLASHGATE_DATA_DIR:-data}
REDIS_PORT=${FLASHGATE_REDIS_PORT:-6390}
SHOP=${FLASHGATE_SHOP_ADDR:-127.0.0.1:8000}
GATEWAY=${FLASHGATE_GATEWAY_ADDR:-127.0.0.1:8080}
GATEWAY_ADMIN=${FLASHGATE_GATEWAY_ADMIN_ADDR:-127.0.0.1:9092}
BACKEND=${FLASHGATE_BACKEND_ADDR:-127.0.0.1:9090}
BACKEND_ADMIN=${FLASHGATE_BACKEND_ADMIN_ADDR:-127.0.0.1:9091}
READY_TIMEOUT=${FLASHGATE_READY_TIMEOUT:-600}
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd)

# Each secret missing from the file (an older file included) is added:
# 32 random bytes, hex. A file written by hand may use `export NAME=value`.
touch "$DATA/secrets.env"
chmod 600 "$DATA/secrets.env"
# A last line without its newline gets one before anything is appended.
[[ -z $(tail -c 1 "$DATA/secrets.env") ]] || echo >> "$DATA/secrets.env"
for name in FLASHGATE_JWT_SECRET FLASHGATE_ADMIN_TOKEN FLASHGATE_INTERNAL_TOKEN FLASHGATE_SHOP_TOKEN; do
  grep -qE "^(export )?$name=" "$DATA/secrets.env" ||
    printf '%s=%s\n' "$name" "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >> "$DATA/secrets.env"
done
# The file only fills what the environment leaves unset: a secret the user
# exported wins. The value is everything after the first `=` (a base64
# secret keeps its trailing `=`), without one pair of surrounding quotes; a
# last line without a newline counts.
while IFS= read -r line || [[ -n $line ]]; do
  line=${line#export }
  name=${line%%=*}
  value=${line#*=}
  [[ $name =~ ^FLASHGATE_[A-Z_]+$ && $line == *=* ]] || continue
  [[ -n ${!name:-} ]] && continue
  if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
    value=${BASH_REMATCH[1]}
  fi
  export "$name=$value"
done < "$DATA/secrets.env"

# The demo sign-in hands a buyer token to whoever asks: say so when the
# gateway (gateway.listen in the config, 0.0.0.0:8080 when unset) is
# reachable from beyond this machine.
listen=$(awk '/^\[/ { s = $0 } s == "[gateway]" && /^[[:space:]]*listen[[:space:]]*=/ { gsub(/.*=[[:space:]]*"|".*/, ""); print; exit }' "$CONFIG")
listen=${listen:-0.0.0.0:8080}
if [[ ! $listen =~ ^(127\.[0-9.]+|\[::1\]|localhost): ]]; then
  echo "warning: the gateway listens on $listen, not loopback: anyone who can reach it can sign in as a demo shopper" \
    "(/demo/sign-in). Set [gateway] listen = \"127.0.0.1:8080\" in $CONFIG to keep the demo on this machine." >&2
fi

pids=()
stop() {
  trap - INT TERM EXIT
  echo; echo "stopping..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

# GET $1 (host:port) $2 (path); prints the status code, a space, the body
# ("000" when nothing answers within 2 s).
http_get() {
  timeout 2 bash -c '
    exec 3<>"/dev/tcp/${1%:*}/${1##*:}" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$1" >&3
    IFS=" " read -r _ status _ <&3
    while IFS= read -r line <&3 && [[ $line != $'"'"'\r'"'"' ]]; do :; done
    printf "%s " "$status"; cat <&3
  ' _ "$1" "$2" 2>/dev/null || printf '000 '
}

# Waits until GET $2/$3 answers 200; after a second, says what $1 waits for
# (its readiness body), again whenever that changes. Gives up at once when
# any process of the stack has exited (naming it and its log: e.g. Redis on
# a damaged AOF or a taken port), or READY_TIMEOUT seconds after the stack
# was started (one deadline for all the waits).
wait_ready() {
  local name=$1 addr=$2 path=$3 said="" reply body i
  local tenths=0
  while :; do
    reply=$(http_get "$addr" "$path")
    [[ ${reply%% *} == 200 ]] && { [[ -n $said ]] && echo "$name is ready"; return 0; }
    for i in "${!pids[@]}"; do
      if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "${names[$i]} exited; see $DATA/${names[$i]}.log" >&2; return 1
      fi
    done
    body=${reply#* }; [[ -n $body ]] || body="(not answering on $addr yet)"
    if (( tenths >= 10 )) && [[ $body != "$said" ]]; then
      echo "waiting for $name to be ready: $body"
      said=$body
    fi
    if (( SECONDS - started > READY_TIMEOUT )); then
      echo "$name not ready ${READY_TIMEOUT}s after start: $body; see $DATA/$name.log" >&2; return 1
    fi
    sleep 0.1; tenths=$((tenths + 1))
  done
}

names=()
started=$SECONDS
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$DATA" --appendonly yes --appendfsync everysec \
  --save "" --maxmemory-policy noeviction --logfile "$DATA/redis.log" & pids+=($!); names+=(redis)
# The demo shop signs in demo shoppers (FLASHGATE_DEMO_SIGNIN: this stack
# only). Their tokens carry only sub and exp, so they work while
# auth.audience and auth.issuer are unset, as in config/flashgate.toml.
FLASHGATE_DEMO_SIGNIN=1 "$BIN/demo-shop" "$SHOP" > "$DATA/shop.log" 2>&1 & pids+=($!); names+=(shop)
"$BIN/flashgate-backend" --config "$CONFIG" > "$DATA/backend.log" 2>&1 & pids+=($!); names+=(backend)
"$BIN/flashgate" --config "$CONFIG" serve > "$DATA/gateway.log" 2>&1 & pids+=($!); names+=(gateway)
wait_ready backend "$BACKEND" /ready
wait_ready gateway "$GATEWAY_ADMIN" /ready

TOKEN=$("$BIN/flashgate" --config "$CONFIG" token --user demo-user --ttl 12h)
cat <<MSG

Flashgate is running (logs in $DATA/*.log):
  sale page      http://$GATEWAY/demo/sign-in?next=/flashgate/sales/demo
                 (the demo shop signs you in as a new demo shopper, then shows the sale: click Buy)
  sale state     http://$GATEWAY/flashgate/api/sales/demo
  shop (proxied) http://$GATEWAY/
  admin API      http://$BACKEND_ADMIN/admin/sales/demo   (Bearer \$FLASHGATE_ADMIN_TOKEN, in $DATA/secrets.env unless set in the environment)
  shop payments  POST http://$BACKEND/internal/orders/ORDER_ID/pay   (Bearer \$FLASHGATE_SHOP_TOKEN)

Or buy as demo-user from a terminal (the page's token field takes the same token):
  curl -i -X POST http://$GATEWAY/flashgate/api/sales/demo/buy \\
    -H 'Authorization: Bearer $TOKEN' -H "Idempotency-Key: \$(date +%s%N)"

Ctrl-C stops everything.
MSG
wait -n "${pids[@]}"
