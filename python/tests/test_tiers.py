"""Pool(tier=...): every tier pages a region four times its budget and gives back every
byte; the compressed tiers store compressible pages compressed (their counters say so);
the remote tiers page to a local Redis Cluster (scripts/redis-cluster.sh, ports 22400+,
stopped even when a test fails)."""

import os
import shutil
import subprocess
import tempfile

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


@pytest.mark.parametrize("incompressible", ["store", "pass"])
def test_pages_that_do_not_compress_are_stored_or_passed_on(incompressible):
    """Every fourth page random: kept in the pool as it is (the default) while the pool
    has room, so nothing reaches the file; or passed straight on to the file. Exact
    either way."""
    with uswap.Pool("32M", tier="compressed+file", unit="4k", compressed_max=90,
                    incompressible=incompressible) as pool:
        r = pool.region(48 * MiB)
        a = np.frombuffer(r, np.uint64).reshape(-1, 512)
        want = page_data(a.shape[0], 5)
        rng = np.random.default_rng(5)
        want[::4] = rng.integers(0, 2**63, size=want[::4].shape, dtype=np.uint64)
        a[:] = want
        stored = pool.counters()["zswap_stored_incompressible_pages"]
        assert np.array_equal(a, want), f"{incompressible}: bytes changed"
        c = pool.counters()
        assert c["peak_used_bytes"] <= 32 * MiB, c
        if incompressible == "store":
            assert stored > 0 and c["pswpout"] == 0, (stored, c)
        else:
            assert stored == 0 and c["pswpout"] > 0, (stored, c)
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


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "redis-cluster.sh")


@pytest.fixture(scope="module")
def cluster():
    """A 3-primary, 3-replica Redis Cluster on loopback; yields its seed URLs."""
    top = tempfile.mkdtemp(prefix="uswap-py-tiers-")
    d = os.path.join(top, "cluster")  # the script makes it (and refuses one it did not)
    try:
        r = subprocess.run(
            [CLUSTER_SCRIPT, "start", "--dir", d, "--base-port", "22400"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (
            "cannot start a local Redis Cluster (the remote tiers' tests need one: "
            f"scripts/test.sh installs redis-server): {r.stderr}"
        )
        with open(os.path.join(d, "ports")) as f:
            ports = [int(line) for line in f if line.strip()]
        yield ",".join(f"redis://127.0.0.1:{p}" for p in ports)
    finally:
        subprocess.run(
            [CLUSTER_SCRIPT, "stop", "--dir", d], capture_output=True, timeout=120
        )
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("tier", ["remote", "compressed+remote"])
def test_remote_tiers_are_exact(cluster, tier):
    with uswap.Pool("32M", tier=tier, remote=cluster, unit="4k") as pool:
        r = pool.region(96 * MiB)
        a = np.frombuffer(r, np.uint64).reshape(-1, 512)
        want = page_data(a.shape[0], 13)
        a[:] = want
        assert np.array_equal(a, want), f"{tier}: bytes changed"
        c = pool.counters()
        assert c["remote_lost"] == 0 and c["poisoned"] == 0, c
        if tier == "compressed+remote":
            # These pages compress so well that they all fit in the pool (the CLI test
            # sends mixed data on to the cluster).
            assert c["zswpout"] > 0 and c["zswpin"] > 0, c
        else:
            assert c["remote_writes"] > 0 and c["remote_reads"] > 0, c
        del a
        r.close()
