./target/release/uswap bench swap-w-rand --size 512M --budget 128M --unit 4k --duration 10s --against kernel --repeat 3 --json --plot /tmp/sitting2/against-kernel-4k-swap-w-rand.png (rc=0)
