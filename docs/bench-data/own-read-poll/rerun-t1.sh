#!/bin/bash
scripts=$(cd "$(dirname "$0")" && pwd)
# The two 1-thread rows again, 5 rounds (the noisiest rows of sitting.sh), same sides.
B=${USWAP_BIN:-/tmp/uswap-poll2}
D=${OUT:-/tmp/poll-rerun}; mkdir -p $D; cd $D
ORDERS="k p0 p250|p250 k p0|p0 p250 k|k p250 p0|p250 p0 k"
. "$scripts/pm.sh"
pm pmbench-1G-t1 pmbench --size 1G --budget 256M --unit 4k --duration 5s
pm pmbench-2G-t1 pmbench --size 2G --budget 512M --unit 4k --duration 5s
echo "$(date +%T) done" >> log
