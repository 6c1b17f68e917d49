//! The engine shared by a pool's threads: userfaultfd, backend, slot allocator, swap
//! cache, the regions, memory accounting against the budget, and the threads.
//!
//! Threads:
//! - fault threads (`PoolBuilder::fault_threads`, default 1): each waits on its own
//!   io_uring for "userfaultfd readable" and for its I/O completions, so one sleep
//!   covers both and a fault needs no hop to another thread; it reclaims directly
//!   when a fault would cross the budget;
//! - one reclaim thread (the kernel's kswapd): woken above the high watermark, it
//!   evicts down to the low one, with its own ring for the writes.

use crate::backend::SwapFile;
use crate::error::{Error, Result};
use crate::io::{Ring, TOKEN_EVENT, TOKEN_UFFD};

use crate::pagemap::{RegionInner, RegionPolicy};
use crate::pool::PoolBuilder;
use crate::readahead::ClusterReadahead;
use crate::slots::{AllocPolicy, SlotAllocator, SlotCursor};
use crate::stats::Counters;
use crate::swap_cache::SwapCache;
use crate::uffd::{Uffd, MSG_SIZE, REGISTER_MISSING, REGISTER_WP};
use crate::{DeviceKind, PAGE_SIZE, UNIT_SIZE};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

/// A page that reclaim put in the swap cache, in the order it went there (the
/// kernel's inactive list). Entries may be stale; they are checked when popped.
#[derive(Debug, Clone, Copy)]
pub struct CachedRef {
    /// Region id.
    pub region: u32,
    /// Page in the region.
    pub page: u64,
    /// Slot it was cached under.
    pub slot: u64,
}

/// Slot → owning page, for readahead by slot (the old cluster policy). One table
/// per 2 MiB cluster, made on first use; entries may be stale and are checked.
pub(crate) struct OwnerMap {
    clusters: Box<[std::sync::OnceLock<Box<[AtomicU64]>>]>,
}

impl OwnerMap {
    fn new(max_slots: u64) -> OwnerMap {
        let n = max_slots.div_ceil(crate::slots::CLUSTER_SLOTS) as usize;
        OwnerMap {
            clusters: (0..n).map(|_| std::sync::OnceLock::new()).collect(),
        }
    }

    /// Record that `slot` holds `page` of region `region`.
    pub(crate) fn set(&self, slot: u64, region: u32, page: u64) {
        let c = (slot / crate::slots::CLUSTER_SLOTS) as usize;
        let Some(t) = self.clusters.get(c) else {
            return;
        };
        let t = t.get_or_init(|| {
            (0..crate::slots::CLUSTER_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect()
        });
        t[(slot % crate::slots::CLUSTER_SLOTS) as usize]
            .store((region as u64) << 40 | (page + 1), Relaxed);
    }

    /// Who was last written to `slot`.
    pub(crate) fn get(&self, slot: u64) -> Option<(u32, u64)> {
        let c = (slot / crate::slots::CLUSTER_SLOTS) as usize;
        let t = self.clusters.get(c)?.get()?;
        let v = t[(slot % crate::slots::CLUSTER_SLOTS) as usize].load(Relaxed);
        let page = v & ((1 << 40) - 1);
        (page != 0).then(|| ((v >> 40) as u32, page - 1))
    }
}

#[derive(Default)]
struct Regions {
    by_addr: BTreeMap<usize, Arc<RegionInner>>,
    by_id: HashMap<u32, Arc<RegionInner>>,
}

/// Shared engine state.
pub struct Engine {
    pub(crate) uffd: Uffd,
    /// The backend; written only at fork, with every thread quiesced.
    pub(crate) swap: RwLock<SwapFile>,
    pub(crate) slots: SlotAllocator,
    pub(crate) cache: SwapCache,
    pub(crate) cfg: PoolBuilder,
    pub(crate) cluster_ra: ClusterReadahead,
    pub(crate) owners: OwnerMap,
    regions: RwLock<Regions>,
    next_id: AtomicU32,
    /// Swap bytes promised to live regions; guarded by itself.
    pub(crate) committed: Mutex<u64>,
    /// Region pages mapped now.
    pub(crate) resident: AtomicI64,
    /// Resident + cached pages, as one atomic: what the budget checks and the peak
    /// read. Two separate loads of the gauges would tear while reclaim moves pages
    /// from one to the other (an eviction read half-done counts its pages twice).
    pub(crate) used: AtomicI64,
    /// Shadow pages allocated now (swap cache, incl. I/O in flight).
    pub(crate) cached: AtomicI64,
    /// Bytes of metadata charged to the budget.
    metadata: AtomicU64,
    /// Bytes of metadata of regions being created: out of the limit at once, so that
    /// reclaim makes room for them before they count in the peak (see `commit_metadata`).
    metadata_reserved: AtomicU64,
    /// Pages reserved by faults in progress (see `make_room`).
    pub(crate) fault_reserved: AtomicI64,
    /// Pages charged so far by faults in progress, out of their reservations.
    pub(crate) fault_charged: AtomicI64,
    /// "Swap full" was said once.
    pub(crate) swap_full_said: AtomicBool,
    /// Highest usage seen, in bytes.
    peak: AtomicU64,
    /// Units with resident pages, oldest first: `region << 32 | unit`.
    pub(crate) lru: Mutex<VecDeque<u64>>,
    /// Pages in the swap cache, oldest first.
    pub(crate) inactive: Mutex<VecDeque<CachedRef>>,
    /// Counters of regions already dropped.
    retired: Mutex<Counters>,
    shutdown: AtomicBool,
    /// eventfd that wakes the reclaim thread.
    kswapd_event: OwnedFd,
    kswapd_asleep: AtomicBool,
    /// eventfds of the fault threads (shutdown).
    worker_events: Vec<OwnedFd>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// pidfd of this process, for process_madvise.
    pidfd: Option<OwnedFd>,
    process_madvise_ok: AtomicBool,
    /// /proc/self/pagemap of the process that opened it (reopened after a fork: the
    /// file stays the parent's), to check whether a page is present before an engine
    /// thread touches it (a touch of a missing region page would wait on our own fault
    /// thread).
    proc_pagemap: Mutex<Option<(u32, std::fs::File)>>,
    /// An inconsistency was found and recovered from (said once).
    pub(crate) recovered_said: AtomicBool,
    /// Zeroed THPs made ahead for first touch (`spare.rs`).
    pub(crate) spares: crate::spare::Spares,
    /// Pool and Region handles alive; the threads stop when it reaches 0.
    users: AtomicUsize,
    /// Writes in flight on any ring.
    pub(crate) writes_inflight: AtomicI64,
    /// Pages in writes in flight: they leave the budget when their write completes.
    pub(crate) writeback_pages: AtomicI64,
    /// Requests (reads and writes) in flight on any ring.
    pub(crate) io_inflight: AtomicI64,
    pub(crate) read_seq: AtomicU64,
    pub(crate) write_seq: AtomicU64,
    /// This process forked (or is a forked child) since the pool started: some pages
    /// may be shared copy-on-write and refuse UFFDIO_MOVE.
    pub(crate) forked: AtomicBool,
    /// A fork is being prepared: threads and API calls wait at `enter`.
    pub(crate) fork_pending: AtomicBool,
    /// Threads and API calls inside the engine now (see `enter`).
    active: AtomicUsize,
}

/// Every engine of this process, for the fork hooks.
static ENGINES: Mutex<Vec<std::sync::Weak<Engine>>> = Mutex::new(Vec::new());

/// The engines alive now.
pub(crate) fn live_engines() -> Vec<Arc<Engine>> {
    ENGINES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|w| w.upgrade())
        .collect()
}

/// Proof of being inside the engine (no fork may start until it drops).
pub(crate) struct Active<'a>(&'a Engine);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, SeqCst);
    }
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd(2) with integer flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Error::sys("eventfd"));
    }
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn raw_eventfd() -> std::io::Result<i32> {
    // SAFETY: eventfd(2) with integer flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

fn signal_eventfd(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Consume an eventfd's count (non-blocking).
pub(crate) fn drain_eventfd_raw(fd: std::os::fd::RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Map `len` bytes aligned to 2 MiB (anonymous, private, no reserve).
pub(crate) fn map_aligned(len: usize) -> Result<usize> {
    let total = len + UNIT_SIZE;
    // SAFETY: anonymous mapping request; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::sys("mmap"));
    }
    let start = p as usize;
    let aligned = (start + UNIT_SIZE - 1) & !(UNIT_SIZE - 1);
    // SAFETY: trims the unaligned head and the tail of the mapping made just above.
    unsafe {
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        let tail = start + total - (aligned + len);
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    Ok(aligned)
}

pub(crate) fn unmap(addr: usize, len: usize) {
    // SAFETY: unmaps a range this engine mapped and no longer hands out.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

impl Engine {
    /// Open everything and start the threads. The caller becomes the first user.
    pub(crate) fn start(cfg: PoolBuilder) -> Result<Arc<Engine>> {
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
        let uffd = Uffd::open()?;
        let swap = SwapFile::open(cfg.swap_file.as_deref(), cfg.swap_size)?;
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
        // The cache is sized for the largest swap this pool may grow to.
        let max_slots = match swap.fixed_size() {
            Some(f) => f / PAGE_SIZE as u64,
            None => fs_size(&swap).unwrap_or(1 << 40) / PAGE_SIZE as u64,
        };
        let slots = SlotAllocator::new(swap.capacity() / PAGE_SIZE as u64, policy);
        // SAFETY: pidfd_open on our own pid.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        let pidfd = if pidfd >= 0 {
            // SAFETY: fresh fd owned by nobody else.
            Some(unsafe { OwnedFd::from_raw_fd(pidfd as i32) })
        } else {
            None
        };
        let nworkers = cfg.fault_threads;
        let spares = crate::spare::Spares::new(cfg.budget)?;
        let engine = Arc::new(Engine {
            uffd,
            swap: RwLock::new(swap),
            slots,
            cache: SwapCache::new(max_slots),
            cluster_ra: ClusterReadahead::new(),
            owners: OwnerMap::new(max_slots),
            cfg,
            regions: RwLock::new(Regions::default()),
            next_id: AtomicU32::new(1),
            committed: Mutex::new(0),
            resident: AtomicI64::new(0),
            used: AtomicI64::new(0),
            cached: AtomicI64::new(0),
            metadata: AtomicU64::new(0),
            metadata_reserved: AtomicU64::new(0),
            fault_reserved: AtomicI64::new(0),
            fault_charged: AtomicI64::new(0),
            swap_full_said: AtomicBool::new(false),
            peak: AtomicU64::new(0),
            lru: Mutex::new(VecDeque::new()),
            inactive: Mutex::new(VecDeque::new()),
            retired: Mutex::new(Counters::default()),
            shutdown: AtomicBool::new(false),
            kswapd_event: eventfd()?,
            kswapd_asleep: AtomicBool::new(true),
            worker_events: (0..nworkers).map(|_| eventfd()).collect::<Result<_>>()?,
            threads: Mutex::new(Vec::new()),
            process_madvise_ok: AtomicBool::new(pidfd.is_some()),
            proc_pagemap: Mutex::new(None),
            recovered_said: AtomicBool::new(false),
            spares,
            pidfd,
            users: AtomicUsize::new(1),
            writes_inflight: AtomicI64::new(0),
            writeback_pages: AtomicI64::new(0),
            io_inflight: AtomicI64::new(0),
            read_seq: AtomicU64::new(0),
            write_seq: AtomicU64::new(0),
            forked: AtomicBool::new(false),
            fork_pending: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        });
        {
            let mut all = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&engine));
        }
        engine.spawn_threads()?;
        Ok(engine)
    }

    /// Start the fault threads and the reclaim thread.
    fn spawn_threads(self: &Arc<Self>) -> Result<()> {
        let mut threads = Vec::new();
        for i in 0..self.cfg.fault_threads {
            let e = self.clone();
            let ctx = ThreadCtx::new(&e)?;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("uswap-fault-{i}"))
                    .spawn(move || e.fault_thread(ctx, i))
                    .map_err(|_| Error::sys("spawn fault thread"))?,
            );
        }
        let e = self.clone();
        let ctx = ThreadCtx::new(&e)?;
        threads.push(
            std::thread::Builder::new()
                .name("uswap-reclaim".into())
                .spawn(move || e.reclaim_thread(ctx))
                .map_err(|_| Error::sys("spawn reclaim thread"))?,
        );
        *self.threads.lock().unwrap_or_else(|p| p.into_inner()) = threads;
        Ok(())
    }

    /// Enter the engine: waits while a fork is being prepared.
    pub(crate) fn enter(&self) -> Active<'_> {
        loop {
            while self.fork_pending.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            self.active.fetch_add(1, SeqCst);
            if !self.fork_pending.load(SeqCst) {
                return Active(self);
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }

    /// Before fork: let every thread and API call inside the engine leave, and keep
    /// them out, so that no engine lock is held across the fork.
    pub(crate) fn fork_prepare(&self) {
        self.fork_pending.store(true, SeqCst);
        while self.active.load(SeqCst) > 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        // Spares shared copy-on-write with the child would not move: none cross a fork.
        self.drop_spares(usize::MAX);
        // Every unit lock must be free now: one held across fork stays held in the child.
        #[cfg(debug_assertions)]
        for r in self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .values()
        {
            for u in r.units.iter() {
                let h = u.holder.load(Relaxed);
                debug_assert!(
                    h == 0,
                    "unit lock held by thread {h} outside the engine at fork"
                );
            }
        }
    }

    /// Both sides after fork: the swap file in use is frozen (either process may still
    /// read what the other wrote there), new writes go to a new file.
    fn fork_switch_swap(&self) {
        self.forked.store(true, SeqCst);
        let committed = *self.committed.lock().unwrap_or_else(|p| p.into_inner());
        let limit = self.swap().capacity() / PAGE_SIZE as u64;
        let r = self
            .swap
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .fork_new_file(committed);
        if let Err(e) = r {
            eprintln!("uswap: after fork: no new swap file ({e}); pages stay in RAM until one can be written");
        }
        self.slots.freeze_below(limit);
        self.slots.grow(self.swap().capacity() / PAGE_SIZE as u64);
    }

    /// In the parent after fork.
    pub(crate) fn fork_parent(&self) {
        self.fork_switch_swap();
        self.fork_pending.store(false, SeqCst);
    }

    /// In the child after fork: it has this engine's memory but none of its threads,
    /// and shares the parent's userfaultfd, eventfds, rings and pidfd. Replace them
    /// all (same fd numbers), re-register the regions, and finish what the parent's
    /// I/O was doing.
    pub(crate) fn fork_child(self: &Arc<Self>) {
        let fresh = |what: &str, new: std::io::Result<i32>, old: i32| match new {
            // SAFETY: dup2 onto an fd number this engine owns; the new fd is closed after.
            Ok(fd) => unsafe {
                libc::dup2(fd, old);
                libc::close(fd);
            },
            Err(e) => eprintln!("uswap: after fork: {what}: {e}"),
        };
        match Uffd::open() {
            Ok(u) => {
                let raw = u.raw();
                // SAFETY: duplicate the new uffd onto the old number; `u` closes its own.
                unsafe { libc::dup2(raw, self.uffd.raw()) };
            }
            Err(e) => {
                eprintln!("uswap: after fork: no userfaultfd in the child ({e}); its regions are plain memory now");
                self.fork_pending.store(false, SeqCst);
                return;
            }
        }
        fresh("eventfd", raw_eventfd(), self.kswapd_event.as_raw_fd());
        for ev in &self.worker_events {
            fresh("eventfd", raw_eventfd(), ev.as_raw_fd());
        }
        if let Some(p) = &self.pidfd {
            // SAFETY: pidfd_open on our own (new) pid.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
            fresh(
                "pidfd",
                if fd >= 0 {
                    Ok(fd)
                } else {
                    Err(std::io::Error::last_os_error())
                },
                p.as_raw_fd(),
            );
        }
        self.fork_switch_swap();
        let regions: Vec<_> = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .values()
            .cloned()
            .collect();
        for r in &regions {
            self.fork_child_region(r);
        }
        // The parent's threads do not exist here; their handles must not be joined.
        std::mem::forget(std::mem::take(
            &mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        self.writes_inflight.store(0, SeqCst);
        self.writeback_pages.store(0, SeqCst);
        self.io_inflight.store(0, SeqCst);
        self.active.store(0, SeqCst);
        self.fork_pending.store(false, SeqCst);
        if let Err(e) = self.spawn_threads() {
            eprintln!("uswap: after fork: cannot start threads: {e}");
        }
    }

    fn fork_child_region(&self, r: &Arc<RegionInner>) {
        use crate::pagemap::PageState;
        use crate::swap_cache::CacheState;
        if let Err(e) = self
            .uffd
            .register(r.base, r.len, REGISTER_MISSING | REGISTER_WP)
            .and_then(|_| self.uffd.register(r.shadow, r.len, REGISTER_WP))
        {
            eprintln!("uswap: after fork: cannot register region {}: {e}", r.id);
            return;
        }
        for (ui, unit) in r.units.iter().enumerate() {
            let mut u = unit.lock();
            u.unit_reads = 0;
            u.unit_waited = false;
            u.prefetched = false;
            let first = (ui * crate::UNIT_PAGES) as u64;
            let mut clean: Vec<(usize, usize)> = Vec::new();
            for i in 0..crate::UNIT_PAGES {
                let p = first + i as u64;
                match u.get(i) {
                    // fork dropped the write-protect bits: put them back on clean pages.
                    PageState::Resident { dirty: false, .. } => match clean.last_mut() {
                        Some(last) if last.0 + last.1 == r.page_addr(p) => last.1 += PAGE_SIZE,
                        _ => clean.push((r.page_addr(p), PAGE_SIZE)),
                    },
                    PageState::Swapped(s) => match self.cache.get(s).map(|e| e.state) {
                        // The parent's read never lands here: read again on demand.
                        Some(CacheState::Reading) => {
                            self.drop_cache_entry(s);
                            self.dontneed(&[(r.shadow_addr(p), PAGE_SIZE)]);
                        }
                        // The parent's write may not finish: the child keeps the page dirty.
                        Some(CacheState::Writing) => {
                            self.cache.remove(s);
                            self.slots.clear_cache(s);
                            self.slots.put(s);
                            self.restore_dirty(r, &mut u, p);
                        }
                        _ => {}
                    },
                    _ => {}
                }
            }
            for (a, l) in clean {
                let _ = self.uffd.write_protect(a, l, true, crate::uffd::Wake::Yes);
            }
            if u.resident > 0 {
                unit.on_lru.store(false, Relaxed);
                self.lru_add(r, first, &u);
            }
        }
    }

    /// After a region's metadata was reserved: wait until reclaim brought usage
    /// under the limit (bounded), then charge the metadata. The budget holds at every
    /// instant: the reserve lowered the limit before the metadata counts as used.
    /// Called outside `enter` (it waits on the reclaim thread, which a pending fork
    /// would hold back).
    pub(crate) fn commit_metadata(&self, r: &RegionInner) {
        self.wait_for_room();
        self.metadata.fetch_add(r.metadata_bytes, Relaxed);
        self.metadata_reserved.fetch_sub(r.metadata_bytes, Relaxed);
    }

    fn wait_for_room(&self) {
        let t = std::time::Instant::now();
        // Faults in progress reserved their room under the old limit: wait for them too.
        while self.promised_pages() > self.limit_pages()
            && t.elapsed() < std::time::Duration::from_secs(10)
        {
            self.wake_kswapd();
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// The backend.
    pub(crate) fn swap(&self) -> std::sync::RwLockReadGuard<'_, SwapFile> {
        self.swap.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a backend request on this thread's ring, at its slot's file and offset.
    pub(crate) fn queue_io(&self, ctx: &mut ThreadCtx, op: crate::io::Op) {
        self.io_inflight.fetch_add(1, Relaxed);
        if op.kind == crate::io::OpKind::Write {
            self.writes_inflight.fetch_add(1, Relaxed);
            self.writeback_pages
                .fetch_add(op.pages.len() as i64, Relaxed);
        }
        let loc = self.swap().locate(op.slot);
        ctx.ring.queue(op, loc);
    }

    /// One more Pool/Region handle.
    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, AcqRel);
    }

    /// One handle fewer; the last one stops the threads.
    pub(crate) fn drop_user(&self) {
        if self.users.fetch_sub(1, AcqRel) == 1 {
            self.shutdown.store(true, Release);
            signal_eventfd(&self.kswapd_event);
            for e in &self.worker_events {
                signal_eventfd(e);
            }
            let threads =
                std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
            for t in threads {
                let _ = t.join();
            }
        }
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Acquire)
    }

    // ---- accounting -------------------------------------------------------------

    /// Pages the engine may hold (budget less metadata).
    pub(crate) fn limit_pages(&self) -> i64 {
        let b = self
            .cfg
            .budget
            .saturating_sub(self.metadata.load(Relaxed) + self.metadata_reserved.load(Relaxed));
        (b / PAGE_SIZE as u64) as i64
    }

    /// Reclaim starts above this.
    pub(crate) fn high_pages(&self) -> i64 {
        let l = self.limit_pages();
        l - (l / 32).max(512)
    }

    /// Reclaim stops at this.
    pub(crate) fn low_pages(&self) -> i64 {
        let l = self.limit_pages();
        l - (l / 12).max(1024)
    }

    /// Resident + cached pages.
    pub(crate) fn usage_pages(&self) -> i64 {
        self.used.load(Relaxed)
    }

    /// Pages enter the engine's hold (`gauge` is `resident` or `cached`).
    pub(crate) fn charge(&self, gauge: &AtomicI64, n: i64) {
        self.used.fetch_add(n, Relaxed);
        gauge.fetch_add(n, Relaxed);
        if crate::reclaim::note_charge(n) {
            self.fault_charged.fetch_add(n, SeqCst);
        }
    }

    /// Pages leave the engine's hold.
    pub(crate) fn uncharge(&self, gauge: &AtomicI64, n: i64) {
        gauge.fetch_sub(n, Relaxed);
        self.used.fetch_sub(n, Relaxed);
    }

    pub(crate) fn note_peak(&self) {
        let used =
            self.usage_pages().max(0) as u64 * PAGE_SIZE as u64 + self.metadata.load(Relaxed);
        self.peak.fetch_max(used, Relaxed);
    }

    pub(crate) fn wake_kswapd(&self) {
        if self.kswapd_asleep.swap(false, AcqRel) {
            signal_eventfd(&self.kswapd_event);
        }
    }

    /// Totals over live and dropped regions, with the gauges.
    pub(crate) fn counters(&self) -> Counters {
        let _a = self.enter();
        let mut c = *self.retired.lock().unwrap_or_else(|p| p.into_inner());
        for r in self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .values()
        {
            c = c.plus(&r.counters.snapshot());
        }
        self.with_gauges(c)
    }

    /// What `Pool::check_invariants` reports: inconsistencies the engine counted or
    /// noticed, dead threads, and (when quiescent: no region, no I/O) leaks. The flag:
    /// no region is alive but I/O is still in flight (the leak check was not made).
    pub(crate) fn invariant_errors(&self) -> (Vec<String>, bool) {
        let mut errors = Vec::new();
        let (double, invalid) = (self.slots.double_frees(), self.slots.invalid_ops());
        if double > 0 {
            errors.push(format!("{double} slot double frees"));
        }
        if invalid > 0 {
            errors.push(format!("{invalid} invalid slot operations"));
        }
        if self.recovered_said.load(Relaxed) {
            errors.push("the engine recovered from an inconsistent page (said on stderr)".into());
        }
        if !self.is_shutdown() {
            let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            for t in threads.iter().filter(|t| t.is_finished()) {
                errors.push(format!(
                    "engine thread {} ended while the pool lives (a panic?)",
                    t.thread().name().unwrap_or("?")
                ));
            }
        }
        let no_regions = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .is_empty();
        let io_busy = self.io_inflight.load(SeqCst) != 0;
        if no_regions && !io_busy {
            let leaked = self.slots.used().saturating_sub(self.slots.bad_slots());
            let (resident, cached) = (self.resident.load(SeqCst), self.cached.load(SeqCst));
            let entries = self.cache.len();
            if leaked > 0 || resident != 0 || cached != 0 || entries > 0 {
                errors.push(format!(
                    "no region is alive but {leaked} slots (besides bad ones) are in use, \
                     {resident} pages resident, {cached} cached, {entries} swap cache entries"
                ));
            }
        }
        (errors, no_regions && io_busy)
    }

    pub(crate) fn with_gauges(&self, mut c: Counters) -> Counters {
        c.slots_used = self.slots.used();
        c.resident_bytes = self.resident.load(Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        c.cached_bytes = self.cached.load(Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        c.metadata_bytes = self.metadata.load(Relaxed);
        c.peak_used_bytes = self.peak.load(Relaxed);
        c
    }

    // ---- regions ----------------------------------------------------------------

    pub(crate) fn region_by_addr(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let g = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let (_, r) = g.by_addr.range(..=addr).next_back()?;
        r.contains(addr).then(|| r.clone())
    }

    pub(crate) fn region_by_id(&self, id: u32) -> Option<Arc<RegionInner>> {
        self.regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .get(&id)
            .cloned()
    }

    /// Map, register and account a new region.
    pub(crate) fn create_region(
        &self,
        size: u64,
        policy: RegionPolicy,
    ) -> Result<Arc<RegionInner>> {
        let _a = self.enter();
        if size == 0 {
            return Err(Error::InvalidRegionSize {
                size,
                reason: "a region needs at least one byte".into(),
            });
        }
        let len = size
            .checked_next_multiple_of(UNIT_SIZE as u64)
            .filter(|&l| l <= (1u64 << 46))
            .ok_or_else(|| Error::InvalidRegionSize {
                size,
                reason: "larger than 64 TiB".into(),
            })? as usize;
        let metadata = (len / UNIT_SIZE * (UNIT_SIZE / PAGE_SIZE * 8 + 64)) as u64;
        let md_after =
            self.metadata.load(Relaxed) + self.metadata_reserved.load(Relaxed) + metadata;
        if md_after + 2 * UNIT_SIZE as u64 > self.cfg.budget {
            return Err(Error::BudgetTooSmall {
                budget: self.cfg.budget,
                minimum: md_after + 2 * UNIT_SIZE as u64,
                why: format!("the page map of a {len}-byte region takes {metadata} bytes"),
            });
        }
        let mut committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        let need = *committed + len as u64;
        match self.swap().fixed_size() {
            Some(cap) if need > cap => {
                return Err(Error::SwapFull {
                    requested: size,
                    needed: len as u64,
                    capacity: cap,
                    committed: *committed,
                })
            }
            _ => {
                self.swap().ensure(need)?;
            }
        }
        self.slots.grow(self.swap().capacity() / PAGE_SIZE as u64);
        let base = map_aligned(len)?;
        let shadow = match map_aligned(len) {
            Ok(s) => s,
            Err(e) => {
                unmap(base, len);
                return Err(e);
            }
        };
        // THPs only where units are mapped whole (Huge); elsewhere a 4 KiB read into
        // an empty 2 MiB-aligned shadow range must not allocate a whole THP.
        let huge = policy.unit == crate::UnitPolicy::Huge;
        let adv = if huge {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: madvise hints on the mappings made above.
        unsafe {
            libc::madvise(base as *mut libc::c_void, len, adv);
            libc::madvise(shadow as *mut libc::c_void, len, adv);
        }
        let reg = self
            .uffd
            .register(base, len, REGISTER_MISSING | REGISTER_WP)
            .and_then(|_| self.uffd.register(shadow, len, REGISTER_WP));
        if let Err(source) = reg {
            unmap(base, len);
            unmap(shadow, len);
            return Err(Error::Sys {
                op: "UFFDIO_REGISTER",
                source,
            });
        }
        *committed = need;
        drop(committed);
        let id = self.next_id.fetch_add(1, Relaxed);
        let mut r = RegionInner::new(id, base, shadow, len, policy, self.cfg.readahead_max_pages);
        r.metadata_bytes = metadata;
        let r = Arc::new(r);
        self.metadata_reserved.fetch_add(metadata, Relaxed);
        let mut g = self.regions.write().unwrap_or_else(|p| p.into_inner());
        g.by_addr.insert(base, r.clone());
        g.by_id.insert(id, r.clone());
        Ok(r)
    }

    /// MADV_DONTNEED semantics on pages `[first, first + n)`: they become untouched
    /// (zeros), their slots and cache copies are freed. I/O in flight on them finishes
    /// later and is dropped (completions check the page still wants it).
    pub(crate) fn discard(&self, r: &RegionInner, first: u64, n: u64) {
        let _a = self.enter();
        let end = (first + n).min(r.pages());
        let mut p = first;
        while p < end {
            let unit_end = ((p / crate::UNIT_PAGES as u64) + 1) * crate::UNIT_PAGES as u64;
            let stop = unit_end.min(end);
            let mut u = r.unit_of(p).lock();
            if r.is_dead() {
                return;
            }
            let (mut region_ranges, mut shadow_ranges) = (Vec::new(), Vec::new());
            for q in p..stop {
                let i = q as usize % crate::UNIT_PAGES;
                match u.get(i) {
                    crate::pagemap::PageState::Resident { slot, .. } => {
                        if let Some(s) = slot {
                            self.slots.put(s);
                        }
                        u.resident -= 1;
                        self.uncharge(&self.resident, 1);
                        region_ranges.push((r.page_addr(q), PAGE_SIZE));
                    }
                    crate::pagemap::PageState::Swapped(s) => {
                        if self.cache.remove_clean(s).is_some() {
                            self.slots.clear_cache(s);
                            self.uncharge(&self.cached, 1);
                            shadow_ranges.push((r.shadow_addr(q), PAGE_SIZE));
                        }
                        self.slots.put(s);
                    }
                    crate::pagemap::PageState::Poisoned => {
                        region_ranges.push((r.page_addr(q), PAGE_SIZE))
                    }
                    crate::pagemap::PageState::Untouched => {}
                }
                u.set(i, crate::pagemap::PageState::Untouched);
            }
            self.dontneed(&region_ranges);
            self.dontneed(&shadow_ranges);
            drop(u);
            p = stop;
        }
    }

    /// Unregister, unmap and free everything a region holds. I/O still in flight
    /// finishes later and only drops its cache references (it sees `dead`).
    pub(crate) fn destroy_region(&self, r: &Arc<RegionInner>) {
        let _a = self.enter();
        r.dead.store(true, Release);
        {
            let mut g = self.regions.write().unwrap_or_else(|p| p.into_inner());
            g.by_addr.remove(&r.base);
            g.by_id.remove(&r.id);
        }
        let mut freed_resident = 0i64;
        let mut freed_cached = 0i64;
        for unit in r.units.iter() {
            // Taking each lock after `dead` is set waits out any handler inside.
            let mut u = unit.lock();
            for i in 0..crate::UNIT_PAGES {
                match u.get(i) {
                    crate::pagemap::PageState::Resident { slot, .. } => {
                        freed_resident += 1;
                        if let Some(s) = slot {
                            self.slots.put(s);
                        }
                    }
                    crate::pagemap::PageState::Swapped(s) => {
                        if self.cache.remove_clean(s).is_some() {
                            self.slots.clear_cache(s);
                            freed_cached += 1;
                        }
                        self.slots.put(s);
                    }
                    _ => {}
                }
                u.set(i, crate::pagemap::PageState::Untouched);
            }
            u.resident = 0;
        }
        self.uncharge(&self.resident, freed_resident);
        self.uncharge(&self.cached, freed_cached);
        let _ = self.uffd.unregister(r.base, r.len);
        let _ = self.uffd.unregister(r.shadow, r.len);
        unmap(r.base, r.len);
        unmap(r.shadow, r.len);
        *self.committed.lock().unwrap_or_else(|p| p.into_inner()) -= r.len as u64;
        self.metadata.fetch_sub(r.metadata_bytes, Relaxed);
        let mut ret = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        *ret = ret.plus(&r.counters.snapshot());
    }

    // ---- memory ops -------------------------------------------------------------

    /// Free shadow (or region) pages: one process_madvise for up to 1024 ranges.
    /// Whether the page at `addr` is present (mapped) in this process; None if the
    /// kernel would not say.
    pub(crate) fn page_present(&self, addr: usize) -> Option<bool> {
        use std::os::unix::fs::FileExt;
        let pid = std::process::id();
        let mut g = self.proc_pagemap.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(|(p, _)| *p != pid) {
            *g = Some((pid, std::fs::File::open("/proc/self/pagemap").ok()?));
        }
        let (_, f) = g.as_ref()?;
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, (addr / PAGE_SIZE) as u64 * 8)
            .ok()?;
        Some(u64::from_le_bytes(b) >> 63 == 1)
    }

    pub(crate) fn dontneed(&self, ranges: &[(usize, usize)]) {
        for chunk in ranges.chunks(1024) {
            if self.process_madvise_ok.load(Relaxed) {
                if let Some(pidfd) = &self.pidfd {
                    let iov: Vec<libc::iovec> = chunk
                        .iter()
                        .map(|&(a, l)| libc::iovec {
                            iov_base: a as *mut libc::c_void,
                            iov_len: l,
                        })
                        .collect();
                    // SAFETY: process_madvise on our own pidfd with ranges of our mappings.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_process_madvise,
                            pidfd.as_raw_fd(),
                            iov.as_ptr(),
                            iov.len(),
                            libc::MADV_DONTNEED,
                            0,
                        )
                    };
                    if r >= 0 {
                        continue;
                    }
                    self.process_madvise_ok.store(false, Relaxed);
                }
            }
            for &(a, l) in chunk {
                // SAFETY: drops pages of a mapping the engine owns.
                unsafe { libc::madvise(a as *mut libc::c_void, l, libc::MADV_DONTNEED) };
            }
        }
    }

    // ---- threads ----------------------------------------------------------------

    /// What the reclaim thread should bring usage down to, if anything: the low
    /// watermark once above the high one; lower while a new region's page map waits
    /// for room that faults in progress have promised (`commit_metadata`).
    fn kswapd_target(&self) -> Option<i64> {
        if self.is_shutdown() {
            return None;
        }
        if self.metadata_reserved.load(Relaxed) > 0 && self.promised_pages() > self.limit_pages() {
            return Some(self.low_pages() - self.unclaimed_pages());
        }
        (self.usage_pages() > self.high_pages()).then(|| self.low_pages())
    }

    fn reclaim_thread(self: Arc<Self>, mut ctx: ThreadCtx) {
        ctx.event_fd = self.kswapd_event.as_raw_fd();
        // Background reclaim yields to the program and the fault threads (nice 19):
        // at the default priority it ran 1 ms stretches on the CPU where the program
        // and its fault thread hand a fault back and forth, while the other vCPU idled
        // (perf sched: 1.2 ms scheduling delays per fault). Measured on swap-w-seq
        // 2 GiB / 256 MiB, --unit 2m: the first pass went from 1.5-1.8 s to 1.1-1.2 s.
        // If it falls behind, faults reclaim directly, as before.
        // SAFETY: setpriority on this thread's own id; no memory is touched.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        ctx.ring.poll(ctx.event_fd, TOKEN_EVENT);
        let mut cqes = Vec::new();
        loop {
            if self.is_shutdown() && ctx.ring.inflight == 0 {
                break;
            }
            if let Some(target) = self.kswapd_target() {
                let _a = self.enter();
                self.reclaim(&mut ctx, target);
                continue;
            }
            let made_spare = {
                let _a = self.enter();
                self.refill_spare()
            };
            if made_spare {
                continue;
            }
            self.kswapd_asleep.store(true, Release);
            // Re-check after publishing that we sleep (a waker may have missed us).
            if self.kswapd_target().is_some() {
                self.kswapd_asleep.store(false, Release);
                continue;
            }
            ctx.ring.wait();
            // Completions take unit locks: inside the engine (no fork meanwhile).
            let _a = self.enter();
            cqes.clear();
            ctx.ring.reap(&mut cqes);
            self.process_cqes(&mut ctx, &cqes);
        }
    }

    fn fault_thread(self: Arc<Self>, mut ctx: ThreadCtx, index: usize) {
        ctx.event_fd = self.worker_events[index].as_raw_fd();
        ctx.ring.poll(ctx.event_fd, TOKEN_EVENT);
        ctx.ring.poll(self.uffd.raw(), TOKEN_UFFD);
        let mut cqes = Vec::new();
        let spin = std::time::Duration::from_micros(self.cfg.spin_us as u64);
        loop {
            if self.is_shutdown() && ctx.ring.inflight == 0 {
                break;
            }
            let a = self.enter();
            // Faults first: they are what a program waits on.
            if self.serve_faults(&mut ctx) == 0 && !spin.is_zero() {
                let t = std::time::Instant::now();
                while t.elapsed() < spin {
                    ctx.ring.submit();
                    if self.serve_faults(&mut ctx) > 0 {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            if !ctx.deferred.is_empty() {
                // Faults put back for a pending fork: leave the engine so that the
                // fork proceeds, then serve them (`enter` waits for the fork).
                drop(a);
                continue;
            }
            // Re-arm right before sleeping: the poll's completion may have been reaped
            // anywhere, also inside a direct reclaim while serving a fault.
            if !ctx.uffd_armed && !self.is_shutdown() {
                ctx.uffd_armed = true;
                ctx.ring.poll(self.uffd.raw(), TOKEN_UFFD);
            }
            drop(a);
            ctx.ring.wait();
            let _a = self.enter();
            cqes.clear();
            ctx.ring.reap(&mut cqes);
            self.process_cqes(&mut ctx, &cqes);
        }
    }

    /// Read and handle every pending fault; returns how many.
    fn serve_faults(&self, ctx: &mut ThreadCtx) -> usize {
        let mut total = 0;
        for f in std::mem::take(&mut ctx.deferred) {
            total += 1;
            if !self.handle_fault(ctx, f) {
                ctx.deferred.push(f);
            }
        }
        loop {
            if !ctx.deferred.is_empty() {
                return total;
            }
            let n = self.uffd.read_msgs(&mut ctx.msgs).unwrap_or_default();
            if n == 0 {
                return total;
            }
            total += n;
            for i in 0..n {
                if let Some(f) = crate::uffd::decode(&ctx.msgs[i]) {
                    if !self.handle_fault(ctx, f) {
                        ctx.deferred.push(f);
                    }
                }
            }
            // Start the reads these faults need before looking for more.
            ctx.ring.submit();
        }
    }
}

fn fs_size(swap: &SwapFile) -> Option<u64> {
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills a live statfs struct for an fd we own.
    let r = unsafe { libc::fstatfs(swap.raw(), &mut st) };
    (r == 0).then(|| st.f_blocks * st.f_bsize as u64)
}

/// Per-thread state: its ring, its slot cursor, its fault message buffer.
pub(crate) struct ThreadCtx {
    pub(crate) ring: Ring,
    pub(crate) cursor: SlotCursor,
    pub(crate) msgs: Vec<[u8; MSG_SIZE]>,
    pub(crate) uffd_armed: bool,
    /// Faults put back because a fork is pending and they need room that only
    /// other threads' I/O can make (see `make_room`); served after the fork.
    pub(crate) deferred: Vec<crate::uffd::Fault>,
    /// The eventfd that wakes this thread.
    pub(crate) event_fd: std::os::fd::RawFd,
}

impl ThreadCtx {
    fn new(e: &Engine) -> Result<ThreadCtx> {
        Ok(ThreadCtx {
            ring: Ring::new(512).map_err(|source| Error::Sys {
                op: "io_uring_setup",
                source,
            })?,
            cursor: e.slots.cursor(),
            msgs: vec![[0u8; MSG_SIZE]; 64],
            uffd_armed: true,
            deferred: Vec::new(),
            event_fd: -1,
        })
    }
}
