#!/bin/bash
# A/B: A = the build before (ceeb78f), B = the fault path keeps its own warm frames.
# A=<build> B=<build> OUT=dir bash sitting.sh; python3 summ.py DIR
A=${A:?the build before}; B=${B:?the build after}
D=${OUT:?where}; mkdir -p "$D/pmbench-inthread" "$D/others"
for i in 1 2 3 4 5; do for v in A B; do bin=${!v}
  "$bin" bench pmbench --size 1G --budget 515M --unit 4k --fault-mode in-thread --duration 5s --tier compressed+file --json > "$D/pmbench-inthread/$v-$i.json" 2>/dev/null
done; done
for i in 1 2 3; do for v in A B; do bin=${!v}
  "$bin" bench swap-w-seq --size 1G --budget 256M --unit 2m --tier compressed+file --json > "$D/others/sw-$v-$i.json" 2>/dev/null
  "$bin" bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --json > "$D/others/pm-$v-$i.json" 2>/dev/null
  "$bin" bench seq-read --size 1G --budget 256M --unit 4k --json > "$D/others/sr-$v-$i.json" 2>/dev/null
done; done
