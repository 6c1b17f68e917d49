./target/release/uswap bench pmbench --size 1G --budget 256M --threads 1 --unit 4k --duration 5s --against kernel --repeat 3 --json --plot docs/bench-data/fa-pmbench-4k.png (rc=0)
