#!/bin/bash
# Warm 2 MiB frames (frames.rs, `tune_warm_units`): before (A) against after (B),
# alternating, the first of each round rotating. swap-w-seq --unit 2m on the
# compressed+file and file tiers, and pmbench 80/20 4 KiB on compressed+file in the
# faulting thread (4 KiB units take no 2 MiB frame: it should not move).
# A=old-binary B=new-binary OUT=dir ROUNDS=5 bash sitting.sh
A=${A:?the build before}; B=${B:?the build after}
D=${OUT:-/tmp/warm-units}; mkdir -p "$D"; cd "$D"
ROUNDS=${ROUNDS:-5}
run() { # side name args...
  local side=$1 name=$2; shift 2
  local bin=$A; [ "$side" = B ] && bin=$B
  "$bin" bench "$@" --json > "$name-$side.json" 2> "$name-$side.err"
  echo "$(date +%T) $name-$side rc=$?" >> log
}
for i in $(seq 1 "$ROUNDS"); do
  order="A B"; [ $((i % 2)) = 0 ] && order="B A"
  for s in $order; do run $s sws-cf-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file; done
  for s in $order; do run $s sws-file-$i swap-w-seq --size 1G --budget 256M --unit 2m --tier file; done
  for s in $order; do run $s pm-cf-$i pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread; done
done
echo "$(date +%T) done" >> log
