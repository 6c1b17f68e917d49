"""`python -m uswap run [OPTIONS] -- PROGRAM ARGS`: the CLI's `uswap run`, from the package.

It runs PROGRAM with its large anonymous memory (big malloc blocks, big anonymous
private mmaps) under uswap, as `uswap run` does (docs/run.md): it checks the settings by
starting and stopping a pool, then execs PROGRAM with libuswap_preload.so in LD_PRELOAD
and the settings in USWAP_* variables. The library is $USWAP_PRELOAD if set, else the
copy built into this package (written once to the package directory, or to
~/.cache/uswap when that is read-only).

Exit status: PROGRAM's own; 2 for bad options; 1 when userfaultfd is not usable;
126/127 when PROGRAM cannot be executed / is not found.
"""

import argparse
import hashlib
import os
import sys
import tempfile

import uswap
from uswap import _uswap

PROG = "python -m uswap"

RUN_EPILOG = """\
What goes under uswap (in PROGRAM and in every process it starts): malloc/calloc/
realloc/memalign blocks and anonymous private read-write mmaps of at least --threshold
bytes; smaller allocations, shared and file mappings, stacks and statically linked or
setuid programs do not (docs/run.md). Each process has its own pool and budget.

Examples:
  python -m uswap run --budget 2G --stats -- python3 big.py
  python -m uswap run --budget 512M --unit 2m --stats=/tmp/stats.json -- ./solver input
"""


def _size(text):
    try:
        return uswap.parse_size(text)
    except uswap.Error as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="uswap: out-of-core memory. `run` puts a program's large memory under uswap.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = sub.add_parser(
        "run",
        help="run PROGRAM with its large anonymous memory under uswap",
        description="Run PROGRAM with its large anonymous memory (big malloc blocks, big "
        "anonymous private mmaps) under uswap; exit status, signals and stdio pass through.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--budget", type=_size, default="256M", metavar="SIZE",
                   help="resident budget for the program's uswap memory [default: 256M]")
    r.add_argument("--swap-file", metavar="PATH",
                   help="swap file place: a directory, a new file, or a block device "
                   "[default: an unlinked file in $TMPDIR]")
    r.add_argument("--unit", choices=["4k", "2m", "auto"], default="auto", type=str.lower,
                   help="swap unit [default: auto: 2 MiB units out, and in where the access "
                   "is sequential]")
    r.add_argument("--threshold", type=_size, default="1M", metavar="SIZE",
                   help="allocations and mappings of at least SIZE go under uswap [default: 1M]")
    r.add_argument("--stats", nargs="?", const="-", metavar="FILE",
                   help="on exit, print the counters and peak resident memory (one JSON line "
                   "per process that used uswap) to stderr, or append them to FILE")
    r.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS")
    return p


def _error(msg, code):
    print(f"{PROG} run: error: {msg}", file=sys.stderr)
    return code


def _same_content(path, image):
    try:
        if os.path.getsize(path) != len(image):
            return False
        with open(path, "rb") as f:
            return f.read() == image
    except OSError:
        return False


def _preload_dirs():
    yield os.path.dirname(os.path.abspath(uswap.__file__))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    yield os.path.join(cache, "uswap")


def preload_library():
    """Path of libuswap_preload.so: $USWAP_PRELOAD, else the copy built into the package
    (written, under a name that carries its hash, where it can be). Raises RuntimeError."""
    env = os.environ.get("USWAP_PRELOAD")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"USWAP_PRELOAD={env} is not a file")
        return os.path.abspath(env)
    image = _uswap._preload_image()
    if image is None:
        raise RuntimeError(
            "this uswap module was built without libuswap_preload.so (feature bundle-preload); "
            "set USWAP_PRELOAD to one built with `cargo build --release -p uswap-preload`"
        )
    name = f"libuswap_preload-{hashlib.sha256(image).hexdigest()[:16]}.so"
    tried = []
    for d in _preload_dirs():
        path = os.path.join(d, name)
        if _same_content(path, image):
            return path
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".libuswap_preload-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                os.chmod(tmp, 0o755)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
            return path
        except OSError as e:
            tried.append(f"{d}: {e}")
    raise RuntimeError("cannot write libuswap_preload.so (" + "; ".join(tried) + ")")


def run(args):
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        return _error("PROGRAM is missing (usage: run [OPTIONS] -- PROGRAM ARGS)", 2)
    try:
        preload = preload_library()
    except RuntimeError as e:
        return _error(str(e), 2)
    # Check the settings here, where an error can stop the run, rather than in the
    # program, where the preload library could only go on without uswap.
    try:
        uswap.Pool(args.budget, swap_file=args.swap_file).close()
    except (uswap.UffdNotPermittedError, uswap.UffdFeatureMissingError) as e:
        return _error(str(e), 1)
    except uswap.Error as e:
        return _error(str(e), 2)
    stats = args.stats
    if stats is not None and stats != "-":
        # One line per process that used uswap is appended; start empty.
        try:
            open(stats, "wb").close()
        except OSError as e:
            return _error(f"cannot create stats file {stats}: {e}", 2)
        stats = os.path.realpath(stats)
    env = dict(os.environ)
    old = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = f"{preload}:{old}" if old else preload
    env["USWAP_BUDGET"] = str(args.budget)
    env["USWAP_UNIT"] = args.unit
    env["USWAP_THRESHOLD"] = str(args.threshold)
    env["USWAP_ROOT_PID"] = str(os.getpid())
    for name, value in (("USWAP_SWAP_FILE", args.swap_file), ("USWAP_STATS", stats)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: on success this does not return; PROGRAM keeps our pid, stdio and signals.
    try:
        os.execvpe(program[0], program, env)
    except FileNotFoundError:
        print(f"{PROG} run: {program[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as e:
        print(f"{PROG} run: cannot execute {program[0]}: {e.strerror or e}", file=sys.stderr)
        return 126


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
