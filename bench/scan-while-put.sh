#!/usr/bin/env bash
# Puts at 100 clients / 10 conns with and without SCANNERS clients (each its
# own process and connection) ranging back to back over KEYS keys of 256
# bytes, against one metcd member (its defaults: one shard on 2 vCPUs) and,
# when `etcd` is installed, one etcd member started the same way.
#
#   bench/scan-while-put.sh                 # KEYS=10000 SCANNERS=2 SECS=6
#   METCD_FLAGS="--shards 1" bench/scan-while-put.sh
#   METCD_BIN=/path/to/older/metcd bench/scan-while-put.sh   # compare builds
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-10000}; SCANNERS=${SCANNERS:-2}; SECS=${SECS:-6}
cargo build --release -q -p server -p bench
B=$PWD/target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
EP=127.0.0.1:23930
PEER=http://127.0.0.1:23931

run_case() { # name, then the server command line
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $EP endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
  $B mixed-expensive --endpoint $EP --conns 10 --clients 10 --scan-clients 0 --prefill "$KEYS" --total 100 --duration 5 >/dev/null
  echo "## $name: puts idle, then while $SCANNERS clients scan $KEYS keys"
  $B put --endpoint $EP --conns 10 --clients 100 --total 1000000 --duration "$SECS" | sed -n 1p
  local scans=()
  for i in $(seq "$SCANNERS"); do
    $B range --endpoint $EP --key /registry/pods/ --end /registry/pods0 --conns 1 --clients 1 \
      --total 1000000 --duration $((SECS + 3)) >"$WORK/scan.$i" 2>&1 &
    scans+=($!)
  done
  sleep 1
  $B put --endpoint $EP --conns 10 --clients 100 --total 1000000 --duration "$SECS" | sed -n 1p
  wait "${scans[@]}"
  for i in $(seq "$SCANNERS"); do sed -n 1p "$WORK/scan.$i"; done
  kill $pid; wait $pid 2>/dev/null || true
}

run_case metcd "${METCD_BIN:-./target/release/metcd}" --data-dir "$WORK/metcd" --listen-client-urls "http://$EP" \
  --advertise-client-urls "http://$EP" --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER \
  --initial-cluster default=$PEER --listen-http-urls '' ${METCD_FLAGS:-}
if command -v etcd >/dev/null && [ -z "${SKIP_ETCD:-}" ]; then
  run_case etcd etcd --data-dir "$WORK/etcd" --listen-client-urls "http://$EP" \
    --advertise-client-urls "http://$EP" --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER \
    --initial-cluster default=$PEER
fi
