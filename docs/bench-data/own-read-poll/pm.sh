# pm NAME ARGS...: pmbench-like rows, kernel (k) and uswap in-thread with --fill-memcg,
# sleeping (p0) or polling (p250) for its own read, in the rotating orders of $ORDERS
# (one round each); every side in a memcg of budget + 64 MiB. Sourced by sitting.sh and
# rerun-t1.sh, with $B the binary.
ORDERS=${ORDERS:-"k p0 p250|p250 k p0|p0 p250 k"}
pm() {
  local w=$1; shift; mkdir -p $w
  local i=0 order s
  IFS='|' read -ra rounds <<< "$ORDERS"
  for order in "${rounds[@]}"; do
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
