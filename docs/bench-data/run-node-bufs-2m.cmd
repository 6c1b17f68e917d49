./target/release/uswap run --against kernel --budget 256M --repeat 3 --unit 2m --json --log-dir /tmp/unitdef/node-2m -- node crates/uswap-cli/tests/progs/bufs.js 1024 (rc=0)
