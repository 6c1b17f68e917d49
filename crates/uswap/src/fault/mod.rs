//! The fault path. A missing fault is served from the zero page (first touch), the
//! swap cache (a copy still in RAM), the compressed tier, or the back tier (one read
//! plus readahead); a write-protect fault marks a clean page dirty and frees its now
//! stale slot (seed 001). Reads complete on the thread that issued them, which maps
//! the page and wakes the faulting thread with the same ioctl.
//!
//! Every path ends with the faulting thread woken: by the ioctl that maps the page,
//! by a wake of its range (the page changed under it: it faults again), or by a
//! poison marker (its bytes are lost: SIGBUS on that page only).

pub(crate) mod in_thread;
pub(crate) mod swapin;

pub(crate) use swapin::{complete_read, drop_entry, poison_page, verify_read};

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::ring::{TOKEN_EVENT, TOKEN_TIMEOUT, TOKEN_UFFD};
use crate::slots::Slot;
use crate::sys::uffd::{Fault, Wake};
use crate::threads::ThreadCtx;
use crate::tier::{Op, OpKind};
use crate::{ReadaheadPolicy, PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

/// A fault thread: serve faults, complete I/O, sleep in the ring.
pub(crate) fn run(e: &Arc<Engine>, mut ctx: ThreadCtx) {
    ctx.arm_polls();
    let mut cqes = Vec::new();
    let spin = std::time::Duration::from_micros(e.cfg.spin_us as u64);
    let io_poll = std::time::Duration::from_micros(e.cfg.io_poll_us as u64);
    loop {
        if e.threads.is_shutdown() && !ctx.io_pending() {
            break;
        }
        let a = e.fork.enter();
        // Faults first: they are what a program waits on.
        if serve_faults(e, &mut ctx) == 0 && !spin.is_zero() {
            let t = std::time::Instant::now();
            while t.elapsed() < spin {
                ctx.ring.submit();
                if serve_faults(e, &mut ctx) > 0 {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if !ctx.deferred.is_empty() {
            // Faults put back for a pending fork: leave the engine so that the fork
            // proceeds, then serve them (`enter` waits for the fork).
            drop(a);
            continue;
        }
        // Re-arm right before sleeping: the poll's completion may have been reaped
        // anywhere, also inside a direct reclaim while serving a fault.
        if !ctx.uffd_armed && !e.threads.is_shutdown() {
            ctx.uffd_armed = true;
            ctx.ring.poll(e.uffd.raw(), TOKEN_UFFD);
        }
        drop(a);
        cqes.clear();
        if ctx.reads_waited_on() && !io_poll.is_zero() {
            // A fault likely waits for one of these reads: poll the completion queue
            // (shared memory, no system call) rather than sleep and pay a wake-up.
            ctx.ring.submit();
            let t = std::time::Instant::now();
            while cqes.is_empty() && t.elapsed() < io_poll {
                std::hint::spin_loop();
                ctx.ring.reap(&mut cqes);
            }
        }
        if cqes.is_empty() && ctx.failed.is_empty() {
            ctx.sleep();
            ctx.ring.reap(&mut cqes);
        }
        let _a = e.fork.enter();
        process_cqes(e, &mut ctx, &cqes);
    }
}

/// Read and handle every pending fault; returns how many.
fn serve_faults(e: &Engine, ctx: &mut ThreadCtx) -> usize {
    let mut total = 0;
    for f in std::mem::take(&mut ctx.deferred) {
        total += 1;
        if !handle_fault(e, ctx, f) {
            ctx.deferred.push(f);
        }
    }
    loop {
        if !ctx.deferred.is_empty() {
            return total;
        }
        let n = e.uffd.read_msgs(&mut ctx.msgs).unwrap_or_default();
        if n == 0 {
            return total;
        }
        total += n;
        for i in 0..n {
            if let Some(f) = crate::sys::uffd::decode(&ctx.msgs[i]) {
                if !handle_fault(e, ctx, f) {
                    ctx.deferred.push(f);
                }
            }
        }
        // Start the reads these faults need before looking for more.
        ctx.ring.submit();
    }
}

/// Dispatch one fault message. False: put it back (a fork is pending and it needs
/// room first).
fn handle_fault(e: &Engine, ctx: &mut ThreadCtx, f: Fault) -> bool {
    let addr = f.addr & !(PAGE_SIZE - 1);
    let Some(r) = e.regions.by_addr(addr) else {
        // Not ours any more (region dropped while the thread faulted): let it retry.
        let _ = e.uffd.wake(addr, PAGE_SIZE);
        return true;
    };
    let page = ((addr - r.base) / PAGE_SIZE) as u64;
    if f.wp {
        handle_wp(e, &r, page);
        true
    } else {
        handle_missing(e, ctx, &r, page, f.write)
    }
}

fn handle_missing(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    page: u64,
    write: bool,
) -> bool {
    // Room first, with no lock held: reclaim takes unit locks.
    let want = if crate::unit::whole_units(r) {
        // A stream through whole units also reserves the units it reads ahead.
        let unit_no = page / UNIT_PAGES as u64;
        let last = r.last_whole_unit.load(Relaxed);
        let stream = last == unit_no.wrapping_sub(1) || last == unit_no + 1;
        let ahead = if stream && r.policy.readahead != ReadaheadPolicy::Off {
            crate::unit::units_ahead(e) as i64
        } else {
            0
        };
        // A unit packed on the back tier reads its blob into a buffer first.
        UNIT_PAGES as i64 * (1 + ahead) + crate::tier::packed::read_room(e, r, page)
    } else {
        1 + e.cfg.readahead_max_pages as i64
    };
    let Some(_room) = crate::reclaim::make_room(e, ctx, r, want) else {
        return false;
    };
    let unit = r.unit_of(page);
    let mut u = unit.lock();
    if r.is_dead() {
        let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
        return true;
    }
    unit.referenced.store(true, Relaxed);
    let i = page as usize % UNIT_PAGES;
    match u.get(i) {
        PageState::Untouched => {
            if !(write && crate::unit::zero_fill_unit(e, r, &mut u, page)) {
                zero_fill(e, r, &mut u, page, write)
            }
        }
        PageState::Resident { .. } => {
            // Usually a fault that raced with the page's mapping: wake it. If the
            // page is really missing (an engine bug, or the program discarded it
            // behind uswap's back), waking would loop the program on this fault:
            // poison it instead (a SIGBUS beats wrong data).
            if crate::sys::mem::PAGE_MAP.empty(r.page_addr(page)) {
                heal_missing_resident(e, r, &mut u, page);
            }
            let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
        }
        PageState::Poisoned => {
            let _ = r.uffd.poison(r.page_addr(page), PAGE_SIZE);
        }
        PageState::Swapped(slot) => {
            if !(crate::unit::whole_units(r)
                && crate::unit::swap_in_unit(e, ctx, r, &mut u, page, write))
            {
                swapin::swap_in(e, ctx, r, &mut u, page, slot, write)
            }
        }
    }
    crate::reclaim::lru_add(e, r, page, &u);
    true
}

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

/// First touch: zeros, no I/O. A write maps them writable (dirty); a read maps them
/// write-protected, so that clean zeros can be dropped without a write. Sequential
/// first writes fault-around: the window doubles up to the rest of the unit, so a
/// program filling memory takes one fault per 2 MiB, not 512.
fn zero_fill(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64, write: bool) {
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
        n = n.min(e.budget.take_room(n as i64).max(1) as usize);
        za.last = page + n as u64;
    }
    if map_zeros(e, r, u, page, n, write) {
        r.counters.minflt.fetch_add(1, Relaxed);
        // A stream of swap-cache hits goes on past a page that holds zeros.
        if r.cache_hit_next
            .compare_exchange(page, page + n as u64, Relaxed, Relaxed)
            .is_ok()
        {
            swapin::unread_in_stream(r, page, n as u64);
        }
    }
}

/// Map `n` Untouched pages from `page` as zeros: writable and dirty (`write`), or
/// write-protected and clean, so that they can be dropped without a write. The
/// caller has the room. False if the mapping failed (said, and the fault woken): the
/// pages it mapped before failing are resident all the same. Under the unit's lock.
pub(crate) fn map_zeros(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    n: usize,
    write: bool,
) -> bool {
    let i = page as usize % UNIT_PAGES;
    let addr = r.page_addr(page);
    let (mapped, ok) = match r.uffd.copy_counted(
        addr,
        zero_source() as *const u8,
        n * PAGE_SIZE,
        !write,
        Wake::Yes,
    ) {
        Ok(()) => (n, true),
        Err((done, err)) => {
            map_failed(r, "zero fill", addr + done, err);
            (done / PAGE_SIZE, false)
        }
    };
    for k in 0..mapped {
        u.set(
            i + k,
            PageState::Resident {
                dirty: write,
                slot: None,
            },
        );
    }
    u.resident += mapped as u32;
    e.budget.charge(Gauge::Resident, mapped as i64);
    ok
}

/// A page resident by the page map is not mapped in the region: its bytes are gone
/// (evicted copies always go through a frame under the unit lock, so this is an
/// engine bug or a program that discarded region memory behind uswap's back).
/// Poisoned: a SIGBUS beats wrong data. Under the unit's lock; said once.
pub(super) fn heal_missing_resident(e: &Engine, r: &RegionInner, u: &mut UnitPages, page: u64) {
    e.diag
        .not_mapped(r, page, "a fault found no page: poisoned");
    let i = page as usize % UNIT_PAGES;
    if let PageState::Resident { slot: Some(s), .. } = u.get(i) {
        e.tiers.release(e, s);
    }
    crate::lock::release(e, u, i);
    u.set(i, PageState::Poisoned);
    u.resident -= 1;
    e.budget.uncharge(Gauge::Resident, 1);
    let _ = r.uffd.poison(r.page_addr(page), PAGE_SIZE);
}

/// A mapping ioctl failed: say so unless the range went away under us (region
/// dropped: nothing waits), and wake the faulting thread so that it retries.
pub(crate) fn map_failed(r: &RegionInner, what: &str, addr: usize, err: std::io::Error) {
    if !matches!(
        err.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::EINVAL) | Some(libc::ESRCH)
    ) {
        say!("uswap: {what} at {addr:#x} failed: {err}");
    }
    let _ = r.uffd.wake(addr, PAGE_SIZE);
}

/// Map the copies of consecutive pages `page..page + copies.len()`, each `(slot,
/// frame)` whose entry the caller removed, into the region and give their frames
/// back. Clean (a read fault): mapped write-protected, the slot stays valid. `dirty`
/// (a write fault): writable at once, the slot is stale (seed 001). Wakes the range.
/// Under the unit's lock.
///
/// Failure leaves each page where it was (its copy is put back in the cache as
/// clean) and the faulting thread retries: a failed UFFDIO_COPY (ENOMEM under a
/// memory limit) must not lose a good page.
pub(crate) fn map_from_frames(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    copies: &[(Slot, usize)],
    dirty: bool,
) {
    let dirty = dirty || r.write_trend.maps_reads_dirty(&r.counters, copies.len());
    map_copies(e, r, u, page, copies, dirty, IfUnmapped::Cache);
}

/// How far [`WriteTrend`]'s score goes either way.
const WRITE_TREND_LIMIT: i32 = 64;

/// While reads are mapped dirty, one read in this many is still mapped clean, so that
/// the score keeps seeing whether it is written.
const WRITE_TREND_PROBE: u32 = 16;

/// Whether a region's pages swapped in by a read are written soon after (sort, a hash
/// table updated in place). Mapped clean (write-protected, the slot kept), such a page
/// takes a write-protect fault, a userfaultfd round trip, to become writable. The
/// kernel maps a read swap-in writable and learns from the dirty bit at reclaim
/// whether it was written; user space cannot read that bit. So the region scores
/// what it sees: +1 for a write-protect fault on a page swapped in clean, -1 for such
/// a page evicted still clean (its copy on swap saved a write). While the score is
/// positive, reads map swapped-in pages dirty, as writes do (their slots stale), which
/// costs a write at eviction for a page that was only read: one of the background
/// writes eviction batches, against a round trip that stops the program.
#[derive(Default)]
pub(crate) struct WriteTrend {
    score: std::sync::atomic::AtomicI32,
    reads: std::sync::atomic::AtomicU32,
}

impl WriteTrend {
    /// A write-protect fault on a page swapped in clean.
    pub(crate) fn written_after_read(&self) {
        self.step(1);
    }

    /// `n` pages swapped in clean were evicted without a write.
    pub(crate) fn evicted_clean(&self, n: u64) {
        if n > 0 {
            self.step(-(n.min(WRITE_TREND_LIMIT as u64) as i32));
        }
    }

    /// Moves the score by `by` pages' evidence. While reads map dirty, the pages seen
    /// are the probes, each standing for `WRITE_TREND_PROBE` reads.
    fn step(&self, by: i32) {
        let _ = self.score.fetch_update(Relaxed, Relaxed, |s| {
            let weight = if s > 0 { WRITE_TREND_PROBE as i32 } else { 1 };
            Some((s + by * weight).clamp(-WRITE_TREND_LIMIT, WRITE_TREND_LIMIT))
        });
    }

    /// Whether a read fault maps the `n` copies it swapped in dirty; counted as
    /// `swpin_mapped_dirty`.
    pub(crate) fn maps_reads_dirty(
        &self,
        counters: &crate::stats::EventCounters,
        n: usize,
    ) -> bool {
        if self.score.load(Relaxed) <= 0
            || self
                .reads
                .fetch_add(1, Relaxed)
                .is_multiple_of(WRITE_TREND_PROBE)
        {
            return false;
        }
        counters.swpin_mapped_dirty.fetch_add(n as u64, Relaxed);
        true
    }
}

/// What becomes of a copy that could not be mapped; its page stays swapped to its
/// slot and the fault retries either way.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum IfUnmapped {
    /// Kept in the swap cache, clean: the slot's tier holds the same bytes.
    Cache,
    /// Freed: a copy just decompressed, whose compressed entry stays until a mapping
    /// succeeds (a cache copy would be the page's only one once the entry went).
    Drop,
}

/// [`map_from_frames`], saying what becomes of a copy that could not be mapped.
pub(crate) fn map_copies(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    copies: &[(Slot, usize)],
    dirty: bool,
    if_unmapped: IfUnmapped,
) {
    let i0 = page as usize % UNIT_PAGES;
    let mut k = 0;
    while k < copies.len() {
        // One copy per run of consecutive frames.
        let mut n = 1;
        while k + n < copies.len() && copies[k + n].1 == copies[k + n - 1].1 + PAGE_SIZE {
            n += 1;
        }
        let dst = r.page_addr(page + k as u64);
        let every = e.cfg.inject.fail_map_every;
        let injected =
            every > 0 && (e.diag.map_seq.fetch_add(1, Relaxed) + 1).is_multiple_of(every);
        let result = if injected {
            Err((0, std::io::Error::from_raw_os_error(libc::ENOMEM)))
        } else {
            r.uffd.copy_counted(
                dst,
                copies[k].1 as *const u8,
                n * PAGE_SIZE,
                !dirty,
                Wake::Yes,
            )
        };
        let mapped = match result {
            Ok(()) => n,
            Err((done, err)) => {
                if injected {
                    let _ = r.uffd.wake(dst, PAGE_SIZE);
                } else {
                    map_failed(r, "swap-in copy", dst, err);
                }
                done / PAGE_SIZE
            }
        };
        for (j, &(s, frame)) in copies[k..k + n].iter().enumerate() {
            let idx = i0 + k + j;
            if j < mapped {
                mark_mapped(e, r, u, idx, s, dirty);
                u.resident += 1;
                e.frames.free_mapped(&e.zapper, &[frame]);
                e.budget.transfer(Gauge::Cached, Gauge::Resident, 1);
            } else if if_unmapped == IfUnmapped::Drop {
                e.tiers.clear_cache(e, s);
                e.frames.free(&e.zapper, &[frame]);
                e.budget.uncharge(Gauge::Cached, 1);
            } else {
                // Not mapped: the copy stays in the cache, clean; the retry finds it.
                let owner = crate::swap_cache::Owner {
                    region: r.id,
                    page: page + (k + j) as u64,
                };
                e.frames.retag(frame, crate::frames::Site::Unmapped);
                e.cache_insert(
                    "unmapped unit copy",
                    s,
                    crate::swap_cache::Entry::new(
                        owner,
                        crate::swap_cache::CacheState::Clean,
                        frame,
                    ),
                );
                crate::reclaim::push_inactive(e, r.id, owner.page, s);
            }
        }
        k += n;
    }
}

/// Page `i` of a unit was just mapped from the swap-cache copy of slot `s` (the
/// entry is gone): a clean page keeps its valid slot; a dirty one (mapped for a
/// write) makes it stale, and the policy decides (seed 001).
pub(crate) fn mark_mapped(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    i: usize,
    s: Slot,
    dirty: bool,
) {
    e.tiers.clear_cache(e, s);
    let slot = if dirty {
        stale_slot_of(e, r, s)
    } else {
        Some(s)
    };
    u.set(i, PageState::Resident { dirty, slot });
}

/// The stale-slot policy (seed 001) for one slot; what the page keeps. A packed
/// page's slot always goes: it names a blob shared with the rest of its unit, which
/// nothing may rewrite in place.
pub(crate) fn stale_slot_of(e: &Engine, r: &RegionInner, s: Slot) -> Option<Slot> {
    let packed = e.tiers.meta.location(s) == crate::tier::Location::Packed;
    match e.cfg.stale_slot_policy {
        crate::StaleSlotPolicy::KeepUntilReclaim if !packed => Some(s),
        _ => {
            e.tiers.release(e, s);
            r.counters.stale_slot_freed.fetch_add(1, Relaxed);
            None
        }
    }
}

/// First write to a clean page: it becomes dirty, and its slot is stale.
fn handle_wp(e: &Engine, r: &RegionInner, page: u64) {
    let addr = r.page_addr(page);
    let mut u = r.unit_of(page).lock();
    if r.is_dead() {
        let _ = r.uffd.wake(addr, PAGE_SIZE);
        return;
    }
    if crate::unit::wp_unit(e, r, &mut u, page) {
        return;
    }
    let i = page as usize % UNIT_PAGES;
    match u.get(i) {
        PageState::Resident { dirty: false, slot } => {
            if slot.is_some() {
                r.write_trend.written_after_read();
            }
            let slot = slot.and_then(|s| stale_slot_of(e, r, s));
            u.set(i, PageState::Resident { dirty: true, slot });
            r.counters.wpflt.fetch_add(1, Relaxed);
            if let Err(err) = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes) {
                map_failed(r, "write unprotect", addr, err);
            }
        }
        PageState::Resident { dirty: true, .. } => {
            let _ = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::Yes);
        }
        // Evicted meanwhile: the retry takes a missing fault.
        _ => {
            let _ = r.uffd.wake(addr, PAGE_SIZE);
        }
    }
}

/// Handle completions reaped from a ring.
pub(crate) fn process_cqes(e: &Engine, ctx: &mut ThreadCtx, cqes: &[(u64, i32)]) {
    for (op, res) in std::mem::take(&mut ctx.failed) {
        complete(e, ctx, op, res);
    }
    if let Some(r) = ctx.remote.as_mut() {
        r.expire();
    }
    for &(ud, res) in cqes {
        match ud {
            TOKEN_UFFD => ctx.uffd_armed = false,
            TOKEN_EVENT => {
                crate::sys::mem::drain_eventfd(ctx.event_fd);
                ctx.ring.poll(ctx.event_fd, TOKEN_EVENT);
            }
            TOKEN_TIMEOUT => {}
            crate::ring::TOKEN_REMOTE => {
                if let Some(r) = ctx.remote.as_mut() {
                    let fd = std::os::fd::AsRawFd::as_raw_fd(&r.event);
                    ctx.ring.poll(fd, crate::ring::TOKEN_REMOTE);
                }
                complete_remote(e, ctx);
            }
            t if crate::ring::is_direct_token(t) => {
                if let Some(r) = ctx.remote.as_mut() {
                    r.readable(t);
                }
                complete_remote(e, ctx);
            }
            t if t > crate::ring::TOKEN_POLL_BASE - 1_000_000
                && t <= crate::ring::TOKEN_POLL_BASE =>
            {
                crate::fork::child_poll_done(e, crate::ring::TOKEN_POLL_BASE - t);
            }
            _ => {
                if let Some(op) = ctx.ring.take(ud) {
                    complete(e, ctx, op, res);
                }
            }
        }
    }
}

/// The remote tier's finished requests (through the store's runtime, or read on the
/// thread's own connections), and its polls armed again.
fn complete_remote(e: &Engine, ctx: &mut ThreadCtx) {
    let mut done = Vec::new();
    if let (Some(r), Some(remote)) = (ctx.remote.as_mut(), &e.tiers.remote) {
        r.drain(remote, &e.frames, &mut done);
    }
    for (op, res) in done {
        complete(e, ctx, op, res);
    }
    if let Some(r) = ctx.remote.as_mut() {
        r.arm(&mut ctx.ring);
    }
}

/// One back-tier request finished with `res` (bytes, or -errno).
pub(crate) fn complete(e: &Engine, ctx: &mut ThreadCtx, op: Op, res: i32) {
    e.tiers.finished(crate::tier::Finished::of(&op));
    handle_completion(e, ctx, op, res);
}

/// An injected read error leaves what the read did not bring undefined, as a real one
/// does: the real read already filled the frames, so a path that mapped them anyway
/// would still find the right bytes there. Scribbled over, it finds wrong ones (a
/// frame reused from another page holds that page's bytes the same way).
fn scribble(e: &Engine, frames: &[usize]) {
    for &f in frames {
        e.frames.page_mut(f).fill(0xee);
    }
}

fn handle_completion(e: &Engine, ctx: &mut ThreadCtx, op: Op, mut res: i32) {
    let inj = e.cfg.inject;
    let hit = |every: u64, n: u64| every > 0 && n.is_multiple_of(every);
    // Injected short I/O shortens the result (half the bytes, whole pages).
    let short = ((op.pages.len() / 2).max(1) * PAGE_SIZE) as i32;
    let inject = res >= 0 && (op.attempt == 0 || !inj.transient);
    match op.kind {
        OpKind::Read => {
            let n = e.diag.read_seq.fetch_add(1, Relaxed) + 1;
            if inject && hit(inj.fail_read_every, n) {
                res = -libc::EIO;
                scribble(e, &op.frames);
            } else if inject && op.pages.len() > 1 && hit(inj.short_read_every, n) {
                res = short;
                scribble(e, &op.frames[short as usize / PAGE_SIZE..]);
            }
            if op.unit_read {
                crate::unit::complete_unit_read(e, ctx, op, res)
            } else {
                complete_read(e, ctx, op, res)
            }
        }
        OpKind::Write => {
            let n = e.diag.write_seq.fetch_add(1, Relaxed) + 1;
            if inject && hit(inj.fail_write_every, n) {
                res = -libc::EIO;
            } else if inject && op.pages.len() > 1 && hit(inj.short_write_every, n) {
                res = short;
            }
            if op.packed.is_some() {
                crate::tier::packed::complete_write(e, ctx, op, res)
            } else {
                crate::writeback::complete_write(e, ctx, op, res)
            }
        }
    }
}
