 uswap bench fault-latency --size 512M --budget 128M --fault-mode in-thread --json
