./target/release/uswap bench pmbench --size 1G --budget 535M --unit 4k --duration 5s --data mixed --tier compressed --compressed-max 90 --json
