//! 2 MiB units, swapped out and in whole (seeds 000 and 002, and the THP swap-in
//! the kernel never merged).
//!
//! - Swap-out: a fully resident unit leaves the region with one UFFDIO_MOVE (a THP
//!   moves as one PMD) into a 2 MiB frame, takes one whole free cluster and is
//!   written with one 2 MiB write (`thp_swpout`). No free cluster: 4 KiB slots
//!   (`thp_swpout_fallback`). A unit that is all clean and still owns one whole
//!   cluster is not written.
//! - Swap-in: a fault in a unit swapped out whole reads it with one 2 MiB read into a
//!   2 MiB frame (THP-backed under `UnitPolicy::Huge`) and moves it into the region
//!   whole (`thp_swpin`): a real transparent huge page where the kernel gives one.
//! - First touch (`Huge`): one zeroed THP moved in (a spare made ahead, `spare.rs`,
//!   or one populated on the spot).
//! - Dirty tracking keeps the unit whole: a unit swapped in for a read is mapped and
//!   then write-protected as one range; the first write lifts protection on the whole
//!   range at once (the PMD stays whole) and the unit's cluster becomes stale (freed
//!   at once under seed 001's policy). UFFDIO_MOVE cannot map write-protected, so a
//!   thread that writes between the move and the protection goes unseen: the unit is
//!   marked `clean_by_move`, and a clean eviction checks every page against its
//!   checksum before it trusts the slot (a mismatch is written as dirty). A unit that
//!   is partly dirty is written whole at its next eviction: one sequential 2 MiB write
//!   costs less than tracking which 4 KiB pages changed.
//!
//! `UnitPolicy::Auto` decides per region, from the faults it sees (`UnitTrend`): a
//! region whose faults on units swapped out whole look like a stream (the unit's first
//! page, or a unit next to the last one faulted on) swaps units out and in whole; a
//! region whose faults land at random takes them in 4 KiB pages with readahead, a unit
//! stored whole in the compressed pool included (the faulting page is mapped, the rest
//! go back into the pool as pages of their own where it takes them), and swaps its
//! units out as pages: a random fault that brings 2 MiB back pushes 2 MiB out, and a
//! pool of such units thrashes (pmbench `compressed+file`, 1 GiB over 256 MiB: 313
//! accesses/s). The decisions are counted (`thp_swpin_declined`,
//! `thp_swpout_declined`). Its frames are small pages, so `Auto` moves 2 MiB per I/O
//! but maps small pages.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::fault::IfUnmapped;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::swap_cache::{CacheState, Entry, Owner};
use crate::sys::uffd::Wake;
use crate::threads::ThreadCtx;
use crate::tier::{Location, Op, OpKind};
use crate::{ReadaheadPolicy, UnitPolicy, PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Whether the region swaps 2 MiB units whole.
pub(crate) fn whole_units(r: &RegionInner) -> bool {
    r.policy.unit != UnitPolicy::Small
}

/// How far `UnitTrend`'s score goes either way: a stream that follows random access
/// swaps whole again from its fifth unit, and a random fault at a unit's first page
/// (one in 512) does not bring a unit back whole in a region that faults at random.
const TREND_LIMIT: i32 = 4;

/// `UnitPolicy::Auto`'s evidence, per region, in the manner of readahead's hit-driven
/// window: each fault on a unit whose pages are all swapped out scores +1 if it looks
/// sequential (the unit's first page, or a unit next to the one faulted on before) and
/// -1 if not, within `TREND_LIMIT` either way. Whole units pay while the score is not
/// negative: a stream gains from them (one 2 MiB I/O, or one decompression, for 512
/// pages it reads next), random access loses (511 pages it does not read, each pushing
/// out one it does).
#[derive(Debug)]
pub(crate) struct UnitTrend {
    score: std::sync::atomic::AtomicI32,
    /// The unit of the last fault scored (`u64::MAX`: none yet).
    last: std::sync::atomic::AtomicU64,
}

impl Default for UnitTrend {
    fn default() -> Self {
        UnitTrend {
            score: std::sync::atomic::AtomicI32::new(0),
            last: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }
}

impl UnitTrend {
    /// A fault at page `i` of unit `unit_no`, whose pages are all swapped out: score it.
    /// Returns whether to swap the unit in whole (it looks sequential, and the region's
    /// faults have not looked random of late).
    pub(crate) fn fault(&self, unit_no: u64, i: usize) -> bool {
        let last = self.last.swap(unit_no, Relaxed);
        let seq = i == 0 || last == unit_no.wrapping_sub(1) || last == unit_no.wrapping_add(1);
        let step = if seq { 1 } else { -1 };
        let score = self
            .score
            .fetch_update(Relaxed, Relaxed, |s| {
                Some((s + step).clamp(-TREND_LIMIT, TREND_LIMIT))
            })
            .map_or(0, |old| (old + step).clamp(-TREND_LIMIT, TREND_LIMIT));
        seq && score >= 0
    }

    /// Whether the region's faults have looked random of late: the score at least half
    /// way down. (Not merely below zero: one stray fault before any of a stream's, as
    /// a write stream's first pass takes none, turned 217 of its 512 units to pages.)
    pub(crate) fn random(&self) -> bool {
        self.score.load(Relaxed) <= -TREND_LIMIT / 2
    }
}

/// Whether a fully resident unit of `r` leaves whole (one 2 MiB write, or one entry in
/// the compressed pool): always under `Huge`; under `Auto` unless the region's faults
/// look random. A unit stored whole comes back whole or is split at a fault.
fn stores_whole(r: &RegionInner) -> bool {
    match r.policy.unit {
        UnitPolicy::Huge => true,
        UnitPolicy::Auto => !r.unit_trend.random(),
        UnitPolicy::Small => false,
    }
}

/// Whether a fault that takes the 4 KiB path on a unit stored whole in the compressed
/// pool maps the whole unit (`Huge`: it is mapped as one THP where it can be), or only
/// its page, the rest going back into the pool as pages (`Auto`).
pub(crate) fn loads_stored_unit_whole(r: &RegionInner) -> bool {
    r.policy.unit == UnitPolicy::Huge
}

/// First touch of a wholly untouched unit under `Huge`: one zeroed THP moved in.
/// Returns false when the caller should fall back to the 4 KiB path.
pub(crate) fn zero_fill_unit(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64) -> bool {
    if r.policy.unit != UnitPolicy::Huge
        || u.resident != 0
        || !(0..UNIT_PAGES).all(|i| u.get(i) == PageState::Untouched)
    {
        return false;
    }
    let first = page - page % UNIT_PAGES as u64;
    let dst = r.page_addr(first);
    e.spares.want();
    let moved = match crate::spare::take_to(e, &r.uffd, dst) {
        Some(UNIT_SIZE) => {
            r.counters.thp_fault_spare.fetch_add(1, Relaxed);
            UNIT_SIZE
        }
        Some(moved) => moved,
        None => {
            e.threads.wake_kswapd(); // to make spares for the next units
            let Some(frame) = e.frames.alloc_huge(crate::frames::Site::FirstTouch) else {
                return false;
            };
            if !crate::sys::mem::populate_write(frame, UNIT_SIZE) {
                e.frames.free(&e.zapper, &huge_pages(frame));
                return false;
            }
            let (moved, _) = r
                .uffd
                .move_pages_partial(dst, frame, zero_move_len(e), Wake::No);
            match moved {
                UNIT_SIZE => e.frames.free_moved_huge(frame),
                0 => e.frames.free(&e.zapper, &huge_pages(frame)),
                // Its first pages left the frame (its PMD split): the rest go with it.
                _ => e.frames.free_moved_from_huge(&e.zapper, &huge_pages(frame)),
            }
            moved
        }
    };
    if moved == 0 {
        return false;
    }
    map_zeroed_unit(e, r, u, first, moved / PAGE_SIZE);
    true
}

/// Bytes of a zeroed THP a first touch moves into its unit: all of it, or the first
/// half where a test injects a move that stops part-way
/// (`FaultInjection::partial_move_every`).
pub(crate) fn zero_move_len(e: &Engine) -> usize {
    let every = e.cfg.inject.partial_move_every;
    if every > 0 && (e.diag.move_seq.fetch_add(1, Relaxed) + 1).is_multiple_of(every) {
        UNIT_SIZE / 2
    } else {
        UNIT_SIZE
    }
}

/// The 512 page addresses of a 2 MiB frame.
fn huge_pages(frame: usize) -> Vec<usize> {
    (0..UNIT_PAGES).map(|i| frame + i * PAGE_SIZE).collect()
}

/// The first `moved` pages of a zeroed THP were moved into the unit from page `first`:
/// they are resident and dirty, and so are the rest once mapped as zeros (a move that
/// stopped part-way has still moved its first pages: counted as untouched, they were
/// never charged, never evicted, and kept their bytes across a discard); then the
/// faulting thread is woken.
fn map_zeroed_unit(e: &Engine, r: &RegionInner, u: &mut UnitPages, first: u64, moved: usize) {
    for i in 0..moved {
        u.set(
            i,
            PageState::Resident {
                dirty: true,
                slot: None,
            },
        );
    }
    u.resident = moved as u32;
    e.budget.charge(Gauge::Resident, moved as i64);
    if moved < UNIT_PAGES {
        // Within the fault's room (a unit). Not mapped: left untouched for their own
        // faults (the 4 KiB path).
        let _ = crate::fault::map_zeros(e, r, u, first + moved as u64, UNIT_PAGES - moved, true);
    }
    r.counters.minflt.fetch_add(1, Relaxed);
    let _ = r.uffd.wake(r.page_addr(first), UNIT_SIZE);
}

/// A fault in a unit whose pages are all swapped: swap it in whole if the policy
/// says so. Returns false to take the 4 KiB path.
pub(crate) fn swap_in_unit(
    e: &Engine,
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
        // The unit is on its way in (read ahead, or by another fault): one read for
        // everybody. The fault waits on its page's entry; the last part's completion
        // maps the unit and wakes the whole range. (No entry: that part failed and
        // was forgotten; the 4 KiB path reads the page again.)
        if !e.cache.mark_waiter(slots[i_fault], write) {
            return false;
        }
        // (Scored: a stream's faults land here, on the units it reads ahead.)
        r.unit_trend.fault(unit_no, i_fault);
        unit_ra_hit(r, u);
        r.last_whole_unit.store(unit_no, Relaxed);
        unit_readahead(e, ctx, r, unit_no, forward, backward);
        return true;
    }
    if r.policy.unit == UnitPolicy::Auto && !r.unit_trend.fault(unit_no, i_fault) {
        r.counters.thp_swpin_declined.fetch_add(1, Relaxed);
        return false;
    }
    let loc = e.tiers.meta.location(slots[i_fault]);
    if matches!(loc, Location::Compressed | Location::Packed)
        && e.cache.get(slots[i_fault]).is_none()
    {
        // Stored compressed (in the pool, or packed on the back tier): what was stored
        // with the page comes back (a unit stored whole comes back whole).
        if loc == Location::Packed {
            crate::tier::packed::fault(e, r, u, page, slots[i_fault], write);
        } else {
            crate::tier::compressed::fault(e, r, u, page, slots[i_fault], write);
        }
        r.last_whole_unit.store(unit_no, Relaxed);
        return true;
    }
    let (mut clean, mut absent) = (0, 0);
    for &s in &slots {
        match e.cache.get(s) {
            None => absent += 1,
            Some(en) if en.state == CacheState::Clean && !en.orphan => clean += 1,
            Some(_) => {}
        }
    }
    if clean == UNIT_PAGES {
        let copies: Vec<(Slot, usize)> = slots
            .iter()
            .map(|&s| (s, e.cache.remove(s).map_or(0, |en| en.frame)))
            .collect();
        r.counters.minflt.fetch_add(1, Relaxed);
        r.counters.swapcache_hit.fetch_add(1, Relaxed);
        if !u.prefetched {
            // One event, not 512 pages: a stream catching up with a unit evicted
            // before it was done with it (a loaded machine) is not a working set that
            // does not fit, and weighed as 512 it turned evicting ahead off for streams.
            crate::reclaim::note_refault(e, r, 1);
        }
        unit_ra_hit(r, u);
        map_unit(e, r, u, first, &copies, write, IfUnmapped::Cache);
        r.last_whole_unit.store(unit_no, Relaxed);
        unit_readahead(e, ctx, r, unit_no, forward, backward);
        return true;
    }
    if absent != UNIT_PAGES
        || !slots
            .iter()
            .all(|&s| e.tiers.meta.location(s) == Location::Back)
    {
        // Partly cached, partly elsewhere: page by page.
        r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
        return false;
    }
    if !queue_unit_read(e, ctx, r, u, first, &slots, Some((i_fault, write))) {
        r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
        return false;
    }
    r.counters.majflt.fetch_add(1, Relaxed);
    r.last_whole_unit.store(unit_no, Relaxed);
    unit_readahead(e, ctx, r, unit_no, forward, backward);
    true
}

/// Units a stream reads ahead: `readahead_units`, but at most a sixteenth of the
/// budget, so that in a small budget reading ahead does not evict what the program
/// is working on (a 16 MiB budget reads none ahead, 256 MiB up to 8).
pub(crate) fn units_ahead(e: &Engine) -> u64 {
    let cap = e.budget.limit_pages().max(0) as u64 / (16 * UNIT_PAGES as u64);
    (e.cfg.readahead_units as u64).min(cap)
}

/// A fault found its unit read ahead: count the unit's pages as hits, once.
fn unit_ra_hit(r: &RegionInner, u: &mut UnitPages) {
    if std::mem::take(&mut u.prefetched) {
        r.counters.swap_ra_hit.fetch_add(UNIT_PAGES as u64, Relaxed);
    }
}

/// Frames for a whole unit: one 2 MiB frame under `Huge` (THP-backed: the unit
/// moves in as one PMD), 512 small frames otherwise.
fn unit_frames(e: &Engine, r: &RegionInner) -> Option<Vec<usize>> {
    if r.policy.unit == UnitPolicy::Huge {
        if let Some(h) = e.frames.alloc_huge_to_fill(crate::frames::Site::UnitRead) {
            return Some(huge_pages(h));
        }
    }
    let mut runs = Vec::new();
    if e.frames
        .alloc(UNIT_PAGES, &mut runs, crate::frames::Site::UnitRead)
        < UNIT_PAGES
    {
        let back: Vec<usize> = runs
            .iter()
            .flat_map(|&(a, n)| (0..n).map(move |k| a + k * PAGE_SIZE))
            .collect();
        e.frames.free(&e.zapper, &back);
        return None;
    }
    Some(
        runs.iter()
            .flat_map(|&(a, n)| (0..n).map(move |k| a + k * PAGE_SIZE))
            .collect(),
    )
}

/// Read a unit swapped out whole into the swap cache: one entry per page (the
/// faulting one waits, if any), one request per run of consecutive slots (one for a
/// unit written whole). The last part's completion maps the unit if a fault wants
/// it. False (nothing done) when no frames are free.
fn queue_unit_read(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    first: u64,
    slots: &[Slot; UNIT_PAGES],
    fault: Option<(usize, bool)>,
) -> bool {
    let Some(frames) = unit_frames(e, r) else {
        return false;
    };
    for (i, &s) in slots.iter().enumerate() {
        let p = first + i as u64;
        let waits = fault.is_some_and(|(f, _)| f == i);
        let mut en = Entry::new(
            Owner {
                region: r.id,
                page: p,
            },
            CacheState::Reading,
            frames[i],
        );
        en.readahead = fault.is_none();
        en.waiters = waits;
        en.write = waits && fault.is_some_and(|(_, w)| w);
        e.cache_insert("unit read", s, en);
        e.slots.set_cache(s);
    }
    e.budget.charge(Gauge::Cached, UNIT_PAGES as i64);
    let mut a = 0;
    while a < UNIT_PAGES {
        let mut b = a + 1;
        while b < UNIT_PAGES && slots[b] == slots[b - 1] + 1 && e.tiers.continues(slots[b - 1]) {
            b += 1;
        }
        let mut op = Op::new(
            OpKind::Read,
            r.clone(),
            (first + a as u64..first + b as u64).collect(),
            frames[a..b].to_vec(),
            slots[a],
        );
        op.unit_read = true;
        u.unit_reads += 1;
        r.counters.read_requests.fetch_add(1, Relaxed);
        e.tiers.submit(e, ctx, op);
        a = b;
    }
    true
}

/// Unit readahead (beyond the kernel, which never swaps in whole): a fault in a
/// stream through whole units also reads the next `readahead_units` units in the
/// stream's direction into the swap cache, so that the disk reads them while the
/// program works on this one. Only units wholly on the back tier and not cached,
/// only with room (`take_room`), only units whose lock is free (never wait on a
/// second unit lock). A unit nobody faults on is dropped clean by reclaim.
fn unit_readahead(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    unit_no: u64,
    forward: bool,
    backward: bool,
) {
    let n = units_ahead(e);
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
            PageState::Swapped(x)
                if e.cache.get(x).is_none() && e.tiers.meta.location(x) == Location::Back =>
            {
                slots[i] = x;
                true
            }
            _ => false,
        });
        if !whole {
            continue; // resident or partly cached: the stream goes on past it
        }
        if e.budget.take_room(UNIT_PAGES as i64) < UNIT_PAGES as i64 {
            break;
        }
        let first = m * UNIT_PAGES as u64;
        if !queue_unit_read(e, ctx, r, &mut g, first, &slots, None) {
            break;
        }
        g.prefetched = true;
        r.counters.swap_ra.fetch_add(UNIT_PAGES as u64, Relaxed);
    }
}

/// Map a unit whose every page has a clean copy, `(slot, frame)` in `copies`, into the
/// region, whole. The caller removed the cache entries. Runs of consecutive frames
/// move with one UFFDIO_MOVE each (a 2 MiB frame as one PMD: a real THP); pages that
/// refuse to move (frames still shared with a forked process) are copied one by one,
/// and a page that cannot be mapped at all is left as `if_unmapped` says for the
/// retrying fault.
pub(crate) fn map_unit(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    first: u64,
    copies: &[(Slot, usize)],
    write: bool,
    if_unmapped: IfUnmapped,
) {
    debug_assert_eq!(copies.len(), UNIT_PAGES);
    let frame = |k: usize| copies[k].1;
    let dst = r.page_addr(first);
    let mut moved = [false; UNIT_PAGES];
    let mut k = 0;
    while k < UNIT_PAGES {
        let mut n = 1;
        while k + n < UNIT_PAGES && frame(k + n) == frame(k + n - 1) + PAGE_SIZE {
            n += 1;
        }
        let (done, _) =
            r.uffd
                .move_pages_partial(dst + k * PAGE_SIZE, frame(k), n * PAGE_SIZE, Wake::No);
        let m = done / PAGE_SIZE;
        moved[k..k + m].fill(true);
        if m == n && n == UNIT_PAGES && e.frames.is_huge(frame(0)) {
            e.frames.free_moved_huge(frame(0));
        } else if m > 0 && !e.frames.is_huge(frame(k)) {
            e.frames.free_moved(frame(k), m);
        } else if m > 0 {
            // Part of a 2 MiB frame moved (its PMD was split): those pages are gone
            // from it; the frame goes back with its last page, zapped (split).
            let part: Vec<usize> = copies[k..k + m].iter().map(|c| c.1).collect();
            e.frames.free_moved_from_huge(&e.zapper, &part);
        }
        k += n;
    }
    let all = moved.iter().all(|&m| m);
    // Clean only if write-protected as a whole: else a write would go unseen.
    let dirty = write
        || !all
        || e.uffd
            .write_protect(dst, UNIT_SIZE, true, Wake::No)
            .is_err();
    let mut n_moved = 0;
    for (i, &(s, _)) in copies.iter().enumerate() {
        if moved[i] {
            crate::fault::mark_mapped(e, r, u, i, s, dirty);
            n_moved += 1;
        }
    }
    u.resident += n_moved;
    e.budget
        .transfer(Gauge::Cached, Gauge::Resident, n_moved as i64);
    for i in (0..UNIT_PAGES).filter(|&i| !moved[i]) {
        let copy = &copies[i..i + 1];
        crate::fault::map_copies(e, r, u, first + i as u64, copy, dirty, if_unmapped);
    }
    u.clean_by_move = !dirty;
    if all {
        r.counters.thp_swpin.fetch_add(1, Relaxed);
    } else {
        r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
    }
    crate::reclaim::lru_add(e, r, first, u);
    // Last: a program woken earlier could read counters that miss this swap-in.
    let _ = r.uffd.wake(dst, UNIT_SIZE);
}

/// One part of a whole-unit read finished; the last part maps the unit if a fault
/// waits on any of its pages (a unit read ahead stays clean in the swap cache).
pub(crate) fn complete_unit_read(e: &Engine, ctx: &mut ThreadCtx, op: Op, res: i32) {
    let Some((op, good)) = crate::fault::verify_read(e, ctx, op, res) else {
        return;
    };
    let r = op.region.clone();
    let first = op.pages[0] - op.pages[0] % UNIT_PAGES as u64;
    let mut u = r.unit_of(first).lock();
    u.unit_reads -= 1;
    for (k, &p) in op.pages.iter().enumerate() {
        let slot = op.slot + k as u64;
        let wanted = !r.is_dead()
            && u.get((p - first) as usize) == PageState::Swapped(slot)
            && e.cache.get(slot).is_some_and(|en| !en.orphan);
        if !wanted {
            crate::fault::drop_entry(e, &r, p, slot);
        } else if good[k] {
            r.counters.pswpin.fetch_add(1, Relaxed);
            e.cache.finish_io(slot);
        } else {
            // Lost on the back tier: a page somebody waits for raises SIGBUS; a page
            // read ahead is forgotten (a fault reads it again).
            if e.cache.get(slot).is_some_and(|en| en.waiters) {
                crate::fault::poison_page(e, &r, &mut u, p, slot);
            }
            crate::fault::drop_entry(e, &r, p, slot);
        }
    }
    if u.unit_reads > 0 || r.is_dead() {
        return;
    }
    // All parts in. Who waits, and is the unit whole in the cache?
    let mut slots = [0 as Slot; UNIT_PAGES];
    let mut whole = true;
    let (mut wanted, mut write) = (false, false);
    for (i, s) in slots.iter_mut().enumerate() {
        match u.get(i) {
            PageState::Swapped(x) => match e.cache.get(x) {
                Some(en) if !en.orphan && en.state == CacheState::Clean => {
                    *s = x;
                    wanted |= en.waiters;
                    write |= en.write;
                }
                _ => whole = false,
            },
            _ => whole = false,
        }
    }
    if wanted && whole {
        let copies: Vec<(Slot, usize)> = slots
            .iter()
            .map(|&s| (s, e.cache.remove(s).map_or(0, |en| en.frame)))
            .collect();
        map_unit(e, &r, &mut u, first, &copies, write, IfUnmapped::Cache);
        return;
    }
    for i in 0..UNIT_PAGES {
        let PageState::Swapped(x) = u.get(i) else {
            continue;
        };
        let p = first + i as u64;
        match e.cache.get(x) {
            Some(en) if en.state == CacheState::Clean && !en.orphan => {
                if en.waiters {
                    // Some pages were lost or discarded: map the waited-for survivors
                    // page by page.
                    e.cache.remove(x);
                    crate::fault::map_from_frames(e, &r, &mut u, p, &[(x, en.frame)], en.write);
                } else {
                    // Read ahead and no fault yet: the copies stay clean in the swap
                    // cache, where a fault maps them, or reclaim drops them.
                    crate::reclaim::push_inactive(e, r.id, p, x);
                }
            }
            _ => {}
        }
    }
    if wanted {
        crate::reclaim::lru_add(e, &r, first, &u);
        // Anybody else waiting in the unit faults again.
        let _ = r.uffd.wake(r.page_addr(first), UNIT_SIZE);
    }
}

/// Eviction of a fully resident unit whose pages are in `frames` now: one cluster,
/// one 2 MiB write. Returns false to fall back to 4 KiB slots (the caller counts
/// nothing here; `thp_swpout_fallback` is counted when no cluster was free).
pub(crate) fn write_whole(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    first: u64,
    frames: &[usize],
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
    if !stores_whole(r) {
        r.counters.thp_swpout_declined.fetch_add(1, Relaxed);
        return false;
    }
    use crate::tier::compressed::UnitStore;
    match crate::tier::compressed::store_unit(e, ctx, r, u, first, frames) {
        UnitStore::Stored => return true,
        // The compressed tier stores pages: the 4 KiB path offers it each page.
        UnitStore::NotTried if e.tiers.compressed.is_some() => return false,
        _ => {}
    }
    if !crate::writeback::can_write(e) {
        return false;
    }
    let Some(base) = crate::writeback::alloc_cluster(e, ctx) else {
        r.counters.thp_swpout_fallback.fetch_add(1, Relaxed);
        return false;
    };
    for i in 0..UNIT_PAGES {
        if let PageState::Resident {
            slot: Some(old), ..
        } = u.get(i)
        {
            // Rewritten whole: the old copy is stale.
            e.tiers.release(e, old);
            r.counters.stale_slot_freed.fetch_add(1, Relaxed);
        }
    }
    let pages: Vec<u64> = (first..first + UNIT_PAGES as u64).collect();
    crate::writeback::write_run(e, ctx, r, u, &pages, frames, base, 0);
    r.counters.thp_swpout.fetch_add(1, Relaxed);
    true
}

/// First write to a unit mapped clean as a whole: lift protection on the whole
/// range (the PMD stays whole) and mark every page dirty. Returns false when the
/// unit is not whole and clean (4 KiB path).
pub(crate) fn wp_unit(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64) -> bool {
    if !whole_units(r) || u.resident != UNIT_PAGES as u32 {
        return false;
    }
    if !(0..UNIT_PAGES).all(|i| matches!(u.get(i), PageState::Resident { dirty: false, .. })) {
        return false;
    }
    let first = page - page % UNIT_PAGES as u64;
    for i in 0..UNIT_PAGES {
        if let PageState::Resident { slot, .. } = u.get(i) {
            let slot = slot.and_then(|s| crate::fault::stale_slot_of(e, r, s));
            u.set(i, PageState::Resident { dirty: true, slot });
        }
    }
    u.clean_by_move = false;
    r.counters.wpflt.fetch_add(1, Relaxed);
    let _ = r
        .uffd
        .write_protect(r.page_addr(first), UNIT_SIZE, false, Wake::Yes);
    true
}

#[cfg(test)]
mod tests {
    use super::{UnitTrend, TREND_LIMIT};

    #[test]
    fn a_stream_swaps_whole_and_random_faults_do_not() {
        let t = UnitTrend::default();
        // A stream: each unit's first page, or the next unit.
        assert!((0..8).all(|u| t.fault(u, 0)));
        assert!(t.fault(8, 100), "the next unit, mid-way: still the stream");
        assert!(!t.random());
        // Random faults: off after the score runs down; a random fault at a unit's first
        // page (1 in 512) does not turn it on.
        let random = [
            (40, 7),
            (3, 300),
            (77, 12),
            (20, 500),
            (61, 9),
            (90, 33),
            (5, 1),
            (70, 2),
        ];
        let whole: Vec<bool> = random.iter().map(|&(u, i)| t.fault(u, i)).collect();
        assert_eq!(whole, [false; 8]);
        assert!(t.random());
        assert!(!t.fault(55, 0));
        assert!(!t.fault(30, 250));
        // A stream again: whole from the unit where the score is back at zero.
        let back: Vec<bool> = (100..100 + TREND_LIMIT as u64 + 1)
            .map(|u| t.fault(u, 0))
            .collect();
        assert_eq!(
            back.iter().filter(|&&w| !w).count(),
            TREND_LIMIT as usize - 1
        );
        assert!(*back.last().unwrap() && !t.random());
        // Backwards too.
        assert!(t.fault(103, 511) && t.fault(102, 511));
        // One stray fault does not make a region random.
        let t = UnitTrend::default();
        assert!(!t.fault(9, 77) && !t.random());
    }
}
