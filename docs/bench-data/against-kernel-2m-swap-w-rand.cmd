./target/release/uswap bench swap-w-rand --size 512M --budget 128M --unit 2m --duration 10s --against kernel --repeat 3 --json --plot /tmp/sitting2/against-kernel-2m-swap-w-rand.png (rc=0)
