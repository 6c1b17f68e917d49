//! Counters named like /proc/vmstat, kept per region and per pool.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Whether a field only grows (a Prometheus counter) or goes up and down (a gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Counts events since the pool started.
    Counter,
    /// A value now (or a peak).
    Gauge,
}

/// One field of [`Counters`], from the one list that defines them: what `--stats`,
/// the live files (`live.rs`) and the Prometheus exposition name and explain.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The field's name: in `--stats` JSON, Python's dict, `uswap stat`.
    pub name: &'static str,
    /// The Prometheus metric name (`uswap_` prefix; unit and `_total` suffixes).
    pub metric: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// The field's documentation, on one line.
    pub help: &'static str,
}

macro_rules! metric_name {
    ($name:ident, counter) => {
        concat!("uswap_", stringify!($name), "_total")
    };
    ($name:ident, counter, $m:literal) => {
        concat!("uswap_", $m, "_total")
    };
    ($name:ident, gauge) => {
        concat!("uswap_", stringify!($name))
    };
    ($name:ident, gauge, $m:literal) => {
        concat!("uswap_", $m)
    };
}

macro_rules! kind {
    (counter) => {
        Kind::Counter
    };
    (gauge) => {
        Kind::Gauge
    };
}

macro_rules! counters {
    (
        events {
            $($(#[doc = $edoc:literal])* $ename:ident $(as $emetric:literal)?,)*
        }
        gauges {
            $($(#[doc = $gdoc:literal])* $gname:ident: $gkind:ident $(as $gmetric:literal)?,)*
        }
    ) => {
        /// Event counters of one region or of a whole pool (atomics, updated where the
        /// event happens).
        #[derive(Debug, Default)]
        pub struct EventCounters {
            $($(#[doc = $edoc])* pub $ename: AtomicU64,)*
        }

        /// A snapshot of the counters plus the pool's gauges.
        #[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $edoc])* pub $ename: u64,)*
            $($(#[doc = $gdoc])* pub $gname: u64,)*
        }

        impl EventCounters {
            /// Copy the event counters into a snapshot (gauges left zero).
            pub fn snapshot(&self) -> Counters {
                Counters { $($ename: self.$ename.load(Relaxed),)* ..Default::default() }
            }
        }

        impl Counters {
            /// Every field, in declaration order (the order of [`Counters::values`]).
            pub const FIELDS: &'static [Field] = &[
                $(Field {
                    name: stringify!($ename),
                    metric: metric_name!($ename, counter $(, $emetric)?),
                    kind: Kind::Counter,
                    help: concat!($($edoc),*),
                },)*
                $(Field {
                    name: stringify!($gname),
                    metric: metric_name!($gname, $gkind $(, $gmetric)?),
                    kind: kind!($gkind),
                    help: concat!($($gdoc),*),
                },)*
            ];

            /// The fields' values in [`Counters::FIELDS`] order.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$ename,)* $(self.$gname,)*]
            }

            /// Counters from values in [`Counters::FIELDS`] order (missing ones 0).
            pub fn from_values(v: &[u64]) -> Counters {
                let mut it = v.iter().copied();
                Counters {
                    $($ename: it.next().unwrap_or(0),)*
                    $($gname: it.next().unwrap_or(0),)*
                }
            }

            /// Field-wise sum of the event counters (gauges kept from self).
            pub fn plus(&self, other: &Counters) -> Counters {
                Counters { $($ename: self.$ename + other.$ename,)* ..*self }
            }

            /// Field-wise difference `self - earlier` of the event counters (gauges kept from self).
            pub fn since(&self, earlier: &Counters) -> Counters {
                Counters { $($ename: self.$ename.saturating_sub(earlier.$ename),)* ..*self }
            }
        }
    };
}

counters! {
    events {
        /// Pages read from the backend (4 KiB units).
        pswpin as "swap_in_pages",
        /// Pages written to the backend (4 KiB units).
        pswpout as "swap_out_pages",
        /// Pages read ahead (not asked for by a fault).
        swap_ra as "readahead_pages",
        /// Read-ahead pages found in the swap cache (by their fault, or mapped around
        /// another's: `fault_around`).
        swap_ra_hit as "readahead_hit_pages",
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
        majflt as "major_faults",
        /// Faults served without backend I/O (first touch, swap cache).
        minflt as "minor_faults",
        /// Pages served from the swap cache (by their fault, or mapped around another's).
        swapcache_hit as "swap_cache_hit_pages",
        /// Pages mapped from the swap cache after a faulting page of the same unit, without
        /// a fault of their own (filemap's fault-around, for swap).
        fault_around as "fault_around_pages",
        /// Evicted pages faulted on again while their copies were still in the swap cache
        /// (the kernel's `workingset_refault_anon`, for what the cache still held). Many
        /// of them stop reclaim from evicting ahead of need (`reclaim/lists.rs`).
        workingset_refault as "refault_pages",
        /// Write-protect faults (first write to a clean page).
        wpflt as "write_protect_faults",
        /// Pages swapped in by a read and mapped dirty (writable, their slots stale) at
        /// once, because the region's reads were being followed by writes
        /// (`fault::WriteTrend`): write-protect faults not taken.
        swpin_mapped_dirty as "swap_in_mapped_dirty_pages",
        /// Slots freed because their copy went stale (seed 001).
        stale_slot_freed as "stale_slots_freed",
        /// Clean pages evicted without a write.
        clean_evicted as "clean_evicted_pages",
        /// Written pages evicted as zeros: all zero bytes, so no slot and no write, and
        /// the next fault maps zeros without a read (the kernel's `swpout_zero`, its
        /// zeromap since 6.12).
        swpout_zero as "zero_evicted_pages",
        /// Pages moved out of the region by reclaim.
        evicted as "evicted_pages",
        /// Backend I/O errors seen (including injected ones).
        io_errors,
        /// Backend writes issued (requests, not pages).
        write_requests,
        /// Backend reads issued (requests, not pages).
        read_requests,
        /// Faults that had to wait for reclaim to make room.
        direct_reclaim as "direct_reclaim_faults",
        /// Pages read back whose bytes did not match their checksum (each try counts).
        swap_csum_fail as "checksum_failed_pages",
        /// Pages whose bytes were lost (read errors, checksum mismatches after retries):
        /// touching one raises SIGBUS.
        poisoned as "poisoned_pages",
        /// Pages stored in the compressed tier (zswap's zswpout).
        zswpout as "compressed_store_pages",
        /// Pages brought back from the compressed tier and mapped (zswap's zswpin).
        zswpin as "compressed_load_pages",
        /// Pages written back from the compressed tier to the back tier (zswap's zswpwb).
        zswpwb as "compressed_writeback_pages",
        /// Units written back from the compressed tier packed: their compressed bytes in
        /// one write, fewer blocks than pages (their pages count in `zswpwb` too).
        zswpwb_packed_units as "compressed_writeback_packed_units",
        /// Pages that compress poorly: refused by the compressed tier, or stored there as
        /// they are (`zswap_stored_incompressible_pages`).
        zswap_reject_compress,
        /// Pages the compressed tier refused: its pool was at its share of the budget.
        zswap_reject_full,
    }
    gauges {
        /// Swap slots in use (4 KiB each).
        slots_used: gauge as "swap_slots_used",
        /// Bytes of region memory mapped now.
        resident_bytes: gauge,
        /// Bytes of region memory the program locked (mlock) now: resident, never
        /// swapped, outside the budget.
        locked_bytes: gauge,
        /// Most bytes locked at once (see `locked_bytes`).
        peak_locked_bytes: gauge,
        /// Bytes held in the swap cache now (clean copies and pages under I/O).
        cached_bytes: gauge,
        /// Bytes of engine metadata (page maps, swap map, warm frames) counted against
        /// the budget.
        metadata_bytes: gauge,
        /// Highest resident + cached + metadata seen.
        peak_used_bytes: gauge,
        /// 2 MiB frames an eviction gave back that a unit read or decode reused (a
        /// unit's read, its packed blob's read buffer, its decompression, also for
        /// writeback): no THP to fault in and zero. Since the pool started.
        thp_swpin_recycled: counter,
        /// What the engine may hold now: the budget, or less where the memory
        /// cgroup leaves less room (`memcg`).
        budget_limit_bytes: gauge,
        /// The budget asked for now: as the pool started, or as changed since
        /// (`Pool::set_budget`, `uswap set`).
        budget_bytes: gauge,
        /// The most the budget may be raised to while the pool runs: the budget it
        /// started with.
        budget_max_bytes: gauge,
        /// Faults that went over the budget because nothing could be reclaimed then
        /// (pages pinned, writes refused or paused).
        over_budget_events: counter,
        /// Swap files this process holds open (its own, and ones inherited at
        /// forks that it still reads).
        swap_files_open: gauge,
        /// Disk space this process's swap file takes now (its allocated blocks:
        /// it grows as pages are evicted and gives back freed clusters).
        swap_disk_bytes: gauge,
        /// Most disk space the swap file took at once (sampled when it grows).
        peak_swap_disk_bytes: gauge,
        /// The cap on the swap file's size (`--max-swap`; a fixed size or a
        /// device's size).
        swap_max_bytes: gauge,
        /// Times a page needed swap and the swap place was full (at its cap, or
        /// its filesystem out of room): such pages stay resident, over the budget
        /// (said on stderr the first time).
        swap_full_events: counter,
        /// Bytes the compressed tier holds now (its pool and metadata).
        zswap_pool_bytes: gauge,
        /// Bytes of pages stored in the compressed tier now, uncompressed.
        zswap_stored_bytes: gauge,
        /// Pages the compressed tier keeps as one repeated word (no pool memory).
        zswap_same_filled_pages: gauge,
        /// Pages the compressed tier holds as they are, uncompressed: they
        /// compress poorly (`PoolBuilder::store_incompressible`; zswap's
        /// `stored_incompressible_pages`).
        zswap_stored_incompressible_pages: gauge,
        /// Values the remote tier read from its cluster.
        remote_reads: counter,
        /// Values the remote tier wrote to its cluster.
        remote_writes: counter,
        /// Payload bytes the remote tier read.
        remote_bytes_in: counter as "remote_read_bytes",
        /// Payload bytes the remote tier wrote.
        remote_bytes_out: counter as "remote_written_bytes",
        /// `remote_bytes_out` as stored in the cluster: compressed where lz4 paid.
        remote_stored_bytes_out: counter as "remote_stored_written_bytes",
        /// Remote operations retried after transient errors.
        remote_retries: counter,
        /// Failovers of the remote cluster seen.
        remote_failovers: counter,
        /// Remote values lost or found corrupt.
        remote_lost: counter,
        /// Median round-trip latency of single remote reads (µs).
        remote_get_p50_us: gauge as "remote_get_p50_microseconds",
        /// 99th percentile round-trip latency of single remote reads (µs).
        remote_get_p99_us: gauge as "remote_get_p99_microseconds",
        /// Of `remote_reads`: values a thread read on its own connection to the
        /// primary (not through the store's runtime).
        remote_direct_reads: counter,
        /// Inconsistencies the engine found and recovered from (engine bugs:
        /// internal errors, slot double frees, invalid slot operations); 0.
        internal_errors: counter,
        /// Pages UFFDIO_MOVE moved without counting them, found by the page map and
        /// counted by the engine (a kernel 6.17+ undercount under compaction; this
        /// process, all pools).
        uffd_moves_uncounted: counter,
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

    /// Readahead hit rate in percent (0 when nothing was read ahead).
    pub fn ra_hit_pct(&self) -> f64 {
        if self.swap_ra == 0 {
            0.0
        } else {
            100.0 * self.swap_ra_hit as f64 / self.swap_ra as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus names: unique, `[a-z0-9_]`, counters (only) ending in `_total`; and
    /// values survive the round trip through the fields' order.
    #[test]
    fn fields_name_every_value_once() {
        let mut seen = std::collections::HashSet::new();
        for f in Counters::FIELDS {
            assert!(seen.insert(f.metric), "{} twice", f.metric);
            assert!(f
                .metric
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            assert_eq!(
                f.kind == Kind::Counter,
                f.metric.ends_with("_total"),
                "{}",
                f.metric
            );
            assert!(!f.help.trim().is_empty(), "{} has no help", f.name);
        }
        let v: Vec<u64> = (1..=Counters::FIELDS.len() as u64).collect();
        let c = Counters::from_values(&v);
        assert_eq!(c.values(), v);
        let json = serde_json::to_value(c).unwrap();
        for (f, want) in Counters::FIELDS.iter().zip(&v) {
            assert_eq!(json[f.name].as_u64(), Some(*want), "{}", f.name);
        }
    }
}
