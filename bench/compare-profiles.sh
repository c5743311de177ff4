#!/usr/bin/env bash
# Each tuning/*.toml profile, one member, same client: put at 1 client and at
# 1000 clients / 100 conns, and put p99 under two full-range scanners.
#
#   bench/compare-profiles.sh [TOTAL]
set -euo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-50000}
cargo build --release -q -p server -p bench
B=./target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
for profile in tuning/*.toml; do
  name=$(basename "$profile" .toml)
  echo "## profile $name"
  ./target/release/metcd --config "$profile" --data-dir "$WORK/$name" \
    --listen-client-urls http://127.0.0.1:23920 --listen-http-urls http://127.0.0.1:23921 >"$WORK/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:23920 endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
  $B put --endpoints 127.0.0.1:23920 --conns 1 --clients 1 --total $((TOTAL / 10)) --duration 10 | grep -v "^ "
  $B put --endpoints 127.0.0.1:23920 --conns 100 --clients 1000 --total "$TOTAL" --duration 20 | grep -v "^ "
  $B mixed-expensive --endpoints 127.0.0.1:23920 --conns 10 --clients 100 --total $((TOTAL / 5)) --duration 20 \
    --scan-clients 2 --prefill 10000 | grep -v "^ "
  kill $pid; wait $pid 2>/dev/null || true
done
