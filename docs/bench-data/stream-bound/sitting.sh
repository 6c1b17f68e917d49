#!/bin/bash
# Issue 12's stream target on 2 vCPUs: the file tier against compressed+file,
# swap-w-seq 2m, 1 GiB / 256 MiB, mixed data (3 alternating rounds), each tier's CPU
# per thread (perf sched timehist -s, one run each), and lz4's speed on the data.
# BIN=<build> OUT=dir bash sitting.sh   (from the repository root for the example)
BIN=${BIN:?the build}; D=${OUT:?where}; mkdir -p "$D"
w="swap-w-seq --size 1G --budget 256M --unit 2m"
for i in 1 2 3; do for t in file compressed+file; do
  "$BIN" bench $w --tier $t --json > "$D/$t-$i.json" 2> "$D/$t-$i.err"
done; done
for t in file compressed+file; do
  perf sched record -q -o "$D/sched.data" -- "$BIN" bench $w --tier $t --json > "$D/sched-$t.json" 2>/dev/null
  perf sched timehist -i "$D/sched.data" -s 2>/dev/null | sed -n '/Runtime summary/,$p' > "$D/sched-$t.txt"
  rm -f "$D/sched.data"
done
cargo run -q --release -p uswap-zpool --example lz4_speeds > "$D/lz4_speeds.txt" 2>&1
