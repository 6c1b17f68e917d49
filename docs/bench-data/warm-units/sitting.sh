#!/bin/bash
# Warm 2 MiB frames (frames.rs, `tune_warm_units`): before (A) against after (B),
# alternating, the first of each round rotating. swap-w-seq --unit 2m on the
# compressed+file and file tiers, and pmbench 80/20 4 KiB on compressed+file in the
# faulting thread (4 KiB units take no 2 MiB frame: it should not move).
# A=old-binary B=new-binary OUT=dir ROUNDS=5 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/warm-units}; mkdir -p "$D"; cd "$D"
for i in $(seq 1 "${ROUNDS:-5}"); do
  ab_pair "$i" sws-cf swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sws-file swap-w-seq --size 1G --budget 256M --unit 2m --tier file
  ab_pair "$i" pm-cf pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
done
echo "$(date +%T) done" >> log
