#!/usr/bin/env python3
"""A NumPy workload 4x its memory budget, on uswap memory or on plain NumPy memory.

    python python/bench/numpy_4x.py [--memory uswap|plain] [--budget SIZE] [--size SIZE]
                                    [--passes N] [--unit 4k|2m|auto] [--swap-file PATH]
                                    [--seed N] [--json]

One int64 array of --size bytes (default: 4x --budget; --budget default 256M):
  fill     write every element, in order, with a hash of its index;
  sum      read every element (a.sum()), against the closed form;
  random   --passes passes (default 3), each reading a random quarter of the array's
           4 KiB rows (fancy indexing), checking them and adding 1 to them;
  verify   read every element, in order, against the hash plus what `random` added.
Each phase prints its time and MB/s (10^6 bytes of array read or written per second);
the exit status is 1 if any check failed. --json adds one JSON object as the last line
(phases, verified, peak RSS = VmHWM, uswap's counters).

--memory uswap (default): the array is uswap.zeros(..., pool=uswap.Pool(budget)): at
most --budget of it is resident. --memory plain: np.zeros, for the same program under
kernel swap in a memory cgroup of the same limit, e.g. (as root, with swap on):

    python python/bench/numpy_4x.py --memory uswap --budget 512M --json
    systemd-run --scope -p MemoryMax=576M -p MemorySwapMax=infinity \\
        python python/bench/numpy_4x.py --memory plain --size 2G --json

(the uswap run's peak RSS is budget + the interpreter's own, about 40 MiB with NumPy).
Or both at once, timed under the same limit (as root; docs/run.md):

    uswap run --against kernel --budget 512M --direct --json -- \\
        python python/bench/numpy_4x.py --size 2G

where USWAP_AGAINST_SIDE (kernel|uswap) sets the default --memory (plain|uswap) and
USWAP_AGAINST_BUDGET the default --budget.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

K = 0x9E3779B97F4A7C15  # odd: i -> i*K mod 2**64 is a permutation, no pattern to compress
CHUNK = 1 << 18  # elements per step (2 MiB): the temporaries stay a few MiB
ROW = 512  # elements per random row: 4 KiB


def value(i):
    """The int64 stored at each index of the uint64 array i (before the random passes)."""
    return (i * np.uint64(K)).view(np.int64)


def parse_size(text):
    units = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    num = t.rstrip("kmgt")
    try:
        return int(float(num) * (1 << units[t[len(num):]]))
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 256M, 2G)") from None


def vm_hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Under `uswap run --against ... --direct`, the side says which memory to use and the
    # budget is the comparison's.
    side = os.environ.get("USWAP_AGAINST_SIDE")
    p.add_argument("--memory", choices=["uswap", "plain"],
                   default={"kernel": "plain", "uswap": "uswap"}.get(side, "uswap"))
    p.add_argument("--budget", type=parse_size,
                   default=parse_size(os.environ.get("USWAP_AGAINST_BUDGET") or "256M"))
    p.add_argument("--size", type=parse_size, help="array bytes [default: 4x --budget]")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--unit", choices=["4k", "2m", "auto"], default="auto")
    p.add_argument("--swap-file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    size = args.size or 4 * args.budget
    n = size // 8 // ROW * ROW
    own_rss = vm_hwm()

    pool = None
    if args.memory == "uswap":
        import uswap

        pool = uswap.Pool(args.budget, swap_file=args.swap_file, unit=args.unit)
        a = uswap.zeros(n, np.int64, pool=pool)
    else:
        a = np.zeros(n, np.int64)
    rows = a.reshape(-1, ROW)
    added = np.zeros(rows.shape[0], np.int64)  # what the random passes added to each row
    rng = np.random.default_rng(args.seed)
    phases, ok = {}, True

    def phase(name, nbytes, fn):
        nonlocal ok
        t = time.perf_counter()
        good = fn()
        dt = time.perf_counter() - t
        ok = ok and good
        phases[name] = {"seconds": round(dt, 3), "bytes": nbytes, "MBps": round(nbytes / dt / 1e6, 1),
                        "verified": bool(good)}
        print(f"{name:<8} {nbytes / 2**20:10.1f} MiB {dt:8.2f} s {nbytes / dt / 1e6:9.1f} MB/s"
              f"  {'ok' if good else 'WRONG'}", flush=True)

    def fill():
        for lo in range(0, n, CHUNK):
            a[lo:lo + CHUNK] = value(np.arange(lo, min(lo + CHUNK, n), dtype=np.uint64))
        return True

    def total():
        return int(a.sum()) % 2**64 == K * (n * (n - 1) // 2) % 2**64

    def random_pass():
        pick = rng.permutation(rows.shape[0])[: rows.shape[0] // 4]
        good = True
        for b in range(0, pick.size, CHUNK // ROW):  # 2 MiB of rows at a time
            some = pick[b:b + CHUNK // ROW]
            got = rows[some]  # gather: random 4 KiB reads
            idx = some.astype(np.uint64)[:, None] * np.uint64(ROW) + np.arange(ROW, dtype=np.uint64)
            good = good and np.array_equal(got, value(idx) + added[some][:, None])
            rows[some] = got + 1  # scatter: random 4 KiB writes
            added[some] += 1
        return good

    def verify():
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            want = value(np.arange(lo, hi, dtype=np.uint64)) + np.repeat(added[lo // ROW:hi // ROW], ROW)
            if not np.array_equal(a[lo:hi], want):
                return False
        return True

    print(f"numpy_4x: {n * 8 / 2**20:.0f} MiB int64 array on {args.memory} memory"
          + (f", budget {args.budget / 2**20:.0f} MiB, unit {args.unit}" if pool else ""), flush=True)
    phase("fill", n * 8, fill)
    phase("sum", n * 8, total)
    for i in range(args.passes):
        phase(f"random{i + 1}", 2 * (rows.shape[0] // 4) * ROW * 8, random_pass)
    phase("verify", n * 8, verify)
    peak = vm_hwm()
    print(f"peak RSS {peak / 2**20:.0f} MiB (interpreter before the array: {own_rss / 2**20:.0f} MiB); "
          f"{'verified' if ok else 'VERIFICATION FAILED'}")
    if args.json:
        out = {"workload": "numpy_4x", "memory": args.memory, "size": n * 8,
               "budget": args.budget if pool else None, "unit": args.unit if pool else None,
               "passes": args.passes, "phases": phases, "verified": ok,
               "peak_rss_bytes": peak, "own_rss_bytes": own_rss,
               "counters": pool.counters() if pool else None}
        print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
