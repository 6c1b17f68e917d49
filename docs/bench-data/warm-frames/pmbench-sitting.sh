#!/usr/bin/env bash
# The pmbench part of the warm-frames sitting (docs/benchmarks.md): each fault mode with
# warm frames (default) and without (USWAP_WARM_FRAMES=0), against the kernel's swap file.
cd "$(dirname "$0")"
U=../../../target/release/uswap
for m in handler in-thread; do
  for w in default 0; do
    n=pmbench-4k-$m-warm$w
    args="pmbench --size 1G --budget 256M --unit 4k --fault-mode $m --against kernel --repeat 3 --duration 5s --json --plot $n.png"
    if [ $w = 0 ]; then pre="USWAP_WARM_FRAMES=0 "; else pre=""; fi
    printf '%suswap bench %s\n%s\n' "$pre" "$args" "$(date -u +%FT%TZ)" > $n.cmd
    if [ $w = 0 ]; then USWAP_WARM_FRAMES=0 $U bench $args > $n.json 2> $n.err; else $U bench $args > $n.json 2> $n.err; fi
    echo "$n rc=$?"
  done
done
