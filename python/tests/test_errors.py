"""Each engine error kind that can be provoked here, raised as its own uswap.Error
subclass (also under the builtin a Python user would catch) with the engine's message.

Not provoked: UffdFeatureMissingError (needs a kernel older than 6.8) and SysError (a
failing system call; under RLIMIT_AS the engine aborts on allocation failure instead)."""

import os

import pytest

from conftest import MiB, run_python, uswap

KINDS = {
    "UffdNotPermittedError": PermissionError,
    "UffdFeatureMissingError": OSError,
    "SwapFileError": OSError,
    "SwapFullError": MemoryError,
    "BudgetTooSmallError": ValueError,
    "BudgetExceedsRamError": ValueError,
    "InvalidSizeError": ValueError,
    "InvalidRegionSizeError": ValueError,
    "SysError": OSError,
    "RemoteError": ConnectionError,
    "InvalidOptionError": ValueError,
}


def test_one_class_per_kind_under_uswap_error():
    for name, builtin in KINDS.items():
        cls = getattr(uswap, name)
        assert issubclass(cls, uswap.Error) and issubclass(cls, builtin), name
        assert cls.__module__ == "uswap" and cls.__doc__
    assert issubclass(uswap.Error, Exception)


def test_invalid_size():
    for bad in ["12Q", "", "G", "1.2.3M", "-5M"]:
        with pytest.raises(uswap.InvalidSizeError, match="invalid size") as e:
            uswap.Pool(bad)
        assert "examples: 4k, 256M, 2G" in str(e.value)
    with pytest.raises(uswap.InvalidSizeError, match="negative"):
        uswap.Pool(-1)
    with pytest.raises(uswap.InvalidSizeError, match="too large"):
        uswap.Pool(2**64)
    with pytest.raises(uswap.InvalidSizeError):
        uswap.parse_size("99999999999999999999T")
    assert uswap.parse_size("1.5g") == 3 << 29 and uswap.parse_size(4096) == 4096
    for wrong_type in [1.5, True, None, b"2G"]:
        with pytest.raises(TypeError, match="int .bytes. or a string"):
            uswap.parse_size(wrong_type)


def test_invalid_region_size(pool):
    with pytest.raises(uswap.InvalidRegionSizeError, match="invalid region size 0"):
        pool.region(0)
    with pytest.raises(uswap.InvalidRegionSizeError, match="larger than"):
        pool.region(2**62)
    with pytest.raises(uswap.InvalidSizeError, match="negative"):
        pool.region(-4096)


def test_budget_too_small_and_larger_than_ram():
    with pytest.raises(uswap.BudgetTooSmallError, match="budget of 1048576 bytes is too small"):
        uswap.Pool("1M")
    with pytest.raises(uswap.BudgetExceedsRamError, match="larger than this machine's RAM"):
        uswap.Pool("64T")


def test_swap_file_not_creatable(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "swap"
    with pytest.raises(uswap.SwapFileError, match="cannot use swap file") as e:
        uswap.Pool("32M", swap_file=missing)
    assert str(missing) in str(e.value)
    assert isinstance(e.value, OSError)


def test_swap_full():
    with uswap.Pool("32M", swap_size="64M") as p:
        r = p.region("48M")
        with pytest.raises(uswap.SwapFullError, match="swap space exhausted") as e:
            p.region("32M")
        assert isinstance(e.value, MemoryError)
        r.close()
        p.region("32M").close()  # the slots came back


def test_uffd_not_permitted_for_an_unprivileged_user():
    """A process that drops to uid 65534 (after importing uswap) may not open
    userfaultfd: sysctl vm.unprivileged_userfaultfd=0 and /dev/userfaultfd mode 0600."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (to run a process as an unprivileged user)")
    with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
        if f.read().strip() != "0":
            pytest.fail("vm.unprivileged_userfaultfd is not 0 here: an unprivileged user may use "
                        "userfaultfd, so UffdNotPermittedError cannot be provoked")
    out = run_python(
        """
        import json, os, uswap
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        try:
            uswap.Pool("32M")
            print(json.dumps({"raised": None}))
        except uswap.Error as e:
            print(json.dumps({"raised": type(e).__name__, "message": str(e),
                              "permission": isinstance(e, PermissionError)}))
        """,
        timeout=60,
    )
    assert out["raised"] == "UffdNotPermittedError", out
    assert out["permission"]
    assert "userfaultfd is not permitted" in out["message"]
    assert "vm.unprivileged_userfaultfd=1" in out["message"]


def test_bad_options_are_invalid_option_errors():
    """Every bad Pool(...) option is a uswap.InvalidOptionError: a uswap.Error and a
    ValueError, with a message that says what to do."""
    bad = uswap.InvalidOptionError
    assert issubclass(bad, uswap.Error) and issubclass(bad, ValueError)
    with pytest.raises(
        bad,
        match='unknown tier "ssd": uswap has "file", "compressed", "compressed\\+file", '
        '"remote", "compressed\\+remote"',
    ):
        uswap.Pool("32M", tier="ssd")
    with pytest.raises(bad, match="unit must be"):
        uswap.Pool("32M", unit="8k")
    with pytest.raises(bad, match="readahead must be"):
        uswap.Pool("32M", readahead="more")
    with pytest.raises(bad, match='unknown compressor "gzip"'):
        uswap.Pool("32M", tier="compressed", compressor="gzip")
    with pytest.raises(bad, match="zstd:99.*outside"):
        uswap.Pool("32M", tier="compressed+file", compressor="zstd:99")
    with pytest.raises(bad, match="compressed_max must be a percent"):
        uswap.Pool("32M", tier="compressed", compressed_max=95)
    with pytest.raises(bad, match="apply to the compressed tiers"):
        uswap.Pool("32M", compressor="lz4")
    with pytest.raises(bad, match="apply to the compressed tiers"):
        uswap.Pool("32M", tier="remote", remote="redis://127.0.0.1:1", compressed_max=20)
    with pytest.raises(bad, match="incompressible applies to"):
        uswap.Pool("32M", tier="compressed", incompressible="store")
    with pytest.raises(bad, match='incompressible must be "store" or "pass"'):
        uswap.Pool("32M", tier="compressed+file", incompressible="keep")
    with pytest.raises(bad, match='tier="remote" needs remote="redis://'):
        uswap.Pool("32M", tier="remote")
    with pytest.raises(bad, match='tier="compressed\\+remote" needs remote='):
        uswap.Pool("32M", tier="compressed+remote", remote="")
    with pytest.raises(bad, match='remote applies to tier="remote"'):
        uswap.Pool("32M", remote="redis://127.0.0.1:7000")
    assert uswap.TIERS == [
        "file",
        "compressed",
        "compressed+file",
        "remote",
        "compressed+remote",
    ]
    for tier in (None, "file"):
        with uswap.Pool("32M", tier=tier, unit="2m", readahead="off") as p:
            memoryview(p.region(MiB))[0] = 1


def test_a_cluster_that_is_not_there_is_a_remote_error():
    assert issubclass(uswap.RemoteError, uswap.Error)
    assert issubclass(uswap.RemoteError, ConnectionError)
    with pytest.raises(uswap.RemoteError, match="remote tier.*127.0.0.1:1"):
        uswap.Pool("32M", tier="remote", remote="redis://127.0.0.1:1")
