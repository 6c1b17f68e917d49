 /tmp/rz/uswap-base bench fault-latency --size 256M --budget 64M --fault-mode in-thread --tier remote --remote redis://127.0.0.1:22500 --json
