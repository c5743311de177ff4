#!/usr/bin/env bash
# Single member, same machine, same client: real etcd 3.4 vs metcd over the
# etcd v3 gRPC API, etcd's published benchmark cases (scaled down to run in
# about a minute on 2 cores). Prints one block of results per server.
#
#   bench/compare-etcd.sh [TOTAL]     (needs etcd from `apt-get install etcd-server`)
set -euo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-100000}
cargo build --release -q -p server -p bench
B=./target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

run_cases() { # endpoint
  local ep=$1
  ETCDCTL_API=3 etcdctl --endpoints "$ep" put foo bar >/dev/null
  $B put --endpoint "$ep" --conns 1 --clients 1 --total $((TOTAL / 10)) --duration 10
  $B put --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20
  $B range --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20 --consistency l
  $B range --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20 --consistency s
}

wait_up() { # endpoint
  for _ in $(seq 100); do
    ETCDCTL_API=3 etcdctl --endpoints "$1" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server on $1 did not come up" >&2; exit 1
}

echo "## etcd $(etcd --version | head -1 | awk '{print $3}')"
etcd --name bench --data-dir "$WORK/etcd" \
  --listen-client-urls http://127.0.0.1:23900 --advertise-client-urls http://127.0.0.1:23900 \
  --listen-peer-urls http://127.0.0.1:23901 --initial-advertise-peer-urls http://127.0.0.1:23901 \
  --initial-cluster bench=http://127.0.0.1:23901 >"$WORK/etcd.log" 2>&1 &
ETCD=$!
wait_up 127.0.0.1:23900
run_cases 127.0.0.1:23900
kill $ETCD; wait $ETCD 2>/dev/null || true

echo "## metcd $(git rev-parse --short HEAD 2>/dev/null || echo dev)"
./target/release/metcd --data-dir "$WORK/metcd" --listen-client-urls http://127.0.0.1:23910 \
  --listen-http-urls http://127.0.0.1:23911 >"$WORK/metcd.log" 2>&1 &
METCD=$!
wait_up 127.0.0.1:23910
run_cases 127.0.0.1:23910
kill $METCD; wait $METCD 2>/dev/null || true
