./target/release/uswap run --against kernel --budget 256M --repeat 3 --unit 4k --json --log-dir /tmp/unitdef/node-4k -- node crates/uswap-cli/tests/progs/bufs.js 1024 (rc=0)
