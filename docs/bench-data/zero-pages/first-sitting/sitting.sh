#!/bin/bash
# zero-page sitting: kernel, old, new alternating; pmbench 1G/256M 4k in-thread 5s
cd /tmp/zs
A="bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --against kernel --json"
i=0
for order in "k old new" "k new old" "k old new"; do
  i=$((i+1))
  for s in $order; do
    case $s in
      k) USWAP_BENCH_SIDES=kernel /tmp/uswap-new $A > k-$i.json 2> k-$i.err ;;
      old) USWAP_BENCH_SIDES=uswap /tmp/uswap-old $A --fault-mode in-thread > old-$i.json 2> old-$i.err ;;
      new) USWAP_BENCH_SIDES=uswap /tmp/uswap-new $A --fault-mode in-thread > new-$i.json 2> new-$i.err ;;
    esac
    echo "$i $s rc=$?" >> log
  done
done
echo done >> log
