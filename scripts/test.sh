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
add_apt util-linux mount e2fsprogs # losetup, mount, mkswap, mkfs.ext4: swap place tests
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# --- Rust ------------------------------------------------------------------------------
say "cargo test --workspace --release"
cargo test --workspace --release
