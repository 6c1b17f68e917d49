./target/release/uswap bench fault-latency --size 256M --budget 64M --json (rc=0)
