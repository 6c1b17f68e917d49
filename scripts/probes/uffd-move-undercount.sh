#!/bin/bash
# The kernel's UFFDIO_MOVE undercount (design.md, "Pages and where their bytes are"):
# builds the probe, runs it for ITER moves (default 20000) while the kernel compacts
# memory every 50 ms (echo 1 > /proc/sys/vm/compact_memory: a one-shot action that
# changes no setting), and stops the compaction loop on any exit.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "needs root (writes /proc/sys/vm/compact_memory)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mktemp /tmp/uffd-move-undercount.XXXXXX)
( while :; do echo 1 > /proc/sys/vm/compact_memory; sleep 0.05; done ) &
loop=$!
trap 'kill $loop 2>/dev/null; rm -f "$bin"' EXIT
cc -O2 -o "$bin" "$here/uffd-move-undercount.c"
timeout 300 "$bin" "${1:-20000}"
