./target/release/uswap bench swap-w-seq --size 512M --budget 128M --unit 2m --duration 5s --against kernel --repeat 3 --json --plot /tmp/bench-new2/against-kernel-2m-swap-w-seq.png (rc=0)
