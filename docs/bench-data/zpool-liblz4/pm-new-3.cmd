/tmp/rz/uswap-zl bench pmbench --size 1G --budget 535M --unit 4k --tier compressed --fault-mode in-thread --duration 5s --json
