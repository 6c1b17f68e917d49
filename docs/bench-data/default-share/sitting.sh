#!/bin/bash
# The compressed pool's defaults with a tier behind it: before (A: a 50% share, pages
# that compress poorly passed on) and after (B: a 90% share, such pages stored as they
# are). One build on both sides; A is it behind old-defaults.sh, which adds
# `--compressed-max 50 --incompressible pass`. Alternating, the first of each round
# rotating. BIN=binary OUT=dir ROUNDS=3 bash sitting.sh
here=$(cd "$(dirname "$0")/../../.." && pwd)
BIN=${BIN:?the build}; export BIN
A="$here/docs/bench-data/default-share/old-defaults.sh" B=$BIN
. "$here/scripts/ab-sitting.sh"
D=${OUT:-/tmp/default-share}; mkdir -p "$D"; cd "$D"
cf="--size 1G --tier compressed+file"
for i in $(seq 1 "${ROUNDS:-3}"); do
  ab_pair "$i" pm-cf-513-it pmbench $cf --budget 537919488 --unit 4k --duration 5s --fault-mode in-thread
  ab_pair "$i" pm-cf-256 pmbench $cf --budget 256M --unit 4k --duration 5s
  ab_pair "$i" pm-cf-256-it pmbench $cf --budget 256M --unit 4k --duration 5s --fault-mode in-thread
  ab_pair "$i" pm-cf-768-it pmbench $cf --budget 768M --unit 4k --duration 5s --fault-mode in-thread
  ab_pair "$i" sws4k-cf swap-w-seq $cf --budget 256M --unit 4k
  ab_pair "$i" sws-cf swap-w-seq $cf --budget 256M --unit 2m
  ab_pair "$i" sr-cf seq-read $cf --budget 256M --unit 2m
done
echo "$(date +%T) done" >> log
