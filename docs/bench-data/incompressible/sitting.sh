#!/bin/bash
# Pages that compress poorly stored as they are in the pool (B, `--incompressible
# store`) or passed straight to the file (A, `--incompressible pass`, the default),
# alternating, the first of each round rotating. A and B are the same build behind a
# wrapper that adds the option. `sitting-1/`: raw pages written back oldest first with
# the rest (not kept); `sitting-2/`: raw pages written back first (kept).
# A=... B=... OUT=dir ROUNDS=3 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/incompressible}; mkdir -p "$D"; cd "$D"
for i in $(seq 1 "${ROUNDS:-3}"); do
  ab_pair "$i" pm-cf-513 pmbench --size 1G --budget 537919488 --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
  ab_pair "$i" pm-cf-513-80 pmbench --size 1G --budget 537919488 --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread --compressed-max 80
  ab_pair "$i" pm-cf-256 pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file
  ab_pair "$i" pm-cf-256-it pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
  ab_pair "$i" sws4k-cf swap-w-seq --size 1G --budget 256M --unit 4k --tier compressed+file
  ab_pair "$i" sws-cf swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sr-cf seq-read --size 1G --budget 256M --unit 2m --tier compressed+file
done
echo "$(date +%T) done" >> log
