./target/release/uswap bench pmbench --size 2G --budget 256M --duration 10s --json --cgroup-limit 335544320 (rc=0)
