//! `uswap bench --against kernel|zram|zswap`: the same workload on kernel swap and on uswap.
