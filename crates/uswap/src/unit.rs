//! 2 MiB units, swapped out and in whole (seeds 000 and 002, and the THP swap-in
//! the kernel never merged).
//!
//! - Swap-out: a fully resident unit leaves the region with one UFFDIO_MOVE (a THP
//!   moves as one PMD), takes one whole free cluster and is written with one 2 MiB
//!   write (`thp_swpout`). No free cluster: 4 KiB slots (`thp_swpout_fallback`).
//!   A unit that is all clean and still owns one whole cluster is not written.
//! - Swap-in: a fault in a unit swapped out whole reads it with one 2 MiB read into
//!   the shadow (THP-backed under `UnitPolicy::Huge`) and moves it into the region
//!   whole (`thp_swpin`): a real transparent huge page where the kernel gives one.
//! - First touch (`Huge`): the shadow unit is populated (one zeroed THP) and moved in.
//! - Dirty tracking keeps the unit whole: a unit swapped in for a read is mapped
//!   write-protected as one range; the first write lifts protection on the whole
//!   range at once (the PMD stays whole) and the unit's cluster becomes stale
//!   (freed at once under seed 001's policy). A unit that is partly dirty is written
//!   whole at its next eviction: one sequential 2 MiB write costs less than
//!   tracking which 4 KiB pages changed.
//!
//! `UnitPolicy::Auto` swaps out whole, and swaps in whole only when the fault looks
//! sequential (the unit's first page, or the unit after the last one read whole);
//! random faults take the 4 KiB path with readahead. Its shadow stays small-paged, so
//! `Auto` moves 2 MiB per I/O but maps small pages.

use crate::engine::{Engine, ThreadCtx};
use crate::io::{Op, OpKind};
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::swap_cache::{CacheState, Entry, Owner};
use crate::uffd::Wake;
use crate::{ReadaheadPolicy, StaleSlotPolicy, UnitPolicy, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Engine {
    /// Whether the region swaps 2 MiB units whole.
    pub(crate) fn unit_mode(&self, r: &RegionInner) -> bool {
        r.policy.unit != UnitPolicy::Small
    }

    /// First touch of a wholly untouched unit under `Huge`: one zeroed THP moved in.
    /// Returns false when the caller should fall back to the 4 KiB path.
    pub(crate) fn zero_fill_unit(&self, r: &RegionInner, u: &mut UnitPages, page: u64) -> bool {
        if r.policy.unit != UnitPolicy::Huge
            || u.resident != 0
            || !(0..UNIT_PAGES).all(|i| u.get(i) == PageState::Untouched)
        {
            return false;
        }
        let first = page - page % UNIT_PAGES as u64;
        let (dst, src) = (r.page_addr(first), r.shadow_addr(first));
        self.spares.want();
        if self.take_spare_to(dst) {
            r.counters.thp_fault_spare.fetch_add(1, Relaxed);
            self.map_zeroed_unit(r, u, dst);
            return true;
        }
        self.wake_kswapd(); // to make spares for the next units
                            // SAFETY: populates the shadow range of a unit this thread holds the lock of.
        let ok = unsafe {
            libc::madvise(
                src as *mut libc::c_void,
                UNIT_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        } == 0;
        if !ok || self.uffd.move_pages(dst, src, UNIT_SIZE, Wake::No).is_err() {
            self.dontneed(&[(src, UNIT_SIZE)]);
            return false;
        }
        self.map_zeroed_unit(r, u, dst);
        true
    }

    /// A zeroed THP was moved into the unit at `dst`: every page resident and dirty;
    /// then the faulting thread is woken.
    fn map_zeroed_unit(&self, r: &RegionInner, u: &mut UnitPages, dst: usize) {
        for i in 0..UNIT_PAGES {
            u.set(
                i,
                PageState::Resident {
                    dirty: true,
                    slot: None,
                },
            );
        }
        u.resident = UNIT_PAGES as u32;
        self.charge(&self.resident, UNIT_PAGES as i64);
        r.counters.minflt.fetch_add(1, Relaxed);
        let _ = self.uffd.wake(dst, UNIT_SIZE);
    }

    /// A fault in a unit whose pages are all swapped: swap it in whole if the policy
    /// says so. Returns false to take the 4 KiB path.
    pub(crate) fn swap_in_unit(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        u: &mut UnitPages,
        page: u64,
        write: bool,
    ) -> bool {
        let first = page - page % UNIT_PAGES as u64;
        let i_fault = (page - first) as usize;
        let mut slots = [0 as Slot; UNIT_PAGES];
        for (i, s) in slots.iter_mut().enumerate() {
            match u.get(i) {
                PageState::Swapped(x) => *s = x,
                _ => return false,
            }
        }
        let unit_no = first / UNIT_PAGES as u64;
        let last = r.last_whole_unit.load(Relaxed);
        // A stream through whole units, and its direction (for unit readahead).
        let forward = last == unit_no.wrapping_sub(1);
        let backward = last == unit_no + 1;
        if u.unit_reads > 0 {
            // The unit is on its way in (read ahead, or by another fault): one read
            // for everybody; its last part maps the unit and wakes them all. (Parts
            // already in are clean entries: not a cache hit to take page by page.)
            u.unit_write |= write;
            u.unit_waited = true;
            self.unit_ra_hit(r, u);
            r.last_whole_unit.store(unit_no, Relaxed);
            self.unit_readahead(ctx, r, unit_no, forward, backward);
            return true;
        }
        if r.policy.unit == UnitPolicy::Auto && !(i_fault == 0 || forward || backward) {
            return false;
        }
        let (mut clean, mut absent) = (0, 0);
        for &s in &slots {
            match self.cache.get(s) {
                None => absent += 1,
                Some(e) if e.state == CacheState::Clean => clean += 1,
                Some(_) => {}
            }
        }
        if clean == UNIT_PAGES {
            for &s in &slots {
                self.cache.remove(s);
            }
            r.counters.minflt.fetch_add(1, Relaxed);
            r.counters.swapcache_hit.fetch_add(1, Relaxed);
            self.unit_ra_hit(r, u);
            self.map_unit(r, u, first, &slots, write);
            r.last_whole_unit.store(unit_no, Relaxed);
            self.unit_readahead(ctx, r, unit_no, forward, backward);
            return true;
        }
        if absent != UNIT_PAGES {
            // Partly cached, partly on disk: page by page.
            r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
            return false;
        }
        r.counters.majflt.fetch_add(1, Relaxed);
        self.queue_unit_read(ctx, r, u, first, &slots, Some((i_fault, write)));
        r.last_whole_unit.store(unit_no, Relaxed);
        self.unit_readahead(ctx, r, unit_no, forward, backward);
        true
    }

    /// Units a stream reads ahead: `readahead_units`, but at most a sixteenth of the
    /// budget, so that in a small budget reading ahead does not evict what the
    /// program is working on (a 16 MiB budget reads none ahead, 256 MiB up to 8).
    pub(crate) fn units_ahead(&self) -> u64 {
        let cap = self.limit_pages().max(0) as u64 / (16 * UNIT_PAGES as u64);
        (self.cfg.readahead_units as u64).min(cap)
    }

    /// A fault found its unit read ahead: count the unit's pages as hits, once.
    fn unit_ra_hit(&self, r: &RegionInner, u: &mut UnitPages) {
        if std::mem::take(&mut u.prefetched) {
            r.counters.swap_ra_hit.fetch_add(UNIT_PAGES as u64, Relaxed);
        }
    }

    /// Read a unit swapped out whole into the swap cache: one entry per page (the
    /// faulting one waits, if any), one request per run of consecutive slots (one
    /// for a unit written whole). The last part's completion maps the unit if a
    /// fault wants it.
    fn queue_unit_read(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        u: &mut UnitPages,
        first: u64,
        slots: &[Slot; UNIT_PAGES],
        fault: Option<(usize, bool)>,
    ) {
        for (i, &s) in slots.iter().enumerate() {
            let p = first + i as u64;
            let waits = fault.is_some_and(|(f, _)| f == i);
            let e = Entry {
                owner: Owner {
                    region: r.id,
                    page: p,
                },
                state: CacheState::Reading,
                readahead: fault.is_none(),
                waiters: waits,
                write: waits && fault.is_some_and(|(_, w)| w),
            };
            self.cache.insert(s, e);
            self.slots.set_cache(s);
        }
        self.charge(&self.cached, UNIT_PAGES as i64);
        u.unit_waited = fault.is_some();
        u.unit_write = fault.is_some_and(|(_, w)| w);
        let mut a = 0;
        while a < UNIT_PAGES {
            let mut b = a + 1;
            while b < UNIT_PAGES && slots[b] == slots[b - 1] + 1 {
                b += 1;
            }
            let mut op = Op::new(
                OpKind::Read,
                r.clone(),
                (first + a as u64..first + b as u64).collect(),
                slots[a],
            );
            op.unit_read = true;
            u.unit_reads += 1;
            r.counters.read_requests.fetch_add(1, Relaxed);
            self.queue_io(ctx, op);
            a = b;
        }
    }

    /// Unit readahead (beyond the kernel, which never swaps in whole): a fault in a
    /// stream through whole units also reads the next `readahead_units` units in
    /// the stream's direction into the swap cache, so that the disk reads them while
    /// the program works on this one. Only units wholly swapped out and not cached,
    /// only with room (`take_room`), only units whose lock is free (never wait
    /// on a second unit lock). A unit nobody faults on is dropped clean by reclaim.
    fn unit_readahead(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        unit_no: u64,
        forward: bool,
        backward: bool,
    ) {
        let n = self.units_ahead();
        if n == 0 || r.policy.readahead == ReadaheadPolicy::Off || !(forward || backward) {
            return;
        }
        for k in 1..=n {
            let m = if forward {
                unit_no + k
            } else {
                match unit_no.checked_sub(k) {
                    Some(m) => m,
                    None => break,
                }
            };
            let Some(unit) = r.units.get(m as usize) else {
                break;
            };
            let Some(mut g) = unit.try_lock() else {
                break;
            };
            if r.is_dead() {
                break;
            }
            if g.unit_reads > 0 {
                continue; // already on its way
            }
            let mut slots = [0 as Slot; UNIT_PAGES];
            let whole = (0..UNIT_PAGES).all(|i| match g.get(i) {
                PageState::Swapped(x) if self.cache.get(x).is_none() => {
                    slots[i] = x;
                    true
                }
                _ => false,
            });
            if !whole {
                continue; // resident or partly cached: the stream goes on past it
            }
            if self.take_room(UNIT_PAGES as i64) < UNIT_PAGES as i64 {
                break;
            }
            let first = m * UNIT_PAGES as u64;
            self.queue_unit_read(ctx, r, &mut g, first, &slots, None);
            g.prefetched = true;
            r.counters.swap_ra.fetch_add(UNIT_PAGES as u64, Relaxed);
        }
    }

    /// Move a unit whose every page is in the shadow into the region, whole. The
    /// caller removed the cache entries.
    fn map_unit(
        &self,
        r: &RegionInner,
        u: &mut UnitPages,
        first: u64,
        slots: &[Slot; UNIT_PAGES],
        mut write: bool,
    ) {
        let (dst, src) = (r.page_addr(first), r.shadow_addr(first));
        if self.uffd.move_pages(dst, src, UNIT_SIZE, Wake::No).is_err() {
            // Shadow pages shared with a forked process do not move: copy the rest
            // (pages already moved are skipped), never lose data.
            if let Err(e) = self
                .uffd
                .copy(dst, src as *const u8, UNIT_SIZE, false, Wake::No)
            {
                eprintln!("uswap: swap-in of a unit of region {} failed: {e}", r.id);
            }
            self.dontneed(&[(src, UNIT_SIZE)]);
        }
        if !write
            && self
                .uffd
                .write_protect(dst, UNIT_SIZE, true, Wake::No)
                .is_err()
        {
            // Without protection a write would go unseen: treat the unit as dirty.
            write = true;
        }
        for (i, &s) in slots.iter().enumerate() {
            self.mark_mapped(r, u, i, s, write);
        }
        u.resident = UNIT_PAGES as u32;
        self.cached.fetch_sub(UNIT_PAGES as i64, Relaxed);
        self.resident.fetch_add(UNIT_PAGES as i64, Relaxed);
        r.counters.thp_swpin.fetch_add(1, Relaxed);
        self.lru_add(r, first, u);
        // Last: a program woken earlier could read counters that miss this swap-in.
        let _ = self.uffd.wake(dst, UNIT_SIZE);
    }

    /// One part of a whole-unit read finished; the last part maps the unit if a
    /// fault wants it (a unit read ahead stays clean in the swap cache).
    pub(crate) fn complete_unit_read(&self, ctx: &mut ThreadCtx, op: Op, res: i32) {
        let Some((op, ok)) = self.retry_failed_read(ctx, op, res) else {
            return;
        };
        let r = op.region.clone();
        let first = op.pages[0] - op.pages[0] % UNIT_PAGES as u64;
        let mut u = r.unit_of(first).lock();
        u.unit_reads -= 1;
        // Does a fault wait for this unit? (Asked only on an error.)
        let mut wanted: Option<bool> = None;
        for (k, &p) in op.pages.iter().enumerate() {
            let slot = op.slot + k as u64;
            if r.is_dead() {
                self.drop_cache_entry(slot);
            } else if u.get((p - first) as usize) != PageState::Swapped(slot) {
                self.drop_orphan(&r, p, slot);
            } else if ok {
                r.counters.pswpin.fetch_add(1, Relaxed);
                self.cache.finish_io(slot);
            } else if *wanted.get_or_insert_with(|| self.unit_wanted(&u)) {
                // Lost on the backend: the page raises SIGBUS (like kernel swap).
                self.drop_cache_entry(slot);
                self.dontneed(&[(r.shadow_addr(p), crate::PAGE_SIZE)]);
                u.set((p - first) as usize, PageState::Poisoned);
                self.slots.put(slot);
                let _ = self.uffd.poison(r.page_addr(p), crate::PAGE_SIZE);
            } else {
                // Read ahead, nobody waits: forget the copy; a fault reads it again.
                self.drop_cache_entry(slot);
                self.dontneed(&[(r.shadow_addr(p), crate::PAGE_SIZE)]);
            }
        }
        if u.unit_reads > 0 || r.is_dead() {
            return;
        }
        let wanted = self.unit_wanted(&u);
        u.unit_waited = false;
        // All parts in: every page swapped with its copy in the cache maps whole.
        let mut slots = [0 as Slot; UNIT_PAGES];
        let mut whole = true;
        for (i, s) in slots.iter_mut().enumerate() {
            match u.get(i) {
                PageState::Swapped(x) if self.cache.get(x).is_some() => *s = x,
                _ => whole = false,
            }
        }
        let write = u.unit_write
            || slots
                .iter()
                .any(|&s| self.cache.get(s).is_some_and(|e| e.write));
        if whole && wanted {
            for &s in &slots {
                self.cache.remove(s);
            }
            self.map_unit(&r, &mut u, first, &slots, write);
            return;
        }
        for i in 0..UNIT_PAGES {
            if let PageState::Swapped(x) = u.get(i) {
                if self.cache.get(x).is_none() {
                    continue;
                }
                if wanted {
                    // Some pages were lost: map the survivors page by page.
                    self.cache.remove(x);
                    self.map_cached(&r, &mut u, first + i as u64, &[x], write);
                } else {
                    // Read ahead and no fault yet: the copies stay clean in the swap
                    // cache, where a fault maps them whole, or reclaim drops them.
                    self.push_inactive(r.id, first + i as u64, x);
                }
            }
        }
        if wanted {
            self.lru_add(&r, first, &u);
        }
    }

    /// A fault waits for this unit's read.
    fn unit_wanted(&self, u: &UnitPages) -> bool {
        u.unit_waited || u.unit_write
    }

    /// Eviction of a fully resident unit (already moved to the shadow): one cluster,
    /// one 2 MiB write. Returns false to fall back to 4 KiB slots.
    pub(crate) fn evict_whole(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        u: &mut UnitPages,
        first: u64,
    ) -> bool {
        // All clean and still owning one whole cluster: nothing to write.
        if let PageState::Resident {
            dirty: false,
            slot: Some(s0),
        } = u.get(0)
        {
            if s0 % UNIT_PAGES as u64 == 0
                && (0..UNIT_PAGES).all(|i| {
                    u.get(i)
                        == PageState::Resident {
                            dirty: false,
                            slot: Some(s0 + i as u64),
                        }
                })
            {
                return false; // the 4 KiB path turns them into clean cache entries
            }
        }
        let Some(base) = self.slots.alloc_cluster(&mut ctx.cursor) else {
            r.counters.thp_swpout_fallback.fetch_add(1, Relaxed);
            return false;
        };
        for i in 0..UNIT_PAGES {
            if let PageState::Resident {
                slot: Some(old), ..
            } = u.get(i)
            {
                // Rewritten whole: the old copy is stale.
                self.slots.put(old);
                r.counters.stale_slot_freed.fetch_add(1, Relaxed);
            }
            self.start_writeback(r, u, first + i as u64, base + i as u64);
        }
        r.counters.write_requests.fetch_add(1, Relaxed);
        r.counters.thp_swpout.fetch_add(1, Relaxed);
        self.queue_io(
            ctx,
            Op::new(
                OpKind::Write,
                r.clone(),
                (first..first + UNIT_PAGES as u64).collect(),
                base,
            ),
        );
        true
    }

    /// First write to a unit mapped clean as a whole: lift protection on the whole
    /// range (the PMD stays whole) and mark every page dirty. Returns false when the
    /// unit is not whole and clean (4 KiB path).
    pub(crate) fn wp_unit(&self, r: &RegionInner, u: &mut UnitPages, page: u64) -> bool {
        if !self.unit_mode(r) || u.resident != UNIT_PAGES as u32 {
            return false;
        }
        if !(0..UNIT_PAGES).all(|i| matches!(u.get(i), PageState::Resident { dirty: false, .. })) {
            return false;
        }
        let first = page - page % UNIT_PAGES as u64;
        for i in 0..UNIT_PAGES {
            if let PageState::Resident { slot, .. } = u.get(i) {
                let slot = slot.and_then(|s| self.stale_slot_of(r, s));
                u.set(i, PageState::Resident { dirty: true, slot });
            }
        }
        r.counters.wpflt.fetch_add(1, Relaxed);
        let _ = self
            .uffd
            .write_protect(r.page_addr(first), UNIT_SIZE, false, Wake::Yes);
        true
    }

    /// The stale-slot policy (seed 001) for one slot; what the page keeps.
    pub(crate) fn stale_slot_of(&self, r: &RegionInner, s: Slot) -> Option<Slot> {
        match self.cfg.stale_slot_policy {
            StaleSlotPolicy::FreeOnWrite => {
                self.slots.put(s);
                r.counters.stale_slot_freed.fetch_add(1, Relaxed);
                None
            }
            StaleSlotPolicy::KeepUntilReclaim => Some(s),
        }
    }
}
