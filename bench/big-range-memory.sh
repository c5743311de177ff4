#!/usr/bin/env bash
# What one big range costs a member in memory: fills KEYS keys of VALUE
# bytes (metcd-bench put, sequential keys), then reads them all with
# `etcdctl get --prefix` and prints the member's resident memory before the
# read and its peak during it (VmHWM, reset just before), and the read's
# time. One metcd member (its defaults), then one etcd member the same way
# when `etcd` is installed. Needs root or the same user (clear_refs).
# CLIENT=curl reads through the JSON gateway instead (`POST /v3/kv/range`
# of every key with curl).
#
#   bench/big-range-memory.sh                   # KEYS=1500 VALUE=65536 (~96 MiB)
#   CLIENT=curl bench/big-range-memory.sh
#   KEYS=100000 VALUE=1024 bench/big-range-memory.sh
#   METCD_BIN=/path/to/older/metcd bench/big-range-memory.sh   # compare builds
#   GET_FLAGS="--sort-by=MODIFY --order=DESCEND" bench/big-range-memory.sh  # more etcdctl get flags
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-1500}; VALUE=${VALUE:-65536}; CLIENT=${CLIENT:-etcdctl}
cargo build --release -q -p server -p bench
B=$PWD/target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
EP=127.0.0.1:23940
PEER=http://127.0.0.1:23941

kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

run_case() { # name, then the server command line
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $EP endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
  $B put --endpoint $EP --conns 10 --clients 50 --total "$KEYS" --duration 600 \
    --sequential-keys --key-space-size "$KEYS" --val-size "$VALUE" | sed -n 1p
  sleep 1
  local before; before=$(kib $pid VmRSS)
  echo 5 >"/proc/$pid/clear_refs"
  local start; start=$(date +%s.%N)
  local bytes
  if [ "$CLIENT" = curl ]; then
    # key "\0" to range_end "\0": every key.
    bytes=$(curl -sS --fail --max-time 600 -X POST "http://$EP/v3/kv/range" \
      -d '{"key":"AA==","range_end":"AA=="}' | wc -c)
  else
    # shellcheck disable=SC2086
    bytes=$(ETCDCTL_API=3 etcdctl --endpoints $EP --command-timeout=600s get --prefix "" ${GET_FLAGS:-} | wc -c)
  fi
  local secs; secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  local peak; peak=$(kib $pid VmHWM)
  printf '%s: %d keys of %d bytes (%d MiB printed by %s) in %.2f s; RSS before %d MiB, peak during the read %d MiB (+%d MiB)\n' \
    "$name" "$KEYS" "$VALUE" $((bytes >> 20)) "$CLIENT" "$secs" $((before >> 10)) $((peak >> 10)) $(((peak - before) >> 10))
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
