#!/usr/bin/env bash
# One 16-core comparison: etcd 3.4 (GOMAXPROCS=8) and metcd at each of
# SHARDS, each server on CPUs SRV, eight metcd-bench processes pinned to the
# CPUs in CL (1000 clients / 104 connections in all). Prints RESULT lines:
# ops/s summed over the client processes, mean of their p50s, max of their
# p99s; CPU lines: server CPU ticks (1/100 s) over the case.
# Env: SRV (0-7) CL ("8 9 .. 15") SHARDS ("7 3 1") SCALE (1 = full size)
#      METCD_FLAGS (extra metcd flags) CASES ("put1 put range txn"; "scan" adds puts with/without 10 scanners of 100k keys) SKIP_ETCD (1: metcd only)
#      CLUSTER3=1: instead, three members of each on disjoint CPU sets
#      (MEMBER_CPUS, default "0-3 4-7 8-11"; etcd with GOMAXPROCS = the set's
#      size, metcd with --cpus = the set) and the clients on CL3 ("12 13 14
#      15"): put at 1000 clients and linearizable range at 1000 clients, all
#      to the leader.
set -u
cd "$(dirname "$0")"
SRV=${SRV:-0-7}; CL=${CL:-$(seq -s" " 8 15)}; SCALE=${SCALE:-1}; SHARDS=${SHARDS:-7 3 1}
CASES=${CASES:-put1 put range txn}; METCD_FLAGS=${METCD_FLAGS:-}
OUT=${OUT:-/tmp/bench16-out}; mkdir -p "$OUT"
B=/tmp/bench16-bin; mkdir -p $B
for f in *.gz; do gunzip -c "$f" > "$B/$(basename "$f" .gz)"; done; chmod +x $B/*
export PATH=$B:$PATH
W=/root/bench16-data; rm -rf $W; mkdir -p $W
ulimit -n 1048576 2>/dev/null; ulimit -l unlimited 2>/dev/null
exec > >(tee -a "$OUT/bench16.log") 2>&1
echo "## machine: $(uname -r), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "## fsync floor"; metcd-bench fsync --dir $W --total 3000 --duration 3
health() { for _ in $(seq 150); do curl -fsS -m1 "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "no health on $1"; return 1; }
multi() { # label, metcd-bench args (@C = the client's cpu)
  local label=$1 cpu; shift; local pids=()
  for cpu in $CL; do metcd-bench "${@//@C/$cpu}" --output json --cpu $cpu > $W/m.$cpu 2>$W/m.$cpu.err & pids+=($!); done
  wait "${pids[@]}"
  python3 - "$label" $(for cpu in $CL; do echo $W/m.$cpu; done) <<'PY'
import json, sys
rs = []
for f in sys.argv[2:]:
    try: rs.append(json.loads(open(f).read().strip().splitlines()[-1]))
    except Exception as e: print("bad", f, e, open(f + ".err").read()[-300:])
if rs:
    q = sum(r["ops_per_sec"] for r in rs); n = sum(r["ops"] for r in rs); e = sum(r["errors"] for r in rs)
    print(f"RESULT {sys.argv[1]:<30} procs={len(rs)} ops={n} err={e} qps={q:,.0f} "
          f"p50(mean)={sum(r['p50_ms'] for r in rs)/len(rs):.2f}ms p99(max)={max(r['p99_ms'] for r in rs):.2f}ms "
          f"p999(max)={max(r['p999_ms'] for r in rs):.2f}ms")
PY
}
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
timed() { # tag case pid multi-args...
  local t=$1 c=$2 pid=$3 c0; shift 3; c0=$(ticks $pid)
  multi "$t $c" "$@"; echo "CPU $t $c server_ticks=$(( $(ticks $pid) - c0 ))"
}
cases() { # tag endpoint pid
  local t=$1 ep=$2 pid=$3
  metcd-bench put --endpoint $ep --conns 1 --clients 1 --total 100 --duration 2 >/dev/null 2>&1
  for c in $CASES; do case $c in
    put1) metcd-bench put --endpoint $ep --conns 1 --clients 1 --total $((20000/SCALE)) --duration 5 --cpu ${CL%% *} --output json | sed "s/^/RESULT1 $t put-1client /" ;;
    put) multi "$t warm" put --endpoint $ep --conns 13 --clients 125 --total $((30000/SCALE)) --duration 4 >/dev/null
         timed $t put-1000c $pid put --endpoint $ep --conns 13 --clients 125 --total $((150000/SCALE)) --duration 10 ;;
    range) timed $t range-l-1000c $pid range --endpoint $ep --conns 13 --clients 125 --total $((400000/SCALE)) --duration 8 --consistency l ;;
    txn) timed $t txn-put-1000c $pid txn-put --prefix /registry/pods/@C/ --endpoint $ep --conns 13 --clients 125 --total $((100000/SCALE)) --duration 8 ;;
    scan) # puts from one client process with and without 10 clients (5 processes) scanning 100k keys
      set -- $CL; local pc=$1; shift
      metcd-bench mixed-expensive --endpoint $ep --conns 10 --clients 10 --scan-clients 0 --prefill $((100000/SCALE)) --total 100 --duration 5 --cpu $pc >/dev/null 2>&1
      metcd-bench put --endpoint $ep --conns 10 --clients 100 --total 200000 --duration 8 --cpu $pc --output json | sed "s/^/RESULT1 $t put-idle /"
      local sp=() sc; for sc in $1 $2 $3 $4 $5; do metcd-bench range --endpoint $ep --key /registry/pods/ --end /registry/pods0 --conns 2 --clients 2 --total 100000 --duration 11 --cpu $sc --output json > $W/scan.$sc 2>&1 & sp+=($!); done
      sleep 1.5
      metcd-bench put --endpoint $ep --conns 10 --clients 100 --total 200000 --duration 8 --cpu $pc --output json | sed "s/^/RESULT1 $t put-while-scanning /"
      wait "${sp[@]}"; for sc in $1 $2 $3 $4 $5; do sed "s/^/RESULT1 $t scan /" $W/scan.$sc; done ;;
  esac; done
}
if [ -n "${CLUSTER3:-}" ]; then
  read -r -a SETS <<< "${MEMBER_CPUS:-0-3 4-7 8-11}"
  CL=${CL3:-12 13 14 15}; nc=$(echo $CL | wc -w)
  per_conns=$((100 / nc)); per_clients=$((1000 / nc))
  cpus_in() { python3 -c 'import sys
n = 0
for part in sys.argv[1].split(","):
    a, _, b = part.partition("-"); n += int(b or a) - int(a) + 1
print(n)' "$1"; }
  cluster3() { # etcd|metcd
    local kind=$1 ic="" i pids=() eps=""
    for i in 0 1 2; do ic+="${ic:+,}n$i=http://127.0.0.1:$((4380 + 10 * i))"; eps+="${eps:+,}127.0.0.1:$((4379 + 10 * i))"; done
    for i in 0 1 2; do
      local set=${SETS[$i]} c=127.0.0.1:$((4379 + 10 * i)) p=http://127.0.0.1:$((4380 + 10 * i))
      if [ "$kind" = etcd ]; then
        GOMAXPROCS=$(cpus_in "$set") taskset -c "$set" etcd --name n$i --data-dir $W/c-etcd$i --listen-client-urls http://$c \
          --advertise-client-urls http://$c --listen-peer-urls $p --initial-advertise-peer-urls $p --initial-cluster "$ic" \
          --initial-cluster-token b16 > $W/c-etcd$i.log 2>&1 &
      else
        taskset -c "$set" metcd --name n$i --data-dir $W/c-metcd$i --cpus "$set" --listen-client-urls http://$c \
          --advertise-client-urls http://$c --listen-http-urls http://127.0.0.1:$((4381 + 10 * i)) --listen-peer-urls $p \
          --initial-advertise-peer-urls $p --initial-cluster "$ic" --initial-cluster-token b16 $METCD_FLAGS > $W/c-metcd$i.log 2>&1 &
      fi
      pids+=($!)
    done
    for i in 0 1 2; do health $((4379 + 10 * i)) || tail -5 $W/c-$kind$i.log; done
    sleep 2
    echo "## $kind, 3 members on ${SETS[*]}, clients on $CL"
    multi "$kind-3m warm" put --endpoints $eps --target-leader --conns $per_conns --clients $per_clients --total $((20000/SCALE)) --duration 3 >/dev/null
    multi "$kind-3m put-1000c" put --endpoints $eps --target-leader --conns $per_conns --clients $per_clients --total $((150000/SCALE)) --duration 10
    multi "$kind-3m range-l-1000c" range --endpoints $eps --target-leader --conns $per_conns --clients $per_clients --total $((400000/SCALE)) --duration 8 --consistency l
    for i in 0 1 2; do grep -h Cpus_allowed_list /proc/${pids[$i]}/task/*/status | sort | uniq -c | sed "s/^/n$i /"; done
    kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
  }
  [ -z "${SKIP_ETCD:-}" ] && cluster3 etcd
  cluster3 metcd
  echo "## done"
  exit 0
fi
if [ -z "${SKIP_ETCD:-}" ]; then
echo "## etcd $(etcd --version | head -1)"
GOMAXPROCS=8 taskset -c $SRV etcd --name e --data-dir $W/etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster e=http://127.0.0.1:2380 > $W/etcd.log 2>&1 &
EP=$!; health 2379 && cases etcd 127.0.0.1:2379 $EP
kill $EP; wait $EP 2>/dev/null
fi
for s in $SHARDS; do
  echo "## metcd --shards $s $METCD_FLAGS"
  taskset -c $SRV metcd --data-dir $W/m$s --shards $s --listen-client-urls http://127.0.0.1:3379 --advertise-client-urls http://127.0.0.1:3379 \
    --listen-http-urls http://127.0.0.1:3390 --listen-peer-urls http://127.0.0.1:3380 --initial-advertise-peer-urls http://127.0.0.1:3380 $METCD_FLAGS > $W/m$s.log 2>&1 &
  MP=$!
  if health 3379; then cases "metcd-s$s" 127.0.0.1:3379 $MP; grep -E 'VmHWM' /proc/$MP/status; else tail -20 $W/m$s.log; fi
  kill $MP; wait $MP 2>/dev/null
done
echo "## done"
