uswap bench pmbench --size 1G --budget 256M --unit 4k --tier compressed+file --fault-mode handler --against zswap --repeat 3 --duration 5s
2026-11-24T04:38:53Z
