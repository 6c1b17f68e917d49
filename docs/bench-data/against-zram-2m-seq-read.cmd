./target/release/uswap bench seq-read --size 512M --budget 128M --unit 2m --duration 10s --against zram --repeat 3 --json --plot /tmp/sitting2/against-zram-2m-seq-read.png (rc=0)
