uswap bench pmbench --size 1G --budget 256M --unit 4k --tier compressed --fault-mode in-thread --against zram --repeat 3 --duration 5s --json --plot zram-compressed-inthread.png
2026-11-24T05:58:26Z
