./target/release/uswap bench seq-read --size 512M --budget 128M --unit 4k --duration 10s --against zram --repeat 3 --json --plot /tmp/sitting2/against-zram-4k-seq-read.png (rc=0)
