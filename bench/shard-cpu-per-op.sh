#!/usr/bin/env bash
# CPU each shard of one metcd member spends per operation, on a machine too
# small to show scaling: a member with SHARDS shards (default 2) answers
# SECS seconds of OP from CONNS connections (spread over the shards that
# accept clients by the kernel); the script reads every shard thread's CPU
# time from /proc before and after and prints it per operation.
#
#   OP=range: serializable ranges over KEYS keys of 256 bytes (the owner
#             doing less per range is what lets a big machine's other cores
#             serve ranges without it)
#   OP=put:   puts of 256-byte values from CLIENTS clients (the owner's CPU
#             per put beside the total is the ceiling of writes per core)
#
#   bench/shard-cpu-per-op.sh                    # OP=range SHARDS=2 KEYS=10000 CONNS=8 SECS=8
#   OP=put CONNS=10 CLIENTS=1000 bench/shard-cpu-per-op.sh
#   METCD_FLAGS="--owner-accepts-clients false" OP=put bench/shard-cpu-per-op.sh
#   METCD_BIN=/path/to/older/metcd bench/shard-cpu-per-op.sh   # compare builds
set -euo pipefail
cd "$(dirname "$0")/.."
OP=${OP:-range}; SHARDS=${SHARDS:-2}; KEYS=${KEYS:-10000}; CONNS=${CONNS:-8}; SECS=${SECS:-8}
CLIENTS=${CLIENTS:-$CONNS}
cargo build --release -q -p server -p bench
B=$PWD/target/release/metcd-bench
BIN=${METCD_BIN:-./target/release/metcd}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
EP=127.0.0.1:23940
PEER=http://127.0.0.1:23941
"$BIN" --data-dir "$WORK/metcd" --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
  --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER --initial-cluster default=$PEER \
  --listen-http-urls '' --shards "$SHARDS" ${METCD_FLAGS:-} >"$WORK/metcd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $EP endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
if [ "$OP" = range ]; then
  $B mixed-expensive --endpoint $EP --conns 10 --clients 10 --scan-clients 0 --prefill "$KEYS" --total 100 --duration 5 >/dev/null
fi

ticks() { # shard -> utime+stime in clock ticks of its threads (glommio
  # names them metcd-shard-<shard>-<executor id>: the executor and its helper)
  local t sum=0
  for t in /proc/$pid/task/*; do
    case "$(cat "$t/comm" 2>/dev/null)" in
      "metcd-shard-$1-"*) sum=$((sum + $(awk '{ print $14 + $15 }' "$t/stat" 2>/dev/null || echo 0))) ;;
    esac
  done
  echo $sum
}
declare -A before
for s in $(seq 0 $((SHARDS - 1))); do before[$s]=$(ticks "$s"); done
process_before=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
if [ "$OP" = range ]; then
  out=$($B range --endpoint $EP --key /registry/pods/ --end /registry/pods0 --conns "$CONNS" \
    --clients "$CLIENTS" --total 1000000 --duration "$SECS" --consistency s | sed -n 1p)
else
  out=$($B put --endpoint $EP --conns "$CONNS" --clients "$CLIENTS" --val-size 256 \
    --total 10000000 --duration "$SECS" | sed -n 1p)
fi
echo "$out"
n=$(echo "$out" | awk '{ for (i = 1; i < NF; i++) if ($(i + 1) == "ops") { print $i; exit } }')
hz=$(getconf CLK_TCK)
for s in $(seq 0 $((SHARDS - 1))); do
  after=$(ticks "$s")
  awk -v s="$s" -v d=$((after - ${before[$s]})) -v n="$n" -v hz="$hz" 'BEGIN {
    printf "shard %d: %.2f s CPU, %.1f us per op\n", s, d / hz, 1e6 * d / hz / n }'
done
process_after=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
awk -v d=$((process_after - process_before)) -v n="$n" -v hz="$hz" 'BEGIN {
  printf "process (every thread): %.2f s CPU, %.1f us per op\n", d / hz, 1e6 * d / hz / n }'
kill $pid; wait $pid 2>/dev/null || true
