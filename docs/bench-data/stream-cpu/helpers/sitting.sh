#!/bin/bash
# Compress helper threads (../compress-threads.patch applied to 6ffddc3; not landed):
# swap-w-seq 2m, compressed+file with --compress-threads 0 and 1, alternating, beside
# the file tier; then at 512 MiB / 256 MiB (the pool holds it all: no writeback).
# BIN=binary with the patch
BIN=${BIN:?the build}
for r in 1 2 3; do for c in 0 1 file; do
  if [ $c = file ]; then a="--tier file"; else a="--tier compressed+file --compress-threads $c"; fi
  "$BIN" bench swap-w-seq --size 1G --budget 256M --unit 2m $a --json > r$r-$c.json
done; done
for r in 1 2 3 4 5; do for c in 0 1; do
  "$BIN" bench swap-w-seq --size 512M --budget 256M --unit 2m --tier compressed+file --compress-threads $c --json > s$r-$c.json
done; done
