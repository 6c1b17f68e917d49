#!/bin/bash
# Issue 14's rows beside the file tier's, alternating, in one sitting: a local 3+3
# cluster (stopped on exit); 3 rounds of swap-w-seq --unit 2m and pmbench 80/20 in the
# faulting thread, each on the remote tier then the file tier, and fault-latency remote.
# OUT=dir USWAP_BIN=path bash sitting.sh
B=${USWAP_BIN:-target/release/uswap}
here=$(cd "$(dirname "$0")/../../.." && pwd)
D=${OUT:-/tmp/remote-quiet}; mkdir -p "$D"; cd "$D"
dir=$(mktemp -d /tmp/rc-quiet.XXXXXX)
trap '"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
cp "$dir/nodes" nodes
R=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
run() { # name tier-args... : one run, its JSON and stderr kept
  local name=$1; shift
  "$B" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
for i in 1 2 3; do
  run sws-remote-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote "$R"
  run sws-file-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier file
  run pm-remote-$i pmbench --size 1G --budget 256M --unit 4k --duration 5s --fault-mode in-thread --tier remote --remote "$R"
  run pm-file-$i pmbench --size 1G --budget 256M --unit 4k --duration 5s --fault-mode in-thread --tier file
  run fl-remote-$i fault-latency --size 256M --budget 64M --fault-mode in-thread --tier remote --remote "$R"
done
echo "$(date +%T) done" >> log
