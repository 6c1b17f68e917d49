./target/release/uswap bench seq-read --size 1G --budget 256M --unit 4k --against kernel --repeat 3 --json --plot docs/bench-data/fa-seq-read-4k.png (rc=0)
