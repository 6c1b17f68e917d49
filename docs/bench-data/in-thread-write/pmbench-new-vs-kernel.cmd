uswap bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json --against kernel --repeat 3
2026-11-24T07:49:12Z
