//! Writeback: evicted pages that need writing get slots and go to a tier; their
//! writes complete here, on the thread that issued them.
//!
//! Errors never lose a page (its bytes are still in its frame):
//! - an I/O error marks the slot bad (never handed out again) and writes the page
//!   elsewhere, at most twice; then the page goes back into its region, dirty;
//! - a short write is tried again at the same place;
//! - a full device (ENOSPC: a thin or copy-on-write device, a file that cannot grow)
//!   or a run of failures stops writeback for a while (doubling from 100 ms to 10 s):
//!   reclaim then leaves dirty pages in RAM instead of moving them out and back in a
//!   loop, and a fault that needs room goes over the budget, said once on stderr.
//!
//! A full swap place (the file at its cap, `MaxSwap`, or its filesystem out of room)
//! is handled the same way, never silently and never in a loop: said loudly on stderr
//! the first time, with the figures and what to raise; counted (`swap_full_events`);
//! writes pause with the same backoff, so reclaim stops moving dirty pages out and
//! back, and faults that need room go over the budget at once while the last
//! reclaim found nothing (`reclaim_futile`) instead of scanning again for each fault.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::{Slot, SlotRun};
use crate::swap_cache::{CacheState, Entry, Owner};
use crate::sys::uffd::Wake;
use crate::threads::ThreadCtx;
use crate::tier::{Location, Op, OpKind};
use crate::{ReadaheadPolicy, PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;

/// Most tries of one page's write (its first place and up to two more).
pub(crate) const WRITE_TRIES: u8 = 3;
const BACKOFF_MIN_MS: u64 = 100;
const BACKOFF_MAX_MS: u64 = 10_000;

/// Whether writes may start, and what was said about it.
pub(crate) struct Writeback {
    epoch: std::time::Instant,
    /// No write starts before this (ns since `epoch`); 0: writes may start.
    blocked_until: AtomicU64,
    backoff_ms: AtomicU64,
    /// "Writes refused" was said (and not yet "writes work again").
    said_blocked: AtomicBool,
    /// "Swap full" was said.
    said_full: AtomicBool,
    /// Times the swap place was found full (a growth refused).
    full_events: AtomicU64,
    /// The `blocked_until` of the pause in which a fault's reclaim found nothing to
    /// free: until it ends, faults go over budget without reclaiming again.
    futile_until: AtomicU64,
}

impl Writeback {
    pub(crate) fn new() -> Writeback {
        Writeback {
            epoch: std::time::Instant::now(),
            blocked_until: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(BACKOFF_MIN_MS),
            said_blocked: AtomicBool::new(false),
            said_full: AtomicBool::new(false),
            full_events: AtomicU64::new(0),
            futile_until: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// How long until writes may start again (None: they may now).
    pub(crate) fn blocked_for(&self) -> Option<std::time::Duration> {
        let until = self.blocked_until.load(Relaxed);
        let now = self.now_ns();
        (until > now).then(|| std::time::Duration::from_nanos(until - now))
    }
}

/// Whether reclaim may start writes now (with encryption: and a key to write with,
/// which a forked child may lack).
pub(crate) fn can_write(e: &Engine) -> bool {
    e.tiers.back_writes
        && e.writeback.blocked_for().is_none()
        && e.tiers.seal.as_ref().is_none_or(|s| s.can_write())
}

impl Writeback {
    /// Times the swap place was found full.
    pub(crate) fn full_events(&self) -> u64 {
        self.full_events.load(Relaxed)
    }

    /// Stop writes for the current backoff, which doubles; returns its length in ms.
    fn pause(&self) -> u64 {
        let ms = self.backoff_ms.load(Relaxed);
        self.backoff_ms.store((ms * 2).min(BACKOFF_MAX_MS), Relaxed);
        self.blocked_until
            .store(self.now_ns() + ms * 1_000_000, Relaxed);
        ms
    }

    /// A fault's reclaim found nothing to free while writes are paused: the next
    /// faults of this pause need not look again.
    pub(crate) fn note_futile(&self) {
        if self.blocked_for().is_some() {
            self.futile_until
                .store(self.blocked_until.load(Relaxed), Relaxed);
        }
    }

    /// Whether a fault's reclaim already found nothing in this pause of writes.
    pub(crate) fn reclaim_futile(&self) -> bool {
        let until = self.futile_until.load(Relaxed);
        until != 0 && until == self.blocked_until.load(Relaxed) && self.blocked_for().is_some()
    }
}

/// The back tier refused a write with `err`: stop writing for a while.
pub(crate) fn refused(e: &Engine, err: i32) {
    let w = &e.writeback;
    let ms = w.pause();
    if !w.said_blocked.swap(true, Relaxed) {
        say!(
            "uswap: the swap device refuses writes ({}): pages stay in RAM, over budget, \
             while it does; trying again in {} ms, then less and less often",
            std::io::Error::from_raw_os_error(err),
            ms
        );
    }
}

/// A write went through: writeback is healthy again.
pub(crate) fn accepted(e: &Engine) {
    let w = &e.writeback;
    if w.blocked_until.load(Relaxed) != 0 || w.backoff_ms.load(Relaxed) != BACKOFF_MIN_MS {
        w.blocked_until.store(0, Relaxed);
        w.backoff_ms.store(BACKOFF_MIN_MS, Relaxed);
    }
    if w.said_blocked.swap(false, Relaxed) {
        say!("uswap: the swap device takes writes again");
    }
}

/// Grow the slot space when allocation falls short (the slot space was `seen`
/// slots then; another thread may have grown it since): a growable swap file grows
/// by a step (`SwapFile::next_step`), never past what backs every committed page
/// again plus the slots lost to write errors (never reused) plus one unit, nor past
/// its cap or its filesystem's floor. In a forked child this makes its own file on
/// first need (its slots start past the parent's). False when it cannot: the swap is
/// full (`swap_full`).
fn grow_slots(e: &Engine, seen: u64) -> bool {
    if e.slots.capacity() > seen {
        return true;
    }
    let f = e.tiers.file();
    let page = PAGE_SIZE as u64;
    let bad = e.slots.bad_slots();
    let grown = match f.fixed_size() {
        Some(_) => Err(None),
        None => {
            let cap = f.capacity();
            let bound = f.base() * page + e.regions.committed() + (bad + UNIT_PAGES as u64) * page;
            let step = f
                .next_step()
                .min(bound.saturating_sub(cap))
                .max(crate::UNIT_SIZE as u64);
            f.grow(step).map_err(Some)
        }
    };
    match grown {
        Ok(_) => {
            e.slots.grow(e.tiers.capacity() / page);
            true
        }
        Err(why) => {
            swap_full(e, why, bad);
            false
        }
    }
}

/// No slot for a page, and the swap cannot grow (`why`; None: a fixed size or a
/// device): counted, writes pause (`Writeback::pause`), said loudly the first time.
fn swap_full(e: &Engine, why: Option<crate::Error>, bad: u64) {
    let w = &e.writeback;
    w.full_events.fetch_add(1, Relaxed);
    w.pause();
    if w.said_full.swap(true, Relaxed) {
        return;
    }
    let f = e.tiers.file();
    let why = why.map_or_else(
        || {
            format!(
                "its fixed size of {} is in use",
                crate::format_size(f.max_bytes())
            )
        },
        |e| e.to_string(),
    );
    let lost = match bad {
        0 => String::new(),
        n => format!(" ({n} slots lost to write errors)"),
    };
    say!(
        "uswap: SWAP FULL: {why}{lost}.\n\
         uswap: pages that need swap now stay in RAM, OVER THE BUDGET of {}, until swap \
         space is freed (counted as swap_full_events in --stats); give a larger --max-swap \
         or a --swap-file on a disk with more room.",
        crate::format_size(e.budget.bytes())
    );
}

/// Up to `n` slots for pages about to leave, appended to `runs` as runs; the slot
/// space grows when it falls short. Returns how many.
pub(crate) fn alloc_slots(
    e: &Engine,
    ctx: &mut ThreadCtx,
    n: usize,
    runs: &mut Vec<SlotRun>,
) -> usize {
    let seen = e.slots.capacity();
    let mut got = e.slots.alloc(&mut ctx.cursor, n, runs);
    if got < n && grow_slots(e, seen) {
        got += e.slots.alloc(&mut ctx.cursor, n - got, runs);
    }
    got
}

/// A whole free cluster (a 2 MiB unit's slots), growing the slot space if there is
/// none.
pub(crate) fn alloc_cluster(e: &Engine, ctx: &mut ThreadCtx) -> Option<Slot> {
    let seen = e.slots.capacity();
    e.slots
        .alloc_cluster(&mut ctx.cursor)
        .or_else(|| grow_slots(e, seen).then(|| e.slots.alloc_cluster(&mut ctx.cursor))?)
}

/// Pages of one locked unit, evicted into `frames` (page map still `Resident`, or
/// a failed write's pages), get slots and leave: one gathered write per run of
/// slots, as try `attempt`. Returns the pages (with their frames) that got no slot;
/// the caller puts them back.
pub(crate) fn write_pages(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    pages: &[u64],
    frames: &[usize],
    attempt: u8,
) -> Vec<(u64, usize)> {
    if pages.is_empty() {
        return Vec::new();
    }
    if !can_write(e) {
        return pages.iter().copied().zip(frames.iter().copied()).collect();
    }
    let mut runs: Vec<SlotRun> = Vec::new();
    let got = alloc_slots(e, ctx, pages.len(), &mut runs);
    let mut next = 0;
    for run in &runs {
        let n = run.len as usize;
        write_run(
            e,
            ctx,
            r,
            u,
            &pages[next..next + n],
            &frames[next..next + n],
            run.start,
            attempt,
        );
        next += n;
    }
    pages[got..]
        .iter()
        .copied()
        .zip(frames[got..].iter().copied())
        .collect()
}

/// Pages `pages` of a locked unit, in `frames`, are written to slots `first..`: the
/// swap cache holds each as `Writing` until the write completes, the page map says
/// swapped, the slot records the page's checksum (of the plaintext). With encryption
/// the frames are encrypted in place once their entries are in (`tier/seal.rs`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_run(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    pages: &[u64],
    frames: &[usize],
    first: Slot,
    attempt: u8,
) {
    let by_slot = r.policy.readahead == ReadaheadPolicy::Cluster;
    for (k, (&p, &f)) in pages.iter().zip(frames).enumerate() {
        let s = first + k as Slot;
        e.frames.retag(f, crate::frames::Site::Writing);
        e.cache_insert(
            "write",
            s,
            Entry::new(
                Owner {
                    region: r.id,
                    page: p,
                },
                CacheState::Writing,
                f,
            ),
        );
        e.slots.set_cache(s);
        let hash = e.tiers.checksum(e.frames.page(f));
        e.tiers.meta.set(s, Location::Back, hash);
        if by_slot {
            e.tiers.meta.set_owner(s, r.id, p);
        }
        u.set(p as usize % UNIT_PAGES, PageState::Swapped(s));
    }
    r.counters.write_requests.fetch_add(1, Relaxed);
    crate::tier::seal::seal_frames(e, frames, first);
    let mut op = Op::new(
        OpKind::Write,
        r.clone(),
        pages.to_vec(),
        frames.to_vec(),
        first,
    );
    op.attempt = attempt;
    e.tiers.submit(e, ctx, op);
}

/// A page in `frame` goes back into its region, dirty and without a slot (its write
/// failed, or it got no slot): moved, or copied where it cannot move. The caller
/// removed its cache entry, if it had one. Under the unit's lock.
pub(crate) fn restore_dirty(e: &Engine, r: &RegionInner, u: &mut UnitPages, p: u64, frame: usize) {
    let dst = r.page_addr(p);
    let moved = r.uffd.move_pages(dst, frame, PAGE_SIZE, Wake::Yes).is_ok();
    if !moved {
        if let Err(err) = r
            .uffd
            .copy(dst, frame as *const u8, PAGE_SIZE, false, Wake::Yes)
        {
            // Nowhere to put it: its bytes are lost. SIGBUS beats zeros.
            e.diag.internal(&format!(
                "cannot restore page {p} of region {}: {err}",
                r.id
            ));
            u.set(p as usize % UNIT_PAGES, PageState::Poisoned);
            r.counters.poisoned.fetch_add(1, Relaxed);
            e.frames.free(&e.zapper, &[frame]);
            e.budget.uncharge(Gauge::Cached, 1);
            let _ = r.uffd.poison(dst, PAGE_SIZE);
            return;
        }
    }
    if moved && !e.frames.is_huge(frame) {
        e.frames.free_moved(frame, 1);
    } else if moved {
        e.frames.free_moved_from_huge(&e.zapper, &[frame]);
    } else {
        e.frames.free(&e.zapper, &[frame]);
    }
    u.set(
        p as usize % UNIT_PAGES,
        PageState::Resident {
            dirty: true,
            slot: None,
        },
    );
    u.resident += 1;
    e.budget.transfer(Gauge::Cached, Gauge::Resident, 1);
}

/// Written pages nobody waits for, their frames still ciphertext (entries `Clean`, under
/// the unit's lock): their frames go, unread. A page of a 2 MiB frame whose other pages
/// live on (clean copies of the unit that stayed) is opened and kept as a clean copy
/// instead: the frame's memory goes only with its last page, so freeing it alone would
/// take it off the budget while it is still held.
fn drop_unread(e: &Engine, r: &RegionInner, u: &mut UnitPages, unread: &[(u64, Slot, usize)]) {
    // Pages here per 2 MiB frame (an op's pages are of one unit: a frame or two).
    let mut here: Vec<(usize, usize)> = Vec::new();
    for &(_, _, f) in unread {
        if let Some(i) = e.frames.huge_index(f) {
            match here.iter_mut().find(|(j, _)| *j == i) {
                Some((_, n)) => *n += 1,
                None => here.push((i, 1)),
            }
        }
    }
    let mut freed: Vec<usize> = Vec::with_capacity(unread.len());
    for &(page, slot, frame) in unread {
        let last = e.frames.huge_index(frame).is_none_or(|i| {
            let n = here.iter().find(|(j, _)| *j == i).map_or(0, |h| h.1);
            n >= usize::from(e.frames.huge_live(frame))
        });
        if !last && crate::tier::seal::open_frame(e, slot, frame) {
            keep_written(e, r, page, slot, frame);
            continue;
        }
        e.cache.remove(slot);
        e.tiers.clear_cache(e, slot);
        if last {
            freed.push(frame);
        } else {
            lose_copy(e, r, u, page, slot, frame);
        }
    }
    e.frames.free(&e.zapper, &freed);
    e.budget.uncharge(Gauge::Cached, freed.len() as i64);
}

/// A written page's copy stays in the swap cache, clean, oldest to go.
fn keep_written(e: &Engine, r: &RegionInner, page: u64, slot: Slot, frame: usize) {
    e.frames.retag(frame, crate::frames::Site::Written);
    crate::reclaim::push_inactive(e, r.id, page, slot);
}

/// The copy of `page` in `frame` (its cache entry gone) cannot be decrypted: its
/// bytes are lost, the program gets SIGBUS on it.
fn lose_copy(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64, slot: Slot, frame: usize) {
    e.diag.internal(&format!(
        "the copy of page {page} of region {} written to slot {slot} does not decrypt",
        r.id
    ));
    e.frames.free(&e.zapper, &[frame]);
    e.budget.uncharge(Gauge::Cached, 1);
    crate::fault::poison_page(e, r, u, page, slot);
}

/// A write finished: the copies are clean (or, on error, written elsewhere or put
/// back).
pub(crate) fn complete_write(e: &Engine, ctx: &mut ThreadCtx, mut op: Op, res: i32) {
    let r = op.region.clone();
    let ok = res >= 0 && res as usize == op.bytes();
    if ok {
        accepted(e);
    } else if !r.is_dead() {
        r.counters.io_errors.fetch_add(1, Relaxed);
        // Short: the device took part of it; the same place is tried again.
        if res >= 0 && op.attempt + 1 < WRITE_TRIES {
            op.attempt += 1;
            e.tiers.submit(e, ctx, op);
            return;
        }
    }
    // Encrypted in place: a written frame nobody waits for goes now (`tier/seal.rs`).
    let sealed = e.tiers.seal.is_some();
    let mut unread: Vec<(u64, Slot, usize)> = Vec::new();
    let first_unit = op.pages[0] / UNIT_PAGES as u64;
    debug_assert!(op.pages.iter().all(|p| p / UNIT_PAGES as u64 == first_unit));
    let mut u = r.unit_of(op.pages[0]).lock();
    // Read once: `destroy` marks the region dead before it waits for this lock, and a
    // second reading could drop the pages taken out for relocation below.
    let dead = r.is_dead();
    let mut relocate: Vec<(u64, usize)> = Vec::new();
    for (k, &page) in op.pages.iter().enumerate() {
        let slot = op.slot + k as u64;
        let i = page as usize % UNIT_PAGES;
        let wanted = !dead
            && u.get(i) == PageState::Swapped(slot)
            && e.cache.get(slot).is_some_and(|en| !en.orphan);
        if !wanted {
            if !ok {
                e.slots.mark_bad(slot);
            }
            crate::fault::drop_entry(e, &r, page, slot);
            continue;
        }
        if ok {
            r.counters.pswpout.fetch_add(1, Relaxed);
            match e.cache.complete_io(slot) {
                Some(en) if en.waiters => {
                    if crate::tier::seal::open_frame(e, slot, en.frame) {
                        crate::fault::map_from_frames(
                            e,
                            &r,
                            &mut u,
                            page,
                            &[(slot, en.frame)],
                            en.write,
                        )
                    } else {
                        e.tiers.clear_cache(e, slot);
                        lose_copy(e, &r, &mut u, page, slot, en.frame);
                    }
                }
                Some(en) if sealed => unread.push((page, slot, en.frame)),
                Some(en) => keep_written(e, &r, page, slot, en.frame),
                None => {}
            }
            continue;
        }
        // Failed: the bytes are still in the frame. The slot goes (bad on an I/O
        // error; a full device's slot is fine, only the device is full).
        let Some(en) = e.cache.remove(slot) else {
            continue;
        };
        e.tiers.clear_cache(e, slot);
        if res == -libc::EIO || res >= 0 {
            e.slots.mark_bad(slot);
        }
        if !crate::tier::seal::open_frame(e, slot, en.frame) {
            lose_copy(e, &r, &mut u, page, slot, en.frame);
            continue;
        }
        e.tiers.release(e, slot);
        if res == -libc::EIO && op.attempt + 1 < WRITE_TRIES {
            relocate.push((page, en.frame));
            if en.waiters {
                // Its fault waited on this write: it faults again and waits on the
                // page's next one (a waiter recorded here would be lost with the entry).
                let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
            }
        } else {
            restore_dirty(e, &r, &mut u, page, en.frame);
        }
    }
    drop_unread(e, &r, &mut u, &unread);
    if !ok && !dead {
        if res != -libc::EIO || op.attempt + 1 >= WRITE_TRIES {
            refused(e, if res < 0 { -res } else { libc::EIO });
        }
        let (pages, frames): (Vec<u64>, Vec<usize>) = relocate.into_iter().unzip();
        let unbacked = write_pages(e, ctx, &r, &mut u, &pages, &frames, op.attempt + 1);
        for (p, f) in unbacked {
            restore_dirty(e, &r, &mut u, p, f);
        }
    }
    // Pages put back, or mapped for a fault that waited: the unit is evictable again
    // (the fault's own `lru_add` ran while its page was still out).
    if !dead {
        crate::reclaim::lru_add(e, &r, op.pages[0], &u);
    }
}
