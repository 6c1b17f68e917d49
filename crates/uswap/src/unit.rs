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
use crate::{StaleSlotPolicy, UnitPolicy, UNIT_PAGES, UNIT_SIZE};
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
        // SAFETY: populates the shadow range of a unit this thread holds the lock of.
        let ok = unsafe {
            libc::madvise(
                src as *mut libc::c_void,
                UNIT_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        } == 0;
        if !ok
            || self
                .uffd
                .move_pages(dst, src, UNIT_SIZE, Wake::Yes)
                .is_err()
        {
            self.dontneed(&[(src, UNIT_SIZE)]);
            return false;
        }
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
        true
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
        let owner = Owner { region: r.id, page };
        if u.unit_reads > 0 {
            // The unit is on its way in: one read for everybody.
            u.unit_write |= write;
            self.cache.fault_lookup(slots[i_fault], owner, write);
            return true;
        }
        if r.policy.unit == UnitPolicy::Auto {
            let unit_no = first / UNIT_PAGES as u64;
            let last = r.last_whole_unit.load(Relaxed);
            let sequential = i_fault == 0 || last == unit_no.wrapping_sub(1) || last == unit_no + 1;
            if !sequential {
                return false;
            }
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
            self.map_unit(r, u, first, &slots, write);
            return true;
        }
        if absent != UNIT_PAGES {
            // Partly cached, partly on disk: page by page.
            r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
            return false;
        }
        r.counters.majflt.fetch_add(1, Relaxed);
        for (i, &s) in slots.iter().enumerate() {
            let p = first + i as u64;
            let e = Entry {
                owner: Owner {
                    region: r.id,
                    page: p,
                },
                state: CacheState::Reading,
                readahead: false,
                waiters: i == i_fault,
                write: write && i == i_fault,
            };
            self.cache.insert(s, e);
            self.slots.set_cache(s);
        }
        self.charge(&self.cached, UNIT_PAGES as i64);
        u.unit_write = write;
        // One request per run of consecutive slots: one for a unit written whole.
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
        r.last_whole_unit.store(first / UNIT_PAGES as u64, Relaxed);
        true
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
        let _ = self.uffd.wake(dst, UNIT_SIZE);
        for (i, &s) in slots.iter().enumerate() {
            self.mark_mapped(r, u, i, s, write);
        }
        u.resident = UNIT_PAGES as u32;
        self.cached.fetch_sub(UNIT_PAGES as i64, Relaxed);
        self.resident.fetch_add(UNIT_PAGES as i64, Relaxed);
        r.counters.thp_swpin.fetch_add(1, Relaxed);
        self.lru_add(r, first, u);
    }

    /// One part of a whole-unit read finished; the last part maps the unit.
    pub(crate) fn complete_unit_read(&self, ctx: &mut ThreadCtx, op: Op, res: i32) {
        let Some((op, ok)) = self.retry_failed_read(ctx, op, res) else {
            return;
        };
        let r = op.region.clone();
        let first = op.pages[0] - op.pages[0] % UNIT_PAGES as u64;
        let mut u = r.unit_of(first).lock();
        u.unit_reads -= 1;
        let mut lost = false;
        for (k, &p) in op.pages.iter().enumerate() {
            let slot = op.slot + k as u64;
            if r.is_dead() {
                self.drop_cache_entry(slot);
            } else if u.get((p - first) as usize) != PageState::Swapped(slot) {
                self.drop_orphan(&r, p, slot);
            } else if ok {
                r.counters.pswpin.fetch_add(1, Relaxed);
                self.cache.finish_io(slot);
            } else {
                // Lost on the backend: the page raises SIGBUS (like kernel swap).
                self.drop_cache_entry(slot);
                self.dontneed(&[(r.shadow_addr(p), crate::PAGE_SIZE)]);
                u.set((p - first) as usize, PageState::Poisoned);
                self.slots.put(slot);
                let _ = self.uffd.poison(r.page_addr(p), crate::PAGE_SIZE);
                lost = true;
            }
        }
        if u.unit_reads > 0 || r.is_dead() {
            return;
        }
        // All parts in: take every entry out and map.
        let mut slots = [0 as Slot; UNIT_PAGES];
        let mut whole = true;
        let mut write = u.unit_write;
        for (i, s) in slots.iter_mut().enumerate() {
            match u.get(i) {
                PageState::Swapped(x) => {
                    *s = x;
                    if let Some(e) = self.cache.get(x) {
                        write |= e.write;
                    }
                }
                _ => whole = false,
            }
        }
        let _ = lost;
        if whole {
            for &s in &slots {
                self.cache.remove(s);
            }
            self.map_unit(&r, &mut u, first, &slots, write);
            return;
        }
        // Some pages were lost: map the survivors page by page.
        for (i, &s) in slots.iter().enumerate() {
            if let PageState::Swapped(x) = u.get(i) {
                if self.cache.remove(x).is_some() {
                    self.map_cached(&r, &mut u, first + i as u64, &[s], write);
                }
            }
        }
        self.lru_add(&r, first, &u);
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
        self.writes_inflight.fetch_add(1, Relaxed);
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
