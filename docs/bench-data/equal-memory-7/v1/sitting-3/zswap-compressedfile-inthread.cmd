/tmp/uswap-C bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --duration 5s --repeat 5 --tier compressed+file --against zswap
