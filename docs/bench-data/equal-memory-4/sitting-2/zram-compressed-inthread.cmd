/tmp/uswap-G bench pmbench --size 1G --budget 256M --unit 4k --fault-mode in-thread --repeat 3 --duration 5s --tier compressed --against zram --plot /tmp/em6/sitting-2/zram-compressed-inthread.png
