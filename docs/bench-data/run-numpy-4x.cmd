./target/release/uswap run --budget 256M --against kernel --repeat 3 --direct --json -- target/py-venv/bin/python python/bench/numpy_4x.py --budget 256M --json (rc=0)
