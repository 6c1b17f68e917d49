#!/bin/bash
# Issue 12's first target at equal total memory with the pool's new defaults (a 90%
# share with a tier behind it, pages that compress poorly stored as they are):
# pmbench 80/20 4 KiB, 1 GiB / 256 MiB + the kernel pool's peak, in the faulting
# thread, compressed+file against zswap and compressed against zram.
# BIN=binary OUT=dir bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/equal-memory-5}; mkdir -p "$D"; cd "$D"
run() { # name args...
  local name=$1; shift
  echo "$BIN bench $*" > "$name.cmd"
  "$BIN" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
pm="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --repeat 3 --duration 5s"
run zswap-compressedfile-inthread $pm --tier compressed+file --against zswap --plot "$D/zswap-compressedfile-inthread.png"
run zram-compressed-inthread $pm --tier compressed --against zram --plot "$D/zram-compressed-inthread.png"
echo "$(date +%T) done" >> log
