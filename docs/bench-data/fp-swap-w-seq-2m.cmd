./target/release/uswap bench swap-w-seq --size 1G --budget 256M --unit 2m --against kernel --repeat 3 --json --plot docs/bench-data/fp-swap-w-seq-2m.png (rc=0)
