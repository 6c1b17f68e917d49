//! Eviction: a unit's resident pages leave the region into frames — one UFFDIO_MOVE
//! per run (no copy; atomic against the program's writes: a write after the move
//! faults and waits), a whole unit under `--unit 2m` as one PMD into a 2 MiB frame.
//! Clean pages whose slot is still valid become clean cache copies (no write), clean
//! zeros are dropped, dirty pages go to writeback.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::swap_cache::{CacheState, Entry, Owner};
use crate::sys::uffd::Wake;
use crate::threads::ThreadCtx;
use crate::{UnitPolicy, PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// How far reclaim evicts beyond what it needs: half the budget, at most 1 GiB. The
/// margin keeps a queue of writes for the device and gives a read stream room for the
/// units it reads ahead (2 GiB / 256 MiB, --unit 2m: no margin left seq-read at 670
/// MB/s with 3% readahead hits, each unit read 3 times; half the budget: 1,800+).
fn evict_ahead_pages(e: &Engine) -> i64 {
    (e.budget.limit_pages() / 2).min(1 << 18)
}

/// Writes in flight that evicting ahead may add up to: the margin, but at most 16
/// units on the remote tier, whose writes hold copies of their pages outside the
/// budget (the store's command buffers) until the cluster acknowledges them. swap-w-seq
/// 2m, 1 GiB / 256 MiB, local 3+3 cluster, 2026-11-23: the whole margin (64 units) in
/// flight, peak RSS 726-750 MiB at 448-467 MB/s; 32 units 508-540 MiB, 499-502 MB/s;
/// 16 units 435-462 MiB, 461-493 MB/s; 8 units 366-386 MiB, 420-493 MB/s, but with
/// too little evicted ahead reclaim dropped read-ahead units before use (71% of them
/// hit, against 84-96%).
fn ahead_write_pages(e: &Engine) -> i64 {
    const REMOTE_AHEAD_PAGES: i64 = 16 * UNIT_PAGES as i64;
    match e.tiers.remote {
        Some(_) => evict_ahead_pages(e).min(REMOTE_AHEAD_PAGES),
        None => evict_ahead_pages(e),
    }
}

/// Evictions over which refaults are judged: a quarter of the budget, at least 4,096
/// pages. (A fixed 4,096 is 8 units of 2 MiB: on a loaded machine one or two units of a
/// stream evicted before the stream was done with them, a whole unit of refaults each,
/// turned evicting ahead off for a write stream at a 256 MiB budget, and it then faulted
/// on the unit it was writing, as before the margin.)
fn refault_window(e: &Engine) -> u64 {
    ((e.budget.limit_pages() / 4).max(0) as u64).max(super::lists::REFAULT_WINDOW)
}

/// Whether reclaim may evict one more unit ahead of need: the margin is not used up
/// by writes in flight (every evicting thread's, as they go: two threads that each
/// sized their batch at the start evicted the whole resident set between them, the
/// unit the program was writing included), a quarter of the limit stays resident, and
/// evicted pages are not coming back often (`Refaults`: `sort -S 1G` of 50 MB at a 56
/// MiB budget evicted 420k pages ahead, 300k of them faulted back from the cache, 43 s;
/// not ahead while they do, 27 s; streams and pmbench unchanged, 2026-11-23).
///
/// Not while a compressed tier in front takes what is evicted: it compresses on the
/// spot, so there is no device queue to keep fed, and the margin only moved pages into
/// the pool early (pmbench 4k `compressed+file` at 515 MiB: a quarter of the budget
/// resident and ~100 MiB of it unused; populating, the pool overflowed and wrote 51 MiB
/// back to the file, read again page by page). Counting loads from the pool as refaults
/// did not stop that: populating loads nothing. Without the margin 1.16× the accesses,
/// streams no slower (docs/benchmarks.md, "no evicting ahead in front of a compressed
/// tier").
/// While the pool refuses (data that does not compress, or full) evictions are writes
/// again, and the margin is back.
fn may_evict_ahead(e: &Engine) -> bool {
    e.tiers
        .compressed
        .as_ref()
        .is_none_or(|c| !c.takes_stores())
        && !e.lists.refaults.thrashing(refault_window(e))
        && e.tiers.inflight.write_pages.load(Relaxed) < ahead_write_pages(e)
        && e.budget.pages_in(Gauge::Resident) > e.budget.limit_pages() / 4
}

/// Evict whole units, oldest first, until at least `need` pages left the region, then
/// on ahead while `may_evict_ahead`; a unit faulted on during the scan is evicted only
/// for `need`, never ahead. Returns pages that left.
pub(super) fn evict_lru(e: &Engine, ctx: &mut ThreadCtx, need: i64) -> i64 {
    let mut moved = 0;
    let len = e.lists.lru().len();
    let mut scanned = 0;
    while (moved < need || may_evict_ahead(e)) && scanned < 2 * len + 1 {
        let Some(key) = e.lists.lru().pop_front() else {
            break;
        };
        scanned += 1;
        let (rid, ui) = ((key >> 32) as u32, (key & 0xffff_ffff) as usize);
        let Some(r) = e.regions.by_id(rid) else {
            continue;
        };
        let unit = &r.units[ui];
        // Second chance: a unit faulted on since the last pass goes round once more.
        if scanned <= len && unit.referenced.swap(false, Relaxed) {
            e.lists.lru().push_back(key);
            continue;
        }
        if moved >= need && unit.referenced.load(Relaxed) {
            // Faulted on since this scan passed it: in use now, not ahead-able.
            e.lists.lru().push_back(key);
            break;
        }
        let mut u = unit.lock();
        unit.on_lru.store(false, Relaxed);
        moved += evict_unit(e, ctx, &r, ui, &mut u);
        // Pages that could not leave (pinned, or writeback refused) keep the unit on
        // the list.
        super::lru_add(e, &r, (ui * UNIT_PAGES) as u64, &u);
    }
    moved
}

/// Whether a resident page can leave without a write (clean, and a valid copy or
/// zeros).
fn leaves_without_write(s: PageState) -> bool {
    matches!(s, PageState::Resident { dirty: false, .. })
}

/// Frames for the pages at `idx` of a unit (indices in order): one 2 MiB frame for a
/// whole unit under `Huge`, else runs of 4 KiB frames. None when none are free.
fn frames_for(e: &Engine, r: &RegionInner, idx: &[usize]) -> Option<Vec<usize>> {
    if idx.len() == UNIT_PAGES && r.policy.unit == UnitPolicy::Huge {
        if let Some(h) = e.frames.alloc_huge(crate::frames::Site::Evict) {
            return Some((0..UNIT_PAGES).map(|i| h + i * PAGE_SIZE).collect());
        }
    }
    let mut runs = Vec::new();
    let got = e
        .frames
        .alloc(idx.len(), &mut runs, crate::frames::Site::Evict);
    let frames: Vec<usize> = runs
        .iter()
        .flat_map(|&(a, n)| (0..n).map(move |k| a + k * PAGE_SIZE))
        .collect();
    if got < idx.len() {
        e.frames.free(&e.zapper, &frames);
        return None;
    }
    Some(frames)
}

/// Move every resident page of unit `ui` that may leave out of the region. Returns
/// pages that left.
fn evict_unit(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    ui: usize,
    u: &mut UnitPages,
) -> i64 {
    if r.is_dead() || u.resident == 0 {
        return 0;
    }
    let first = (ui * UNIT_PAGES) as u64;
    // With writeback refused (or no back tier), only what leaves without a write,
    // and as many dirty pages as the compressed pool can take, may go: moving dirty
    // pages out only to put them back would spin.
    let mut dirty_room = match crate::writeback::can_write(e) {
        true => UNIT_PAGES,
        false => e.tiers.compressed.as_ref().map_or(0, |c| c.room_pages()),
    };
    // Kept pages come due for a retry only over evictions that could take them: a
    // retry that falls due while the pool has no room would wait, marks cleared, and
    // then every kept page of the unit would be tried at once when room came.
    if dirty_room > 0 {
        u.eviction_starts();
    }
    let idx: Vec<usize> = (0..UNIT_PAGES)
        .filter(|&i| match u.get(i) {
            PageState::Resident { .. } if u.is_kept(i) || u.is_locked(i) => false,
            s @ PageState::Resident { .. } if leaves_without_write(s) => true,
            PageState::Resident { .. } if dirty_room > 0 => {
                dirty_room -= 1;
                true
            }
            _ => false,
        })
        .collect();
    if idx.is_empty() {
        return 0;
    }
    let Some(dst) = frames_for(e, r, &idx) else {
        return 0;
    };
    // 1. Detach: one MOVE per run of pages whose frames follow each other too.
    let mut left: Vec<(usize, usize)> = Vec::with_capacity(idx.len()); // (index, frame)
    let mut unused: Vec<usize> = Vec::new();
    let mut k = 0;
    while k < idx.len() {
        let mut n = 1;
        while k + n < idx.len()
            && idx[k + n] == idx[k + n - 1] + 1
            && dst[k + n] == dst[k + n - 1] + PAGE_SIZE
        {
            n += 1;
        }
        let p = first + idx[k] as u64;
        let (done, err) =
            e.uffd
                .move_pages_partial(dst[k], r.page_addr(p), n * PAGE_SIZE, Wake::Yes);
        let m = done / PAGE_SIZE;
        left.extend((k..k + m).map(|j| (idx[j], dst[j])));
        if let Some(err) = err.filter(|_| m < n) {
            // This page refused to move; the rest of the run is tried again next.
            let (j, q) = (k + m, first + idx[k + m] as u64);
            if refused_page(e, r, u, q, dst[j], err) {
                left.push((idx[j], dst[j]));
            } else {
                unused.push(dst[j]);
                // Still here (pinned, locked, under migration): passed over by the
                // next evictions, tried again ever less often, never spun on.
                if matches!(u.get(idx[j]), PageState::Resident { .. }) {
                    u.keep(idx[j]);
                }
            }
            k += m + 1;
            continue;
        }
        k += n;
    }
    if !unused.is_empty() {
        e.frames.free(&e.zapper, &unused);
    }
    if left.is_empty() {
        return 0;
    }
    let n_left = left.len() as i64;
    u.resident -= n_left as u32;
    e.budget.transfer(Gauge::Resident, Gauge::Cached, n_left);
    r.counters.evicted.fetch_add(n_left as u64, Relaxed);
    e.lists.refaults.evicted(n_left as u64);
    let frames: Vec<usize> = left.iter().map(|&(_, f)| f).collect();
    // 2. A whole unit leaves as one 2 MiB write to one cluster.
    if left.len() == UNIT_PAGES
        && crate::unit::whole_units(r)
        && crate::unit::write_whole(e, ctx, r, u, first, &frames)
    {
        u.clean_by_move = false;
        return n_left;
    }
    // 3. Classify.
    let mut to_write: Vec<u64> = Vec::new();
    let mut to_write_frames: Vec<usize> = Vec::new();
    let mut zeros: Vec<usize> = Vec::new();
    let mut clean = 0u64;
    for &(i, f) in &left {
        let p = first + i as u64;
        match u.get(i) {
            PageState::Resident {
                dirty: false,
                slot: Some(s),
            } if !u.clean_by_move
                || e.tiers
                    .meta
                    .hash_matches(s, crate::tier::page_hash(e.frames.page(f))) =>
            {
                e.frames.retag(f, crate::frames::Site::EvictClean);
                e.cache_insert(
                    "clean eviction",
                    s,
                    Entry::new(
                        Owner {
                            region: r.id,
                            page: p,
                        },
                        CacheState::Clean,
                        f,
                    ),
                );
                e.slots.set_cache(s);
                u.set(i, PageState::Swapped(s));
                super::push_inactive(e, r.id, p, s);
                clean += 1;
            }
            PageState::Resident {
                dirty: false,
                slot: None,
            } if !u.clean_by_move => {
                // Zeros never written: nothing to keep.
                u.set(i, PageState::Untouched);
                zeros.push(f);
            }
            PageState::Resident { slot, dirty } => {
                if !dirty && slot.is_some() {
                    // Mapped clean by a move, written in the window before its
                    // protection: caught by its checksum. (A clean page with no slot
                    // in a unit so marked comes here unchecked: zeros or not, it is
                    // classified by its bytes below.)
                    e.diag.clean_mismatch.fetch_add(1, Relaxed);
                }
                if let Some(stale) = slot {
                    e.tiers.release(e, stale);
                    r.counters.stale_slot_freed.fetch_add(1, Relaxed);
                }
                if uswap_zpool::same_filled(e.frames.page(f)) == Some(0) {
                    // All zeros: a first touch gives the same bytes, with no slot,
                    // no write and no read.
                    u.set(i, PageState::Untouched);
                    zeros.push(f);
                    r.counters.swpout_zero.fetch_add(1, Relaxed);
                } else {
                    to_write.push(p);
                    to_write_frames.push(f);
                }
            }
            other => {
                // Moved out under the unit lock, so still Resident: a bug if not.
                e.diag.internal(&format!(
                    "evicted page {p} of region {} is {other:?}, not resident",
                    r.id
                ));
                zeros.push(f);
            }
        }
    }
    // Pages that could not leave (refused moves) keep the unit's mark: written unseen
    // after a move, they would be trusted clean at the next eviction.
    if u.resident == 0 {
        u.clean_by_move = false;
    }
    if !zeros.is_empty() {
        e.frames.free(&e.zapper, &zeros);
        e.budget.uncharge(Gauge::Cached, zeros.len() as i64);
    }
    // 4. The dirty pages: into the compressed tier where they compress; the rest get
    // slots and one gathered write per slot run; pages that got no slot go back (over
    // budget, said once).
    let (to_write, to_write_frames) =
        crate::tier::compressed::store_pages(e, ctx, r, u, &to_write, &to_write_frames);
    let unbacked = crate::writeback::write_pages(e, ctx, r, u, &to_write, &to_write_frames, 0);
    let back = unbacked.len() as i64;
    for (p, f) in unbacked {
        crate::writeback::restore_dirty(e, r, u, p, f);
    }
    r.counters.clean_evicted.fetch_add(clean, Relaxed);
    r.write_trend.evicted_clean(clean);
    n_left - back
}

/// Page `q` refused UFFDIO_MOVE with `err`. EBUSY while mapped by this process only:
/// pinned by the program's own I/O (O_DIRECT into it), so it stays, or the program
/// would keep stale bytes once the DMA lands. Shared copy-on-write with a forked
/// process (or any other refusal of a present page): copied out into `frame`. Not
/// mapped at all: its bytes are gone, the page is poisoned. True if it left.
fn refused_page(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    q: u64,
    frame: usize,
    err: std::io::Error,
) -> bool {
    let addr = r.page_addr(q);
    match crate::sys::mem::PAGE_MAP.page(addr) {
        Some(info) if info.empty() => {
            e.diag.not_mapped(
                r,
                q,
                &format!("UFFDIO_MOVE: {err}; no copy found: poisoned"),
            );
            let i = q as usize % UNIT_PAGES;
            if let PageState::Resident { slot: Some(s), .. } = u.get(i) {
                e.tiers.release(e, s);
            }
            u.set(i, PageState::Poisoned);
            u.resident -= 1;
            e.budget.uncharge(Gauge::Resident, 1);
            let _ = r.uffd.poison(addr, PAGE_SIZE);
            false
        }
        // Something in its page-table entry (a migration entry: the kernel moving
        // the page): not gone; it stays for now.
        Some(info) if !info.present => false,
        Some(info) if info.exclusive && err.raw_os_error() == Some(libc::EBUSY) => false,
        Some(_) => copy_out(r, addr, frame),
        None => false,
    }
}

/// Detach a page that cannot move: write-protect it so that the program's next write
/// waits, copy it into the frame, drop it from the region. Under the unit's lock.
fn copy_out(r: &RegionInner, addr: usize, frame: usize) -> bool {
    if r.uffd
        .write_protect(addr, PAGE_SIZE, true, Wake::No)
        .is_err()
    {
        return false;
    }
    // A populated frame page, so the copy cannot fault.
    if !crate::sys::mem::populate_write(frame, PAGE_SIZE) {
        let _ = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes);
        return false;
    }
    // Read through /proc/self/mem: the program may have made the page PROT_NONE,
    // and a plain copy would then fault in this thread.
    // SAFETY: the frame is ours, populated, and nobody else writes it; the region page
    // is present (checked under the unit lock, which every change of it takes) and
    // write-protected, so nobody changes it meanwhile.
    if !unsafe { crate::sys::mem::read_own_memory(addr, frame, PAGE_SIZE) } {
        let _ = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes);
        return false;
    }
    // Checked: a page the kernel will not drop (locked by the program behind uswap's
    // back, by a raw system call) stays mapped, and an engine that counted it as gone
    // would answer the program's next write to it by waking it forever.
    if !crate::sys::mem::zap_now(addr, PAGE_SIZE) {
        let _ = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes);
        return false;
    }
    true
}
