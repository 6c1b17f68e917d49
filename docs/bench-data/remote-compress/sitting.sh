#!/bin/bash
# The remote-compress sitting (docs/benchmarks.md, "Compressed values and units read ahead
# kept"): the build before (9a7204f) against the build after (3f76b79), and the build after
# with USWAP_REMOTE_COMPRESS=off, alternating, rotating which goes first.
#   BASE=path/to/uswap-9a7204f NEW=path/to/uswap-3f76b79 OUT=dir sitting.sh
# Needs the local cluster: scripts/redis-cluster.sh start --dir /tmp/rc --base-port 22500
set -u
OUT=${OUT:-.}
R="--tier remote --remote redis://127.0.0.1:22500"
run() { # name workload args... ; env from $ENV
    local name=$1; shift
    local bin=$BASE; case $name in *-new-*|*-newoff-*) bin=$NEW;; esac
    echo "$ENVV $bin bench $* --json" > "$OUT/$name.cmd"
    env $ENVV "$bin" bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "$name rc=$?"
}
for i in 1 2 3; do
    order="base new newoff"; [ $i = 2 ] && order="new newoff base"; [ $i = 3 ] && order="newoff base new"
    for v in $order; do
        ENVV=""; [ $v = newoff ] && ENVV="USWAP_REMOTE_COMPRESS=off"
        run "sw-remote-$v-$i" swap-w-seq --size 1G --budget 256M --unit 2m $R
    done
done
for i in 1 2 3; do
    order="base new"; [ $i = 2 ] && order="new base"
    for v in $order; do
        ENVV=""
        run "sw-file-$v-$i" swap-w-seq --size 1G --budget 256M --unit 2m
        run "fl-remote-$v-$i" fault-latency --size 256M --budget 64M --fault-mode in-thread $R
        run "pm-remote-$v-$i" pmbench --size 1G --budget 256M --unit 4k --duration 5s $R
    done
done
