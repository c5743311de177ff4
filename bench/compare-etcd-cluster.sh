#!/usr/bin/env bash
# Three members on loopback, real etcd 3.4 vs metcd, same client: put at
# 1000 clients / 100 conns and linearizable / serializable range at 1000
# clients, all against the leader (etcd benchmark's --target-leader).
#
#   bench/compare-etcd-cluster.sh [TOTAL]     (needs etcd from `apt-get install etcd-server`)
set -euo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-100000}
cargo build --release -q -p server -p bench
B=./target/release/metcd-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
export ETCDCTL_API=3

start_cluster() { # etcd|metcd base-port
  local bin=$1 base=$2 ic="" i o
  for i in 1 2 3; do ic+="${ic:+,}n$i=http://127.0.0.1:$((base + (i - 1) * 10 + 1))"; done
  for i in 1 2 3; do
    o=$(((i - 1) * 10))
    if [ "$bin" = etcd ]; then
      etcd --name "n$i" --data-dir "$WORK/etcd-n$i" \
        --listen-client-urls "http://127.0.0.1:$((base + o))" --advertise-client-urls "http://127.0.0.1:$((base + o))" \
        --listen-peer-urls "http://127.0.0.1:$((base + o + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((base + o + 1))" \
        --initial-cluster "$ic" --initial-cluster-token bench >"$WORK/etcd-n$i.log" 2>&1 &
    else
      ./target/release/metcd --name "n$i" --data-dir "$WORK/metcd-n$i" \
        --listen-client-urls "http://127.0.0.1:$((base + o))" --listen-http-urls "http://127.0.0.1:$((base + o + 2))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((base + o + 1))" \
        --initial-cluster "$ic" --initial-cluster-token bench --shards 1 >"$WORK/metcd-n$i.log" 2>&1 &
    fi
  done
}

leader_of() { # base-port -> host:port of the leader's client URL
  local base=$1 ep
  for _ in $(seq 100); do
    for o in 0 10 20; do
      ep=127.0.0.1:$((base + o))
      if etcdctl --endpoints "$ep" endpoint status -w json 2>/dev/null |
        python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(0 if s.get("leader")==s["header"]["member_id"] else 1)' 2>/dev/null; then
        echo "$ep"; return 0
      fi
    done
    sleep 0.2
  done
  echo "no leader on $base" >&2; exit 1
}

run_cases() { # endpoint
  local ep=$1
  etcdctl --endpoints "$ep" put foo bar >/dev/null
  $B put --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20
  $B range --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20 --consistency l
  $B range --endpoint "$ep" --conns 100 --clients 1000 --total "$TOTAL" --duration 20 --consistency s
}

echo "## etcd $(etcd --version | head -1 | awk '{print $3}'), 3 members"
start_cluster etcd 26000
run_cases "$(leader_of 26000)"
kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true

echo "## metcd $(git rev-parse --short HEAD 2>/dev/null || echo dev), 3 members"
start_cluster metcd 27000
run_cases "$(leader_of 27000)"
