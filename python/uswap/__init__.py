"""uswap: out-of-core memory for Python.

A Pool owns a resident budget and a swap file; the regions and NumPy arrays made from
it can be far bigger than the budget: a user-space swap engine (userfaultfd) pages
them to the swap file and back on access. No copy anywhere: an array's memory *is* the
region.

    import numpy as np, uswap
    with uswap.Pool(budget="2G") as pool:                # at most 2 GiB in RAM
        a = uswap.zeros((2**30,), np.float64, pool=pool)  # an 8 GiB array
        a[:] = 1.5; a[::4096] += 1                        # pages out as you go
        print(a.sum(), pool.counters()["pswpout"])        # and back in

Regions (Pool.region) support the buffer protocol: memoryview(region) is writable.
Errors are uswap.Error subclasses carrying the engine's message. Threads: the GIL is
released around every call that can wait on the engine, and any number of threads may
use one array. fork: a child made by os.fork() or multiprocessing ("fork" start
method) gets its own copy-on-write copy of every region and pool; see docs/python.md.
"""

import math as _math
import operator as _operator
import os as _os

from . import _uswap
from ._uswap import (
    PAGE_SIZE,
    TIERS,
    UNIT_SIZE,
    BudgetExceedsRamError,
    BudgetTooSmallError,
    Error,
    InvalidOptionError,
    InvalidRegionSizeError,
    InvalidSizeError,
    RemoteError,
    Pool,
    Region,
    SwapFileError,
    SwapFullError,
    SysError,
    UffdFeatureMissingError,
    UffdNotPermittedError,
    format_size,
    parse_size,
)

try:
    from importlib.metadata import version as _version

    __version__ = _version("uswap")
except Exception:  # not installed as a distribution (e.g. imported from a build tree)
    __version__ = "0+unknown"

__all__ = [
    "Pool",
    "Region",
    "empty",
    "zeros",
    "parse_size",
    "format_size",
    "Error",
    "UffdNotPermittedError",
    "UffdFeatureMissingError",
    "SwapFileError",
    "SwapFullError",
    "BudgetTooSmallError",
    "BudgetExceedsRamError",
    "InvalidSizeError",
    "InvalidRegionSizeError",
    "SysError",
    "RemoteError",
    "InvalidOptionError",
    "TIERS",
    "UNIT_SIZE",
    "PAGE_SIZE",
]

# The child of os.fork() gets its own engine for every pool (new userfaultfd, threads and
# swap file for new writes) and a copy-on-write view of every region, swapped-out pages
# included; the parent goes on as before. Forks that do not go through os.fork() (those
# of subprocess, which execs at once) do not run these hooks and need not.
_os.register_at_fork(
    before=_uswap._prepare_fork,
    after_in_parent=_uswap._after_fork_parent,
    after_in_child=_uswap._after_fork_child,
)


def _numpy():
    try:
        import numpy
    except ImportError as e:
        raise ImportError("uswap.empty and uswap.zeros need NumPy: pip install numpy") from e
    return numpy


def _shape_tuple(shape):
    try:
        return (_operator.index(shape),)
    except TypeError:
        return tuple(shape)


def empty(shape, dtype=float, *, pool, order="C"):
    """A NumPy array of `shape` and `dtype` whose memory is a new region of `pool`.

    No copy: the array's buffer is the region (numpy.frombuffer), and the array keeps
    the region alive; the region is freed when the last view of the array goes. The
    memory of a fresh region reads as zeros, so this equals zeros().
    """
    np = _numpy()
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"uswap arrays hold plain data, not Python objects (dtype {dtype})")
    shape = tuple(_operator.index(d) for d in _shape_tuple(shape))
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    count = _math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype, order=order)
    region = pool.region(count * dtype.itemsize)
    return np.frombuffer(region, dtype=dtype, count=count).reshape(shape, order=order)


def zeros(shape, dtype=float, *, pool, order="C"):
    """A zero-filled NumPy array whose memory is a new region of `pool` (see empty())."""
    return empty(shape, dtype, pool=pool, order=order)
