"""python/bench/numpy_4x.py runs and verifies, on uswap memory and on plain memory."""

import json
import os
import sys

from conftest import MiB, run_process

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "numpy_4x.py")


def bench(*args):
    r = run_process([sys.executable, BENCH, "--passes", "1", "--json", *args], timeout=180)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_bench_on_uswap_memory():
    out = bench("--memory", "uswap", "--budget", "32M")
    assert out["verified"] and out["size"] == 128 * MiB
    assert set(out["phases"]) == {"fill", "sum", "random1", "verify"}
    assert all(p["verified"] and p["MBps"] > 0 for p in out["phases"].values())
    assert out["counters"]["pswpout"] * 4096 >= 96 * MiB  # it really was 4x the budget


def test_bench_on_plain_memory():
    out = bench("--memory", "plain", "--size", "16M")
    assert out["verified"] and out["counters"] is None and out["size"] == 16 * MiB
