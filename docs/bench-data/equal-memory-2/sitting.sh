#!/bin/bash
# Issue 12's first target at equal total memory: pmbench 80/20 4 KiB, 1 GiB / 256 MiB,
# in the faulting thread, against zswap (compressed+file) and zram (compressed).
# BIN=binary OUT=dir bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/equal-memory-2}; mkdir -p "$D"; cd "$D"
run() { # name args...
  local name=$1; shift
  echo "$BIN bench $*" > "$name.cmd"
  "$BIN" bench "$@" --json > "$name.json" 2> "$name.err"
  echo "$(date +%T) $name rc=$?" >> log
}
run zswap-compressedfile-inthread pmbench --size 1G --budget 256M --unit 4k --tier compressed+file --fault-mode in-thread --against zswap --repeat 3 --duration 5s --plot "$D/zswap-compressedfile-inthread.png"
run zram-compressed-inthread pmbench --size 1G --budget 256M --unit 4k --tier compressed --fault-mode in-thread --against zram --repeat 3 --duration 5s --plot "$D/zram-compressed-inthread.png"
echo "$(date +%T) done" >> log
