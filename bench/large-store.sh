#!/usr/bin/env bash
# Issue 20's table in one run: one member each of etcd 3.4 (when installed)
# and metcd with every engine; KEYS sequential 8-byte keys with 256-byte
# values put by `metcd-bench put --conns 10 --clients 100`, then RSS, then
# kill -9 and restart until the member answers a read, then RSS again;
# each RSS with the btree/lsm block cache's share (metcd_engine_block_cache_bytes),
# which is memory per key's business only up to its capacity.
#
#   bench/large-store.sh                        # KEYS=1000000, all four
#   KEYS=200000 SERVERS="memory lsm" bench/large-store.sh
#   METCD_BIN=/path/to/older/metcd SERVERS=memory bench/large-store.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-1000000}
SERVERS=${SERVERS:-etcd memory btree lsm}
cargo build --release -q -p server -p bench
METCD=${METCD_BIN:-$PWD/target/release/metcd}
B=$PWD/target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
EP=127.0.0.1:23940
PEER=http://127.0.0.1:23941
HTTP_API=127.0.0.1:23942

rss_mib() { awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$1/status"; }
# The btree/lsm block cache's share of RSS, from metcd's HTTP API (0 for etcd
# and the memory engine).
cache_mib() {
  { curl -s "http://$HTTP_API/metrics" || true; } | awk '/^metcd_engine_block_cache_bytes / {c = $2} END {printf "%d", c / 1048576}'
}

start() { # server name; sets PID
  local name=$1
  if [ "$name" = etcd ]; then
    etcd --data-dir "$WORK/etcd" --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
      --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER --initial-cluster default=$PEER \
      >>"$WORK/$name.log" 2>&1 &
  else
    "$METCD" --engine "$name" --data-dir "$WORK/$name" --listen-client-urls "http://$EP" \
      --advertise-client-urls "http://$EP" --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER \
      --initial-cluster default=$PEER --listen-http-urls "http://$HTTP_API" >>"$WORK/$name.log" 2>&1 &
  fi
  PID=$!
}

# Seconds until a serializable get of the last key answers (bounded),
# through the JSON gateway both serve on the client URL: curl fails at once
# while nothing listens, where etcdctl would wait out its dial timeout
# (up to a second more per try).
wait_ready() {
  local t0 last
  t0=$(date +%s.%N)
  last=$(printf '%08d' $((KEYS - 1)) | base64)
  for _ in $(seq 6000); do
    if curl -s -m 1 "http://$EP/v3/kv/range" -d "{\"key\":\"$last\",\"serializable\":true}" 2>/dev/null | grep -q '"kvs"'; then
      break
    fi
    sleep 0.01
  done
  echo "$(date +%s.%N) - $t0" | bc
}

rows=()
for s in $SERVERS; do
  if [ "$s" = etcd ] && ! command -v etcd >/dev/null; then continue; fi
  start "$s"; pid=$PID
  for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $EP endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
  rate=$($B put --endpoint $EP --conns 10 --clients 100 --sequential-keys --key-space-size "$KEYS" \
    --total "$KEYS" --duration 600 | sed -n 1p | grep -o '[0-9.]* ops/s' | head -1)
  sleep 2
  before=$(rss_mib "$pid"); cache_before=$(cache_mib)
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  start "$s"; pid=$PID
  ready=$(wait_ready)
  sleep 2
  after=$(rss_mib "$pid"); cache_after=$(cache_mib)
  if [ "$s" != etcd ]; then grep -h "start-up\|recovered\|raised to ordinary\|could not raise" "$WORK/$s.log" | tail -12 || true; fi
  rows+=("| $s | $rate | $before MiB | $cache_before MiB | ${ready}s | $after MiB | $cache_after MiB |")
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
done
echo
echo "$KEYS keys of 256 bytes, $(nproc) CPUs, $(date -u +%F)"
echo "| server | puts/s filling | RSS after fill | of it block cache | restart until a read answers | RSS after restart | of it block cache |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
