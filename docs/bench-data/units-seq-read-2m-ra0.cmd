./target/release/uswap bench seq-read --size 2G --budget 256M --unit 2m --ra-units 0 --json (rc=0)
