#!/bin/bash
# sitting: kernel, old (2597108), new (zero pages + streams) alternating, 3 rounds each
D=/tmp/zs5; mkdir -p $D; cd $D
run() { # name args...
  local w=$1; shift; mkdir -p $w
  local i=0
  for order in "k old new" "k new old" "k old new"; do
    i=$((i+1))
    for s in $order; do
      case $s in
        k) USWAP_BENCH_SIDES=kernel /tmp/uswap-new4 bench "$@" --against kernel --json > $w/k-$i.json 2> $w/k-$i.err ;;
        old) USWAP_BENCH_SIDES=uswap /tmp/uswap-old bench "$@" $EXTRA --against kernel --json > $w/old-$i.json 2> $w/old-$i.err ;;
        new) USWAP_BENCH_SIDES=uswap /tmp/uswap-new4 bench "$@" $EXTRA --against kernel --json > $w/new-$i.json 2> $w/new-$i.err ;;
      esac
      echo "$w $i $s rc=$?" >> log
    done
  done
}
EXTRA="--fault-mode in-thread" run pmbench-in-thread pmbench --size 1G --budget 256M --unit 4k --duration 5s
EXTRA="" run pmbench-handler pmbench --size 1G --budget 256M --unit 4k --duration 5s
EXTRA="" run seq-read seq-read --size 1G --budget 256M --unit 4k
EXTRA="" run swap-w-seq swap-w-seq --size 1G --budget 256M --unit 4k
EXTRA="" run swap-w-seq-2m swap-w-seq --size 1G --budget 256M --unit 2m
echo done >> log
