#!/bin/bash
# No evicting ahead of need while a compressed pool takes what is evicted
# (reclaim/evict.rs, `may_evict_ahead`; `Compressed::takes_stores`): before (A) against
# after (B), alternating, the first of each round rotating. `sitting-1/`: a first version
# that never evicted ahead with a compressed tier; `sitting-2/`: loads from the pool
# counted as refaults instead (not kept); `sitting-3/`: the landed version.
# pmbench 80/20 4 KiB on compressed+file at issue 12's equal-memory budget against zswap
# (515 MiB, in the faulting thread) and at 256 MiB (fault thread), on compressed at the
# one against zram (535 MiB; at 256 MiB the pool cannot hold 1 GiB of mixed data); and
# the 2 MiB streams on compressed+file, which the margin was meant for, with data that
# does not compress too (the pool refuses it: the file tier's case, margin needed).
# A=old-binary B=new-binary OUT=dir ROUNDS=3 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/no-ahead-compressed}; mkdir -p "$D"; cd "$D"
for i in $(seq 1 "${ROUNDS:-3}"); do
  ab_pair "$i" pm-cf-515 pmbench --size 1G --budget 540016640 --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
  ab_pair "$i" pm-cf-256 pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file
  ab_pair "$i" pm-c-535 pmbench --size 1G --budget 560988160 --unit 4k --duration 5s --tier compressed --fault-mode in-thread
  ab_pair "$i" sws-cf swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sr-cf seq-read --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sr-cf-random seq-read --size 1G --budget 256M --unit 2m --tier compressed+file --data random
done
echo "$(date +%T) done" >> log
