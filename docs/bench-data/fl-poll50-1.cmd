./target/release/uswap bench fault-latency --size 512M --budget 128M --fault-mode handler --io-poll-us 50 --json (rc=0)
