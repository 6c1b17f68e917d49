"""fork: a child made by os.fork() or multiprocessing's "fork" start method gets its
own copy-on-write copy of every region (swapped-out pages included) and working pools;
parent and child each see only their own writes (docs/python.md)."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(200)

from conftest import MiB, uswap

BUDGET = 32 * MiB
N = 4 * BUDGET // 8  # int64 elements: 4x the budget
CHUNK = 1 << 20


def pattern(lo, hi, seed):
    return np.arange(lo, hi, dtype=np.int64) * 7 + seed


def fill(a, lo, hi, seed):
    for s in range(lo, hi, CHUNK):
        a[s:min(s + CHUNK, hi)] = pattern(s, min(s + CHUNK, hi), seed)


def first_bad(a, lo, hi, seed):
    for s in range(lo, hi, CHUNK):
        e = min(s + CHUNK, hi)
        bad = np.flatnonzero(a[s:e] != pattern(s, e, seed))
        if bad.size:
            return s + int(bad[0])
    return None


def threads_of(pid):
    """Each thread's name, state and wait channel, for the report of a hung child."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        t = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{t}/comm") as c, open(f"{t}/stat") as st, open(f"{t}/wchan") as w:
                out.append(f"{c.read().strip()} {st.read().rsplit(')', 1)[1].split()[0]} {w.read()}")
        except OSError:
            pass
    return "; ".join(out)


def wait_child(pid, deadline_s):
    """waitpid with a deadline (below the test's timeout, so that the child never
    outlives the test): past it the child is killed and the test fails."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    threads = threads_of(pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child still running after {deadline_s} s (hung?); killed. "
                f"Its threads (name, state, wait channel): {threads}")


def test_os_fork_parent_and_child_see_their_own_copy():
    with uswap.Pool(BUDGET) as pool:
        a = uswap.zeros(N, np.int64, pool=pool)
        half = N // 2
        fill(a, 0, N, 1)
        assert pool.counters()["pswpout"] > 0  # much of it is in the swap file at fork
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report through the pipe, never return into pytest
            code = 1
            try:
                os.close(r)
                msgs = []
                if (i := first_bad(a, 0, N, 1)) is not None:
                    msgs.append(f"child: pre-fork data wrong at {i}")
                fill(a, 0, half, 2)
                if (i := first_bad(a, 0, half, 2)) is not None:
                    msgs.append(f"child: own writes wrong at {i}")
                if (i := first_bad(a, half, N, 1)) is not None:
                    msgs.append(f"child: untouched half wrong at {i}")
                # The child's pool works: a new region, 4x the budget, of its own.
                b = uswap.zeros(N, np.int64, pool=pool)
                fill(b, 0, N, 3)
                if (i := first_bad(b, 0, N, 3)) is not None:
                    msgs.append(f"child: new region wrong at {i}")
                os.write(w, ("\n".join(msgs) or "ok").encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        # The parent writes the other half meanwhile and must not see the child's writes.
        fill(a, half, N, 4)
        code = wait_child(pid, 90)
        with os.fdopen(r) as f:
            child_says = f.read()
        assert code == 0 and child_says == "ok", (code, child_says)
        assert first_bad(a, 0, half, 1) is None, "parent sees the child's writes"
        assert first_bad(a, half, N, 4) is None, "parent's own writes wrong"
        b = uswap.zeros(N // 4, np.int64, pool=pool)  # the parent's pool goes on too
        fill(b, 0, b.size, 5)
        assert first_bad(b, 0, b.size, 5) is None


# multiprocessing ("fork"): the workers inherit SHARED, set before the pool starts.
SHARED = None


def chunk_sum_then_scribble(k):
    """Worker: the sum of chunk k of the inherited array, then overwrite the chunk (the
    parent must not see it) and check the write."""
    lo, hi = k * CHUNK, (k + 1) * CHUNK
    s = int(SHARED[lo:hi].sum())
    SHARED[lo:hi] = -1
    assert (SHARED[lo:hi] == -1).all()
    return k, s, os.getpid()


def test_multiprocessing_fork_workers():
    global SHARED
    ctx = multiprocessing.get_context("fork")
    with uswap.Pool(BUDGET) as pool:
        SHARED = uswap.zeros(N, np.int64, pool=pool)
        fill(SHARED, 0, N, 9)
        with ctx.Pool(2) as workers:
            res = workers.map_async(chunk_sum_then_scribble, range(N // CHUNK)).get(timeout=90)
        pids = {pid for _, _, pid in res}
        assert os.getpid() not in pids
        for k, s, _ in res:
            assert s == int(pattern(k * CHUNK, (k + 1) * CHUNK, 9).sum()), f"chunk {k}"
        assert first_bad(SHARED, 0, N, 9) is None, "a worker's write reached the parent"
        SHARED = None
