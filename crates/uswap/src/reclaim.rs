//! Reclaim: keeps resident + cached pages + metadata under the budget.
//!
//! Two lists, like the kernel's active/inactive LRUs but built from what user space
//! can see (faults, not accessed bits):
//! - `lru`: units (2 MiB) with resident pages, in the order they got them, with a
//!   second-chance bit set by every fault in the unit (a CLOCK);
//! - `inactive`: pages in the swap cache in the order they got there.
//!
//! Eviction takes a unit whole: its resident pages leave the region with one
//! UFFDIO_MOVE per run into the shadow (no copy; atomic against the program's
//! writes), clean pages whose slot is still valid become clean cache entries (no
//! write), dirty ones get slots (contiguous runs from this thread's cluster) and
//! leave as one gathered write per run. Trimming drops clean cache pages, oldest
//! first, with one process_madvise per unit. A fault on a page still in the cache is
//! the cheap second chance.

use crate::engine::{CachedRef, Engine, ThreadCtx};
use crate::io::{Op, OpKind};
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::{Slot, SlotRun};
use crate::swap_cache::{CacheState, Entry, Owner};
use crate::uffd::Wake;
use crate::{PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;

/// Pages a direct reclaim frees beyond what the fault needs, so that the next
/// faults do not reclaim again at once.
const DIRECT_BATCH: i64 = 256;

/// The room a fault in progress reserved (see `Engine::make_room`); released when
/// the fault is done, by which time its pages are charged.
pub(crate) struct Room<'a> {
    engine: &'a Engine,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        let (reserved, charged) = OWN.with(|c| c.replace((0, 0)));
        // Charged first: a reader in between over-counts, never under-counts.
        self.engine.fault_charged.fetch_sub(charged, SeqCst);
        self.engine.fault_reserved.fetch_sub(reserved, SeqCst);
    }
}

thread_local! {
    /// This thread's fault in progress: pages reserved (0 outside a fault; grown by
    /// `take_room`) and pages charged so far.
    static OWN: std::cell::Cell<(i64, i64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Pages entered the engine's hold on this thread (see `Engine::charge`): inside a
/// fault they use its reservation. True if inside a fault.
pub(crate) fn note_charge(n: i64) -> bool {
    OWN.with(|c| {
        let (reserved, charged) = c.get();
        if reserved > 0 {
            c.set((reserved, charged + n));
        }
        reserved > 0
    })
}

impl Engine {
    /// Before a fault maps up to `want` pages: reserve them, reclaiming directly if
    /// usage plus every fault's reservation would cross the budget; wake the reclaim
    /// thread above the high watermark. The reservation lasts as long as the returned
    /// guard: the fault charges its pages while holding it, and charges nothing past
    /// it (`take_room` for more), so two threads never both take the last room, and
    /// a new region's page map waits for them (`commit_metadata`).
    ///
    /// None: no room, and a fork is pending, which holds back the other threads
    /// whose I/O would make it; the caller puts the fault back and leaves the engine.
    pub(crate) fn make_room(
        &self,
        ctx: &mut ThreadCtx,
        r: &RegionInner,
        want: i64,
    ) -> Option<Room<'_>> {
        let mut stalled = 0;
        loop {
            let limit = self.limit_pages();
            self.fault_reserved.fetch_add(want, SeqCst);
            // After two passes of reclaim without progress: over budget rather than a
            // hung fault (`reclaim` has said so).
            if self.promised_pages() <= limit || stalled >= 2 {
                break;
            }
            self.fault_reserved.fetch_sub(want, SeqCst);
            if stalled == 0 {
                r.counters.direct_reclaim.fetch_add(1, Relaxed);
            }
            let target = limit - self.unclaimed_pages() - want - DIRECT_BATCH;
            if !self.reclaim(ctx, target) {
                if self.fork_pending.load(SeqCst) {
                    return None;
                }
                stalled += 1;
            }
        }
        if self.usage_pages() > self.high_pages() {
            self.wake_kswapd();
        }
        OWN.with(|c| c.set((want, 0)));
        Some(Room { engine: self })
    }

    /// Pages reserved by faults in progress and not charged yet.
    pub(crate) fn unclaimed_pages(&self) -> i64 {
        let charged = self.fault_charged.load(SeqCst);
        (self.fault_reserved.load(SeqCst) - charged).max(0)
    }

    /// Pages used, or promised to faults in progress: what must fit under the limit.
    /// (Loads ordered so that a charge in between over-counts, never under-counts.)
    pub(crate) fn promised_pages(&self) -> i64 {
        let charged = self.fault_charged.load(SeqCst);
        let used = self.usage_pages();
        used + self.fault_reserved.load(SeqCst) - charged
    }

    /// Room for up to `n` more pages in this thread's fault: what is left of its
    /// reservation, grown without reclaim into room nobody else holds (fault-around,
    /// a long readahead window, units read ahead). Returns the pages it may charge
    /// (0 outside a fault).
    pub(crate) fn take_room(&self, n: i64) -> i64 {
        let (reserved, charged) = OWN.with(|c| c.get());
        if reserved == 0 || n <= 0 {
            return 0;
        }
        let left = (reserved - charged).max(0);
        if left >= n {
            return n;
        }
        let extra = n - left;
        self.fault_reserved.fetch_add(extra, SeqCst);
        let over = self.promised_pages() - self.limit_pages();
        let back = over.clamp(0, extra);
        if back > 0 {
            self.fault_reserved.fetch_sub(back, SeqCst);
        }
        OWN.with(|c| c.set((reserved + extra - back, charged)));
        left + extra - back
    }

    /// Reclaim until usage is at most `target` pages; false if it gave up (nothing
    /// more can go).
    pub(crate) fn reclaim(&self, ctx: &mut ThreadCtx, target: i64) -> bool {
        let mut idle = 0;
        let mut cqes = Vec::new();
        while self.usage_pages() > target && !self.is_shutdown() {
            // Spare zeroed THPs nobody is about to take go first (`spare.rs`).
            if self.spares.idle() && self.drop_spares(usize::MAX) > 0 {
                continue;
            }
            let need = self.usage_pages() - target;
            let dropped = self.trim_inactive(need);
            if dropped >= need {
                continue;
            }
            // Pages under writeback become droppable when their writes complete:
            // evict only what they do not cover, then ahead of need up to a margin
            // (`may_evict_ahead`), and otherwise wait for completions below. The
            // margin keeps a queue of writes for the device and gives a read stream
            // room for unit readahead instead of dropping what was just read ahead
            // (2 GiB / 256 MiB, --unit 2m: no margin left seq-read at 670 MB/s with
            // 3% readahead hits, each unit read 3 times; half the budget: 1,800+).
            // Counting writes in flight as not reclaimed at all (the previous rule)
            // made each direct reclaim evict the whole resident set, the unit being
            // written included; its writer then faulted 512 times on pages under
            // writeback, and the writes went out in bursts of ~100 units.
            let uncovered = need - dropped - self.writeback_pages.load(Relaxed);
            let moved = self.evict_lru(ctx, uncovered.max(0));
            ctx.ring.submit();
            if dropped > 0 || moved > 0 {
                idle = 0;
                continue;
            }
            // Nothing droppable now: what remains is under I/O. Wait for our own
            // writes; other threads' complete on their rings.
            if ctx.ring.inflight > 0 {
                ctx.ring.wait();
                cqes.clear();
                ctx.ring.reap(&mut cqes);
                self.process_cqes(ctx, &cqes);
            } else if self.fork_pending.load(SeqCst) {
                // Other threads wait outside the engine for a fork, which waits for
                // this one: give up for now (the caller leaves and comes back).
                return false;
            } else if self.io_inflight.load(Relaxed) > 0 && idle < 200_000 {
                // Another thread's I/O will make pages droppable: the budget is a
                // promise, so wait for it (bounded at ~10 s against a stuck device).
                idle += 1;
                self.wake_kswapd();
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else if self.drop_spares(1) > 0 {
                // Nothing will free room but a spare zeroed THP: it goes. (Not
                // before: dropped, its memory goes back to the host, and making
                // it again costs more than waiting for a write.)
                idle = 0;
            } else {
                idle += 1;
                if idle > 2000 {
                    // Nothing in flight and nothing evictable (pages pinned by the
                    // program's own I/O): proceed rather than hang the fault.
                    if idle > 200_000 {
                        eprintln!("uswap: reclaim made no progress for 10 s; going over budget");
                    }
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        true
    }

    /// How far reclaim evicts beyond what it needs (see `reclaim`): half the
    /// budget, at most 1 GiB.
    fn evict_ahead_pages(&self) -> i64 {
        (self.limit_pages() / 2).min(1 << 18)
    }

    /// Slots of failed writes are never reused: a growable swap file grows by as
    /// many, so that every committed page keeps a place. False when it cannot (a
    /// fixed size or a device): pages without a slot then stay in RAM, over budget,
    /// and the user is told once.
    pub(crate) fn replace_bad_slots(&self) -> bool {
        let bad = self.slots.bad_slots();
        let grown = self.swap().fixed_size().is_none() && {
            let committed = *self.committed.lock().unwrap_or_else(|p| p.into_inner());
            let need = committed + (bad + UNIT_PAGES as u64) * PAGE_SIZE as u64;
            self.swap().ensure(need).is_ok()
        };
        if grown {
            self.slots.grow(self.swap().capacity() / PAGE_SIZE as u64);
        } else if !self.swap_full_said.swap(true, Relaxed) {
            eprintln!(
                "uswap: swap full ({bad} slots lost to write errors): pages stay in RAM over budget"
            );
        }
        grown
    }

    /// Whether reclaim may evict one more unit ahead of need: the margin is not
    /// used up by writes in flight (every evicting thread's, as they go: two threads
    /// that each sized their batch at the start evicted the whole resident set
    /// between them, the unit the program was writing included), and a quarter of
    /// the limit stays resident.
    fn may_evict_ahead(&self) -> bool {
        self.writeback_pages.load(Relaxed) < self.evict_ahead_pages()
            && self.resident.load(Relaxed) > self.limit_pages() / 4
    }

    /// Evict whole units, oldest first, until at least `need` pages left the region,
    /// then on ahead while `may_evict_ahead`; a unit faulted on during the scan is
    /// evicted only for `need`, never ahead.
    fn evict_lru(&self, ctx: &mut ThreadCtx, need: i64) -> i64 {
        let mut moved = 0;
        let len = self.lru.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut scanned = 0;
        while (moved < need || self.may_evict_ahead()) && scanned < 2 * len + 1 {
            let Some(key) = self
                .lru
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
            else {
                break;
            };
            scanned += 1;
            let (rid, ui) = ((key >> 32) as u32, (key & 0xffff_ffff) as usize);
            let Some(r) = self.region_by_id(rid) else {
                continue;
            };
            let unit = &r.units[ui];
            // Second chance: a unit faulted on since the last pass goes round once more.
            if scanned <= len && unit.referenced.swap(false, Relaxed) {
                self.lru
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(key);
                continue;
            }
            if moved >= need && unit.referenced.load(Relaxed) {
                // Faulted on since this scan passed it: in use now, not ahead-able.
                self.lru
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(key);
                break;
            }
            let mut u = unit.lock();
            unit.on_lru.store(false, Relaxed);
            moved += self.evict_unit(ctx, &r, ui, &mut u);
            // Pages that could not leave (pinned) keep the unit on the list.
            self.lru_add(&r, (ui * UNIT_PAGES) as u64, &u);
        }
        moved
    }

    /// Move every resident page of unit `ui` out of the region. Returns pages moved.
    fn evict_unit(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        ui: usize,
        u: &mut UnitPages,
    ) -> i64 {
        if r.is_dead() || u.resident == 0 {
            return 0;
        }
        let first = (ui * UNIT_PAGES) as u64;
        let resident: Vec<usize> = (0..UNIT_PAGES)
            .filter(|&i| matches!(u.get(i), PageState::Resident { .. }))
            .collect();
        // 1. Detach: one MOVE per run of resident pages.
        let mut moved_idx: Vec<usize> = Vec::with_capacity(resident.len());
        let forked = self.forked.load(Relaxed);
        for run in runs(&resident) {
            let mut k = 0;
            while k < run.len() {
                let p = first + run[k] as u64;
                let bytes = (run.len() - k) * PAGE_SIZE;
                let (done, err) = self.uffd.move_pages_partial(
                    r.shadow_addr(p),
                    r.page_addr(p),
                    bytes,
                    Wake::Yes,
                );
                let n = done / PAGE_SIZE;
                moved_idx.extend_from_slice(&run[k..k + n]);
                k += n;
                if let Some(e) = err.filter(|_| k < run.len()) {
                    // This page refused to move. EBUSY: pinned by the program's own
                    // O_DIRECT (leave it resident) or, after a fork, shared with the
                    // other process (copy it out). Anything else (a range the program
                    // mprotect'ed differs from the shadow): copy it out. But first
                    // make sure it is there: copying from a missing region page would
                    // fault to our own fault thread, which waits for this unit's lock.
                    let q = first + run[k] as u64;
                    let here = self.page_present(r.page_addr(q));
                    let in_shadow = self.page_present(r.shadow_addr(q));
                    if here == Some(false) {
                        if in_shadow == Some(true) {
                            // Its bytes are already in the shadow (EEXIST): it moved.
                            moved_idx.push(run[k]);
                        }
                        self.say_not_mapped(
                            r,
                            q,
                            if in_shadow == Some(true) {
                                "its copy was in the shadow: taken as evicted"
                            } else {
                                "no copy found: left as it is"
                            },
                        );
                    } else {
                        let pinned = e.raw_os_error() == Some(libc::EBUSY) && !forked;
                        if !pinned && self.copy_out(r, q) {
                            moved_idx.push(run[k]);
                        }
                    }
                    k += 1;
                }
            }
        }
        // A whole unit leaves as one 2 MiB write to one cluster.
        if self.unit_mode(r) && moved_idx.len() == UNIT_PAGES && self.evict_whole(ctx, r, u, first)
        {
            let n = UNIT_PAGES as i64;
            u.resident = 0;
            self.resident.fetch_sub(n, Relaxed);
            self.cached.fetch_add(n, Relaxed);
            r.counters.evicted.fetch_add(n as u64, Relaxed);
            return n;
        }
        // 2. Classify.
        let mut dirty: Vec<usize> = Vec::new();
        let mut zeros: Vec<(usize, usize)> = Vec::new();
        let mut clean = 0i64;
        for &i in &moved_idx {
            let p = first + i as u64;
            match u.get(i) {
                PageState::Resident {
                    dirty: false,
                    slot: Some(s),
                } => {
                    let e = Entry {
                        owner: Owner {
                            region: r.id,
                            page: p,
                        },
                        state: CacheState::Clean,
                        readahead: false,
                        waiters: false,
                        write: false,
                    };
                    if self.cache.insert(s, e) {
                        self.slots.set_cache(s);
                    }
                    u.set(i, PageState::Swapped(s));
                    self.push_inactive(r.id, p, s);
                    clean += 1;
                }
                PageState::Resident {
                    dirty: false,
                    slot: None,
                } => {
                    // Zeros never written: nothing to keep.
                    u.set(i, PageState::Untouched);
                    zeros.push((r.shadow_addr(p), PAGE_SIZE));
                }
                PageState::Resident { dirty: true, slot } => {
                    if let Some(stale) = slot {
                        self.slots.put(stale);
                        r.counters.stale_slot_freed.fetch_add(1, Relaxed);
                    }
                    dirty.push(i);
                }
                _ => {}
            }
        }
        // 3. Slots for the dirty pages, and one gathered write per slot run.
        let mut slot_runs: Vec<SlotRun> = Vec::new();
        let mut got = self
            .slots
            .alloc(&mut ctx.cursor, dirty.len(), &mut slot_runs);
        if got < dirty.len() && self.replace_bad_slots() {
            got += self
                .slots
                .alloc(&mut ctx.cursor, dirty.len() - got, &mut slot_runs);
        }
        let (to_write, unbacked) = dirty.split_at(got.min(dirty.len()));
        let mut next = 0;
        for run in &slot_runs {
            let pages: Vec<usize> = to_write[next..next + run.len as usize].to_vec();
            next += run.len as usize;
            for (k, &i) in pages.iter().enumerate() {
                self.start_writeback(r, u, first + i as u64, run.start + k as Slot);
            }
            r.counters.write_requests.fetch_add(1, Relaxed);
            self.queue_io(
                ctx,
                Op::new(
                    OpKind::Write,
                    r.clone(),
                    pages.iter().map(|&i| first + i as u64).collect(),
                    run.start,
                ),
            );
        }
        // Swap full (should not happen: regions commit their swap): keep them in RAM.
        for &i in unbacked {
            let p = first + i as u64;
            self.restore_page(r, p);
            u.set(
                i,
                PageState::Resident {
                    dirty: true,
                    slot: None,
                },
            );
        }
        let moved = (moved_idx.len() - unbacked.len()) as i64;
        u.resident -= moved as u32;
        self.resident.fetch_sub(moved, Relaxed);
        self.cached.fetch_add(moved - zeros.len() as i64, Relaxed);
        self.used.fetch_sub(zeros.len() as i64, Relaxed);
        self.dontneed(&zeros);
        r.counters.evicted.fetch_add(moved as u64, Relaxed);
        r.counters.clean_evicted.fetch_add(clean as u64, Relaxed);
        moved
    }

    /// Drop up to `need` clean cache pages, oldest first. Returns pages freed.
    fn trim_inactive(&self, need: i64) -> i64 {
        let mut freed = 0;
        while freed < need {
            let batch: Vec<_> = {
                let mut q = self.inactive.lock().unwrap_or_else(|p| p.into_inner());
                let n = ((need - freed) as usize).min(q.len()).min(4096);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            let mut batch = batch;
            batch.sort_by_key(|c| (c.region, c.page));
            let mut i = 0;
            while i < batch.len() {
                let (rid, unit_no) = (batch[i].region, batch[i].page / UNIT_PAGES as u64);
                let mut j = i;
                while j < batch.len()
                    && batch[j].region == rid
                    && batch[j].page / UNIT_PAGES as u64 == unit_no
                {
                    j += 1;
                }
                if let Some(r) = self.region_by_id(rid) {
                    let u = r.unit_of(batch[i].page).lock();
                    if !r.is_dead() {
                        // A unit's shadow is one THP under `Huge`: drop all of its clean
                        // pages at once. Dropping part would split the THP and leave a
                        // page table that keeps every later read into this unit in
                        // 4 KiB pages (no THP swap-in there again). The unit's other
                        // list entries go stale and are skipped when popped.
                        let whole: Vec<CachedRef>;
                        let refs = if r.policy.unit == crate::UnitPolicy::Huge {
                            let first = unit_no * UNIT_PAGES as u64;
                            whole = (0..UNIT_PAGES)
                                .filter_map(|k| match u.get(k) {
                                    PageState::Swapped(slot) => Some(CachedRef {
                                        region: rid,
                                        page: first + k as u64,
                                        slot,
                                    }),
                                    _ => None,
                                })
                                .collect();
                            &whole[..]
                        } else {
                            &batch[i..j]
                        };
                        let mut ranges: Vec<(usize, usize)> = Vec::new();
                        for c in refs {
                            if u.get(c.page as usize % UNIT_PAGES) != PageState::Swapped(c.slot) {
                                continue;
                            }
                            if self.cache.remove_clean(c.slot).is_none() {
                                continue;
                            }
                            self.slots.clear_cache(c.slot);
                            let a = r.shadow_addr(c.page);
                            match ranges.last_mut() {
                                Some(last) if last.0 + last.1 == a => last.1 += PAGE_SIZE,
                                _ => ranges.push((a, PAGE_SIZE)),
                            }
                            freed += 1;
                            self.uncharge(&self.cached, 1);
                        }
                        // Under the unit lock: a read into these shadow pages must not
                        // start before they are gone.
                        self.dontneed(&ranges);
                    }
                }
                i = j;
            }
        }
        freed
    }

    /// A write finished: the copy is clean (or, on error, retried elsewhere).
    pub(crate) fn complete_write(&self, ctx: &mut ThreadCtx, op: Op, res: i32) {
        let r = op.region.clone();
        let ok = res >= 0 && res as usize == op.bytes();
        if !ok && !r.is_dead() {
            r.counters.io_errors.fetch_add(1, Relaxed);
        }
        let mut k = 0;
        while k < op.pages.len() {
            let unit_no = op.pages[k] / UNIT_PAGES as u64;
            let mut u = r.unit_of(op.pages[k]).lock();
            while k < op.pages.len() && op.pages[k] / UNIT_PAGES as u64 == unit_no {
                let (page, slot) = (op.pages[k], op.slot + k as u64);
                k += 1;
                if r.is_dead() {
                    self.drop_cache_entry(slot);
                    continue;
                }
                let i = page as usize % UNIT_PAGES;
                if u.get(i) != PageState::Swapped(slot) {
                    self.drop_orphan(&r, page, slot);
                    continue;
                }
                if ok {
                    r.counters.pswpout.fetch_add(1, Relaxed);
                    match self.cache.complete_io(slot) {
                        Some(e) if e.waiters => self.map_cached(&r, &mut u, page, &[slot], e.write),
                        Some(_) => self.push_inactive(r.id, page, slot),
                        None => {}
                    }
                } else {
                    // The data is still in the shadow page: never reuse that slot, and
                    // write the page elsewhere (once), else keep it in RAM.
                    let waiters = self.cache.remove(slot).is_some_and(|e| e.waiters);
                    self.slots.mark_bad(slot);
                    self.slots.clear_cache(slot);
                    self.slots.put(slot);
                    let mut one = Vec::new();
                    let mut got = self.slots.alloc(&mut ctx.cursor, 1, &mut one);
                    if got == 0 && self.replace_bad_slots() {
                        got = self.slots.alloc(&mut ctx.cursor, 1, &mut one);
                    }
                    if op.attempt == 0 && got == 1 {
                        let s = one[0].start;
                        let e = Entry {
                            owner: Owner { region: r.id, page },
                            state: CacheState::Writing,
                            readahead: false,
                            waiters,
                            write: false,
                        };
                        self.cache.insert(s, e);
                        self.slots.set_cache(s);
                        self.owners.set(s, r.id, page);
                        u.set(i, PageState::Swapped(s));
                        let mut op2 = Op::new(OpKind::Write, r.clone(), vec![page], s);
                        op2.attempt = 1;
                        self.queue_io(ctx, op2);
                    } else {
                        self.restore_dirty(&r, &mut u, page);
                        self.lru_add(&r, page, &u);
                    }
                }
            }
        }
    }
}

impl Engine {
    /// Page `p` (in the shadow now, unit lock held) is to be written to slot `s`:
    /// the swap cache holds it as `Writing` until the write completes.
    pub(crate) fn start_writeback(&self, r: &RegionInner, u: &mut UnitPages, p: u64, s: Slot) {
        let owner = Owner {
            region: r.id,
            page: p,
        };
        let e = Entry {
            owner,
            state: CacheState::Writing,
            readahead: false,
            waiters: false,
            write: false,
        };
        self.cache.insert(s, e);
        self.slots.set_cache(s);
        self.owners.set(s, r.id, p);
        u.set(p as usize % UNIT_PAGES, PageState::Swapped(s));
    }

    /// Page `p` is resident by the page map but not mapped in the region (eviction or a
    /// fault found it so); `what` says what was done. Said once: it is an engine bug to
    /// chase (or a program that discarded region memory behind uswap's back), and the
    /// engine goes on instead of deadlocking or looping on it.
    pub(crate) fn say_not_mapped(&self, r: &RegionInner, p: u64, what: &str) {
        if !self.recovered_said.swap(true, Relaxed) {
            eprintln!(
                "uswap: internal: page {p} of region {} was resident by the page map but \
                 not mapped ({what}): an engine bug, or the program discarded it behind \
                 uswap's back",
                r.id
            );
        }
    }

    /// Detach a page that cannot move (shared with a forked process): write-protect
    /// it so that the program's next write waits, copy it to the shadow, drop it from
    /// the region. Under the unit's lock.
    fn copy_out(&self, r: &RegionInner, p: u64) -> bool {
        let (src, dst) = (r.page_addr(p), r.shadow_addr(p));
        if self
            .uffd
            .write_protect(src, PAGE_SIZE, true, Wake::No)
            .is_err()
        {
            return false;
        }
        // The program may have made the page PROT_NONE (`uswap run` leaves unmapped
        // holes and uncommitted parts of reservations so): a plain copy would fault
        // in this thread, so read through /proc/self/mem, which ignores protection.
        // Both are live pages of this region's mappings; the source is present and
        // write-protected (nobody changes it now), the shadow page is unused (the unit
        // lock is held and the page is resident, so its shadow slot is empty).
        if !read_own_memory(src, dst, PAGE_SIZE) {
            return false;
        }
        self.dontneed(&[(src, PAGE_SIZE)]);
        true
    }

    /// Put a page held in the shadow back into the region, writable (it stays dirty):
    /// move it, or copy it where it cannot move. Never drops the data.
    /// A page held in the shadow as cache (its write failed or may never finish) goes
    /// back into the region, dirty and without a slot; the unit lock is held.
    pub(crate) fn restore_dirty(&self, r: &RegionInner, u: &mut UnitPages, p: u64) {
        self.restore_page(r, p);
        u.set(
            p as usize % UNIT_PAGES,
            PageState::Resident {
                dirty: true,
                slot: None,
            },
        );
        u.resident += 1;
        // A move between gauges: `used` does not change.
        self.cached.fetch_sub(1, Relaxed);
        self.resident.fetch_add(1, Relaxed);
    }

    pub(crate) fn restore_page(&self, r: &RegionInner, p: u64) {
        let (dst, src) = (r.page_addr(p), r.shadow_addr(p));
        if self
            .uffd
            .move_pages(dst, src, PAGE_SIZE, Wake::Yes)
            .is_err()
        {
            if let Err(e) = self
                .uffd
                .copy(dst, src as *const u8, PAGE_SIZE, false, Wake::Yes)
            {
                eprintln!("uswap: cannot restore page {p} of region {}: {e}", r.id);
                return;
            }
            self.dontneed(&[(src, PAGE_SIZE)]);
        }
    }
}

/// Copy `len` bytes of this process's memory at `src` into `dst` (writable memory of
/// ours) whatever the protection of `src`: a pread of /proc/self/mem.
fn read_own_memory(src: usize, dst: usize, len: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open("/proc/self/mem") else {
        return false;
    };
    // SAFETY: `dst` is `len` bytes of a live writable mapping of the engine's (the
    // caller's contract); the slice lives only for this call.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
    matches!(f.read_at(buf, src as u64), Ok(n) if n == len)
}

/// Split sorted indices into runs of consecutive values.
fn runs(v: &[usize]) -> impl Iterator<Item = &[usize]> {
    let mut rest = v;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 1;
        while n < rest.len() && rest[n] == rest[n - 1] + 1 {
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}
