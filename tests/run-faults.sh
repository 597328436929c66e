#!/usr/bin/env bash
# Runs the fault-injection suite (tests/tests/faults.rs) N times and prints
# each case's report line per run; stops at the first failing run.
set -euo pipefail
runs="${1:-10}"
cargo="${CARGO:-cargo}"
for i in $(seq 1 "$runs"); do
  echo "== fault run $i/$runs"
  out="$(mktemp)"
  if ! "$cargo" nextest run -p flashgate-tests --test faults --no-capture >"$out" 2>&1; then
    cat "$out"
    rm -f "$out"
    echo "fault run $i failed"
    exit 1
  fi
  grep -E '^fault=' "$out" | sort
  grep -E 'Summary' "$out" || true
  rm -f "$out"
done
