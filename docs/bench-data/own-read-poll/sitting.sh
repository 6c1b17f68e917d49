#!/bin/bash
scripts=$(cd "$(dirname "$0")" && pwd)
# In-thread faults that poll for their own read (--own-read-poll-us 250, the default)
# against the same faults sleeping for it (0) and against the kernel's swap file.
# Every side in a memcg of budget + 64 MiB; uswap with --fill-memcg. 3 rounds, the order
# rotating. Then fault-latency, the remote tier (a local 3+3 cluster, stopped on exit),
# and the handler-mode rows that this change leaves alone (swap-w-seq, seq-read).
B=${USWAP_BIN:-/tmp/uswap-poll}
here=$(cd "$(dirname "$0")/../../.." && pwd)
D=${OUT:-/tmp/poll-sitting}; mkdir -p $D; cd $D
. "$scripts/pm.sh"
pm pmbench-1G-t1 pmbench --size 1G --budget 256M --unit 4k --duration 5s
pm pmbench-1G-t4 pmbench --size 1G --budget 256M --unit 4k --duration 5s --threads 4
pm pmbench-2G-t1 pmbench --size 2G --budget 512M --unit 4k --duration 5s
pm pmbench-2G-t4 pmbench --size 2G --budget 512M --unit 4k --duration 5s --threads 4
mkdir -p fl
for i in 1 2 3; do
  for v in 0 250; do
    $B bench fault-latency --size 256M --budget 64M --fault-mode in-thread --own-read-poll-us $v --json > fl/file-p$v-$i.json 2> fl/file-p$v-$i.err
    echo "$(date +%T) fl file p$v $i rc=$?" >> log
  done
done
# the remote tier
dir=$(mktemp -d /tmp/rc-poll.XXXXXX)
trap '"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
cp "$dir/nodes" nodes
R=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
mkdir -p remote
for i in 1 2 3; do
  for v in 0 250; do
    $B bench fault-latency --size 256M --budget 64M --tier remote --remote "$R" --fault-mode in-thread --own-read-poll-us $v --json > remote/fl-p$v-$i.json 2> remote/fl-p$v-$i.err
    echo "$(date +%T) remote fl p$v $i rc=$?" >> log
    $B bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier remote --remote "$R" --fault-mode in-thread --own-read-poll-us $v --json > remote/pm-p$v-$i.json 2> remote/pm-p$v-$i.err
    echo "$(date +%T) remote pm p$v $i rc=$?" >> log
  done
done
"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1
# handler-mode rows (not changed here): nothing regresses
mkdir -p handler
$B bench swap-w-seq --size 1G --budget 256M --unit 2m --against kernel --repeat 3 --json > handler/sws-2m.json 2> handler/sws-2m.err; echo "$(date +%T) sws-2m rc=$?" >> log
$B bench swap-w-seq --size 1G --budget 256M --unit 4k --against kernel --repeat 3 --json > handler/sws-4k.json 2> handler/sws-4k.err; echo "$(date +%T) sws-4k rc=$?" >> log
$B bench seq-read --size 1G --budget 256M --unit 4k --against kernel --repeat 3 --json > handler/seq-read-4k.json 2> handler/seq-read-4k.err; echo "$(date +%T) seq-read-4k rc=$?" >> log
echo "$(date +%T) done" >> log
