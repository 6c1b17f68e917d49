 uswap bench fault-latency --size 256M --budget 64M --tier remote --remote redis://127.0.0.1:22500 --fault-mode in-thread --json
