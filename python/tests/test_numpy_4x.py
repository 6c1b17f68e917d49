"""An int64 array 4x the pool's budget: filled, summed, read at random (fancy indexing),
sorted in place, every result checked exactly; the process's peak RSS stays within the
budget + 64 MiB + the interpreter's own.

The work runs once, in a fresh interpreter (so that its VmHWM is its own), and reports
what it computed next to what it must be; each test asserts one part of that report.
"""

import pytest

pytestmark = pytest.mark.timeout(300)

from conftest import MiB, run_python

BUDGET = 64 * MiB
SIZE = 4 * BUDGET
SLACK = 64 * MiB

WORKLOAD = f"""
import json, numpy as np, uswap

def vm_hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

own = vm_hwm()                       # the interpreter with numpy and uswap loaded
out = {{"own_bytes": own}}
K = 0x9E3779B97F4A7C15               # odd: i -> i*K mod 2**64 is a permutation
CHUNK = 1 << 20                      # elements per step (8 MiB of plain memory)

def value(i):                        # i: uint64 array -> the int64 stored at i
    return (i * np.uint64(K)).view(np.int64)

with uswap.Pool({BUDGET}) as pool:
    a = uswap.zeros({SIZE} // 8, np.int64, pool=pool)
    n = a.size
    out["n"] = n
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    region = getattr(base, "obj", base)              # a memoryview of the region
    out["shares_region"] = (
        isinstance(region, uswap.Region) and region.address == a.ctypes.data
        and a.flags.writeable and a.flags.c_contiguous
    )

    # Fill (pages go out as the fill proceeds), then sum: int64 sums wrap mod 2**64.
    for lo in range(0, n, CHUNK):
        a[lo:lo + CHUNK] = value(np.arange(lo, min(lo + CHUNK, n), dtype=np.uint64))
    out["sum"] = int(a.sum(dtype=np.int64)) % 2**64
    out["sum_expected"] = K * (n * (n - 1) // 2) % 2**64

    # Random reads through fancy indexing, against the formula.
    rng = np.random.default_rng(7)
    idx = rng.integers(0, n, 40_000)
    got = a[idx]
    out["fancy_wrong"] = int(np.count_nonzero(got != value(idx.astype(np.uint64))))
    out["fancy_n"] = idx.size
    rows = rng.integers(0, n // 1024, 1000)
    m = a.reshape(-1, 1024)[rows, 3::97]          # 2-D fancy + strided slice
    cols = np.arange(3, 1024, 97, dtype=np.uint64)
    want = value(rows.astype(np.uint64)[:, None] * np.uint64(1024) + cols[None, :])
    out["fancy2d_wrong"] = int(np.count_nonzero(m != want))
    del got, idx, m, want

    # Sort in place. The array is COPIES shuffled copies of one random block B, so the
    # sorted array must be np.sort(B) with each element repeated COPIES times: that
    # reference sort is done in plain memory on B alone.
    COPIES = 32
    block = rng.integers(-2**63, 2**63 - 1, n // COPIES, dtype=np.int64)
    for c in range(COPIES):
        a[c * block.size:(c + 1) * block.size] = np.roll(block, c * 7919)
    a.sort()                                        # in place, in the region
    ref = np.sort(block)
    wrong = 0
    step = (CHUNK // COPIES) * COPIES
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        wrong += int(np.count_nonzero(a[lo:hi] != np.repeat(ref[lo // COPIES:hi // COPIES], COPIES)))
    out["sort_wrong"] = wrong
    c = pool.counters()
    out["counters"] = c
out["peak_bytes"] = vm_hwm()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    return run_python(WORKLOAD, timeout=280)


def test_array_is_the_region(report):
    assert report["n"] == SIZE // 8
    assert report["shares_region"], "the array's memory is not a writable 2 MiB-aligned region"


def test_fill_and_sum_4x_budget(report):
    assert report["sum"] == report["sum_expected"]
    c = report["counters"]
    # 4x the budget cannot fit: the data went to the swap file and came back.
    assert c["pswpout"] * 4096 >= SIZE - BUDGET, c
    assert c["pswpin"] > 0, c


def test_random_fancy_indexing_reads(report):
    assert report["fancy_n"] == 40_000
    assert report["fancy_wrong"] == 0
    assert report["fancy2d_wrong"] == 0


def test_sort_in_place_matches_plain_memory_sort(report):
    assert report["sort_wrong"] == 0


def test_peak_rss_within_budget(report):
    own, peak = report["own_bytes"], report["peak_bytes"]
    c = report["counters"]
    assert c["peak_used_bytes"] <= BUDGET, c
    assert peak <= own + BUDGET + SLACK, (
        f"peak RSS {peak / MiB:.0f} MiB > interpreter's own {own / MiB:.0f} MiB "
        f"+ budget {BUDGET / MiB:.0f} MiB + {SLACK / MiB:.0f} MiB"
    )
