./target/release/uswap bench pmbench --size 512M --budget 128M --unit 2m --duration 10s --against zram --repeat 3 --json --plot /tmp/sitting2/against-zram-2m-pmbench.png (rc=0)
