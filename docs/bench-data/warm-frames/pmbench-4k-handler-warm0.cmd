USWAP_WARM_FRAMES=0 uswap bench pmbench --size 1G --budget 256M --unit 4k --fault-mode handler --against kernel --repeat 3 --duration 5s --json --plot pmbench-4k-handler-warm0.png
2026-11-24T05:49:12Z
