//! The engine: what a pool's threads share, one owner per concept.
//!
//! | field | concept | module |
//! |---|---|---|
//! | `budget` | the budget, its gauges and reservations | `budget.rs` |
//! | `frames` | where pages live while out of their region | `frames.rs` |
//! | `cache` | slot → copy being read, written, or kept clean | `swap_cache.rs` |
//! | `slots` | the slot allocator (clusters, per-thread cursors) | `slots.rs` |
//! | `tiers` | where swapped bytes go; per-slot records | `tier/` |
//! | `regions` | the live regions, committed swap | `regions.rs` |
//! | `lists` | reclaim's CLOCK of units and list of clean copies | `reclaim/` |
//! | `writeback` | whether writes may start, what was said | `writeback.rs` |
//! | `spares` | zeroed THPs made ahead for first touch | `spare.rs` |
//! | `fork` | quiescing for fork, children's references | `fork.rs` |
//! | `threads` | fault threads, the reclaim thread, shutdown | `threads.rs` |
//!
//! Data flows one way: a fault enters (`fault/`), finds its page through the swap
//! cache or a tier, and leaves mapped; reclaim (`reclaim/`) goes the other way, into
//! frames and through writeback to a tier.

use crate::budget::Budget;
use crate::error::{Error, Result};
use crate::frames::Frames;
use crate::pagemap::RegionInner;
use crate::pool::PoolBuilder;
use crate::readahead::ClusterReadahead;
use crate::reclaim::ReclaimLists;
use crate::regions::Regions;
use crate::slots::{AllocPolicy, SlotAllocator};
use crate::stats::Counters;
use crate::swap_cache::SwapCache;
use crate::sys::mem::{mem_total, Zapper};
use crate::sys::uffd::Uffd;
use crate::threads::Threads;
use crate::tier::file::SwapFile;
use crate::tier::{Op, Tiers};
use crate::writeback::Writeback;
use crate::{DeviceKind, PAGE_SIZE, UNIT_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};

/// Shared engine state.
pub struct Engine {
    pub(crate) cfg: PoolBuilder,
    /// The pool's userfaultfd: regions served by the fault threads, and the frames.
    pub(crate) uffd: Arc<Uffd>,
    /// The userfaultfd of regions whose faults are served in the faulting thread
    /// (made with the first such region).
    pub(crate) uffd_in_thread: std::sync::OnceLock<Arc<Uffd>>,
    pub(crate) budget: Budget,
    pub(crate) frames: Frames,
    pub(crate) cache: SwapCache,
    pub(crate) slots: SlotAllocator,
    pub(crate) tiers: Tiers,
    pub(crate) regions: Regions,
    pub(crate) lists: ReclaimLists,
    pub(crate) writeback: Writeback,
    pub(crate) spares: crate::spare::Spares,
    pub(crate) fork: crate::fork::ForkState,
    pub(crate) threads: Threads,
    pub(crate) cluster_ra: ClusterReadahead,
    /// Frees pages of our own mappings (batched MADV_DONTNEED).
    pub(crate) zapper: Zapper,
    pub(crate) diag: Diagnostics,
    /// The memory cgroup the budget follows (`memcg`), if one limits the process.
    pub(crate) memcg: Option<crate::memcg::Follow>,
    /// Where the pool publishes its counters for other processes (`live.rs`).
    pub(crate) live: crate::live::Live,
}

/// Every engine of this process, for the fork hooks.
pub(crate) static ENGINES: Mutex<Vec<std::sync::Weak<Engine>>> = Mutex::new(Vec::new());

/// The engines alive now.
pub(crate) fn live_engines() -> Vec<Arc<Engine>> {
    ENGINES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|w| w.upgrade())
        .collect()
}

impl Engine {
    /// A pool or region handle ends; with the last one the threads stop and the remote
    /// tier's values go, except those a live forked child may still read (left to it).
    /// (Not in `Drop`: in a forked child, the parent's threads' references to the engine
    /// were copied and are never dropped.)
    pub(crate) fn drop_user(&self) {
        if self.threads.drop_user() {
            self.close_remote();
        }
    }

    /// The remote tier's values go, except those a live forked child may still read.
    pub(crate) fn close_remote(&self) {
        if let Some(r) = &self.tiers.remote {
            r.close(crate::fork::live_children(self));
        }
    }

    /// Open everything and start the threads. The caller becomes the first user.
    pub(crate) fn start(cfg: PoolBuilder) -> Result<Arc<Engine>> {
        // Threads started here (the engine's, the remote tier's runtime) inherit this
        // mask: the program's signals never run its handlers on them.
        let _signals = crate::sys::mem::SignalsHeld::new();
        let min_budget = 4 * UNIT_SIZE as u64;
        if cfg.budget < min_budget {
            return Err(Error::BudgetTooSmall {
                budget: cfg.budget,
                minimum: min_budget,
                why: "room for a few 2 MiB units besides the swap cache and metadata".into(),
            });
        }
        if let Some(ram) = mem_total() {
            if cfg.budget > ram {
                return Err(Error::BudgetExceedsRam {
                    budget: cfg.budget,
                    ram,
                });
            }
        }
        let max_swap = cfg
            .max_swap
            .check()
            .map_err(|what| Error::InvalidSetting { what })?;
        let uffd = Uffd::open()?;
        let swap = SwapFile::open_capped(
            cfg.swap_file.as_deref(),
            cfg.swap_size,
            max_swap,
            cfg.keep_free,
        )?;
        let rotational = match cfg.device_kind {
            DeviceKind::Ssd => false,
            DeviceKind::Rotational => true,
            DeviceKind::Auto => swap.rotational().unwrap_or(false),
        };
        let policy = if rotational {
            AllocPolicy::Rotational
        } else {
            AllocPolicy::Ssd
        };
        // Tables are sized for the largest swap this pool may grow to.
        let max_slots = match swap.fixed_size() {
            Some(f) => f / PAGE_SIZE as u64,
            None => fs_size(&swap).unwrap_or(1 << 40) / PAGE_SIZE as u64,
        };
        let slots = SlotAllocator::new(swap.capacity() / PAGE_SIZE as u64, policy);
        let compressed = match cfg.tier {
            crate::TierKind::File => None,
            crate::TierKind::Remote => None,
            t => Some(crate::tier::compressed::Compressed::new(
                cfg.compressor,
                cfg.budget / 100
                    * cfg
                        .compressed_max_percent
                        .unwrap_or(t.default_compressed_max_percent()) as u64,
                max_slots,
                t.has_writeback(),
                cfg.store_incompressible.unwrap_or(true),
            )?),
        };
        let back_writes = cfg.tier != crate::TierKind::Compressed;
        let remote = match cfg.tier {
            crate::TierKind::Remote | crate::TierKind::CompressedRemote => {
                let nodes = cfg.remote.as_deref().ok_or_else(|| Error::Remote {
                    what: "the remote tier needs the cluster's address (--remote \
                           redis://HOST:PORT[,HOST:PORT...])"
                        .into(),
                })?;
                Some(crate::tier::remote::connect(nodes)?)
            }
            _ => None,
        };
        let seal = match cfg.encrypt {
            true => Some(crate::tier::seal::Sealer::new(max_slots)?),
            false => None,
        };
        let frames = Frames::new(cfg.budget)?;
        frames.register(&uffd).map_err(|source| Error::Sys {
            op: "UFFDIO_REGISTER (swap-cache frames)",
            source,
        })?;
        let engine = Arc::new(Engine {
            uffd: Arc::new(uffd),
            uffd_in_thread: std::sync::OnceLock::new(),
            // A compressed tier's stores need room at the limit.
            budget: Budget::new(
                cfg.budget,
                compressed.as_ref().map_or(0, |c| c.reclaim_reserve()),
            ),
            frames,
            cache: SwapCache::new(max_slots),
            slots,
            tiers: Tiers::new(
                swap,
                compressed,
                remote,
                back_writes,
                max_slots,
                seal,
                cfg.checksums,
            ),
            regions: Regions::new(),
            lists: ReclaimLists::default(),
            writeback: Writeback::new(),
            spares: crate::spare::Spares::new(cfg.budget)?,
            fork: crate::fork::ForkState::new(),
            threads: Threads::new(cfg.fault_threads)?,
            cluster_ra: ClusterReadahead::new(),
            zapper: Zapper::new(),
            diag: Diagnostics::default(),
            memcg: cfg.follow_memcg.then(crate::memcg::Follow::open).flatten(),
            live: crate::live::Live::new(cfg.live),
            cfg,
        });
        crate::memcg::follow(&engine);
        // Warm frames hold memory whenever they are full: charged for the pool's life.
        engine.budget.reserve_metadata(engine.frames.warm_bytes());
        engine.budget.commit_metadata(engine.frames.warm_bytes());
        if let Some(c) = &engine.tiers.compressed {
            // What the pool holds from the start (its tables, a unit store's buffer).
            crate::tier::compressed::charge_pool(&engine, c);
        }
        Threads::spawn(&engine)?;
        if engine.cfg.fork_hooks {
            crate::fork::register_hooks();
        }
        let mut g = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|w| w.strong_count() > 0);
        g.push(Arc::downgrade(&engine));
        Ok(engine)
    }

    /// After a region's metadata was reserved: wait until reclaim brought usage under
    /// the limit (bounded), then charge the metadata. The budget holds at every
    /// instant: the reserve lowered the limit before the metadata counts as used.
    /// Called outside `enter` (it waits on the reclaim thread, which a pending fork
    /// would hold back).
    pub(crate) fn commit_metadata(&self, r: &RegionInner) {
        let t = std::time::Instant::now();
        // Faults in progress reserved their room under the old limit: wait for them too
        // (not while writes pause and reclaim found nothing: swap full, the page map
        // goes over budget with the pages; waiting 10 s for each new region made a
        // program of four 256 MiB blocks take 32.7 s instead of 1.6 s).
        while self.budget.promised_pages() > self.budget.limit_pages()
            && t.elapsed() < std::time::Duration::from_secs(10)
            && !self.writeback.reclaim_futile()
        {
            self.threads.wake_kswapd();
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        self.budget.commit_metadata(r.metadata_bytes);
    }

    /// The budget asked for becomes `bytes` (`Pool::set_budget`): the limit follows at
    /// once, as when the memory cgroup leaves less room, and reclaim evicts down to it.
    pub(crate) fn set_budget(&self, bytes: u64) -> Result<()> {
        let (min, max) = (4 * UNIT_SIZE as u64, self.budget.bytes());
        if bytes < min || bytes > max {
            return Err(Error::InvalidSetting {
                what: format!(
                    "budget {}: a running pool's budget may go from {} to {} (the budget \
                     it started with; start it with a bigger one to grow past that)",
                    crate::format_size(bytes),
                    crate::format_size(min),
                    crate::format_size(max)
                ),
            });
        }
        self.budget.set_requested(bytes);
        if let Some(c) = &self.tiers.compressed {
            c.follow_limit(self.budget.effective_bytes(), self.budget.bytes());
        }
        self.threads.wake_kswapd();
        Ok(())
    }

    /// Totals over live and dropped regions, with the gauges.
    pub(crate) fn counters(&self) -> Counters {
        let _a = self.fork.enter_from_program();
        self.with_gauges(self.regions.counters())
    }

    /// `c` with the pool's gauges filled in.
    pub(crate) fn with_gauges(&self, mut c: Counters) -> Counters {
        use crate::budget::Gauge;
        let pages = |g| self.budget.pages_in(g).max(0) as u64 * PAGE_SIZE as u64;
        c.slots_used = self.slots.used();
        c.resident_bytes = pages(Gauge::Resident);
        c.cached_bytes = pages(Gauge::Cached);
        c.locked_bytes = self.budget.locked_pages().max(0) as u64 * PAGE_SIZE as u64;
        c.peak_locked_bytes = self.budget.locked_peak_pages().max(0) as u64 * PAGE_SIZE as u64;
        c.metadata_bytes = self.budget.metadata_bytes().0;
        c.peak_used_bytes = self.budget.peak_bytes();
        c.thp_swpin_recycled = self.frames.huge_recycled();
        c.budget_limit_bytes = self.budget.effective_bytes();
        c.budget_bytes = self.budget.requested_bytes();
        c.budget_max_bytes = self.budget.bytes();
        c.over_budget_events = self.diag.over_budget_events.load(Relaxed);
        c.swap_files_open = self.tiers.file().open_files() as u64;
        c.swap_disk_bytes = self.tiers.file().disk_bytes();
        c.peak_swap_disk_bytes = self.tiers.file().peak_disk_bytes().max(c.swap_disk_bytes);
        c.swap_max_bytes = self.tiers.file().max_bytes();
        c.swap_full_events = self.writeback.full_events();
        if let Some(rc) = self.tiers.remote.as_ref().and_then(|r| r.counters()) {
            c.remote_reads = rc.reads;
            c.remote_writes = rc.writes;
            c.remote_bytes_in = rc.bytes_in;
            c.remote_bytes_out = rc.bytes_out;
            c.remote_stored_bytes_out = rc.stored_bytes_out;
            c.remote_retries = rc.retries;
            c.remote_failovers = rc.failovers_seen;
            c.remote_lost = rc.lost + rc.corrupt;
            c.remote_get_p50_us = rc.get_latency.p50_us;
            c.remote_get_p99_us = rc.get_latency.p99_us;
            c.remote_direct_reads = rc.direct_reads;
        }
        if let Some(z) = &self.tiers.compressed {
            let st = z.stats();
            c.zswap_pool_bytes = st.pool_bytes + st.metadata_bytes;
            c.zswap_stored_bytes = st.stored_bytes;
            c.zswap_same_filled_pages = st.same_filled_pages + 512 * st.same_filled_units;
            c.zswap_stored_incompressible_pages = st.incompressible_pages;
        }
        c.internal_errors =
            self.diag.internal.load(Relaxed) + self.slots.double_frees() + self.slots.invalid_ops();
        c.uffd_moves_uncounted = crate::sys::uffd::moves_uncounted();
        c
    }

    /// What `Pool::check_invariants` reports: inconsistencies the engine counted, dead
    /// threads, and (when no region is alive and no I/O is in flight) leaks. The flag:
    /// no region is alive but I/O is still in flight (the leak check was not made).
    /// Insert the entry of a slot whose cache claim the caller holds (the slot is its
    /// page's, under the unit lock): an entry already there is an engine bug, said once.
    pub(crate) fn cache_insert(
        &self,
        what: &str,
        slot: crate::slots::Slot,
        entry: crate::swap_cache::Entry,
    ) {
        if !self.cache.insert(slot, entry) {
            self.diag.internal(&format!(
                "{what}: slot {slot} already has a swap cache entry ({:?})",
                self.cache.get(slot)
            ));
        }
    }

    pub(crate) fn invariant_errors(&self) -> (Vec<String>, bool) {
        use crate::budget::Gauge;
        let mut bad = Vec::new();
        let internal = self.diag.internal.load(Relaxed);
        if internal > 0 {
            bad.push(format!(
                "{internal} internal errors (first: {})",
                self.diag.first()
            ));
        }
        let df = self.slots.double_frees();
        if df > 0 {
            bad.push(format!("{df} slot double frees"));
        }
        let dff = self.frames.double_frees.load(Relaxed);
        if dff > 0 {
            bad.push(format!("{dff} frames given back while free"));
        }
        let inv = self.slots.invalid_ops();
        if inv > 0 {
            bad.push(format!("{inv} invalid slot operations"));
        }
        bad.extend(self.threads.dead());
        let no_regions = self.regions.all().is_empty();
        let io_busy = self.tiers.inflight.requests.load(Relaxed) != 0;
        if no_regions && !io_busy {
            let leaked = self.slots.used().saturating_sub(self.slots.bad_slots());
            let (resident, cached) = (
                self.budget.pages_in(Gauge::Resident),
                self.budget.pages_in(Gauge::Cached),
            );
            let entries = self.cache.len();
            let frames = self.frames.in_use_pages();
            if leaked > 0 || resident != 0 || cached != 0 || entries > 0 || frames > 0 {
                bad.push(format!(
                    "no region is alive but {leaked} slots (besides bad ones) are in use, \
                     {resident} pages resident, {cached} cached, {entries} swap cache \
                     entries, {frames} frames in use ({})",
                    self.frames.in_use_by_site()
                ));
            }
        }
        (bad, no_regions && io_busy)
    }
}

/// The engine's own diagnostics: sequence numbers for injected errors, and things
/// said once.
#[derive(Default)]
pub(crate) struct Diagnostics {
    pub(crate) read_seq: AtomicU64,
    pub(crate) map_seq: AtomicU64,
    pub(crate) move_seq: AtomicU64,
    pub(crate) write_seq: AtomicU64,
    /// Inconsistencies found and recovered from (each one an engine bug).
    pub(crate) internal: AtomicU64,
    first_internal: Mutex<String>,
    /// Clean pages mapped whole by a move that turned out written (see `unit.rs`).
    pub(crate) clean_mismatch: AtomicU64,
    said_over_budget: AtomicBool,
    /// Faults that went over the budget (said once, counted every time).
    pub(crate) over_budget_events: AtomicU64,
    said_read_error: AtomicBool,
    said_checksum: AtomicBool,
}

impl Diagnostics {
    /// An inconsistency the engine recovered from: counted, said once.
    pub(crate) fn internal(&self, what: &str) {
        if self.internal.fetch_add(1, Relaxed) == 0 {
            *self
                .first_internal
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = what.to_string();
            say!("uswap: internal: {what} (an engine bug: please report it)");
        }
    }

    fn first(&self) -> String {
        self.first_internal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A page resident by the page map is not mapped in the region.
    pub(crate) fn not_mapped(&self, r: &RegionInner, p: u64, what: &str) {
        self.internal(&format!(
            "page {p} of region {} was resident by the page map but not mapped ({what}); \
             or the program discarded it behind uswap's back",
            r.id
        ));
    }

    /// A fault went over the budget because nothing could be reclaimed.
    pub(crate) fn over_budget(&self) {
        self.over_budget_events.fetch_add(1, Relaxed);
        if !self.said_over_budget.swap(true, Relaxed) {
            say!(
                "uswap: nothing can be reclaimed now (pages pinned, or writes refused): \
                 going over budget rather than stopping the program"
            );
        }
    }

    /// A read failed for good (said once).
    pub(crate) fn say_read_error(&self, res: i32, op: &Op) {
        if !self.said_read_error.swap(true, Relaxed) {
            let what = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                format!("short read: {res} of {} bytes", op.bytes())
            };
            say!(
                "uswap: reading swapped pages failed ({what}) at slot {}: pages lost this \
                 way raise SIGBUS when touched",
                op.slot
            );
        }
    }

    /// A compressed copy failed its checksum (said once).
    pub(crate) fn say_compressed_corrupt(&self, slot: u64) {
        if !self.said_checksum.swap(true, Relaxed) {
            say!(
                "uswap: a compressed page failed its checksum (slot {slot}): pages lost this \
                 way raise SIGBUS when touched"
            );
        }
    }

    /// A packed unit could not be read back, or failed its checksum (said once).
    pub(crate) fn say_packed_lost(&self, slot: u64) {
        if !self.said_read_error.swap(true, Relaxed) {
            say!(
                "uswap: a packed unit could not be read back intact (page slot {slot}): \
                 pages lost this way raise SIGBUS when touched"
            );
        }
    }

    /// Bytes read back did not match their checksum, for good (said once).
    pub(crate) fn say_checksum(&self, op: &Op) {
        if !self.said_checksum.swap(true, Relaxed) {
            say!(
                "uswap: swapped pages came back corrupted (checksum mismatch) at slot {}: \
                 pages lost this way raise SIGBUS when touched",
                op.slot
            );
        }
    }
}

fn fs_size(swap: &SwapFile) -> Option<u64> {
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills a live statfs struct for an fd we own.
    let r = unsafe { libc::fstatfs(swap.raw(), &mut st) };
    (r == 0).then(|| st.f_blocks * st.f_bsize as u64)
}
