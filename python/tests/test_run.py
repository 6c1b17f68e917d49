"""`python -m uswap run`: an unmodified Python program's big buffer under uswap through
the preload library built into the package, the CLI's exit codes and checks."""

import json
import sys

from conftest import MiB, run_process

BUDGET = 32 * MiB
SIZE = 4 * BUDGET
SLACK = 64 * MiB

PROGRAM = f"""
import sys
def vm_hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
own = vm_hwm()
CH = 1 << 20
buf = bytearray({SIZE})            # one big malloc: a uswap region under the preload
for k in range(0, {SIZE}, CH):
    buf[k:k + CH] = k.to_bytes(8, "little") * (CH // 8)
bad = sum(buf[k:k + CH] != k.to_bytes(8, "little") * (CH // 8) for k in range(0, {SIZE}, CH))
print(own, vm_hwm(), bad)
"""


def uswap_run(*args, timeout=180):
    return run_process([sys.executable, "-m", "uswap", "run", *args], timeout=timeout)


def test_program_runs_under_the_budget(tmp_path):
    stats = tmp_path / "stats.jsonl"
    r = uswap_run("--budget", str(BUDGET), "--unit", "2m", f"--stats={stats}", "--",
                  sys.executable, "-c", PROGRAM)
    assert r.returncode == 0, r.stderr
    own, peak, bad = map(int, r.stdout.split())
    assert bad == 0, f"{bad} MiB of the buffer read back wrong"
    assert peak <= own + BUDGET + SLACK, (
        f"peak RSS {peak / MiB:.0f} MiB > own {own / MiB:.0f} + budget + {SLACK / MiB:.0f} MiB")
    lines = [json.loads(line)["uswap_stats"] for line in stats.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["active"], lines
    s = lines[0]
    assert s["budget"] == BUDGET and s["regions_created"] >= 1
    assert s["counters"]["pswpout"] * 4096 >= SIZE - BUDGET, s


def test_exit_status_passes_through():
    r = uswap_run("--", sys.executable, "-c", "import sys; sys.exit(7)", timeout=60)
    assert r.returncode == 7, r.stderr


def test_bad_settings_and_missing_program():
    r = uswap_run("--budget", "12Q", "--", "true", timeout=60)
    assert r.returncode == 2 and "invalid size" in r.stderr, r.stderr
    r = uswap_run("--budget", "1M", "--", "true", timeout=60)
    assert r.returncode == 2 and "too small" in r.stderr, r.stderr
    r = uswap_run("--budget", "64M", "--swap-file", "/no/such/dir/f", "--", "true", timeout=60)
    assert r.returncode == 2 and "cannot use swap file" in r.stderr, r.stderr
    r = uswap_run("--", "/no/such/program", timeout=60)
    assert r.returncode == 127 and "command not found" in r.stderr, r.stderr
    r = uswap_run("--budget", "64M", timeout=60)
    assert r.returncode == 2 and "PROGRAM is missing" in r.stderr, r.stderr
