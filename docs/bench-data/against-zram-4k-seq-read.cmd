./target/release/uswap bench seq-read --size 512M --budget 128M --unit 4k --duration 5s --against zram --repeat 3 --json --plot /tmp/bench-new2/against-zram-4k-seq-read.png (rc=0)
