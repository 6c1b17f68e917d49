./target/release/uswap bench swap-w-seq --size 1G --budget 256M --unit 4k --against kernel --repeat 3 --json --plot docs/bench-data/fp-swap-w-seq-4k.png (rc=0)
