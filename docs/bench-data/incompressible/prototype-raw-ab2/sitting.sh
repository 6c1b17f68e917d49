. /work/main/scripts/ab-sitting.sh
for i in 1 2 3; do
  ab_pair "$i" pm-cf-513 pmbench --size 1G --budget 537919488 --unit 4k --duration 5s --tier compressed+file --fault-mode in-thread --compressed-max 80
done
echo done >> log
