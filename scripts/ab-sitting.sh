# Sourced by an A/B sitting's script (kept with its output under target/bench-data/,
# its commands and medians in the commit body): the build before (A) and after (B) run
# the same rows alternating, the first of each round rotating, so that both see the
# same disk and memory state. Each run leaves NAME-ROUND-SIDE.json and .err in the
# current directory and a line in ./log; `scripts/ab_summ.py` reads them. Set A and B
# (binaries) before sourcing.
: "${A:?the build before}" "${B:?the build after}"

# One run: ab_run SIDE NAME bench-args...
ab_run() {
  local side=$1 name=$2; shift 2
  local bin=$A; [ "$side" = B ] && bin=$B
  "$bin" bench "$@" --json > "$name-$side.json" 2> "$name-$side.err"
  echo "$(date +%T) $name-$side rc=$?" >> log
}

# Both sides of one row in round I: ab_pair I NAME bench-args...
ab_pair() {
  local i=$1 name=$2; shift 2
  local order="A B"; [ $((i % 2)) = 0 ] && order="B A"
  for s in $order; do ab_run "$s" "$name-$i" "$@"; done
}
