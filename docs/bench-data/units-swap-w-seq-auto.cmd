./target/release/uswap bench swap-w-seq --size 2G --budget 256M --unit auto --json (rc=0)
