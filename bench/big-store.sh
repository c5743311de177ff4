#!/usr/bin/env bash
# Issue 20's big stores: one member each of etcd 3.4 (when installed) and
# metcd with every engine, holding KEYS sequential 8-byte keys of VALUE
# bytes, and what an operator does with such a store. Each step prints its
# wall time and the member's peak RSS during it (VmHWM, reset before the
# step through /proc/PID/clear_refs):
#   fill      metcd-bench put --conns 10 --clients 100 --sequential-keys
#   restart   kill -9, start, until a serializable get of the last key answers
#   keys      etcdctl get --prefix "" --keys-only (its output counted, not kept)
#   list      Kubernetes' paged LIST: metcd-bench list, 500 keys a page
#   defrag    etcdctl defrag
#   backup    etcdctl snapshot save (and the file's size)
#   restore   snapshot restore into a new data dir (peak: the restoring
#             process), then a member started on it until the last key reads
#   learner   member add --learner on the restored member, a second member
#             started empty until its revision is the leader's (it catches
#             up by snapshot); peak: the leader's, and the learner's after
#
#   bench/big-store.sh                               # KEYS=10000000 VALUE=256, all four
#   KEYS=1000000 SERVERS="lsm" bench/big-store.sh
#   KEYS=300 VALUE=1048576 bench/big-store.sh        # a few 1 MiB values
#
# The quota is raised to 8 GiB for both (etcd's largest); every wait is
# bounded (WAIT_SECS, default 900 s per step; LIST_SECS, default WAIT_SECS,
# for the paged LIST, which etcd 3.4 makes quadratic). Data goes to a new
# directory under WORK_DIR (default $TMPDIR or /tmp), removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-10000000}
VALUE=${VALUE:-256}
SERVERS=${SERVERS:-etcd memory btree lsm}
WAIT_SECS=${WAIT_SECS:-900}
# etcd 3.4 counts the rest of the range for every page: 10M keys take hours.
LIST_SECS=${LIST_SECS:-$WAIT_SECS}
for tool in etcdctl bc /usr/bin/time; do
  command -v $tool >/dev/null || { echo "big-store.sh needs $tool" >&2; exit 2; }
done
cargo build --release -q -p server -p bench
B=$PWD/target/release/metcd-bench
METCD=${METCD_BIN:-$PWD/target/release/metcd}
WORK=$(mktemp -d "${WORK_DIR:-${TMPDIR:-/tmp}}/big-store.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
QUOTA=$((8 << 30))
EP=127.0.0.1:23950 PEER=http://127.0.0.1:23951 HTTP_API=127.0.0.1:23952
EP2=127.0.0.1:23953 PEER2=http://127.0.0.1:23954 HTTP_API2=127.0.0.1:23955
LAST=$(printf '%08d' $((KEYS - 1)))
export ETCDCTL_API=3

mib() { awk -v k="$2" '$1 == k":" {printf "%d", $2 / 1024}' "/proc/$1/status"; }
reset_peak() { echo 5 >"/proc/$1/clear_refs"; }
now() { date +%s.%N; }
since() { echo "scale=2; ($(now) - $1) / 1" | bc; }

# start NAME DATA_DIR [peer/client ports of member 2] [extra flags...]; sets PID.
start() {
  local name=$1 dir=$2 second=$3
  shift 3
  local ep=$EP peer=$PEER http=$HTTP_API
  if [ "$second" = 2 ]; then ep=$EP2 peer=$PEER2 http=$HTTP_API2; fi
  if [ "$name" = etcd ]; then
    etcd --data-dir "$dir" --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --quota-backend-bytes $QUOTA "$@" >>"$WORK/$name.log" 2>&1 &
  else
    "$METCD" --engine "$name" --data-dir "$dir" --listen-client-urls "http://$ep" \
      --advertise-client-urls "http://$ep" --listen-peer-urls "$peer" \
      --initial-advertise-peer-urls "$peer" --listen-http-urls "http://$http" \
      --quota-backend-bytes $QUOTA "$@" >>"$WORK/$name.log" 2>&1 &
  fi
  PID=$!
}

# Waits (bounded) until a serializable get of the last key answers on $1,
# through the JSON gateway both serve on the client URL: curl fails at once
# while nothing listens, where etcdctl would wait out its dial timeout.
wait_read() {
  local ep=$1 deadline=$((SECONDS + WAIT_SECS)) key
  key=$(printf '%s' "$LAST" | base64 -w0)
  while [ $SECONDS -lt $deadline ]; do
    if curl -s -m 2 "http://$ep/v3/kv/range" -d "{\"key\":\"$key\",\"serializable\":true,\"keys_only\":true}" 2>/dev/null | grep -q '"kvs"'; then
      return 0
    fi
    sleep 0.01
  done
  echo "no answer from $ep in ${WAIT_SECS}s" >&2
  return 1
}

revision() { # endpoint -> its header revision (empty when it does not answer)
  local status
  status=$(etcdctl --endpoints "$1" --command-timeout=2s endpoint status -w json 2>/dev/null || true)
  grep -o '"revision":[0-9]*' <<<"$status" | head -1 | cut -d: -f2 || true
}

rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); echo "  $2: $3, peak $4" >&2; }

for s in $SERVERS; do
  if [ "$s" = etcd ] && ! command -v etcd >/dev/null; then continue; fi
  echo "== $s: $KEYS keys of $VALUE bytes" >&2
  one=default=$PEER
  start "$s" "$WORK/$s" 1 --initial-cluster "$one"; pid=$PID
  for _ in $(seq 100); do etcdctl --endpoints $EP endpoint health >/dev/null 2>&1 && break; sleep 0.1; done

  reset_peak "$pid"; t=$(now)
  out=$($B put --endpoint $EP --conns 10 --clients 100 --sequential-keys --key-space-size "$KEYS" \
    --val-size "$VALUE" --total "$KEYS" --duration "$WAIT_SECS" | sed -n 1p)
  row "$s" fill "$(since "$t") s ($(grep -o '[0-9.]* ops/s' <<<"$out" | head -1))" "$(mib "$pid" VmHWM) MiB"

  sleep 2
  kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  t=$(now)
  start "$s" "$WORK/$s" 1 --initial-cluster "$one"; pid=$PID
  wait_read $EP
  row "$s" restart "$(since "$t") s" "$(mib "$pid" VmHWM) MiB"

  reset_peak "$pid"; t=$(now)
  n=$(etcdctl --endpoints $EP --command-timeout=${WAIT_SECS}s get --prefix "" --keys-only | grep -c . || true)
  row "$s" "get --prefix --keys-only" "$(since "$t") s ($n lines)" "$(mib "$pid" VmHWM) MiB"

  reset_peak "$pid"; t=$(now)
  out=$(timeout "$LIST_SECS" $B list --endpoint $EP --limit 500 || true)
  listed=$(grep -o '[0-9]* keys ([0-9.]* MiB of values) in [0-9]* pages' <<<"$out" || echo "not finished in ${LIST_SECS} s")
  row "$s" "paged LIST" "$(since "$t") s ($listed)" "$(mib "$pid" VmHWM) MiB"

  reset_peak "$pid"; t=$(now)
  etcdctl --endpoints $EP --command-timeout=${WAIT_SECS}s defrag >/dev/null
  row "$s" defrag "$(since "$t") s" "$(mib "$pid" VmHWM) MiB"

  reset_peak "$pid"; t=$(now)
  etcdctl --endpoints $EP --command-timeout=${WAIT_SECS}s snapshot save "$WORK/backup.db" >/dev/null
  row "$s" backup "$(since "$t") s ($(du -m "$WORK/backup.db" | cut -f1) MiB)" "$(mib "$pid" VmHWM) MiB"
  kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true

  restored=$WORK/$s-restored
  restore=(etcdctl snapshot restore)
  [ "$s" = etcd ] || restore=("$METCD" snapshot restore --engine "$s")
  t=$(now)
  peak=$(/usr/bin/time -f %M "${restore[@]}" "$WORK/backup.db" --data-dir "$restored" --name default \
    --initial-cluster "$one" --initial-advertise-peer-urls $PEER 2>&1 >/dev/null | tail -1)
  start "$s" "$restored" 1 --initial-cluster "$one"; pid=$PID
  wait_read $EP
  row "$s" "restore and start" "$(since "$t") s" "$((peak / 1024)) MiB restoring, $(mib "$pid" VmHWM) MiB started"
  rm -f "$WORK/backup.db"; rm -rf "${WORK:?}/$s"

  reset_peak "$pid"; t=$(now)
  etcdctl --endpoints $EP member add learner --learner --peer-urls=$PEER2 >/dev/null
  start "$s" "$WORK/$s-learner" 2 --name learner --initial-cluster "$one,learner=$PEER2" \
    --initial-cluster-state existing; learner=$PID
  target=$(revision $EP) caught="" deadline=$((SECONDS + WAIT_SECS))
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(revision $EP2)" = "$target" ]; then caught=yes; break; fi
    sleep 0.1
  done
  [ -n "$caught" ] || echo "the learner did not reach revision $target in ${WAIT_SECS}s" >&2
  row "$s" "learner catches up" "$(since "$t") s$([ -n "$caught" ] || echo " (not caught up)")" \
    "$(mib "$pid" VmHWM) MiB leader, $(mib "$learner" VmHWM) MiB learner"
  kill -9 "$pid" "$learner" 2>/dev/null || true; wait "$pid" "$learner" 2>/dev/null || true
  rm -rf "${WORK:?}/$s-restored" "${WORK:?}/$s-learner"
done
echo
echo "$KEYS keys of $VALUE bytes, $(nproc) CPUs, $(date -u '+%F %H:%M UTC'), metcd $(git rev-parse --short HEAD)"
echo "| server | step | time | peak RSS |"
echo "|---|---|---:|---:|"
printf '%s\n' "${rows[@]}"
