#!/usr/bin/env bash
# Issue 14's targets in one sitting: a local cluster (3+3, scripts/redis-cluster.sh), 3
# rounds of: fault-latency remote in-thread, remote fault thread, file tier in-thread;
# swap-w-seq --unit 2m remote; pmbench remote in-thread. The cluster stops on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
B=${USWAP_BIN:-$here/target/release/uswap}
out=${OUT:-/tmp/remote-sitting}; mkdir -p "$out"
dir=$(mktemp -d /tmp/rc-sitting.XXXXXX)
trap '"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
R=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
cp "$dir/nodes" "$out/nodes"
for r in 1 2 3; do
  $B bench fault-latency --size 256M --budget 64M --tier remote --remote "$R" --fault-mode in-thread --json > "$out/fl-remote-inthread-$r.json" 2> "$out/fl-remote-inthread-$r.err"
  $B bench fault-latency --size 256M --budget 64M --tier remote --remote "$R" --json > "$out/fl-remote-handler-$r.json" 2> "$out/fl-remote-handler-$r.err"
  $B bench fault-latency --size 256M --budget 64M --fault-mode in-thread --json > "$out/fl-file-inthread-$r.json" 2> "$out/fl-file-inthread-$r.err"
  $B bench swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote "$R" --json > "$out/sws-2m-remote-$r.json" 2> "$out/sws-2m-remote-$r.err"
  $B bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier remote --remote "$R" --fault-mode in-thread --json > "$out/pmbench-remote-inthread-$r.json" 2> "$out/pmbench-remote-inthread-$r.err"
  echo "round $r done"
done
