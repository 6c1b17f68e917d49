./target/release/uswap bench pmbench --size 2G --budget 512M --threads 4 --unit 4k --duration 5s --against kernel --repeat 3 --json --plot docs/bench-data/fp-pmbench-2G-t4.png (rc=0)
