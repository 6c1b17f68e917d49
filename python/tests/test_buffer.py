"""Regions through the buffer protocol: writable memoryviews with no copy, round trips
through the APIs that take buffers, and closing while a buffer is exported."""

import ctypes
import gc
import hashlib
import os
import random
import struct
import weakref

import numpy as np
import pytest

from conftest import MiB, uswap


def test_memoryview_is_writable_and_zero_copy(pool):
    r = pool.region(3 * MiB + 5)
    assert len(r) == 3 * MiB + 5
    mv = memoryview(r)
    assert (mv.nbytes, mv.itemsize, mv.format, mv.readonly, mv.ndim) == (len(r), 1, "B", False, 1)
    assert mv.c_contiguous and mv.obj is r
    mv[10:15] = b"hello"
    # The same bytes seen at the region's address (ctypes) and through a second view.
    assert ctypes.string_at(r.address + 10, 5) == b"hello"
    assert bytes(memoryview(r)[10:15]) == b"hello"
    ctypes.memmove(r.address + len(r) - 3, b"xyz", 3)
    assert bytes(mv[-3:]) == b"xyz"
    assert np.frombuffer(r, np.uint8).ctypes.data == r.address
    mv.release()


def test_fresh_region_reads_as_zeros(pool):
    r = pool.region(8 * MiB)
    a = np.frombuffer(r, np.uint64)
    assert not a.any()
    z = uswap.zeros((1000, 1000), np.float32, pool=pool)
    assert z.shape == (1000, 1000) and z.dtype == np.float32 and not z.any()


def test_round_trip_random_bytes_4x_budget(pool):
    """Random data 4x the budget written in random-sized pieces through memoryview
    slices, read back piece by piece, every byte compared."""
    r = pool.region(128 * MiB)
    mv = memoryview(r)
    rng = random.Random(11)
    pieces, pos = [], 0
    while pos < len(r):
        n = min(rng.randrange(1, 3 * MiB), len(r) - pos)
        pieces.append((pos, n, rng.randbytes(8)))
        pos += n
    for pos, n, seed in pieces:
        mv[pos:pos + n] = (seed * (n // 8 + 1))[:n]
    assert pool.counters()["pswpout"] > 0
    for pos, n, seed in rng.sample(pieces, len(pieces)):
        assert mv[pos:pos + n] == (seed * (n // 8 + 1))[:n], f"bytes at {pos}..{pos + n} differ"
    mv.release()


def test_buffer_consumers(pool, tmp_path):
    r = pool.region(6 * MiB)
    mv = memoryview(r)
    data = os.urandom(len(r))
    # readinto from a file: the kernel writes into region memory (faults served).
    f = tmp_path / "data"
    f.write_bytes(data)
    with open(f, "rb", buffering=0) as fh:
        assert fh.readinto(mv) == len(r)
    assert hashlib.sha256(r).digest() == hashlib.sha256(data).digest()
    # write from the region: the kernel reads region memory.
    g = tmp_path / "copy"
    with open(g, "wb", buffering=0) as fh:
        assert fh.write(r) == len(r)
    assert g.read_bytes() == data
    # struct, casts, bytearray slicing.
    struct.pack_into("<QdI", r, 1000, 2**63 + 5, 2.5, 7)
    assert struct.unpack_from("<QdI", r, 1000) == (2**63 + 5, 2.5, 7)
    words = mv.cast("Q")
    words[7] = 0x0123456789ABCDEF
    assert int.from_bytes(mv[56:64], "little") == 0x0123456789ABCDEF
    words.release()
    mv.release()


def test_close_refused_while_exported_then_allowed(pool):
    r = pool.region(4 * MiB)
    mv = memoryview(r)
    mv[0] = 42
    with pytest.raises(BufferError):
        r.close()
    assert not r.closed and mv[0] == 42  # still mapped, still ours
    a = np.frombuffer(r, np.uint8)
    mv.release()
    with pytest.raises(BufferError):
        r.close()
    assert a[0] == 42
    del a
    gc.collect()
    r.close()
    assert r.closed
    r.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        memoryview(r)
    with pytest.raises(ValueError, match="closed"):
        len(r)
    with pytest.raises(ValueError, match="closed"):
        r.counters()


def test_close_frees_memory(pool):
    before = pool.counters()["resident_bytes"]
    with pool.region(24 * MiB) as r:
        memoryview(r)[:] = b"\x01" * len(r)
        assert pool.counters()["resident_bytes"] >= before + 16 * MiB
    assert r.closed
    assert pool.counters()["resident_bytes"] <= before + 2 * MiB


def test_array_keeps_its_region_alive():
    with uswap.Pool("32M") as p:
        a = uswap.zeros(8 * MiB, np.uint8, pool=p)
        region = a.base
        while isinstance(region, (np.ndarray, memoryview)):
            region = region.obj if isinstance(region, memoryview) else region.base
        assert isinstance(region, uswap.Region)
        ref = weakref.ref(region)
        del region
        a[:] = 9
    # The pool is closed but the array's region stays valid while the array lives.
    assert p.closed and ref() is not None and not ref().closed
    assert int(a.sum()) == 9 * a.size
    b = a[::2]
    del a
    gc.collect()
    assert ref() is not None and b[-1] == 9  # a view keeps it too
    del b
    gc.collect()
    assert ref() is None  # freed with the last view


def test_pool_close_closes_unused_regions():
    p = uswap.Pool("32M")
    idle = p.region(2 * MiB)
    busy = p.region(2 * MiB)
    mv = memoryview(busy)
    p.close()
    assert p.closed and idle.closed and not busy.closed
    mv[0] = 1
    assert mv[0] == 1
    mv.release()
    busy.close()
    with pytest.raises(ValueError, match="closed"):
        p.region(2 * MiB)
    with pytest.raises(ValueError, match="closed"):
        p.counters()
    p.close()


def test_empty_and_zeros_shapes(pool):
    a = uswap.empty((3, 4, 5), np.int16, pool=pool)
    assert a.shape == (3, 4, 5) and a.dtype == np.int16 and a.flags.c_contiguous
    f = uswap.zeros((300, 200), "f8", pool=pool, order="F")
    assert f.flags.f_contiguous and f.shape == (300, 200)
    f[:, 1] = 2.0
    assert f.sum() == 600.0
    assert uswap.zeros(7, pool=pool).dtype == np.float64
    assert uswap.zeros((0, 5), np.int8, pool=pool).shape == (0, 5)
    with pytest.raises(ValueError, match="negative"):
        uswap.zeros((-1,), pool=pool)
    with pytest.raises(TypeError):
        uswap.zeros(4, object, pool=pool)
    with pytest.raises(TypeError):
        uswap.zeros(4)  # pool is required


def test_counters_have_the_cli_names(pool):
    r = pool.region(96 * MiB)
    memoryview(r)[::4096] = b"\x07" * (len(r) // 4096)
    c = pool.counters()
    rc = r.counters()
    names = {"pswpin", "pswpout", "swap_ra", "swap_ra_hit", "thp_swpout", "thp_swpout_fallback",
             "thp_swpin", "thp_swpin_fallback", "majflt", "minflt", "evicted", "slots_used",
             "resident_bytes", "cached_bytes", "metadata_bytes", "peak_used_bytes"}
    assert names <= set(c) and set(c) == set(rc)
    assert all(type(v) is int for v in c.values())
    assert c["pswpout"] > 0 and rc["pswpout"] > 0
    assert c["peak_used_bytes"] <= pool.budget == 32 * MiB
