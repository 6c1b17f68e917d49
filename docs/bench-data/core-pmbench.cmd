./target/release/uswap bench pmbench --size 2G --budget 256M --duration 10s --json (rc=0)
