/tmp/s/uswap-around2 bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --repeat 5 --duration 5s --tier compressed+file --against zswap
