USWAP_REMOTE_COMPRESS=off /tmp/rz/uswap-new bench swap-w-seq --size 1G --budget 256M --unit 2m --tier remote --remote redis://127.0.0.1:22500 --json
