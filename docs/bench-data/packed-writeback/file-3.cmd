 /tmp/uswap-packed bench swap-w-seq --size 1G --budget 256M --unit 2m --tier file --json
