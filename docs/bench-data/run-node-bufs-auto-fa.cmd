./target/release/uswap run --against kernel --budget 256M --repeat 3 --unit auto --json --log-dir /tmp/fa/f-node-auto -- node crates/uswap-cli/tests/progs/bufs.js 1024 (rc=0)
