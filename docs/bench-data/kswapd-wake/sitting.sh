#!/bin/bash
# The reclaim thread woken from what faults have promised, and before a fault reclaims
# directly (reclaim/mod.rs, `wake_if_high`): before (A) against after (B), alternating,
# the first of each round rotating. swap-w-seq --unit 2m on the file and compressed+file
# tiers, and pmbench 80/20 4 KiB on the file tier through the fault thread.
# A=old-binary B=new-binary OUT=dir ROUNDS=5 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/kswapd-wake}; mkdir -p "$D"; cd "$D"
for i in $(seq 1 "${ROUNDS:-5}"); do
  ab_pair "$i" sws-cf swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sws-file swap-w-seq --size 1G --budget 256M --unit 2m --tier file
  ab_pair "$i" pm-file pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier file
done
echo "$(date +%T) done" >> log
