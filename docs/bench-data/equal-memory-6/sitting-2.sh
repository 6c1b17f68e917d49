#!/bin/bash
# The zswap row of sitting.sh again, 5 alternating rounds, nothing else running.
# BIN=binary OUT=dir bash sitting-2.sh
BIN=${BIN:?the build}
D=${OUT:-/tmp/equal-memory-6b}; mkdir -p "$D"; cd "$D"
pm="pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s"
echo "$BIN bench $pm --repeat 5 --tier compressed+file --against zswap" > zswap-compressedfile-inthread.cmd
"$BIN" bench $pm --repeat 5 --tier compressed+file --against zswap --plot "$D/zswap-compressedfile-inthread.png" --json > zswap-compressedfile-inthread.json 2> zswap-compressedfile-inthread.err
echo "$(date +%T) rc=$?" >> log
