./target/release/uswap bench combined --size 1G --budget 256M --unit 4k --readahead cluster --ra-stream off --threads 1 --bg-threads 1 --duration 20s --json (rc=0)
