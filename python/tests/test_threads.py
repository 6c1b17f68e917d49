"""Many Python threads on one region-backed array, 4x the budget: NumPy releases the
GIL in its loops, so their page faults are served concurrently. Every value checked."""

import threading

import numpy as np

from conftest import MiB, uswap

THREADS = 4


def run_threads(target, n=THREADS):
    errors = []

    def wrapped(t):
        try:
            target(t)
        except BaseException as e:  # reported by the main thread
            errors.append(f"thread {t}: {e!r}")

    ts = [threading.Thread(target=wrapped, args=(t,)) for t in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in ts), "a thread is still running after 90 s (hung?)"
    assert not errors, errors


def test_threads_fill_and_check_each_others_chunks():
    with uswap.Pool("32M") as pool:
        a = uswap.zeros(128 * MiB // 8, np.int64, pool=pool)
        chunk = 1 << 18  # 2 MiB of int64
        chunks = range(0, a.size, chunk)
        barrier = threading.Barrier(THREADS, timeout=60)

        def work(t):
            for lo in chunks[t::THREADS]:
                a[lo:lo + chunk] = np.arange(lo, lo + chunk) * 3 + t
            barrier.wait()
            # Check what another thread wrote, while the others check theirs.
            other = (t + 1) % THREADS
            for lo in chunks[other::THREADS]:
                got = a[lo:lo + chunk]
                want = np.arange(lo, lo + chunk) * 3 + other
                assert np.array_equal(got, want), f"chunk at {lo} (thread {other}'s) differs"

        run_threads(work)
        c = pool.counters()
        assert c["pswpout"] > 0 and c["pswpin"] > 0, c


def test_threads_interleaved_in_the_same_pages():
    """Thread t writes elements t, t+4, t+8, ...: every page is written by all threads
    at once, so faults on the same page race."""
    with uswap.Pool("32M") as pool:
        a = uswap.zeros(96 * MiB // 4, np.uint32, pool=pool)

        def work(t):
            for rnd in range(2):
                a[t::THREADS] = (t + 1) * 0x01010101 + rnd

        run_threads(work)
        want = (np.arange(THREADS, dtype=np.uint32) + 1) * 0x01010101 + 1
        rows = a.reshape(-1, THREADS)
        for lo in range(0, rows.shape[0], 1 << 18):
            block = rows[lo:lo + (1 << 18)]
            assert (block == want).all(), f"rows {lo}.. differ"


def test_threads_compute_while_others_make_and_close_regions():
    with uswap.Pool("48M") as pool:
        a = uswap.zeros(160 * MiB // 8, np.float64, pool=pool)
        for lo in range(0, a.size, 1 << 20):
            a[lo:lo + (1 << 20)] = np.arange(lo, min(lo + (1 << 20), a.size), dtype=np.float64)
        n = a.size
        expected = n * (n - 1) / 2
        stop = threading.Event()
        made = []

        def work(t):
            if t == 0:
                # Region life and counters from one thread while the others fault.
                while not stop.is_set():
                    with pool.region(4 * MiB) as r:
                        mv = memoryview(r)
                        mv[::4096] = b"\x05" * (len(r) // 4096)
                        ok = mv[4096 * 7] == 5
                        mv.release()
                    pool.counters()
                    made.append(ok)
                return
            try:
                for _ in range(2):
                    # Each thread sums the whole array in pieces (exact: integers < 2**53).
                    total = sum(float(a[lo:lo + (1 << 20)].sum()) for lo in range(0, n, 1 << 20))
                    assert total == expected, (total, expected)
            finally:
                if t == 1:
                    stop.set()

        run_threads(work)
        assert made and all(made)
