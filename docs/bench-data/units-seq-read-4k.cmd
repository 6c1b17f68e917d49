./target/release/uswap bench seq-read --size 2G --budget 256M --unit 4k --json (rc=0)
