#!/bin/bash
# Fault-around from the pool: before (A, the build with the new pool defaults, pages in
# the pool each faulted on alone) and after (B, a stream's fault maps the pages after
# it that are in the pool, decompressed, beside those read ahead). Alternating, the
# first of each round rotating. A=... B=... OUT=dir ROUNDS=3 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/pool-around}; mkdir -p "$D"; cd "$D"
cf="--size 1G --budget 256M --tier compressed+file"
for i in $(seq 1 "${ROUNDS:-3}"); do
  ab_pair "$i" sws4k-cf swap-w-seq $cf --unit 4k
  ab_pair "$i" sws4k-cf-50-pass swap-w-seq $cf --unit 4k --compressed-max 50 --incompressible pass
  ab_pair "$i" sr4k-cf seq-read $cf --unit 4k
  ab_pair "$i" pm-cf-256 pmbench $cf --unit 4k --duration 5s
  ab_pair "$i" pm-cf-513-it pmbench --size 1G --budget 537919488 --tier compressed+file --unit 4k --duration 5s --fault-mode in-thread
done
echo "$(date +%T) done" >> log
