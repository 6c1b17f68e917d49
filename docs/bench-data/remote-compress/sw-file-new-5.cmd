/tmp/rz/uswap-new bench swap-w-seq --size 1G --budget 256M --unit 2m --json
