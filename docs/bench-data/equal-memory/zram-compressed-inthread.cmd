uswap bench pmbench --size 1G --budget 256M --unit 4k --tier compressed --fault-mode in-thread --against zram --repeat 3 --duration 5s
2026-11-24T04:27:11Z
