uswap bench pmbench --size 1G --budget 256M --unit 4k --fault-mode handler --against kernel --repeat 3 --duration 5s --json --plot pmbench-4k-handler-warmdefault.png
2026-11-24T05:47:29Z
