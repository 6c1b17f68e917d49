//! Fault handling: a missing fault is served from the zero page (first touch), the
//! swap cache (a copy still in RAM) or the backend (one read, plus readahead); a
//! write-protect fault marks a clean page dirty and frees its now stale slot
//! (seed 001). Reads complete on the thread that issued them, which maps the page
//! and wakes the faulting thread with the same ioctl.

use crate::engine::{CachedRef, Engine, ThreadCtx};
use crate::io::{Op, OpKind, TOKEN_EVENT, TOKEN_UFFD};
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::swap_cache::{CacheState, Entry, Lookup, Owner};
use crate::uffd::{Fault, Wake};
use crate::{ReadaheadPolicy, PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

/// A 2 MiB mapping that is never written: UFFDIO_COPY from it fills pages with
/// zeros without any RSS of its own (reads map the kernel's zero page).
fn zero_source() -> usize {
    static ZERO: OnceLock<usize> = OnceLock::new();
    *ZERO.get_or_init(|| {
        // SAFETY: a fresh read-only anonymous mapping that is never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                UNIT_SIZE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "cannot map the zero source");
        p as usize
    })
}

impl Engine {
    /// Dispatch one fault message. False: put it back (a fork is pending and it
    /// needs room first).
    pub(crate) fn handle_fault(&self, ctx: &mut ThreadCtx, f: Fault) -> bool {
        let addr = f.addr & !(PAGE_SIZE - 1);
        let Some(r) = self.region_by_addr(addr) else {
            // Not ours any more (region dropped while the thread faulted): let it retry.
            let _ = self.uffd.wake(addr, PAGE_SIZE);
            return true;
        };
        let page = ((addr - r.base) / PAGE_SIZE) as u64;
        if f.wp {
            self.handle_wp(&r, page);
            true
        } else {
            self.handle_missing(ctx, &r, page, f.write)
        }
    }

    fn handle_missing(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        page: u64,
        write: bool,
    ) -> bool {
        // Room first, with no lock held: reclaim takes unit locks.
        let want = if self.unit_mode(r) {
            // A stream through whole units also reserves the units it reads ahead.
            let unit_no = page / UNIT_PAGES as u64;
            let last = r.last_whole_unit.load(Relaxed);
            let stream = last == unit_no.wrapping_sub(1) || last == unit_no + 1;
            let ahead = if stream && r.policy.readahead != ReadaheadPolicy::Off {
                self.units_ahead() as i64
            } else {
                0
            };
            UNIT_PAGES as i64 * (1 + ahead)
        } else {
            1 + self.cfg.readahead_max_pages as i64
        };
        let Some(_room) = self.make_room(ctx, r, want) else {
            return false;
        };
        let unit = r.unit_of(page);
        let mut u = unit.lock();
        if r.is_dead() {
            let _ = self.uffd.wake(r.page_addr(page), PAGE_SIZE);
            return true;
        }
        unit.referenced.store(true, Relaxed);
        let i = page as usize % UNIT_PAGES;
        match u.get(i) {
            PageState::Untouched => {
                if !(write && self.zero_fill_unit(r, &mut u, page)) {
                    self.zero_fill(r, &mut u, page, write)
                }
            }
            PageState::Resident { .. } => {
                // Usually a fault that raced with the page's mapping: wake it. If the
                // page is really missing (an engine bug), waking would loop the
                // program on this fault: put the shadow's copy back, or poison.
                if self.page_present(r.page_addr(page)) == Some(false) {
                    self.heal_missing_resident(r, &mut u, page);
                }
                let _ = self.uffd.wake(r.page_addr(page), PAGE_SIZE);
            }
            PageState::Poisoned => {
                let _ = self.uffd.poison(r.page_addr(page), PAGE_SIZE);
            }
            PageState::Swapped(slot) => {
                if !(self.unit_mode(r) && self.swap_in_unit(ctx, r, &mut u, page, write)) {
                    self.swap_in(ctx, r, &mut u, page, slot, write)
                }
            }
        }
        u.prefetched = false;
        self.lru_add(r, page, &u);
        true
    }

    /// Put the unit of `page` on the reclaim list if it has resident pages and is not
    /// there yet. Called under the unit's lock.
    pub(crate) fn lru_add(&self, r: &RegionInner, page: u64, u: &UnitPages) {
        let unit = r.unit_of(page);
        if u.resident > 0 && !unit.on_lru.swap(true, Relaxed) {
            let key = ((r.id as u64) << 32) | (page / UNIT_PAGES as u64);
            self.lru
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(key);
        }
        self.note_peak();
    }

    /// First touch: zeros, no I/O. A write maps them writable (dirty); a read maps
    /// them write-protected, so that clean zeros can be dropped without a write.
    /// Sequential first writes fault-around: the window doubles up to the rest of
    /// the unit, so a program filling memory takes one fault per 2 MiB, not 512.
    fn zero_fill(&self, r: &RegionInner, u: &mut UnitPages, page: u64, write: bool) {
        let i = page as usize % UNIT_PAGES;
        let mut n = 1usize;
        if write {
            let mut za = r.zero_ahead.lock().unwrap_or_else(|p| p.into_inner());
            za.win = if page == za.last && za.win > 0 {
                (za.win * 2).min(UNIT_PAGES as u32)
            } else {
                1
            };
            let max = (za.win as usize).min(UNIT_PAGES - i);
            while n < max && u.get(i + n) == PageState::Untouched {
                n += 1;
            }
            // Past this fault's reservation only as far as free room allows.
            n = n.min(self.take_room(n as i64).max(1) as usize);
            za.last = page + n as u64;
        }
        let addr = r.page_addr(page);
        if let Err(e) = self.uffd.copy(
            addr,
            zero_source() as *const u8,
            n * PAGE_SIZE,
            !write,
            Wake::Yes,
        ) {
            self.map_failed("zero fill", addr, e);
            return;
        }
        for k in 0..n {
            u.set(
                i + k,
                PageState::Resident {
                    dirty: write,
                    slot: None,
                },
            );
        }
        u.resident += n as u32;
        self.charge(&self.resident, n as i64);
        r.counters.minflt.fetch_add(1, Relaxed);
    }

    /// A page resident by the page map is not mapped in the region. Its bytes are in
    /// the shadow (put them back) or nowhere (poison: a SIGBUS beats wrong data).
    /// Under the unit's lock; said once.
    fn heal_missing_resident(&self, r: &RegionInner, u: &mut UnitPages, page: u64) {
        let in_shadow = self.page_present(r.shadow_addr(page)) == Some(true);
        // Said first: a poisoned page kills the program as soon as it is woken.
        self.say_not_mapped(
            r,
            page,
            if in_shadow {
                "its copy was in the shadow: put back"
            } else {
                "no copy found: poisoned"
            },
        );
        if in_shadow {
            self.restore_page(r, page);
            return;
        }
        let i = page as usize % UNIT_PAGES;
        if let PageState::Resident { slot: Some(s), .. } = u.get(i) {
            self.slots.put(s);
        }
        u.set(i, PageState::Poisoned);
        u.resident -= 1;
        self.uncharge(&self.resident, 1);
        let _ = self.uffd.poison(r.page_addr(page), PAGE_SIZE);
    }

    fn map_failed(&self, what: &str, addr: usize, e: std::io::Error) {
        // ENOENT/EINVAL: the range went away under us (region dropped); nothing waits.
        if !matches!(
            e.raw_os_error(),
            Some(libc::ENOENT) | Some(libc::EINVAL) | Some(libc::ESRCH)
        ) {
            eprintln!("uswap: {what} at {addr:#x} failed: {e}");
        }
        let _ = self.uffd.wake(addr, PAGE_SIZE);
    }

    /// A fault on a swapped page: the swap cache, or a read (deduplicated).
    fn swap_in(
        &self,
        ctx: &mut ThreadCtx,
        r: &Arc<RegionInner>,
        u: &mut UnitPages,
        page: u64,
        slot: Slot,
        write: bool,
    ) {
        let owner = Owner { region: r.id, page };
        match self.cache.fault_lookup(slot, owner, write) {
            Lookup::Hit(e) => {
                r.counters.minflt.fetch_add(1, Relaxed);
                r.counters.swapcache_hit.fetch_add(1, Relaxed);
                if e.readahead {
                    r.counters.swap_ra_hit.fetch_add(1, Relaxed);
                }
                match r.policy.readahead {
                    // The kernel's lookup_swap_cache: a hit also moves the stream position.
                    ReadaheadPolicy::Vma => {
                        r.ra.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .vma
                            .cache_hit(page, e.readahead)
                    }
                    ReadaheadPolicy::Cluster if e.readahead => self.cluster_ra.hit(),
                    _ => {}
                }
                self.map_cached(r, u, page, &[slot], write);
            }
            Lookup::InFlight => {}
            Lookup::Miss => {
                r.counters.majflt.fetch_add(1, Relaxed);
                self.slots.set_cache(slot);
                self.charge(&self.cached, 1);
                let mut reads = vec![(r.clone(), page, slot)];
                self.readahead(r, u, page, slot, &mut reads);
                self.queue_reads(ctx, reads);
            }
        }
    }

    /// Pick readahead pages around a fault and insert them in the swap cache.
    fn readahead(
        &self,
        r: &Arc<RegionInner>,
        u: &mut UnitPages,
        page: u64,
        slot: Slot,
        reads: &mut Vec<(Arc<RegionInner>, u64, Slot)>,
    ) {
        // The fault's own page is charged; the window takes the rest of the
        // reservation, grown where room is free (a long stream's window).
        let max = self.cfg.readahead_max_pages;
        match r.policy.readahead {
            ReadaheadPolicy::Off => {}
            ReadaheadPolicy::Vma => {
                let w = {
                    let mut g = r.ra.lock().unwrap_or_else(|p| p.into_inner());
                    let st = &mut *g;
                    if self.cfg.readahead_stream {
                        st.vma.window_adaptive(page, r.pages(), &mut st.cap)
                    } else {
                        st.vma.window(page, r.pages(), max)
                    }
                };
                let need = w.end.saturating_sub(w.start).saturating_sub(1);
                let room = self.take_room(need as i64) as u64;
                for p in w.start..w.end {
                    if p == page || reads.len() as u64 > room {
                        continue;
                    }
                    if let PageState::Swapped(s) = u.get(p as usize % UNIT_PAGES) {
                        self.try_readahead(r, p, s, reads);
                    }
                }
            }
            ReadaheadPolicy::Cluster => {
                let (lo, hi) = self.cluster_ra.window(slot, self.slots.capacity(), max);
                let room = self.take_room(hi.saturating_sub(lo) as i64) as u64;
                for s in lo..hi {
                    if s == slot || reads.len() as u64 > room {
                        continue;
                    }
                    let Some((rid, p)) = self.owners.get(s) else {
                        continue;
                    };
                    let same_unit =
                        rid == r.id && p / UNIT_PAGES as u64 == page / UNIT_PAGES as u64;
                    if same_unit {
                        if u.get(p as usize % UNIT_PAGES) == PageState::Swapped(s) {
                            self.try_readahead(r, p, s, reads);
                        }
                        continue;
                    }
                    let Some(or) = self.region_by_id(rid) else {
                        continue;
                    };
                    if p >= or.pages() {
                        continue;
                    }
                    // Another unit's lock: only if free (lock order is per unit; never wait).
                    let Some(ou) = or.unit_of(p).try_lock() else {
                        continue;
                    };
                    if !or.is_dead() && ou.get(p as usize % UNIT_PAGES) == PageState::Swapped(s) {
                        self.try_readahead(&or, p, s, reads);
                    }
                }
            }
        }
    }

    fn try_readahead(
        &self,
        r: &Arc<RegionInner>,
        p: u64,
        s: Slot,
        reads: &mut Vec<(Arc<RegionInner>, u64, Slot)>,
    ) {
        let e = Entry {
            owner: Owner {
                region: r.id,
                page: p,
            },
            state: CacheState::Reading,
            readahead: true,
            waiters: false,
            write: false,
        };
        if self.cache.insert(s, e) {
            self.slots.set_cache(s);
            self.charge(&self.cached, 1);
            r.counters.swap_ra.fetch_add(1, Relaxed);
            reads.push((r.clone(), p, s));
        }
    }

    /// Queue reads, one request per run of consecutive slots of one region.
    fn queue_reads(&self, ctx: &mut ThreadCtx, mut reads: Vec<(Arc<RegionInner>, u64, Slot)>) {
        reads.sort_by_key(|(r, _, s)| (r.id, *s));
        let mut i = 0;
        while i < reads.len() {
            let mut j = i + 1;
            while j < reads.len()
                && reads[j].0.id == reads[i].0.id
                && reads[j].2 == reads[j - 1].2 + 1
                && j - i < UNIT_PAGES
            {
                j += 1;
            }
            let pages: Vec<u64> = reads[i..j].iter().map(|x| x.1).collect();
            let r = reads[i].0.clone();
            r.counters.read_requests.fetch_add(1, Relaxed);
            self.queue_io(ctx, Op::new(OpKind::Read, r, pages, reads[i].2));
            i = j;
        }
    }

    /// Map cached copies of consecutive pages `page..page+slots.len()` from the shadow
    /// into the region, write-protected (clean, slot valid), and free the shadow
    /// pages. The caller removed their cache entries. Under the unit's lock.
    /// Map cached copies of consecutive pages `page..page+slots.len()` from the shadow
    /// into the region and free the shadow pages. The caller removed their cache
    /// entries. Clean: write-protected, the slot stays valid. `dirty` (the fault was a
    /// write): writable at once, the slot is stale (seed 001). Under the unit's lock.
    pub(crate) fn map_cached(
        &self,
        r: &RegionInner,
        u: &mut UnitPages,
        page: u64,
        slots: &[Slot],
        dirty: bool,
    ) {
        let n = slots.len();
        let (dst, src) = (r.page_addr(page), r.shadow_addr(page));
        if let Err(e) = self
            .uffd
            .copy(dst, src as *const u8, n * PAGE_SIZE, !dirty, Wake::Yes)
        {
            self.map_failed("swap-in copy", dst, e);
        }
        self.dontneed(&[(src, n * PAGE_SIZE)]);
        let i = page as usize % UNIT_PAGES;
        for (k, &s) in slots.iter().enumerate() {
            self.mark_mapped(r, u, i + k, s, dirty);
        }
        u.resident += n as u32;
        // A move between gauges: `used` (what the budget reads) does not change.
        self.cached.fetch_sub(n as i64, Relaxed);
        self.resident.fetch_add(n as i64, Relaxed);
    }

    /// Page `i` of a unit was just mapped from the swap cache copy of slot `s` (the
    /// entry is gone): clean pages keep their valid slot; dirty ones (mapped for a
    /// write) make it stale, and the policy decides (seed 001).
    pub(crate) fn mark_mapped(
        &self,
        r: &RegionInner,
        u: &mut UnitPages,
        i: usize,
        s: Slot,
        dirty: bool,
    ) {
        self.slots.clear_cache(s);
        let slot = if dirty {
            self.stale_slot_of(r, s)
        } else {
            Some(s)
        };
        u.set(i, PageState::Resident { dirty, slot });
    }

    /// First write to a clean page: it becomes dirty, and its slot is stale.
    fn handle_wp(&self, r: &RegionInner, page: u64) {
        let addr = r.page_addr(page);
        let mut u = r.unit_of(page).lock();
        if r.is_dead() {
            let _ = self.uffd.wake(addr, PAGE_SIZE);
            return;
        }
        if self.wp_unit(r, &mut u, page) {
            return;
        }
        let i = page as usize % UNIT_PAGES;
        match u.get(i) {
            PageState::Resident { dirty: false, slot } => {
                let slot = slot.and_then(|s| self.stale_slot_of(r, s));
                u.set(i, PageState::Resident { dirty: true, slot });
                r.counters.wpflt.fetch_add(1, Relaxed);
                if let Err(e) = self.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes) {
                    self.map_failed("write unprotect", addr, e);
                }
            }
            PageState::Resident { dirty: true, .. } => {
                let _ = self.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes);
            }
            // Evicted meanwhile: the retry takes a missing fault.
            _ => {
                let _ = self.uffd.wake(addr, PAGE_SIZE);
            }
        }
    }

    /// Handle completions reaped from a ring.
    pub(crate) fn process_cqes(&self, ctx: &mut ThreadCtx, cqes: &[(u64, i32)]) {
        for &(ud, res) in cqes {
            match ud {
                TOKEN_UFFD => ctx.uffd_armed = false,
                TOKEN_EVENT => {
                    crate::engine::drain_eventfd_raw(ctx.event_fd);
                    ctx.ring.poll(ctx.event_fd, TOKEN_EVENT);
                }
                _ => self.complete(ctx, ud, res),
            }
        }
    }

    /// One backend request finished.
    pub(crate) fn complete(&self, ctx: &mut ThreadCtx, ud: u64, mut res: i32) {
        let Some(op) = ctx.ring.take(ud) else { return };
        self.io_inflight.fetch_sub(1, Relaxed);
        let inj = self.cfg.inject;
        let hit = |every: u64, n: u64| every > 0 && n.is_multiple_of(every);
        // Injected short I/O only shortens the result: the bytes did move.
        let short = (op.bytes() / 2) as i32;
        let inject = res >= 0 && (op.attempt == 0 || !inj.transient);
        match op.kind {
            OpKind::Read => {
                let n = self.read_seq.fetch_add(1, Relaxed) + 1;
                if inject && hit(inj.fail_read_every, n) {
                    res = -libc::EIO;
                } else if inject && hit(inj.short_read_every, n) {
                    res = short;
                }
                self.complete_read(ctx, op, res);
            }
            OpKind::Write => {
                self.writes_inflight.fetch_sub(1, Relaxed);
                self.writeback_pages
                    .fetch_sub(op.pages.len() as i64, Relaxed);
                let n = self.write_seq.fetch_add(1, Relaxed) + 1;
                if inject && hit(inj.fail_write_every, n) {
                    res = -libc::EIO;
                } else if inject && hit(inj.short_write_every, n) {
                    res = short;
                }
                self.complete_write(ctx, op, res);
            }
        }
    }

    fn complete_read(&self, ctx: &mut ThreadCtx, op: Op, res: i32) {
        if op.unit_read {
            return self.complete_unit_read(ctx, op, res);
        }
        let Some((op, ok)) = self.retry_failed_read(ctx, op, res) else {
            return;
        };
        let r = op.region.clone();
        // Pages of one request may span units (cluster readahead): lock each in turn.
        let mut k = 0;
        while k < op.pages.len() {
            let unit_no = op.pages[k] / UNIT_PAGES as u64;
            let mut u = r.unit_of(op.pages[k]).lock();
            let mut to_map: Vec<(u64, Slot, bool)> = Vec::new();
            while k < op.pages.len() && op.pages[k] / UNIT_PAGES as u64 == unit_no {
                let (page, slot) = (op.pages[k], op.slot + k as u64);
                k += 1;
                if r.is_dead() {
                    self.drop_cache_entry(slot);
                    continue;
                }
                if u.get(page as usize % UNIT_PAGES) != PageState::Swapped(slot) {
                    // Discarded while the read was in flight: drop it, let waiters retry.
                    self.drop_orphan(&r, page, slot);
                    continue;
                }
                if ok {
                    r.counters.pswpin.fetch_add(1, Relaxed);
                    match self.cache.complete_io(slot) {
                        Some(e) if e.waiters => to_map.push((page, slot, e.write)),
                        Some(_) => self.push_inactive(r.id, page, slot),
                        None => {}
                    }
                } else {
                    let waited = self.cache.get(slot).is_some_and(|e| e.waiters);
                    self.drop_cache_entry(slot);
                    self.dontneed(&[(r.shadow_addr(page), PAGE_SIZE)]);
                    if waited {
                        // The data is gone: the program gets SIGBUS on this page, as it
                        // would from kernel swap after an I/O error.
                        u.set(page as usize % UNIT_PAGES, PageState::Poisoned);
                        self.slots.put(slot);
                        let _ = self.uffd.poison(r.page_addr(page), PAGE_SIZE);
                    }
                }
            }
            // Map runs of consecutive pages with one copy each.
            let mut a = 0;
            while a < to_map.len() {
                let mut b = a + 1;
                while b < to_map.len()
                    && to_map[b].0 == to_map[b - 1].0 + 1
                    && to_map[b].2 == to_map[a].2
                {
                    b += 1;
                }
                let slots: Vec<Slot> = to_map[a..b].iter().map(|x| x.1).collect();
                self.map_cached(&r, &mut u, to_map[a].0, &slots, to_map[a].2);
                a = b;
            }
            if !to_map.is_empty() {
                self.lru_add(&r, to_map[0].0, &u);
            }
        }
    }

    /// A read finished with `res`: if it failed and may be tried again (twice), queue
    /// it again and return None; else the request and whether it succeeded.
    pub(crate) fn retry_failed_read(
        &self,
        ctx: &mut ThreadCtx,
        mut op: Op,
        res: i32,
    ) -> Option<(Op, bool)> {
        let ok = res >= 0 && res as usize == op.bytes();
        if !ok && !op.region.is_dead() {
            op.region.counters.io_errors.fetch_add(1, Relaxed);
            if op.attempt < 2 {
                op.attempt += 1;
                self.queue_io(ctx, op);
                return None;
            }
        }
        Some((op, ok))
    }

    /// Remove a cache entry whose page will not be used (dead region, failed I/O).
    pub(crate) fn drop_cache_entry(&self, slot: Slot) {
        if self.cache.remove(slot).is_some() {
            self.slots.clear_cache(slot);
            self.uncharge(&self.cached, 1);
        }
    }

    /// I/O finished for a page that no longer owns `slot` (discarded meanwhile):
    /// free the copy, wake whoever waited so that they fault again.
    pub(crate) fn drop_orphan(&self, r: &RegionInner, page: u64, slot: Slot) {
        let waited = self.cache.get(slot).is_some_and(|e| e.waiters);
        self.drop_cache_entry(slot);
        self.dontneed(&[(r.shadow_addr(page), PAGE_SIZE)]);
        if waited {
            let _ = self.uffd.wake(r.page_addr(page), PAGE_SIZE);
        }
    }

    /// A clean copy joins the tail of the inactive list.
    pub(crate) fn push_inactive(&self, region: u32, page: u64, slot: Slot) {
        self.inactive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(CachedRef { region, page, slot });
    }
}
