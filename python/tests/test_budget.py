"""Pool.set_budget: a running pool's budget shrinks (it evicts down to it) and
grows back (it holds more again), the arrays' bytes exact throughout."""

import time

import numpy as np
import pytest

from conftest import MiB, uswap

CHUNK = 1 << 20  # elements checked at a time: no 256 MiB copy outside the pool


def held(pool):
    c = pool.counters()
    return c["resident_bytes"] + c["cached_bytes"] + c["metadata_bytes"]


def fill(a, seed):
    for i in range(0, a.size, CHUNK):
        n = min(CHUNK, a.size - i)
        a[i:i + n] = (np.arange(i, i + n, dtype=np.uint64) + seed) * np.uint64(0x9E3779B97F4A7C15)


def bad_elements(a, seed):
    bad = 0
    for i in range(0, a.size, CHUNK):
        n = min(CHUNK, a.size - i)
        want = (np.arange(i, i + n, dtype=np.uint64) + seed) * np.uint64(0x9E3779B97F4A7C15)
        bad += int(np.count_nonzero(a[i:i + n] != want))
    return bad


def test_set_budget_shrinks_and_grows_with_bytes_exact():
    with uswap.Pool("128M") as pool:
        a = uswap.zeros((256 * MiB // 8,), np.uint64, pool=pool)
        fill(a, 7)
        assert bad_elements(a, 7) == 0
        assert held(pool) > 64 * MiB

        pool.set_budget("32M")
        assert pool.budget == 32 * MiB
        assert pool.counters()["budget_bytes"] == 32 * MiB
        # The reclaim thread evicts down to it (a fault meanwhile waits for room).
        deadline = time.monotonic() + 5
        while held(pool) > 32 * MiB:
            assert time.monotonic() < deadline, f"still {held(pool)} bytes held after 5 s"
            time.sleep(0.01)
        assert bad_elements(a, 7) == 0
        assert held(pool) <= 32 * MiB
        assert pool.counters()["budget_limit_bytes"] == 32 * MiB

        pool.set_budget(128 * MiB)
        assert pool.budget == 128 * MiB
        assert bad_elements(a, 7) == 0
        assert held(pool) > 64 * MiB, "grown back, it holds more than the small budget"

        for bad in ("1G", "4M"):
            with pytest.raises(uswap.InvalidSizeError, match="may go from 8.0 MiB to 128.0 MiB"):
                pool.set_budget(bad)
        assert pool.budget == 128 * MiB
        del a


def test_set_budget_on_a_closed_pool_raises():
    pool = uswap.Pool("32M")
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.set_budget("16M")
