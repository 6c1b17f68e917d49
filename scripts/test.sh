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
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# FUSE and loop devices for the fault tests: load the modules where the kernel has them
# as modules (the tests fail, saying why, where there are none).
if command -v modprobe >/dev/null; then
  [ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
  [ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
fi

# --- Rust ------------------------------------------------------------------------------
say "cargo test --workspace --release"
cargo test --workspace --release
