uswap bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --json   (base build)
2026-11-24T07:53:46Z
