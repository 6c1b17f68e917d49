./target/release/uswap bench pmbench --size 1G --budget 256M --threads 4 --unit 4k --duration 5s --against kernel --repeat 3 --json --plot docs/bench-data/fp-pmbench-1G-t4.png (rc=0)
