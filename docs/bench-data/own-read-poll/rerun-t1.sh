#!/bin/bash
# The two 1-thread rows again, 5 rounds (the noisiest rows of sitting.sh), same sides.
B=${USWAP_BIN:-/tmp/uswap-poll2}
D=${OUT:-/tmp/poll-rerun}; mkdir -p $D; cd $D
pm() { # name args...
  local w=$1; shift; mkdir -p $w
  local i=0
  for order in "k p0 p250" "p250 k p0" "p0 p250 k" "k p250 p0" "p250 p0 k"; do
    i=$((i+1))
    for s in $order; do
      case $s in
        k) USWAP_BENCH_SIDES=kernel $B bench "$@" --against kernel --json > $w/k-$i.json 2> $w/k-$i.err ;;
        p*) USWAP_BENCH_SIDES=uswap $B bench "$@" --fault-mode in-thread --own-read-poll-us ${s#p} --fill-memcg --against kernel --json > $w/$s-$i.json 2> $w/$s-$i.err ;;
      esac
      echo "$(date +%T) $w $i $s rc=$?" >> log
    done
  done
}
pm pmbench-1G-t1 pmbench --size 1G --budget 256M --unit 4k --duration 5s
pm pmbench-2G-t1 pmbench --size 2G --budget 512M --unit 4k --duration 5s
echo "$(date +%T) done" >> log
