//! Counters named like /proc/vmstat, kept per region and per pool.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Event counters of one region or of a whole pool (atomics, updated where the
        /// event happens).
        #[derive(Debug, Default)]
        pub struct EventCounters {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A snapshot of the counters plus the pool's gauges.
        #[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
        pub struct Counters {
            $($(#[$doc])* pub $name: u64,)*
            /// Swap slots in use (4 KiB each).
            pub slots_used: u64,
            /// Bytes of region memory mapped now.
            pub resident_bytes: u64,
            /// Bytes of region memory the program locked (mlock) now: resident, never
            /// swapped, outside the budget.
            pub locked_bytes: u64,
            /// Most bytes locked at once (see `locked_bytes`).
            pub peak_locked_bytes: u64,
            /// Bytes held in the swap cache now (clean copies and pages under I/O).
            pub cached_bytes: u64,
            /// Bytes of engine metadata (page maps, swap map, warm frames) counted against
            /// the budget.
            pub metadata_bytes: u64,
            /// Highest resident + cached + metadata seen.
            pub peak_used_bytes: u64,
            /// 2 MiB frames an eviction gave back that a unit read or decode reused (a
            /// unit's read, its packed blob's read buffer, its decompression, also for
            /// writeback): no THP to fault in and zero. Since the pool started.
            pub thp_swpin_recycled: u64,
            /// What the engine may hold now: the budget, or less where the memory
            /// cgroup leaves less room (`memcg`).
            pub budget_limit_bytes: u64,
            /// Swap files this process holds open (its own, and ones inherited at
            /// forks that it still reads).
            pub swap_files_open: u64,
            /// Disk space this process's swap file takes now (its allocated blocks:
            /// it grows as pages are evicted and gives back freed clusters).
            pub swap_disk_bytes: u64,
            /// Most disk space the swap file took at once (sampled when it grows).
            pub peak_swap_disk_bytes: u64,
            /// The cap on the swap file's size (`--max-swap`; a fixed size or a
            /// device's size).
            pub swap_max_bytes: u64,
            /// Times a page needed swap and the swap place was full (at its cap, or
            /// its filesystem out of room): such pages stay resident, over the budget
            /// (said on stderr the first time).
            pub swap_full_events: u64,
            /// Bytes the compressed tier holds now (its pool and metadata).
            pub zswap_pool_bytes: u64,
            /// Bytes of pages stored in the compressed tier now, uncompressed.
            pub zswap_stored_bytes: u64,
            /// Pages the compressed tier keeps as one repeated word (no pool memory).
            pub zswap_same_filled_pages: u64,
            /// Pages the compressed tier holds as they are, uncompressed: they
            /// compress poorly (`PoolBuilder::store_incompressible`; zswap's
            /// `stored_incompressible_pages`).
            pub zswap_stored_incompressible_pages: u64,
            /// Remote tier (gauges of the pool's store): values read and written,
            /// payload bytes, retries after transient errors, failovers seen, values
            /// lost or corrupt, and the round-trip latency of single reads (µs).
            pub remote_reads: u64,
            /// See `remote_reads`.
            pub remote_writes: u64,
            /// See `remote_reads`.
            pub remote_bytes_in: u64,
            /// See `remote_reads`.
            pub remote_bytes_out: u64,
            /// `remote_bytes_out` as stored in the cluster: compressed where lz4 paid.
            pub remote_stored_bytes_out: u64,
            /// See `remote_reads`.
            pub remote_retries: u64,
            /// See `remote_reads`.
            pub remote_failovers: u64,
            /// See `remote_reads`.
            pub remote_lost: u64,
            /// See `remote_reads`.
            pub remote_get_p50_us: u64,
            /// See `remote_reads`.
            pub remote_get_p99_us: u64,
            /// Of `remote_reads`: values a thread read on its own connection to the
            /// primary (not through the store's runtime).
            pub remote_direct_reads: u64,
            /// Inconsistencies the engine found and recovered from (engine bugs:
            /// internal errors, slot double frees, invalid slot operations); 0.
            pub internal_errors: u64,
            /// Pages UFFDIO_MOVE moved without counting them, found by the page map and
            /// counted by the engine (a kernel 6.17+ undercount under compaction; this
            /// process, all pools).
            pub uffd_moves_uncounted: u64,
        }

        impl EventCounters {
            /// Copy the event counters into a snapshot (gauges left zero).
            pub fn snapshot(&self) -> Counters {
                Counters { $($name: self.$name.load(Relaxed),)* ..Default::default() }
            }
        }

        impl Counters {
    /// The compressed tier's ratio: bytes stored over bytes held (0 when empty).
    pub fn zswap_ratio(&self) -> f64 {
        if self.zswap_pool_bytes == 0 {
            0.0
        } else {
            self.zswap_stored_bytes as f64 / self.zswap_pool_bytes as f64
        }
    }

            /// Field-wise sum of the event counters (gauges kept from self).
            pub fn plus(&self, other: &Counters) -> Counters {
                Counters { $($name: self.$name + other.$name,)* ..*self }
            }

            /// Field-wise difference `self - earlier` of the event counters (gauges kept from self).
            pub fn since(&self, earlier: &Counters) -> Counters {
                Counters { $($name: self.$name.saturating_sub(earlier.$name),)* ..*self }
            }
        }
    };
}

counters! {
    /// Pages read from the backend (4 KiB units).
    pswpin,
    /// Pages written to the backend (4 KiB units).
    pswpout,
    /// Pages read ahead (not asked for by a fault).
    swap_ra,
    /// Read-ahead pages found in the swap cache (by their fault, or mapped around
    /// another's: `fault_around`).
    swap_ra_hit,
    /// 2 MiB units written whole to one cluster.
    thp_swpout,
    /// 2 MiB units that could not get a whole cluster and were written as 4 KiB slots.
    thp_swpout_fallback,
    /// 2 MiB units read back whole.
    thp_swpin,
    /// 2 MiB units read back in pieces.
    thp_swpin_fallback,
    /// Faults on a unit swapped out whole that `UnitPolicy::Auto` served in 4 KiB pages
    /// (with readahead), the region's faults looking random: no 2 MiB swap-in.
    thp_swpin_declined,
    /// Fully resident units that `UnitPolicy::Auto` swapped out as 4 KiB pages, the
    /// region's faults looking random: neither one 2 MiB write nor one pool entry.
    thp_swpout_declined,
    /// Units stored whole in the compressed pool that 4 KiB swap-ins split: the
    /// faulting page mapped, the others stored again as pages of their own (counted
    /// once the unit's entry holds none; pages the pool refused wait there).
    zswap_unit_split,
    /// First touches of a whole unit served by a THP the reclaim thread zeroed ahead.
    thp_fault_spare,
    /// Faults that waited for a backend read.
    majflt,
    /// Faults served without backend I/O (first touch, swap cache).
    minflt,
    /// Pages served from the swap cache (by their fault, or mapped around another's).
    swapcache_hit,
    /// Pages mapped from the swap cache after a faulting page of the same unit, without
    /// a fault of their own (filemap's fault-around, for swap).
    fault_around,
    /// Evicted pages faulted on again while their copies were still in the swap cache
    /// (the kernel's `workingset_refault_anon`, for what the cache still held). Many
    /// of them stop reclaim from evicting ahead of need (`reclaim/lists.rs`).
    workingset_refault,
    /// Write-protect faults (first write to a clean page).
    wpflt,
    /// Pages swapped in by a read and mapped dirty (writable, their slots stale) at
    /// once, because the region's reads were being followed by writes
    /// (`fault::WriteTrend`): write-protect faults not taken.
    swpin_mapped_dirty,
    /// Slots freed because their copy went stale (seed 001).
    stale_slot_freed,
    /// Clean pages evicted without a write.
    clean_evicted,
    /// Written pages evicted as zeros: all zero bytes, so no slot and no write, and
    /// the next fault maps zeros without a read (the kernel's `swpout_zero`, its
    /// zeromap since 6.12).
    swpout_zero,
    /// Pages moved out of the region by reclaim.
    evicted,
    /// Backend I/O errors seen (including injected ones).
    io_errors,
    /// Backend writes issued (requests, not pages).
    write_requests,
    /// Backend reads issued (requests, not pages).
    read_requests,
    /// Faults that had to wait for reclaim to make room.
    direct_reclaim,
    /// Pages read back whose bytes did not match their checksum (each try counts).
    swap_csum_fail,
    /// Pages whose bytes were lost (read errors, checksum mismatches after retries):
    /// touching one raises SIGBUS.
    poisoned,
    /// Pages stored in the compressed tier (zswap's zswpout).
    zswpout,
    /// Pages brought back from the compressed tier and mapped (zswap's zswpin).
    zswpin,
    /// Pages written back from the compressed tier to the back tier (zswap's zswpwb).
    zswpwb,
    /// Pages that compress poorly: refused by the compressed tier, or stored there as
    /// they are (`zswap_stored_incompressible_pages`).
    zswap_reject_compress,
    /// Pages the compressed tier refused: its pool was at its share of the budget.
    zswap_reject_full,
}

impl Counters {
    /// Readahead hit rate in percent (0 when nothing was read ahead).
    pub fn ra_hit_pct(&self) -> f64 {
        if self.swap_ra == 0 {
            0.0
        } else {
            100.0 * self.swap_ra_hit as f64 / self.swap_ra as f64
        }
    }
}
