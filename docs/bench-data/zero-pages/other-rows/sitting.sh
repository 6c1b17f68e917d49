#!/bin/bash
# issue 18's other pmbench rows: kernel and uswap (da76ace/84c01d1) alternating, 3 rounds
D=/tmp/zs6; mkdir -p $D; cd $D
run() {
  local w=$1; shift; mkdir -p $w
  local i=0
  for order in "k new" "new k" "k new"; do
    i=$((i+1))
    for s in $order; do
      case $s in
        k) USWAP_BENCH_SIDES=kernel /tmp/uswap-new4 bench "$@" --against kernel --json > $w/k-$i.json 2> $w/k-$i.err ;;
        new) USWAP_BENCH_SIDES=uswap /tmp/uswap-new4 bench "$@" --fault-mode in-thread --against kernel --json > $w/new-$i.json 2> $w/new-$i.err ;;
      esac
      echo "$w $i $s rc=$?" >> log
    done
  done
}
run pmbench-1G-t4 pmbench --size 1G --budget 256M --unit 4k --duration 5s --threads 4
run pmbench-2G-t1 pmbench --size 2G --budget 512M --unit 4k --duration 5s
run pmbench-2G-t4 pmbench --size 2G --budget 512M --unit 4k --duration 5s --threads 4
echo done >> log
