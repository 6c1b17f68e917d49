USWAP_REMOTE_SPIN_US=100 uswap bench fault-latency --size 256M --budget 64M --tier remote --remote redis://127.0.0.1:22500 --fault-mode in-thread --json
2026-11-24T07:56:34Z
