. /work/main/scripts/ab-sitting.sh
for i in 1 2 3; do
  ab_pair "$i" pm-cf-513 pmbench --size 1G --budget 537919488 --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
done
for i in 1 2 3; do
  ab_pair "$i" pm-cf-256 pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread
  ab_pair "$i" sws4k-cf swap-w-seq --size 1G --budget 256M --unit 4k --tier compressed+file
done
echo done >> log
