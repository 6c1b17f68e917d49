"""Pool(tier=...): every tier pages a region four times its budget and gives back every
byte; the compressed tiers store compressible pages compressed (their counters say so)."""

import numpy as np
import pytest

from conftest import MiB, uswap


def page_data(n_pages, seed):
    """Pages that compress well but differ: each a run of small numbers with its index."""
    a = np.zeros((n_pages, 512), np.uint64)
    a[:] = np.arange(512, dtype=np.uint64) % 7
    a[:, 0] = np.arange(n_pages, dtype=np.uint64) * 1000003 + seed
    return a


@pytest.mark.parametrize("tier", ["file", "compressed", "compressed+file"])
def test_every_tier_is_exact_four_times_over_budget(tier):
    opts = {} if tier == "file" else {"compressor": "lz4", "compressed_max": 50}
    with uswap.Pool("32M", tier=tier, unit="4k", **opts) as pool:
        r = pool.region(128 * MiB)
        a = np.frombuffer(r, np.uint64).reshape(-1, 512)
        want = page_data(a.shape[0], 7)
        a[:] = want
        assert np.array_equal(a, want), f"{tier}: bytes changed"
        c = pool.counters()
        assert c["peak_used_bytes"] <= 32 * MiB, c
        if tier == "file":
            assert c["zswpout"] == 0 and c["pswpout"] > 0, c
        else:
            assert c["zswpout"] > 0 and c["zswpin"] > 0, c
        if tier == "compressed":
            assert c["pswpout"] == 0, f"compressed only wrote to a file: {c}"
        del a
        r.close()


def test_zstd_compressor_is_exact():
    with uswap.Pool("32M", tier="compressed+file", compressor="zstd:3", unit="4k") as pool:
        r = pool.region(96 * MiB)
        a = np.frombuffer(r, np.uint64).reshape(-1, 512)
        want = page_data(a.shape[0], 11)
        a[:] = want
        assert np.array_equal(a, want)
        assert pool.counters()["zswpout"] > 0
        del a
        r.close()
