./target/release/uswap run --against kernel --budget 128M --repeat 3 --unit 2m --json --log-dir /tmp/unitdef/py-2m -- python3 crates/uswap-cli/tests/progs/fill.py 512 (rc=0)
