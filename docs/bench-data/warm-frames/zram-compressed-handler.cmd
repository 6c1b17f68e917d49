uswap bench pmbench --size 1G --budget 256M --unit 4k --tier compressed --against zram --repeat 3 --duration 5s --json --plot zram-compressed-handler.png
2026-11-24T06:03:39Z
