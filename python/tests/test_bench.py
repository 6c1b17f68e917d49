"""python/bench/numpy_4x.py runs and verifies, on uswap memory and on plain memory."""

import json
import os
import sys

from conftest import MiB, run_process

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "numpy_4x.py")


def bench(*args, env=None):
    r = run_process([sys.executable, BENCH, "--passes", "1", "--json", *args], timeout=180, env=env)
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


def test_bench_takes_its_memory_and_budget_from_uswap_run_against():
    """`uswap run --against --direct` tells each side which it is and the budget."""
    for side, memory in [("kernel", "plain"), ("uswap", "uswap")]:
        env = dict(os.environ, USWAP_AGAINST_SIDE=side, USWAP_AGAINST_BUDGET=str(8 * MiB))
        out = bench(env=env)
        assert out["verified"] and out["memory"] == memory, out
        assert out["size"] == 32 * MiB, out  # 4x the budget from the environment
    # An explicit option wins.
    env = dict(os.environ, USWAP_AGAINST_SIDE="kernel", USWAP_AGAINST_BUDGET=str(8 * MiB))
    out = bench("--memory", "uswap", "--budget", "16M", env=env)
    assert out["memory"] == "uswap" and out["budget"] == 16 * MiB, out
