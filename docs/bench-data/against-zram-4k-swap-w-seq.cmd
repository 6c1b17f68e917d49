./target/release/uswap bench swap-w-seq --size 512M --budget 128M --unit 4k --duration 10s --against zram --repeat 3 --json --plot /tmp/sitting2/against-zram-4k-swap-w-seq.png (rc=0)
