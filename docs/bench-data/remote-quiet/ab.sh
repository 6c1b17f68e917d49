#!/bin/bash
# swap-w-seq --unit 2m on the remote tier, the build before (A) against after (B),
# alternating, the first of each round rotating; a local 3+3 cluster, stopped on exit.
# A=old-binary B=new-binary OUT=dir ROUNDS=4 bash ab.sh
A=${A:?the build before}; B=${B:?the build after}
here=$(cd "$(dirname "$0")/../../.." && pwd)
D=${OUT:-/tmp/remote-ab}; mkdir -p "$D"; cd "$D"
dir=$(mktemp -d /tmp/rc-ab.XXXXXX)
trap '"$here/scripts/redis-cluster.sh" stop --dir "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
"$here/scripts/redis-cluster.sh" start --dir "$dir/c" --base-port 22500 > "$dir/nodes"
R=$(paste -sd, "$dir/nodes" | sed 's#\([^,]*\)#redis://\1#g')
for i in $(seq 1 "${ROUNDS:-4}"); do
  order="A B"; [ $((i % 2)) = 0 ] && order="B A"
  for s in $order; do
    bin=$A; [ "$s" = B ] && bin=$B
    "$bin" bench swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote "$R" --json > "sws-remote-$i-$s.json" 2> "sws-remote-$i-$s.err"
    echo "$(date +%T) sws-remote-$i-$s rc=$?" >> log
  done
done
echo "$(date +%T) done" >> log
