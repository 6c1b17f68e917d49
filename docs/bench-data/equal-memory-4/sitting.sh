#!/bin/bash
# Issue 12's first target at equal total memory: pmbench 80/20 4 KiB, 1 GiB / 256 MiB +
# the kernel pool's peak, in the faulting thread, against zswap (compressed+file with
# the defaults, and with a pool share of 80% and pages that compress poorly stored as
# they are, as zswap does) and zram (compressed). BIN=binary OUT=dir bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/equal-memory-4}; mkdir -p "$D"; cd "$D"
run() { # name args...
  local name=$1; shift
  echo "$BIN bench $*" > "$name.cmd"
  "$BIN" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
pm="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --repeat 3 --duration 5s"
run zswap-compressedfile-inthread $pm --tier compressed+file --against zswap --plot "$D/zswap-compressedfile-inthread.png"
run zswap-compressedfile-inthread-80-store $pm --tier compressed+file --compressed-max 80 --incompressible store --against zswap --plot "$D/zswap-compressedfile-inthread-80-store.png"
run zram-compressed-inthread $pm --tier compressed --against zram --plot "$D/zram-compressed-inthread.png"
echo "$(date +%T) done" >> log
