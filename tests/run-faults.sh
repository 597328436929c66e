#!/usr/bin/env bash
# Runs the fault-injection suite (tests/tests/faults.rs) N times and prints
# each case's report line per run; stops at the first failing run.
#
# Each run goes through the suite twice: on a standalone Redis (every case),
# then on a Redis Cluster (FLASHGATE_FAULTS_REDIS=cluster; the gateway,
# backend and database cases: a Redis killed in a cluster is a failover,
# tests/tests/failover.rs, run here once per run as well). Each run also
# repeats the gateway's tests of stale sold-out answers (the stock epoch,
# gateway/src/sales/events.rs and gateway/src/buy/tests.rs), whose outcome
# depends on when events and replies interleave. The stock raise
# case (tests/tests/faults/stock_raise.rs) runs on the PostgreSQL at
# 127.0.0.1:5432, whose sessions it cuts.
set -euo pipefail
runs="${1:-10}"
cargo="${CARGO:-cargo}"

# One pass: `run_pass LABEL ENV-ASSIGNMENT NEXTEST-ARGS...`; prints the
# report lines, or the whole output and exits on failure.
run_pass() {
  local label="$1" env="$2"
  shift 2
  local out
  out="$(mktemp)"
  if ! env "$env" "$cargo" nextest run --no-capture "$@" >"$out" 2>&1; then
    cat "$out"
    rm -f "$out"
    echo "fault run $i ($label) failed"
    exit 1
  fi
  { grep -E '^(fault|failover)=' "$out" || true; } | sort
  grep -E 'Summary' "$out" || true
  rm -f "$out"
}

for i in $(seq 1 "$runs"); do
  echo "== fault run $i/$runs"
  run_pass standalone FLASHGATE_FAULTS_REDIS=standalone -p flashgate-tests --test faults
  run_pass cluster FLASHGATE_FAULTS_REDIS=cluster -p flashgate-tests --test faults -E 'not test(/^redis_/)'
  run_pass failover FLASHGATE_FAULTS_REDIS=cluster -p flashgate-tests --test failover
  run_pass epoch FLASHGATE_FAULTS_REDIS=standalone -p flashgate -E 'test(events::tests) | test(sales::cache::tests) | test(missed_the_restock) | test(never_wins_later)'
done
