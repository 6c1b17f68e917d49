#!/bin/bash
# The packed-writeback sitting (docs/benchmarks.md, "Units written back packed"): one
# build; swap-w-seq --unit 2m, 1 GiB / 256 MiB, mixed data: the file tier, the
# compressed+file tier writing units back decompressed (USWAP_PACKED_WRITEBACK=off, as
# before), and packed (the default); alternating, 3 rounds.
#   BIN=path/to/uswap OUT=dir sitting.sh
set -u
OUT=${OUT:-.}
run() { # name env args...
    local name=$1 envs=$2; shift 2
    echo "$envs $BIN bench $* --json" > "$OUT/$name.cmd"
    env $envs "$BIN" bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "$name rc=$?"
}
args="swap-w-seq --size 1G --budget 256M --unit 2m"
for i in 1 2 3; do
    order="file unpacked packed"
    [ $i = 2 ] && order="packed file unpacked"
    [ $i = 3 ] && order="unpacked packed file"
    for v in $order; do
        case $v in
            file) run "$v-$i" "" $args --tier file ;;
            unpacked) run "$v-$i" "USWAP_PACKED_WRITEBACK=off" $args --tier compressed+file ;;
            packed) run "$v-$i" "" $args --tier compressed+file ;;
        esac
    done
done
