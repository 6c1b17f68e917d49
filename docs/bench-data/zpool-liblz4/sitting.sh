#!/bin/bash
# The zpool-liblz4 sitting (docs/benchmarks.md, "The compressed tier decompresses with
# liblz4"): f465ebf (lz4_flex decodes) against the next commit (liblz4 decodes), alternating.
# The budget is what uswap had at equal total memory with zram in the warm-frames sitting
# (256 MiB + zram's 279 MiB).
#   OLD=path/to/uswap-f465ebf NEW=path/to/uswap-new OUT=dir sitting.sh
set -u
OUT=${OUT:-.}
run() { # name bin args...
    local name=$1 bin=$2; shift 2
    echo "$bin bench $* --json" > "$OUT/$name.cmd"
    "$bin" bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "$name rc=$?"
}
for i in 1 2 3; do
    order="old new"; [ $i = 2 ] && order="new old"
    for v in $order; do
        bin=$OLD; [ $v = new ] && bin=$NEW
        run "pm-$v-$i" "$bin" pmbench --size 1G --budget 535M --unit 4k --tier compressed --fault-mode in-thread --duration 5s
    done
done
