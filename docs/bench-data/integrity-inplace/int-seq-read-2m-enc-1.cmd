./target/release/uswap bench seq-read --size 1G --budget 256M --unit 2m --encrypt --json (rc=0)
