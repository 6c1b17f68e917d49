#!/usr/bin/env bash
# In-thread write faults (docs/benchmarks.md "In-thread write faults"): pmbench 4 KiB,
# in-thread, the build before the change (uswap-base) and after (uswap-new), alternating,
# six runs each (base first in runs 1-3, new first in 4-6; the new build's run against the
# kernel's swap file came between them).
cd "$(dirname "$0")"
args="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json"
for k in 1 2 3 4 5 6; do
  if [ $k -le 3 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    n=pmbench-$b-$k
    printf 'uswap bench %s   (%s build)\n%s\n' "$args" "$b" "$(date -u +%FT%TZ)" > $n.cmd
    /tmp/uswap-$b bench $args > $n.json 2> $n.err
    echo "$n rc=$?"
  done
  if [ $k = 3 ]; then
    n=pmbench-new-vs-kernel
    a2="$args --against kernel --repeat 3"
    printf 'uswap bench %s\n%s\n' "$a2" "$(date -u +%FT%TZ)" > $n.cmd
    /tmp/uswap-new bench $a2 > $n.json 2> $n.err
    echo "$n rc=$?"
  fi
done
