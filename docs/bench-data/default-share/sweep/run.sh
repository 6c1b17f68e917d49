# The share sweep (engine f22d249, 2026-11-27 22:24-22:29 UTC): 3 alternating rounds of pmbench 4k
# in the faulting thread at 513 MiB (90/80% and store, 90% and pass) and 256 MiB (90/80%).
# Files r-BUDGET-SHARE-INCOMPRESSIBLE-ROUND.json
B=/work/main/target/release/uswap
for i in 1 2 3; do
for cfg in "513 90 store" "513 80 store" "513 90 pass" "256 90 store" "256 80 store"; do
 set -- $cfg; bud=$1; [ $bud = 513 ] && bud=537919488 || bud=256M
 $B bench pmbench --size 1G --budget $bud --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread --compressed-max $2 --incompressible $3 --json > r-$1-$2-$3-$i.json 2>r-$1-$2-$3-$i.err
done; done
echo done > done
