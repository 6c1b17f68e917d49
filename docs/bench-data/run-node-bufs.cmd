./target/release/uswap run --budget 256M --against kernel --repeat 3 --json -- node crates/uswap-cli/tests/progs/bufs.js (rc=0)
