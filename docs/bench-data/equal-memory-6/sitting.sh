#!/bin/bash
# Issue 12's first target at equal total memory, the kernel side now with
# vm.page-cluster 0 (the harness's default against zram and zswap): pmbench 80/20
# 4 KiB, 1 GiB / 256 MiB + the kernel pool's peak, in the faulting thread,
# compressed+file against zswap (5 alternating rounds) and compressed against zram (3).
# BIN=binary OUT=dir bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/equal-memory-6}; mkdir -p "$D"; cd "$D"
run() { # name args...
  local name=$1; shift
  echo "$BIN bench $*" > "$name.cmd"
  "$BIN" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
pm="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s"
run zswap-compressedfile-inthread $pm --repeat 5 --tier compressed+file --against zswap --plot "$D/zswap-compressedfile-inthread.png"
run zram-compressed-inthread $pm --repeat 3 --tier compressed --against zram --plot "$D/zram-compressed-inthread.png"
echo "$(date +%T) done" >> log
