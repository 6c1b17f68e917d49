./target/release/uswap bench seq-read --size 1G --budget 256M --unit 4k --readahead off --ra-stream off --json (rc=0)
