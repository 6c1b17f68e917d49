./target/release/uswap bench swap-w-seq --size 1G --budget 256M --unit 2m --encrypt --json (rc=0)
