./target/release/uswap bench seq-read --size 2G --budget 256M --unit auto --json (rc=0)
