#!/usr/bin/env bash
# In-thread write faults (docs/benchmarks.md "In-thread write faults"): pmbench 4 KiB,
# in-thread, the build before the change (uswap-base) and after (uswap-new), alternating,
# three runs each, then the new build against the kernel's swap file.
cd "$(dirname "$0")"
args="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json"
for k in 1 2 3; do
  for b in base new; do
    n=pmbench-$b-$k
    printf 'uswap bench %s   (%s build)\n%s\n' "$args" "$b" "$(date -u +%FT%TZ)" > $n.cmd
    /tmp/uswap-$b bench $args > $n.json 2> $n.err
    echo "$n rc=$?"
  done
done
n=pmbench-new-vs-kernel
a2="$args --against kernel --repeat 3"
printf 'uswap bench %s\n%s\n' "$a2" "$(date -u +%FT%TZ)" > $n.cmd
/tmp/uswap-new bench $a2 > $n.json 2> $n.err
echo "$n rc=$?"
