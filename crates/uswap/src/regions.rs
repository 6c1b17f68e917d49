//! The pool's regions: made (mapped, registered, swap committed, page map charged),
//! discarded in part (MADV_DONTNEED semantics) and dropped.
//!
//! A page that stops being wanted while I/O on its old copy is in flight leaves that
//! copy to the I/O: its swap-cache entry becomes an orphan, which the completion
//! frees (see `swap_cache`); nothing the program does afterwards to the page can
//! meet the old copy, which lives in a frame of its own.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::pagemap::{PageState, RegionInner, RegionPolicy, UnitPages};
use crate::stats::Counters;
use crate::sys::mem::{map_aligned, map_fixed, unmap};
use crate::sys::uffd::{REGISTER_MISSING, REGISTER_WP};
use crate::{PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};

#[derive(Default)]
struct Table {
    by_addr: BTreeMap<usize, Arc<RegionInner>>,
    by_id: HashMap<u32, Arc<RegionInner>>,
}

/// The live regions, the swap they committed, and the counters of dropped ones.
pub(crate) struct Regions {
    table: RwLock<Table>,
    next_id: AtomicU32,
    /// Swap bytes promised to live regions; guarded by itself.
    pub(crate) committed: Mutex<u64>,
    /// Counters of regions already dropped.
    retired: Mutex<Counters>,
}

impl Regions {
    pub(crate) fn new() -> Regions {
        Regions {
            table: RwLock::new(Table::default()),
            next_id: AtomicU32::new(1),
            committed: Mutex::new(0),
            retired: Mutex::new(Counters::default()),
        }
    }

    /// The region containing `addr`.
    pub(crate) fn by_addr(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let g = self.table.read().unwrap_or_else(|p| p.into_inner());
        let (_, r) = g.by_addr.range(..=addr).next_back()?;
        r.contains(addr).then(|| r.clone())
    }

    /// The region with id `id`.
    pub(crate) fn by_id(&self, id: u32) -> Option<Arc<RegionInner>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .get(&id)
            .cloned()
    }

    /// Every live region.
    pub(crate) fn all(&self) -> Vec<Arc<RegionInner>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .values()
            .cloned()
            .collect()
    }

    /// Counters over live and dropped regions.
    pub(crate) fn counters(&self) -> Counters {
        let mut c = *self.retired.lock().unwrap_or_else(|p| p.into_inner());
        for r in self.all() {
            c = c.plus(&r.counters.snapshot());
        }
        c
    }

    /// Swap bytes committed to live regions.
    pub(crate) fn committed(&self) -> u64 {
        *self.committed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bytes of metadata a region of `len` bytes is charged: its page map (a word and a
/// slot's records per page: `slot_bytes`, the location and checksum, with encryption
/// also the generation and tag) and per-unit state.
fn metadata_of(len: usize, slot_bytes: u64) -> u64 {
    let units = (len / UNIT_SIZE) as u64;
    units * (UNIT_PAGES as u64 * (8 + slot_bytes) + 128)
}

/// Map, register and account a new region; its metadata is reserved, to be
/// committed (`Budget::commit_metadata`) once reclaim made room.
/// `at`: map the region there (2 MiB aligned; the caller owns that range, an empty
/// reservation, which the region replaces and which is put back as a PROT_NONE
/// reservation if creation fails). None: anywhere.
pub(crate) fn create(
    e: &Engine,
    size: u64,
    policy: RegionPolicy,
    in_thread: bool,
    at: Option<usize>,
) -> Result<Arc<RegionInner>> {
    let _a = e.fork.enter_from_program();
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
    let metadata = metadata_of(len, e.tiers.bytes_per_slot());
    let (md, md_res) = e.budget.metadata_bytes();
    let md_after = md + md_res + metadata;
    if md_after + 2 * UNIT_SIZE as u64 > e.budget.bytes() {
        return Err(Error::BudgetTooSmall {
            budget: e.budget.bytes(),
            minimum: md_after + 2 * UNIT_SIZE as u64,
            why: format!("the page map of a {len}-byte region takes {metadata} bytes"),
        });
    }
    let mut committed = e
        .regions
        .committed
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let need = *committed + len as u64;
    e.tiers.commit(need, size, len as u64, *committed)?;
    e.slots.grow(e.tiers.capacity() / PAGE_SIZE as u64);
    // THPs only where units are mapped whole (Huge).
    let huge = policy.unit == crate::UnitPolicy::Huge;
    let uffd = if in_thread {
        crate::fault::in_thread::uffd(e)?
    } else {
        e.uffd.clone()
    };
    let base = match at {
        Some(a) => map_fixed(a, len, libc::PROT_READ | libc::PROT_WRITE, huge)?,
        None => map_aligned(len, huge)?,
    };
    if let Err(source) = uffd.register(base, len, REGISTER_MISSING | REGISTER_WP) {
        match at {
            // Give a fixed range back as the reservation it was.
            Some(a) => {
                let _ = map_fixed(a, len, libc::PROT_NONE, false);
            }
            None => unmap(base, len),
        }
        return Err(Error::Sys {
            op: "UFFDIO_REGISTER",
            source,
        });
    }
    *committed = need;
    drop(committed);
    let id = e.regions.next_id.fetch_add(1, Relaxed);
    let mut r = RegionInner::new(
        uffd,
        in_thread,
        id,
        base,
        len,
        policy,
        e.cfg.readahead_max_pages,
    );
    r.metadata_bytes = metadata;
    let r = Arc::new(r);
    e.budget.reserve_metadata(metadata);
    let mut g = e.regions.table.write().unwrap_or_else(|p| p.into_inner());
    g.by_addr.insert(base, r.clone());
    g.by_id.insert(id, r.clone());
    drop(g);
    crate::reclaim::reserve_lru(e, len / UNIT_SIZE);
    Ok(r)
}

/// Page `i` of a locked unit stops being what it was: its slot reference, cache
/// copy and RAM go. Returns the region range to zap, if any (the caller batches).
/// A copy with I/O in flight is left to its completion (an orphan).
fn drop_page(e: &Engine, r: &RegionInner, u: &mut UnitPages, p: u64) -> Option<usize> {
    let i = p as usize % UNIT_PAGES;
    let zap = match u.get(i) {
        PageState::Resident { slot, .. } => {
            if let Some(s) = slot {
                e.tiers.release(e, s);
            }
            crate::lock::release(e, u, i);
            u.resident -= 1;
            e.budget.uncharge(crate::budget::Gauge::Resident, 1);
            Some(r.page_addr(p))
        }
        PageState::Swapped(s) => {
            if let Some(entry) = e.cache.orphan(s) {
                // A clean copy: gone now.
                e.tiers.clear_cache(e, s);
                e.frames.free(&e.zapper, &[entry.frame]);
                e.budget.uncharge(crate::budget::Gauge::Cached, 1);
            }
            e.tiers.release(e, s);
            None
        }
        PageState::Poisoned => Some(r.page_addr(p)),
        PageState::Untouched => None,
    };
    u.set(i, PageState::Untouched);
    zap
}

/// MADV_DONTNEED semantics on pages `[first, first + n)`: they become untouched
/// (zeros), their slots and cache copies are freed. Faults waiting on them retry.
pub(crate) fn discard(e: &Engine, r: &RegionInner, first: u64, n: u64) {
    let _a = e.fork.enter_from_program();
    let end = (first + n).min(r.pages());
    let mut p = first;
    while p < end {
        let unit_end = ((p / UNIT_PAGES as u64) + 1) * UNIT_PAGES as u64;
        let stop = unit_end.min(end);
        let mut u = r.unit_of(p).lock();
        if r.is_dead() {
            return;
        }
        let mut zap: Vec<(usize, usize)> = Vec::new();
        let locked = (p..stop).any(|q| u.is_locked(q as usize % UNIT_PAGES));
        for q in p..stop {
            if let Some(a) = drop_page(e, r, &mut u, q) {
                match zap.last_mut() {
                    Some(last) if last.0 + last.1 == a => last.1 += PAGE_SIZE,
                    _ => zap.push((a, PAGE_SIZE)),
                }
            }
        }
        // (`clean_by_move` stays: the unit's other pages mapped clean by a move may
        // still have been written unseen.)
        if locked {
            // The kernel drops no locked page: discarded memory is unlocked (the
            // kernel refuses MADV_DONTNEED there; the program asked for zeros).
            for &(a, l) in &zap {
                crate::sys::mem::munlock(a, l);
            }
        }
        e.zapper.zap(&zap);
        // Whoever waited on these pages faults again and finds them untouched.
        let _ = r.uffd.wake(r.page_addr(p), (stop - p) as usize * PAGE_SIZE);
        drop(u);
        p = stop;
    }
}

/// Unregister, unmap and free everything a region holds. I/O still in flight
/// finishes later into its own frames and only drops its orphaned entries.
pub(crate) fn destroy(e: &Engine, r: &Arc<RegionInner>) {
    let _a = e.fork.enter_from_program();
    r.dead.store(true, Release);
    {
        let mut g = e.regions.table.write().unwrap_or_else(|p| p.into_inner());
        g.by_addr.remove(&r.base);
        g.by_id.remove(&r.id);
    }
    for (ui, unit) in r.units.iter().enumerate() {
        // Taking each lock after `dead` is set waits out any handler inside.
        let mut u = unit.lock();
        for i in 0..UNIT_PAGES {
            drop_page(e, r, &mut u, (ui * UNIT_PAGES + i) as u64);
        }
        u.resident = 0;
    }
    // Threads still waiting in the region are woken by the unregister; the mapping
    // being gone, their access then gets SIGSEGV, as with ordinary memory.
    let _ = r.uffd.unregister(r.base, r.len);
    unmap(r.base, r.len);
    *e.regions
        .committed
        .lock()
        .unwrap_or_else(|p| p.into_inner()) -= r.len as u64;
    e.budget.release_metadata(r.metadata_bytes);
    let mut ret = e.regions.retired.lock().unwrap_or_else(|p| p.into_inner());
    *ret = ret.plus(&r.counters.snapshot());
}
