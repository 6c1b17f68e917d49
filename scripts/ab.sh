#!/usr/bin/env bash
# A/B of two uswap builds on one workload, runs alternating (A B A B ...) so that both
# see the same disk and memory state; one line per run. The engine changes of
# 2026-11-21 18:00-19:10 were measured with it (docs/design.md, docs/benchmarks.md):
#
#   git worktree add /tmp/base <old commit>
#   (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base/target cargo build --release)
#   cargo build --release
#   scripts/ab.sh /tmp/base/target/release/uswap ./target/release/uswap 3 \
#       swap-w-seq --size 2G --budget 256M --unit 2m
#   PAUSE=4 scripts/ab.sh ...   # 4 s before each run: the host takes freed memory back
#                               # (free page reporting), so each run's first touch is fresh
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: [PAUSE=s] $0 USWAP_A USWAP_B RUNS WORKLOAD [bench options...]" >&2
  exit 2
fi
a=$1 b=$2 n=$3; shift 3
for i in $(seq 1 "$n"); do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    [ -n "${PAUSE:-}" ] && sleep "$PAUSE"
    "$bin" bench "$@" --json 2>/dev/null | tail -n 1 | python3 -c '
import json, sys
j = json.load(sys.stdin)
c = j["counters_measured"]
v = j["throughput_MBps"] or j["accesses_per_s"] or 0
print(sys.argv[1], f"{v:,.0f}", "phases", [round(p["seconds"], 2) for p in j["phases"]],
      "ra_hit%", round(j["ra_hit_pct"] or 0, 1), "direct_reclaim", c.get("direct_reclaim"),
      "thp_swpin_fallback", c.get("thp_swpin_fallback"), "thp_fault_spare", c.get("thp_fault_spare"),
      "verify", j["verify"])' "$side" || echo "$side FAILED"
  done
done
