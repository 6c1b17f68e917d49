./target/release/uswap bench seq-read --size 512M --budget 128M --unit 2m --duration 5s --against kernel --repeat 3 --json --plot /tmp/bench-new2/against-kernel-2m-seq-read.png (rc=0)
