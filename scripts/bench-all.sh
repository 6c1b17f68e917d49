#!/usr/bin/env bash
# Runs the benchmarks behind docs/benchmarks.md in one sitting. Raw output (each run's
# stdout, stderr, JSON report, command line and plot) goes to $OUT, by default
# target/bench-data/<UTC date and time>/, never into git; the headline of every
# --against run then goes into docs/bench-results.csv (scripts/render-benchmarks.py
# collect), the only part kept. Needs root (cgroups, kernel swap for --against).
#
#   scripts/bench-all.sh                              # the results table: SECTIONS=results
#   python3 scripts/render-benchmarks.py table        # the table docs/benchmarks.md shows
#   SECTIONS="disk units" scripts/bench-all.sh        # other sections (list below)
#   python3 scripts/render-sitting.py target/bench-data/<sitting>   # their tables
#
# DRY_RUN=1 prints the commands without running them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench-data/$(date -u +%Y-%m-%dT%H%M)}
SIZE=${SIZE:-2G}
BUDGET=${BUDGET:-256M}
REPEAT=${REPEAT:-3}
DUR=${DUR:-10s}
ASIZE=${ASIZE:-512M}
ABUDGET=${ABUDGET:-128M}
CSV=${CSV:-docs/bench-results.csv}
log() { echo "[$(date +%T)] $*" >&2; }
U=./target/release/uswap
if [ -n "${DRY_RUN:-}" ]; then
  run() { shift; echo "$*"; }
  fio_run() { echo "fio $*"; }; fio_fresh() { echo "fio (fresh file) $*"; }; fio_rw2() { echo "fio (read + write) $*"; }
else
mkdir -p "$OUT"
cargo build --release -q --bin uswap || exit 1
# Who, where and what: scripts/render-benchmarks.py collect reads it.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo +dirty)"
  echo "machine: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB, Linux $(uname -r), swap files on $(df --output=source "${TMPDIR:-/tmp}" | tail -1) ($(df --output=fstype "${TMPDIR:-/tmp}" | tail -1))"
} > "$OUT/sitting.txt"
log "raw output in $OUT"
run() { # name, command...
  local name=$1; shift
  log "$name: $*"
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  tail -n 1 "$OUT/$name.out" > "$OUT/$name.json"
  echo "$* (rc=$rc)" > "$OUT/$name.cmd"
  [ -s "$OUT/$name.err" ] || rm -f "$OUT/$name.err"
  [ $rc = 0 ] || log "  FAILED rc=$rc (see $OUT/$name.err)"
}
fio_run() { # name, rw, bs, iodepth
  local f=${TMPDIR:-/var/tmp}/uswap-fio.$$
  log "fio $1"
  fio --name="$1" --filename="$f" --size=2G --rw="$2" --bs="$3" --iodepth="$4" \
      --ioengine=io_uring --direct=1 --runtime=15 --time_based --output-format=json > "$OUT/fio-$1.json" 2>/dev/null
  rm -f "$f"
}
fio_fresh() { # name: one pass of 2 MiB writes (QD4) over a fresh 4 GiB preallocated file,
  # which is what a new swap file is: ext4 converts each write's unwritten extents
  # when it completes, which the time-based runs above (overwriting) do not pay.
  local f=${TMPDIR:-/var/tmp}/uswap-fio-fresh.$$
  log "fio $1 (fresh preallocated file)"
  rm -f "$f"; fallocate -l 4G "$f"
  fio --name="$1" --filename="$f" --size=4G --rw=write --bs=2M --iodepth=4 \
      --ioengine=io_uring --direct=1 --output-format=json > "$OUT/fio-$1.json" 2>/dev/null
  rm -f "$f"
}
fio_rw2() { # name: a sequential reader and a sequential writer at once (2 MiB, QD4 each),
  # the shape of swap-w-seq's second pass
  local f=${TMPDIR:-/var/tmp}/uswap-fio-r.$$ g=${TMPDIR:-/var/tmp}/uswap-fio-w.$$
  log "fio $1"
  fio --name=prep --filename="$f" --size=2G --rw=write --bs=2M --direct=1 --ioengine=io_uring > /dev/null 2>&1
  fio --output-format=json --ioengine=io_uring --direct=1 --bs=2M --iodepth=4 --runtime=15 --time_based --size=2G \
      --name=read --filename="$f" --rw=read --name=write --filename="$g" --rw=write > "$OUT/fio-$1.json" 2>/dev/null
  rm -f "$f" "$g"
}
fi
SECTIONS=${SECTIONS:-results}
# results: docs/benchmarks.md's table. Every workload on every tier with no tuning flag,
# against the kernel's swap file, zswap and zram (those two at equal total memory: the
# harness adds the kernel's uncharged pool to uswap's budget), alternating, medians.
RSIZE=${RSIZE:-1G}
RBUDGET=${RBUDGET:-256M}
RWORKLOADS=${RWORKLOADS:-"pmbench swap-w-seq swap-w-rand seq-read combined"}
RTIERS=${RTIERS:-"file compressed compressed+file"}
RAGAINST=${RAGAINST:-"kernel zswap zram"}
for s in $SECTIONS; do
if [ -n "${DRY_RUN:-}" ]; then case $s in vm|remote|checksum) echo "# $s: runs its own tools, not shown in a dry run"; continue ;; esac; fi
case $s in
results)
  for w in $RWORKLOADS; do for t in $RTIERS; do for k in $RAGAINST; do
    run "results-$w-$t-$k" $U bench $w --size $RSIZE --budget $RBUDGET --tier $t --against $k --repeat $REPEAT --json --plot "$OUT/results-$w-$t-$k.svg"
  done; done; done
  ;;
disk)
  fio_run seqwrite write 2M 4
  fio_run seqread read 2M 4
  fio_run randread4k randread 4k 1
  fio_run seqmixed rw 2M 8   # 50/50 sequential reads and writes, as swap-w-seq's pass 2
  fio_rw2 seqrw2
  fio_fresh seqwrite-fresh
  ;;
vm)
  # First touch of a THP on this machine (fresh to the process, recycled, cleared).
  if cc -O2 -o /tmp/uswap-thp-first-touch scripts/thp-first-touch.c; then
    log "thp-first-touch"
    /tmp/uswap-thp-first-touch 1024 > "$OUT/thp-first-touch.jsonl"
  fi
  ;;
core)
  for w in swap-w-seq pmbench seq-read; do
    run "core-$w" $U bench $w --size $SIZE --budget $BUDGET --duration $DUR --json
    run "core-$w-memcg" $U bench $w --size $SIZE --budget $BUDGET --duration $DUR --json --cgroup-limit $(( $(numfmt --from=iec $BUDGET) + 64*1024*1024 ))
  done
  ;;
units)
  for u in 4k 2m auto; do
    run "units-swap-w-seq-$u" $U bench swap-w-seq --size $SIZE --budget $BUDGET --unit $u --json
    run "units-seq-read-$u" $U bench seq-read --size $SIZE --budget $BUDGET --unit $u --json
  done
  # Unit readahead off, for the comparison with the default (2 units ahead).
  run "units-swap-w-seq-2m-ra0" $U bench swap-w-seq --size $SIZE --budget $BUDGET --unit 2m --ra-units 0 --json
  run "units-seq-read-2m-ra0" $U bench seq-read --size $SIZE --budget $BUDGET --unit 2m --ra-units 0 --json
  ;;
readahead)
  for ra in vma cluster; do
    run "ra-combined-$ra" $U bench combined --size 1G --budget $BUDGET --unit 4k --readahead $ra --ra-stream off --threads 1 --bg-threads 1 --duration 20s --json
  done
  for ra in vma off; do
    run "ra-seq-read-$ra" $U bench seq-read --size 1G --budget $BUDGET --unit 4k --readahead $ra --ra-stream off --json
  done
  run "ra-seq-read-vma-stream" $U bench seq-read --size 1G --budget $BUDGET --unit 4k --readahead vma --ra-stream on --json
  ;;
against)
  # Kernel swap file and zram: every workload x {4k, 2m}; the kernel in SSD mode
  # (queue/rotational=0) on swap-w-seq.
  for u in 4k 2m; do for w in swap-w-seq swap-w-rand pmbench seq-read combined; do
    run "against-kernel-$u-$w" $U bench $w --size $ASIZE --budget $ABUDGET --unit $u --duration $DUR --against kernel --repeat $REPEAT --json --plot "$OUT/against-kernel-$u-$w.png"
  done; done
  for u in 4k 2m; do for w in swap-w-seq swap-w-rand pmbench seq-read combined; do
    run "against-zram-$u-$w" $U bench $w --size $ASIZE --budget $ABUDGET --unit $u --duration $DUR --against zram --repeat $REPEAT --json --plot "$OUT/against-zram-$u-$w.png"
  done; done
  for u in 4k 2m; do for w in swap-w-seq; do
    run "against-kernelssd-$u-$w" $U bench $w --size $ASIZE --budget $ABUDGET --unit $u --duration $DUR --against kernel --kernel-ssd --repeat $REPEAT --json --plot "$OUT/against-kernelssd-$u-$w.png"
  done; done
  ;;
headline)
  # Issue 3's target, with the disk measured right before and after: swap-w-seq and
  # seq-read with 2 MiB units, 5 runs each (medians), at 2 GiB and 4 GiB / 256 MiB.
  fio_run seqwrite-before write 2M 4
  fio_fresh seqwrite-fresh-before
  fio_run seqread-before read 2M 4
  for i in 1 2 3 4 5; do
    run "headline-swap-w-seq-2G-$i" $U bench swap-w-seq --size 2G --budget $BUDGET --unit 2m --json
    run "headline-seq-read-2G-$i" $U bench seq-read --size 2G --budget $BUDGET --unit 2m --json
  done
  for i in 1 2 3; do
    run "headline-swap-w-seq-4G-$i" $U bench swap-w-seq --size 4G --budget $BUDGET --unit 2m --json
    run "headline-seq-read-4G-$i" $U bench seq-read --size 4G --budget $BUDGET --unit 2m --json
  done
  fio_run seqwrite-after write 2M 4
  fio_fresh seqwrite-fresh-after
  fio_run seqread-after read 2M 4
  ;;
faultpath)
  # Issue 18. What one 4 KiB fault costs on each fault path, alternating, 3 runs each:
  # the handler thread (blocks in io_uring_enter), the handler polling its completion
  # queue for up to 50 us while a read is out, and the faulting thread itself (SIGBUS).
  for i in 1 2 3; do
    run "fl-handler-$i" $U bench fault-latency --size 512M --budget 128M --fault-mode handler --json
    run "fl-poll50-$i" $U bench fault-latency --size 512M --budget 128M --fault-mode handler --io-poll-us 50 --json
    run "fl-inthread-$i" $U bench fault-latency --size 512M --budget 128M --fault-mode in-thread --json
  done
  # Against the kernel's swap file, same disk, same memcg limit (FAULT_OPTS: the path).
  for sb in 2G:512M 1G:256M; do for t in 1 4; do
    run "fp-pmbench-${sb%%:*}-t$t" $U bench pmbench --size ${sb%%:*} --budget ${sb##*:} --threads $t --unit 4k --duration $DUR ${FAULT_OPTS:-} --against kernel --repeat $REPEAT --json --plot "$OUT/fp-pmbench-${sb%%:*}-t$t.png"
  done; done
  # The in-thread path against the kernel (its price: see docs/design.md).
  run "fp-pmbench-1G-t1-inthread" $U bench pmbench --size 1G --budget 256M --threads 1 --unit 4k --duration $DUR --fault-mode in-thread --against kernel --repeat $REPEAT --json --plot "$OUT/fp-pmbench-1G-t1-inthread.png"
  for w in seq-read swap-w-seq; do
    run "fp-$w-4k" $U bench $w --size 1G --budget 256M --unit 4k ${FAULT_OPTS:-} --against kernel --repeat $REPEAT --json --plot "$OUT/fp-$w-4k.png"
  done
  run "fp-swap-w-seq-2m" $U bench swap-w-seq --size 1G --budget 256M --unit 2m --against kernel --repeat $REPEAT --json --plot "$OUT/fp-swap-w-seq-2m.png"
  ;;
tiers)
  # Issue 12: the compressed tier against zswap and zram, mixed data, 1 GiB / 256 MiB.
  for t in file compressed+file; do
    run "tiers-pmbench-$t-zswap" $U bench pmbench --size 1G --budget 256M --unit 4k --duration $DUR --data mixed --tier $t --against zswap --repeat $REPEAT --json --plot "$OUT/tiers-pmbench-$t-zswap.png"
  done
  for t in compressed compressed+file; do
    run "tiers-pmbench-$t-zram" $U bench pmbench --size 1G --budget 256M --unit 4k --duration $DUR --data mixed --tier $t --against zram --repeat $REPEAT --json --plot "$OUT/tiers-pmbench-$t-zram.png"
  done
  # swap-w-seq 2m, file alone against compressed+file, alternating (bytes written: counters).
  for i in 1 2 3; do for t in file compressed+file; do
    run "tiers-swap-w-seq-2m-$t-$i" $U bench swap-w-seq --size 1G --budget 256M --unit 2m --data mixed --tier $t --json
  done; done
  ;;
remote)
  # Issue 14: a local Redis Cluster (3 primaries + 3 replicas on loopback).
  RDIR=$(mktemp -d /tmp/uswap-bench-redis.XXXXXX)
  if scripts/redis-cluster.sh start --dir "$RDIR/c" --base-port 22500 > "$OUT/remote-cluster.txt"; then
    NODES=$(sed 's|^|redis://|' "$RDIR/c/nodes" | paste -sd,)
    for i in 1 2 3; do
      run "remote-fl-$i" $U bench fault-latency --size 256M --budget 64M --tier remote --remote "$NODES" --json
      run "remote-swap-w-seq-2m-$i" $U bench swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote "$NODES" --json
      run "remote-pmbench-$i" $U bench pmbench --size 1G --budget 256M --unit 4k --duration $DUR --tier remote --remote "$NODES" --json
      run "file-fl-$i" $U bench fault-latency --size 256M --budget 64M --json
    done
  else
    log "  redis cluster did not start: remote section skipped"
  fi
  scripts/redis-cluster.sh stop --dir "$RDIR/c" > /dev/null 2>&1; rm -rf "$RDIR"
  ;;
checksum)
  # Issue 17: what a page checksum costs on this CPU (xxh3, used, against crc32c).
  log "hash-cost"
  cargo run --release -q --manifest-path scripts/hash-cost/Cargo.toml > "$OUT/hash-cost.txt" 2>&1
  ;;
integrity)
  # Issue 17: checksums (the default), none, and encryption at rest, alternating.
  for i in 1 2 3; do for enc in "" "--no-checksums" "--encrypt"; do
    case $enc in --encrypt) tag=-enc ;; --no-checksums) tag=-nocsum ;; *) tag=-plain ;; esac
    run "int-swap-w-seq-2m$tag-$i" $U bench swap-w-seq --size 1G --budget 256M --unit 2m $enc --json
    run "int-pmbench-4k$tag-$i" $U bench pmbench --size 1G --budget 256M --unit 4k --duration $DUR $enc --json
    run "int-seq-read-2m$tag-$i" $U bench seq-read --size 1G --budget 256M --unit 2m $enc --json
  done; done
  ;;
runtimes)
  # Issues 13 and 15: unmodified programs under kernel swap and under uswap, same memcg limit.
  if command -v node > /dev/null; then
    run "run-node-bufs" $U run --budget 256M --against kernel --repeat $REPEAT --json -- node crates/uswap-cli/tests/progs/bufs.js
  fi
  if [ -x target/py-venv/bin/python ]; then
    run "run-numpy-4x" $U run --budget 256M --against kernel --repeat $REPEAT --direct --json -- target/py-venv/bin/python python/bench/numpy_4x.py --budget 256M --json
  fi
  ;;
esac; done
if [ -z "${DRY_RUN:-}" ]; then
  # The headline of every --against run into the CSV (a run of the same key replaced).
  python3 scripts/render-benchmarks.py collect "$OUT" --csv "$CSV" || log "nothing collected into $CSV"
  log "done: raw output in $OUT"
fi
