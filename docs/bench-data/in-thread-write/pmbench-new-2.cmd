uswap bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json   (new build)
2026-11-24T07:47:43Z
