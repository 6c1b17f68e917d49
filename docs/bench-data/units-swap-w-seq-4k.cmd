./target/release/uswap bench swap-w-seq --size 2G --budget 256M --unit 4k --json (rc=0)
