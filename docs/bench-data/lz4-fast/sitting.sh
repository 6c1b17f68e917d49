#!/bin/bash
# lz4 against lz4 with liblz4's acceleration (--compressor lz4:N) on one build,
# alternating, the first of each round rotating: swap-w-seq --unit 2m on
# compressed+file (every byte evicted is compressed once), the file tier beside them,
# and pmbench 80/20 4 KiB in the faulting thread (the pool's ratio decides how much
# of the cold set stays in RAM).
# BIN=binary OUT=dir ROUNDS=3 bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/lz4-fast}; mkdir -p "$D"; cd "$D"
ROUNDS=${ROUNDS:-3}
run() { # name args...
  local name=$1; shift
  "$BIN" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
for i in $(seq 1 "$ROUNDS"); do
  cs="lz4 lz4:4 lz4:8 lz4:16"
  [ $((i % 2)) = 0 ] && cs="lz4:16 lz4:8 lz4:4 lz4"
  for c in $cs; do run sws-cf-$c-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file --compressor $c; done
  run sws-file-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier file
  for c in lz4 lz4:8; do run pm-cf-$c-$i pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread --compressor $c; done
done
echo "$(date +%T) done" >> log
