"""Shared helpers of the uswap Python tests (run by scripts/test.sh, as root).

Every test that could hang has a deadline: pytest-timeout (thread method, see
pyproject.toml) for in-process tests, and a killed process group for subprocesses.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

MiB = 1 << 20


def _installed_uswap():
    try:
        import uswap
        from uswap import _uswap  # noqa: F401
    except ImportError as e:
        pytest.exit(
            f"cannot import the built uswap package ({e}): install it first "
            "(pip install ./python; scripts/test.sh does), and run pytest from the "
            "repository root so that python/uswap (the sources) does not shadow it",
            returncode=2,
        )
    return uswap


uswap = _installed_uswap()


def vm_kib(field, pid="self"):
    """A VmXXX line of /proc/PID/status, in KiB (e.g. VmHWM: the peak RSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def run_process(argv, *, timeout, env=None, user=None, input=None):
    """Run argv in its own process group with a deadline: on expiry the whole group
    (forked children included) is killed and the test fails. Returns CompletedProcess."""
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        env=env,
        user=user,
        start_new_session=True,
        text=True,
    ) as p:
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(
                f"{argv[:3]}... still running after {timeout} s (hung?); killed\n"
                f"stdout: {out[-3000:]}\nstderr: {err[-3000:]}"
            )
        return subprocess.CompletedProcess(argv, p.returncode, out, err)


def run_python(code, *, timeout, **kw):
    """Run Python code in a fresh interpreter (this one's); it must print one JSON
    object as its last stdout line, which is returned. A non-zero exit fails the test."""
    r = run_process([sys.executable, "-c", textwrap.dedent(code)], timeout=timeout, **kw)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
    lines = r.stdout.strip().splitlines()
    assert lines, f"no output\nstderr: {r.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture
def pool():
    with uswap.Pool("32M") as p:
        yield p
