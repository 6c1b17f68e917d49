 /tmp/rz/uswap-base bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --tier remote --remote redis://127.0.0.1:22500 --json
