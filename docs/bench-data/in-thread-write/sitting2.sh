#!/usr/bin/env bash
# Second half of the A/B (new first this time), same commands as sitting.sh.
cd "$(dirname "$0")"
args="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json"
for k in 4 5 6; do
  for b in new base; do
    n=pmbench-$b-$k
    printf 'uswap bench %s   (%s build)\n%s\n' "$args" "$b" "$(date -u +%FT%TZ)" > $n.cmd
    /tmp/uswap-$b bench $args > $n.json 2> $n.err
    echo "$n rc=$?"
  done
done
