/tmp/bins/uswap-47d771c bench pmbench --size 1G --budget 256M --unit 4k --tier compressed+file --fault-mode in-thread --against zswap --repeat 3 --duration 5s
