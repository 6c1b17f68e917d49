#!/bin/bash
# pmbench 80/20 4 KiB, 1 GiB / 256 MiB + the kernel pool's peak, in the faulting thread,
# mixed data, against zswap at vm.page-cluster 0: 5 alternating rounds, kernel first.
# BIN=binary OUT=dir bash sitting.sh
BIN=${BIN:?the build}
D=${OUT:?where}; mkdir -p "$D"; cd "$D"
pm="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s"
echo "$BIN bench $pm --repeat 5 --tier compressed+file --against zswap" > zswap-compressedfile-inthread.cmd
"$BIN" bench $pm --repeat 5 --tier compressed+file --against zswap --plot "$D/zswap-compressedfile-inthread.png" --json > zswap-compressedfile-inthread.json 2> zswap-compressedfile-inthread.err
echo "$(date +%T) rc=$?" >> log
# With ZRAM=1 also: compressed against zram, 3 runs a side.
if [ -n "$ZRAM" ]; then
  echo "$BIN bench $pm --repeat 3 --tier compressed --against zram" > zram-compressed-inthread.cmd
  "$BIN" bench $pm --repeat 3 --tier compressed --against zram --plot "$D/zram-compressed-inthread.png" --json > zram-compressed-inthread.json 2> zram-compressed-inthread.err
  echo "$(date +%T) zram rc=$?" >> log
fi
