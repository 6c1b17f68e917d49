//! Counters and gauges of a pool, and the snapshot [`ZpoolStats`] that reports them.
//!
//! Gauges (entries and bytes stored now) go up on store and down on free; events only
//! go up. All are relaxed atomics updated where the event happens: a snapshot taken
//! while other threads work is each field's value at some instant, not one instant.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The atomics behind [`ZpoolStats`].
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($(#[$doc])* pub(crate) $name: AtomicU64,)*
        }

        /// A snapshot of a pool's counters and gauges ([`Zpool::stats`](crate::Zpool::stats)).
        #[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
        pub struct ZpoolStats {
            $($(#[$doc])* pub $name: u64,)*
            /// Bytes of backing memory held now: the zspages (every page resident).
            pub pool_bytes: u64,
            /// Heap bytes of bookkeeping held now: handle tables, zspage bitmaps, unit
            /// records, unit scratch buffers, the classes. Charge `pool_bytes +
            /// metadata_bytes`.
            pub metadata_bytes: u64,
            /// The byte limit that `pool_bytes + metadata_bytes` may not pass.
            pub limit_bytes: u64,
            /// Objects stored (pages, and unit chunks that were not same-filled).
            pub objects: u64,
            /// Bytes of the slots those objects occupy (class size each).
            pub object_bytes: u64,
            /// Zspages held.
            pub zspages: u64,
            /// Bytes of zspages that hold no object (free slots and slot tails):
            /// `pool_bytes − object_bytes`.
            pub fragmented_bytes: u64,
            /// Bytes that [`Zpool::compact`](crate::Zpool::compact) could free now.
            pub compactable_bytes: u64,
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> ZpoolStats {
                ZpoolStats { $($name: self.$name.load(Relaxed),)* ..Default::default() }
            }
        }
    };
}

counters! {
    /// Pages (4 KiB entries) stored now, same-filled ones included.
    stored_pages,
    /// Units (2 MiB entries) stored now, same-filled ones included.
    stored_units,
    /// Of `stored_pages`, those kept as a same-filled word.
    same_filled_pages,
    /// Of `stored_units`, those kept as a same-filled word.
    same_filled_units,
    /// Of `stored_pages`, those stored as they are, uncompressed
    /// ([`Zpool::store_page_raw`](crate::Zpool::store_page_raw); zswap's
    /// `stored_incompressible_pages`).
    incompressible_pages,
    /// Uncompressed bytes of everything stored now.
    stored_bytes,
    /// Bytes those take compressed (raw for incompressible unit chunks and pages stored
    /// as they are; 0 for same-filled), without object headers.
    compressed_bytes,
    /// Stores refused because the data compressed over the threshold (a page the
    /// caller then stores as it is, [`Zpool::store_page_raw`](crate::Zpool::store_page_raw),
    /// counts here too).
    reject_poor_compression,
    /// Stores refused because the pool was at its limit.
    reject_pool_full,
    /// Stores that succeeded (pages and units).
    stores,
    /// Loads that succeeded.
    loads,
    /// Frees that succeeded.
    frees,
    /// Loads that found damaged data (checksum or decompression failed).
    corrupt_loads,
    /// Calls of `compact`.
    compactions,
    /// Pages freed by compaction.
    compacted_pages,
}

impl ZpoolStats {
    /// Uncompressed over compressed bytes (zram's ratio: same-filled data counts as
    /// stored in 0 bytes). 0 when nothing is compressed.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.stored_bytes, self.compressed_bytes)
    }

    /// Uncompressed bytes over all memory the pool holds (zspages and metadata): what
    /// the memory saving really is. 0 when the pool holds nothing.
    pub fn effective_ratio(&self) -> f64 {
        ratio(self.stored_bytes, self.pool_bytes + self.metadata_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(c: &AtomicU64, n: u64) {
        c.fetch_sub(n, Relaxed);
    }
}
