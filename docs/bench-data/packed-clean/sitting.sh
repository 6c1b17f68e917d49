#!/bin/bash
# Packed units mapped clean on a read fault (tier/packed.rs): before (A) against after
# (B), alternating, the first of each round rotating. swap-w-seq and seq-read --unit 2m
# on compressed+file (disk bytes over the whole run and the measured passes, and speed),
# and swap-w-seq on the file tier, which the change does not touch (the bytes ratio's
# other side).
# A=old-binary B=new-binary OUT=dir ROUNDS=5 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/packed-clean}; mkdir -p "$D"; cd "$D"
for i in $(seq 1 "${ROUNDS:-5}"); do
  ab_pair "$i" sws-cf swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sr-cf seq-read --size 1G --budget 256M --unit 2m --tier compressed+file
  ab_pair "$i" sws-file swap-w-seq --size 1G --budget 256M --unit 2m --tier file
done
echo "$(date +%T) done" >> log
