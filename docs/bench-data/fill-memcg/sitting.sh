#!/bin/bash
# sitting: the kernel's swap file, uswap with a fixed budget, uswap filling the memcg
# (--fill-memcg), alternating, 3 rounds each; every side in a memcg of budget + 64 MiB.
B=${USWAP_BIN:-/tmp/uswap-fill}
D=${OUT:-/tmp/fill-sitting}; mkdir -p $D; cd $D
run() { # name args...
  local w=$1; shift; mkdir -p $w
  local i=0
  for order in "k fixed fill" "k fill fixed" "k fixed fill"; do
    i=$((i+1))
    for s in $order; do
      case $s in
        k) USWAP_BENCH_SIDES=kernel $B bench "$@" --against kernel --json > $w/k-$i.json 2> $w/k-$i.err ;;
        fixed) USWAP_BENCH_SIDES=uswap $B bench "$@" $EXTRA --against kernel --json > $w/fixed-$i.json 2> $w/fixed-$i.err ;;
        fill) USWAP_BENCH_SIDES=uswap $B bench "$@" $EXTRA --fill-memcg --against kernel --json > $w/fill-$i.json 2> $w/fill-$i.err ;;
      esac
      echo "$w $i $s rc=$?" >> log
    done
  done
}
EXTRA="--fault-mode in-thread" run pmbench-1G-t1-in-thread pmbench --size 1G --budget 256M --unit 4k --duration 5s
EXTRA="" run pmbench-1G-t1-handler pmbench --size 1G --budget 256M --unit 4k --duration 5s
EXTRA="--fault-mode in-thread" run pmbench-1G-t4-in-thread pmbench --size 1G --budget 256M --unit 4k --duration 5s --threads 4
EXTRA="--fault-mode in-thread" run pmbench-2G-t1-in-thread pmbench --size 2G --budget 512M --unit 4k --duration 5s
EXTRA="--fault-mode in-thread" run pmbench-2G-t4-in-thread pmbench --size 2G --budget 512M --unit 4k --duration 5s --threads 4
echo done >> log
