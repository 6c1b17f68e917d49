#!/usr/bin/env bash
# Issue 14's bound, shown: what a 4 KiB remote fault costs when the cluster and the
# program share one vCPU (no cross-vCPU wake-up in a round trip) against the default
# placement. Starts a local cluster (scripts/redis-cluster.sh), then per round: the
# cluster's own 4 KiB GET p50 (redis-benchmark --cluster) and
# `uswap bench fault-latency --tier remote --fault-mode in-thread`, unpinned and pinned
# to CPU 1 (servers with taskset -p, the bench with taskset -c), alternating. Stops the
# cluster and puts every server back on all CPUs, also on failure.
#
#   sudo scripts/probes/remote-one-vcpu.sh [OUT_DIR] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/remote-one-vcpu}; rounds=${2:-3}
uswap=${USWAP_BIN:-$here/target/release/uswap}
dir=$(mktemp -d /tmp/rc-one-vcpu.XXXXXX)
mkdir -p "$out"
cleanup() { "$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
first=$(head -1 "$dir/nodes"); host=${first%:*}; port=${first##*:}
all_cpus=$(taskset -pc $$ | sed 's/.*: //')
pin() { for p in $(cat "$dir"/c/redis-*.pid); do taskset -pc "$1" "$p" >/dev/null; done; }
remotes=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
for r in $(seq "$rounds"); do
  for mode in spread one; do
    if [ $mode = one ]; then pin 1; run="taskset -c 1"; else pin "$all_cpus"; run=""; fi
    redis-benchmark --cluster -h "$host" -p "$port" -c 1 -n 20000 -d 4096 -t get -q --precision 1 \
      > "$out/get-$mode-$r.txt" 2>&1 || true
    $run "$uswap" bench fault-latency --size 256M --budget 64M --tier remote --remote "$remotes" \
      --fault-mode in-thread --json > "$out/fl-$mode-$r.json" 2> "$out/fl-$mode-$r.err"
    echo "round $r $mode: $(tail -1 "$out/get-$mode-$r.txt" | tr -d '\r' | tail -c 120)"
  done
done
pin "$all_cpus"
