//! 4 KiB swap-in: the swap cache, the compressed tier, or a read of the back tier
//! with readahead around the fault (seed 004), and the reads' completions.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::swap_cache::{CacheState, Entry, Lookup, Owner};
use crate::threads::ThreadCtx;
use crate::tier::{Location, Op, OpKind};
use crate::{ReadaheadPolicy, PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Most tries of a read whose result is wrong (an I/O error, a short read, or bytes
/// that do not match their checksum) before its pages are given up.
const READ_TRIES: u8 = 3;

/// A fault on a swapped page: the swap cache, or a read (deduplicated).
pub(super) fn swap_in(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    write: bool,
) {
    match e.cache.fault_lookup(slot, write) {
        Lookup::Hit(en) => {
            r.counters.minflt.fetch_add(1, Relaxed);
            cache_hit(e, r, page, &en);
            super::map_from_frames(e, r, u, page, &[(slot, en.frame)], write);
            fault_around(e, r, u, page, write);
        }
        Lookup::InFlight => {}
        Lookup::Miss => match e.tiers.meta.location(slot) {
            Location::Back => {
                let Some(frame) = e.frames.alloc_to_fill(crate::frames::Site::SwapIn) else {
                    // No frame free (the cache took every one): retry once reclaim
                    // has trimmed it.
                    e.threads.wake_kswapd();
                    let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
                    return;
                };
                r.counters.majflt.fetch_add(1, Relaxed);
                let mut en = Entry::new(Owner { region: r.id, page }, CacheState::Reading, frame);
                en.waiters = true;
                en.write = write;
                e.cache_insert("swap-in read", slot, en);
                e.slots.set_cache(slot);
                e.budget.charge(Gauge::Cached, 1);
                let mut reads = vec![(r.clone(), page, slot, frame)];
                readahead(e, r, u, page, slot, &mut reads);
                queue_reads(e, ctx, reads);
            }
            Location::Compressed if !crate::unit::loads_stored_unit_whole(r) => {
                crate::tier::compressed::fault_page(e, ctx, r, u, page, slot, write)
            }
            Location::Compressed => crate::tier::compressed::fault(e, r, u, page, slot, write),
            Location::Packed => crate::tier::packed::fault(e, r, u, page, slot, write),
            Location::None => {
                // Swapped with its bytes nowhere: an engine bug. SIGBUS beats zeros.
                e.diag.internal(&format!(
                    "page {page} of region {} is swapped to slot {slot}, which holds nothing",
                    r.id
                ));
                poison_page(e, r, u, page, slot);
            }
        },
    }
}

/// A page's copy was found in the swap cache: counted, and, as the kernel's
/// lookup_swap_cache does, a hit also moves the readahead stream's position.
fn cache_hit(e: &Engine, r: &RegionInner, page: u64, en: &Entry) {
    cache_hits(e, r, page, 1, en.readahead as u32);
}

/// `n` pages up to `last` found in the swap cache at once, `read_ahead` of them
/// brought in by readahead (`cache_hit`, with one lock of the readahead state).
fn cache_hits(e: &Engine, r: &RegionInner, last: u64, n: u32, read_ahead: u32) {
    r.counters.swapcache_hit.fetch_add(n as u64, Relaxed);
    r.counters.swap_ra_hit.fetch_add(read_ahead as u64, Relaxed);
    if n > read_ahead {
        crate::reclaim::note_refault(e, r, (n - read_ahead) as u64);
    }
    match r.policy.readahead {
        ReadaheadPolicy::Vma => {
            let mut ra = r.ra.lock().unwrap_or_else(|p| p.into_inner());
            ra.vma.cache_hit(last, false);
            for _ in 0..read_ahead {
                ra.vma.hit();
            }
        }
        ReadaheadPolicy::Cluster => {
            for _ in 0..read_ahead {
                e.cluster_ra.hit();
            }
        }
        _ => {}
    }
}

/// `n` pages from `first` that needed no read (they hold zeros, or were decompressed
/// from the pool) were mapped in a stream (around a hit, or at their own fault): the
/// readahead window had them in it but nothing to read, and they count as its hits, as
/// the kernel's zero-filled swap-cache pages (and its zswap loads into the swap cache)
/// do. Else every window over such pages looks partly wasted, and the window never
/// grows (seq-read 4k with 22% zero pages: 5 pages per read instead of 500).
pub(crate) fn unread_in_stream(r: &RegionInner, first: u64, n: u64) {
    if r.policy.readahead == ReadaheadPolicy::Vma {
        let mut ra = r.ra.lock().unwrap_or_else(|p| p.into_inner());
        // The stream's position moves past them, as a hit's does.
        ra.vma.cache_hit(first + n - 1, false);
        for _ in 0..n {
            ra.vma.hit();
        }
    }
}

/// Fault-around (filemap's `do_fault_around`, for the swap cache) on a stream: when the
/// page just mapped from the swap cache or the pool follows the last one so mapped, map
/// the pages after it in its unit whose clean copies wait there too (read ahead), or
/// that are in the pool (decompressed now, mapped dirty as every load from the pool),
/// or hold zeros, up to the first that is none of these. Each would otherwise take a
/// fault of its own, a userfaultfd round trip (seq-read 4k: 75 MB/s without, 420 with). Only on a stream: on random access
/// (pmbench) mapping around every hit cost 5–17% of the accesses (2026-11-23, A/B), the
/// pages mapped mostly unused. Counted as the hits they stand for, so that a stream's
/// readahead window keeps growing. Mapped as the hit was: after a read, clean
/// (write-protected, their slots stay valid); after a write, dirty (writable, their slots
/// stale), as a write stream writes them next — mapped clean, each took a write-protect
/// fault, a round trip of its own (swap-w-seq 4k: 256,935 such faults, 16.8 s of pass 2).
/// Not while a unit read is in flight: its completion looks at every page's copy. Under
/// the unit's lock.
pub(crate) fn fault_around(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64, write: bool) {
    let Some(end) = around_end(r, page) else {
        return;
    };
    if u.unit_reads > 0 {
        return;
    }
    // Runs of copies in the cache, and between them runs of pages that hold zeros
    // (evicted as zeros, or never written: the stream would fault on each next).
    let mut copies: Vec<(Slot, usize)> = Vec::new();
    let mut read_ahead = 0;
    let mut q = page + 1;
    let mut mapped = 0u64;
    let flush = |u: &mut UnitPages, copies: &mut Vec<(Slot, usize)>, q: u64, ra: &mut u32| {
        if !copies.is_empty() {
            cache_hits(e, r, q - 1, copies.len() as u32, *ra);
            super::map_from_frames(e, r, u, q - copies.len() as u64, copies, write);
            copies.clear();
            *ra = 0;
        }
    };
    while q < end {
        match u.get(q as usize % UNIT_PAGES) {
            PageState::Swapped(s) => {
                if let Some(en) = e.cache.remove_clean(s) {
                    read_ahead += en.readahead as u32;
                    copies.push((s, en.frame));
                    q += 1;
                    mapped += 1;
                    continue;
                }
                flush(u, &mut copies, q, &mut read_ahead);
                let (n, in_place) = crate::tier::compressed::load_run(e, r, u, q, end);
                mapped += in_place;
                // None, or a copy failed to map (memory is short): no further.
                if n == 0 || in_place < n {
                    break;
                }
                unread_in_stream(r, q, n);
                q += n;
            }
            PageState::Untouched => {
                flush(u, &mut copies, q, &mut read_ahead);
                let mut n = 1;
                while q + n < end && u.get((q + n) as usize % UNIT_PAGES) == PageState::Untouched {
                    n += 1;
                }
                // Zeros take new room: only what is free.
                let n = e.budget.take_room(n as i64).max(0) as u64;
                if n == 0 || !super::map_zeros(e, r, u, q, n as usize, write) {
                    break;
                }
                unread_in_stream(r, q, n);
                q += n;
                mapped += n;
            }
            _ => break,
        }
    }
    flush(u, &mut copies, q, &mut read_ahead);
    if mapped > 0 {
        r.counters.fault_around.fetch_add(mapped, Relaxed);
        r.cache_hit_next.store(q, Relaxed);
    }
}

/// Where fault-around after `page` stops, if `page` was just mapped on a stream (it
/// follows the last page mapped from the swap cache or the pool): the end of its unit,
/// of the region, or of the stream's window, which doubles with each such fault from 4
/// pages up to a unit. None, and the window starts again, off a stream. The caller
/// moves `cache_hit_next` past what it maps.
fn around_end(r: &RegionInner, page: u64) -> Option<u64> {
    if r.cache_hit_next.swap(page + 1, Relaxed) != page {
        r.around_win.store(0, Relaxed);
        return None;
    }
    let win = (r.around_win.load(Relaxed) * 2).clamp(4, UNIT_PAGES as u32);
    r.around_win.store(win, Relaxed);
    Some(
        ((page / UNIT_PAGES as u64 + 1) * UNIT_PAGES as u64)
            .min(page + 1 + win as u64)
            .min(r.pages()),
    )
}

/// The bytes of `page` (swapped to `slot`) are lost: the program gets SIGBUS on it,
/// as it would from kernel swap after an I/O error. Under the unit's lock.
pub(crate) fn poison_page(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64, slot: Slot) {
    u.set(page as usize % UNIT_PAGES, PageState::Poisoned);
    e.tiers.release(e, slot);
    r.counters.poisoned.fetch_add(1, Relaxed);
    let _ = r.uffd.poison(r.page_addr(page), PAGE_SIZE);
}

/// Pick readahead pages around a fault and insert them in the swap cache.
fn readahead(
    e: &Engine,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    reads: &mut Vec<(Arc<RegionInner>, u64, Slot, usize)>,
) {
    // The fault's own page is charged; the window takes the rest of the
    // reservation, grown where room is free (a long stream's window).
    let max = e.cfg.readahead_max_pages;
    match r.policy.readahead {
        ReadaheadPolicy::Off => {}
        ReadaheadPolicy::Vma => {
            let w = {
                let mut g = r.ra.lock().unwrap_or_else(|p| p.into_inner());
                let st = &mut *g;
                if e.cfg.readahead_stream {
                    st.vma.window_adaptive(page, r.pages(), &mut st.cap)
                } else {
                    st.vma.window(page, r.pages(), max)
                }
            };
            let need = w.end.saturating_sub(w.start).saturating_sub(1);
            let room = e.budget.take_room(need as i64) as u64;
            for p in w.start..w.end {
                if p == page || reads.len() as u64 > room {
                    continue;
                }
                if let PageState::Swapped(s) = u.get(p as usize % UNIT_PAGES) {
                    try_readahead(e, r, p, s, reads);
                }
            }
        }
        ReadaheadPolicy::Cluster => {
            let (lo, hi) = e.cluster_ra.window(slot, e.slots.capacity(), max);
            let room = e.budget.take_room(hi.saturating_sub(lo) as i64) as u64;
            for s in lo..hi {
                if s == slot || reads.len() as u64 > room {
                    continue;
                }
                let Some((rid, p)) = e.tiers.meta.owner(s) else {
                    continue;
                };
                let same_unit = rid == r.id && p / UNIT_PAGES as u64 == page / UNIT_PAGES as u64;
                if same_unit {
                    if u.get(p as usize % UNIT_PAGES) == PageState::Swapped(s) {
                        try_readahead(e, r, p, s, reads);
                    }
                    continue;
                }
                let Some(or) = e.regions.by_id(rid) else {
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
                    try_readahead(e, &or, p, s, reads);
                }
            }
        }
    }
}

/// Read page `p` (swapped to `s`) ahead, if it is on the back tier and not cached.
fn try_readahead(
    e: &Engine,
    r: &Arc<RegionInner>,
    p: u64,
    s: Slot,
    reads: &mut Vec<(Arc<RegionInner>, u64, Slot, usize)>,
) {
    if e.tiers.meta.location(s) != Location::Back || e.cache.get(s).is_some() {
        return;
    }
    let Some(frame) = e.frames.alloc_to_fill(crate::frames::Site::Readahead) else {
        return;
    };
    let mut en = Entry::new(
        Owner {
            region: r.id,
            page: p,
        },
        CacheState::Reading,
        frame,
    );
    en.readahead = true;
    if e.cache.insert(s, en) {
        e.slots.set_cache(s);
        e.budget.charge(Gauge::Cached, 1);
        r.counters.swap_ra.fetch_add(1, Relaxed);
        reads.push((r.clone(), p, s, frame));
    } else {
        e.frames.free(&e.zapper, &[frame]);
    }
}

/// Queue reads, one request per run of consecutive slots of one region in one file.
fn queue_reads(
    e: &Engine,
    ctx: &mut ThreadCtx,
    mut reads: Vec<(Arc<RegionInner>, u64, Slot, usize)>,
) {
    reads.sort_by_key(|(r, _, s, _)| (r.id, *s));
    let mut i = 0;
    while i < reads.len() {
        let mut j = i + 1;
        while j < reads.len()
            && reads[j].0.id == reads[i].0.id
            && reads[j].2 == reads[j - 1].2 + 1
            && j - i < UNIT_PAGES
            && e.tiers.continues(reads[j - 1].2)
        {
            j += 1;
        }
        let pages: Vec<u64> = reads[i..j].iter().map(|x| x.1).collect();
        let frames: Vec<usize> = reads[i..j].iter().map(|x| x.3).collect();
        let r = reads[i].0.clone();
        r.counters.read_requests.fetch_add(1, Relaxed);
        e.tiers
            .submit(e, ctx, Op::new(OpKind::Read, r, pages, frames, reads[i].2));
        i = j;
    }
}

/// Which pages of a finished read came back right: all of them for a full read
/// whose checksums match (with encryption: that decrypt, their tags matching), none
/// for an error. On any wrong page the request is tried again (whole) while tries
/// remain: None.
pub(crate) fn verify_read(
    e: &Engine,
    ctx: &mut ThreadCtx,
    mut op: Op,
    res: i32,
) -> Option<(Op, Vec<bool>)> {
    let full = res >= 0 && res as usize == op.bytes();
    let lost = std::mem::take(&mut op.lost);
    let good: Vec<bool> = if full {
        op.frames
            .iter()
            .enumerate()
            .map(|(k, &f)| {
                if lost.get(k).copied().unwrap_or(false) {
                    return false; // counted by the tier (remote_lost)
                }
                let ok = e.tiers.verify_page(&e.frames, op.slot + k as u64, f);
                if !ok {
                    op.region.counters.swap_csum_fail.fetch_add(1, Relaxed);
                }
                ok
            })
            .collect()
    } else {
        vec![false; op.pages.len()]
    };
    if good.iter().all(|&g| g) || op.region.is_dead() {
        return Some((op, good));
    }
    op.region.counters.io_errors.fetch_add(1, Relaxed);
    if op.attempt + 1 < READ_TRIES {
        op.attempt += 1;
        e.tiers.submit(e, ctx, op);
        return None;
    }
    if !full {
        e.diag.say_read_error(res, &op);
    } else {
        e.diag.say_checksum(&op);
    }
    Some((op, good))
}

/// Remove the entry of a copy that will not be used (its page stopped wanting it,
/// its region was dropped, its read failed): the frame and the slot's cache
/// reference go; whoever waited on the page faults again.
pub(crate) fn drop_entry(e: &Engine, r: &RegionInner, page: u64, slot: Slot) {
    if let Some(en) = e.cache.remove(slot) {
        e.tiers.clear_cache(e, slot);
        e.frames.free(&e.zapper, &[en.frame]);
        e.budget.uncharge(Gauge::Cached, 1);
        if en.waiters && !r.is_dead() {
            let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
        }
    }
}

/// A 4 KiB read finished.
pub(crate) fn complete_read(e: &Engine, ctx: &mut ThreadCtx, op: Op, res: i32) {
    let Some((op, good)) = verify_read(e, ctx, op, res) else {
        return;
    };
    let r = op.region.clone();
    // Pages of one request may span units (cluster readahead): lock each in turn.
    let mut k = 0;
    while k < op.pages.len() {
        let unit_no = op.pages[k] / UNIT_PAGES as u64;
        let mut u = r.unit_of(op.pages[k]).lock();
        let mut to_map: Vec<(u64, Slot, usize, bool)> = Vec::new();
        while k < op.pages.len() && op.pages[k] / UNIT_PAGES as u64 == unit_no {
            let (page, slot) = (op.pages[k], op.slot + k as u64);
            let ok = good[k];
            k += 1;
            let wanted = !r.is_dead()
                && u.get(page as usize % UNIT_PAGES) == PageState::Swapped(slot)
                && e.cache.get(slot).is_some_and(|en| !en.orphan);
            if !wanted {
                drop_entry(e, &r, page, slot);
                continue;
            }
            if ok {
                r.counters.pswpin.fetch_add(1, Relaxed);
                match e.cache.complete_io(slot) {
                    Some(en) if en.waiters => to_map.push((page, slot, en.frame, en.write)),
                    Some(_) => crate::reclaim::push_inactive(e, r.id, page, slot),
                    None => {}
                }
            } else {
                // Lost on the back tier: a page somebody waits for raises SIGBUS; a
                // page read ahead is forgotten (a fault reads it again).
                if e.cache.get(slot).is_some_and(|en| en.waiters) {
                    poison_page(e, &r, &mut u, page, slot);
                }
                drop_entry(e, &r, page, slot);
            }
        }
        // Map runs of consecutive pages with one copy each.
        let mut a = 0;
        while a < to_map.len() {
            let mut b = a + 1;
            while b < to_map.len()
                && to_map[b].0 == to_map[b - 1].0 + 1
                && to_map[b].3 == to_map[a].3
            {
                b += 1;
            }
            let copies: Vec<(Slot, usize)> = to_map[a..b].iter().map(|x| (x.1, x.2)).collect();
            super::map_from_frames(e, &r, &mut u, to_map[a].0, &copies, to_map[a].3);
            a = b;
        }
        if !to_map.is_empty() {
            crate::reclaim::lru_add(e, &r, to_map[0].0, &u);
        }
    }
}
