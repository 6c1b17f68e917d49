./target/release/uswap bench pmbench --size 1G --budget 256M --unit 4k --duration 5s --encrypt --json (rc=0)
