#!/bin/bash
# Issue 14's rows again with the fixed build: a local 3+3 cluster (stopped on exit);
# 3 rounds of swap-w-seq --unit 2m and pmbench on the remote tier (in-thread, polling),
# and fault-latency remote in-thread.
B=${USWAP_BIN:-/tmp/uswap-poll2}
here=$(cd "$(dirname "$0")/../../.." && pwd)
D=${OUT:-/tmp/poll-remote2}; mkdir -p $D; cd $D
dir=$(mktemp -d /tmp/rc-poll.XXXXXX)
trap '"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
cp "$dir/nodes" nodes
R=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
for i in 1 2 3; do
  $B bench swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote "$R" --json > sws-2m-$i.json 2> sws-2m-$i.err
  echo "$(date +%T) sws-2m $i rc=$?" >> log
  $B bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier remote --remote "$R" --fault-mode in-thread --json > pm-$i.json 2> pm-$i.err
  echo "$(date +%T) pm $i rc=$?" >> log
  $B bench fault-latency --size 256M --budget 64M --tier remote --remote "$R" --fault-mode in-thread --json > fl-$i.json 2> fl-$i.err
  echo "$(date +%T) fl $i rc=$?" >> log
done
echo "$(date +%T) done" >> log
