#!/usr/bin/env bash
# Packs what a 16-core comparison run needs into .bench16/ of the project
# checkout (git-ignored through .git/info/exclude): stripped, gzipped
# metcd, metcd-bench and etcd 3.4 binaries plus run.sh.
#   bench/bench16/pack.sh        (from anywhere in the checkout)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.bench16/' .git/info/exclude 2>/dev/null || echo '/.bench16/' >> .git/info/exclude
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server; }
cargo build --release -q -p server -p bench
rm -rf .bench16 && mkdir .bench16
for f in target/release/metcd target/release/metcd-bench "$(command -v etcd)"; do
  n=$(basename "$f"); cp "$f" ".bench16/$n"; strip ".bench16/$n" 2>/dev/null || true; gzip -9 ".bench16/$n"
done
cp "$here/run.sh" .bench16/run.sh
du -sh .bench16
echo "packed: run 'bash .bench16/run.sh' on the 16-CPU machine"
