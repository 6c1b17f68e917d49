#!/usr/bin/env bash
# The project's one test command (the README's, and what CI runs after fmt and clippy).
# On a fresh Debian machine it first installs what the tests need, then runs every test:
# the Rust workspace and the Python package. Run it as root (userfaultfd, cgroups, loop
# devices, FUSE); each step says what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

# --- what the tests need -------------------------------------------------------------
# (each helper below installs only what is missing, so a second run is quick)
need_apt=()
add_apt() { for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p"); done; }
# add_apt PACKAGE... lines go here
# uswap-faultfs (the FUSE + loop device fault tests): losetup. The FUSE mount is mount(2)
# as root through the fuser crate: no libfuse, no fusermount.
add_apt util-linux

# Python 3.11+ with venv for the Python package (python/): the first interpreter that
# fits; Debian's own python3 needs python3-venv for `-m venv`.
find_python() {
  for py in python3 python3.13 python3.12 python3.11; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}
PYTHON=$(find_python || true)
if [ -z "$PYTHON" ]; then
  add_apt python3 python3-venv
elif ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  add_apt python3-venv
fi
# Toolchains that crates/uswap-cli/tests/run.rs builds its runtime programs with (C,
# static C, Java, Node, Go): a test whose toolchain is missing fails, it never skips.
need_tool() { command -v "$1" >/dev/null 2>&1 || add_apt "${@:2}"; }
need_tool cc gcc libc6-dev
need_tool objcopy binutils   # strips the preload library the Python wheel embeds
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || add_apt libc6-dev
need_tool javac default-jdk-headless
need_tool node nodejs
need_tool go golang-go
add_apt redis-server redis-tools openssl   # crates/uswap-remote tests: a real local Redis Cluster (scripts/redis-cluster.sh; --tls needs openssl)
# crates/uswap-cli/tests/run.rs: programs that bring their own allocator (issue 46),
# linked (headers, .so) and preloaded; Debian's redis-server (above) links jemalloc.
add_apt libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev
# gdb: the engine tests' watchdog prints every thread's backtrace when a test hangs
# (crates/uswap/tests/common); without it, kernel stacks only.
add_apt gdb
add_apt util-linux mount e2fsprogs # losetup, mount, mkswap, mkfs.ext4: swap place tests
# memtester: it mlocks its buffer (crates/uswap-cli/tests/run.rs, locked memory);
# setpriv (util-linux) runs a program without CAP_IPC_LOCK for the refused mlock.
add_apt memtester
# stress-ng: its malloc stressor under uswap run never takes the swap filesystem below
# the --max-swap cap (crates/uswap-cli/tests/swap_space.rs).
need_tool stress-ng stress-ng
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi
PYTHON=${PYTHON:-$(find_python)}

# The Python test tools, in a virtualenv under target/ (no system site-packages touched).
PY_VENV=target/py-venv
if ! "$PY_VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "creating $PY_VENV with $PYTHON"
  rm -rf "$PY_VENV"
  "$PYTHON" -m venv "$PY_VENV"
fi
# prometheus_client: crates/uswap-cli/tests/live.rs parses `uswap export`'s scrape with
# the Prometheus client library's own parser.
if ! "$PY_VENV/bin/python" -c 'import numpy, pytest, pytest_timeout, prometheus_client' 2>/dev/null ||
   ! [ -x "$PY_VENV/bin/maturin" ]; then
  say "installing maturin, numpy, pytest, pytest-timeout, prometheus_client into $PY_VENV"
  "$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check \
    'maturin>=1.5,<2' numpy pytest pytest-timeout prometheus_client
fi

# FUSE and loop devices for the fault tests: load the modules where the kernel has them
# as modules (the tests fail, saying why, where there are none).
if command -v modprobe >/dev/null; then
  [ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
  [ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
fi

# --- Rust ------------------------------------------------------------------------------
# Every target first, the C libraries (cdylibs) too, which `cargo test` does not build and
# the tests that need them would otherwise build one by one (the same command as
# `build_cdylibs` in crates/uswap/tests/support); `cargo test` then reuses it all. The
# Python module as an extension module, as maturin builds it: no libpython to link.
say "cargo build --workspace --all-targets --release"
cargo build --workspace --all-targets --release --features uswap-py/extension-module
say "cargo test --workspace --release"
cargo test --workspace --release

# --- Python ----------------------------------------------------------------------------
# Build the package from python/ (maturin, the same as `pip install ./python`; the maturin
# of the venv instead of a fresh isolated one) and run its tests from the repository root,
# where python/uswap, the sources, cannot shadow the installed package. pytest exits
# non-zero on any failure and when it collects no test.
# The wheel embeds libuswap_preload.so: the one built above, without its debug info as
# a release wheel has it (crates/uswap-py/build.rs would otherwise build it a third time,
# in a target directory of its own).
say "pip install ./python (the uswap Python package)"
objcopy --strip-debug target/release/libuswap_preload.so target/libuswap_preload-wheel.so
USWAP_PRELOAD_SO="$PWD/target/libuswap_preload-wheel.so" PATH="$PWD/$PY_VENV/bin:$PATH" \
  "$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps ./python
say "pytest python/tests"
"$PY_VENV/bin/python" -m pytest -p no:cacheprovider python/tests
