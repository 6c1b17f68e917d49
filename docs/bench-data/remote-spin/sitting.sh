#!/usr/bin/env bash
# Remote tier, in-thread faults: a blocking read that sleeps in poll at once
# (USWAP_REMOTE_SPIN_US=0) against one that polls its socket for up to 100 µs first
# (a trial build, not kept: docs/benchmarks.md; the kept build ignores the variable),
# alternating, three runs each, on the local cluster
# (scripts/redis-cluster.sh start --dir /tmp/rc --base-port 22500: 3 primaries,
# 3 replicas on loopback).
cd "$(dirname "$0")"
U=../../../target/release/uswap
args="fault-latency --size 256M --budget 64M --tier remote --remote redis://127.0.0.1:22500 --fault-mode in-thread --json"
for k in 1 2 3; do
  for sp in 0 100; do
    n=fl-remote-spin$sp-$k
    printf 'USWAP_REMOTE_SPIN_US=%s uswap bench %s\n%s\n' "$sp" "$args" "$(date -u +%FT%TZ)" > $n.cmd
    USWAP_REMOTE_SPIN_US=$sp $U bench $args > $n.json 2> $n.err
    echo "$n rc=$?"
  done
done
