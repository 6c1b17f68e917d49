//! Packed units: the compressed tier writes a unit it stored whole back to the back
//! tier as it is stored, compressed (zswap decompresses what it writes back; a stream
//! through `compressed+file` then wrote nearly every byte it compressed, whole).
//!
//! - Write (`write`, reclaim thread, from `compressed::balance`): a unit entry whose
//!   512 pages are all still swapped to it, none of their slots shared with a fork's
//!   child, is exported (`Zpool::export_unit`: its
//!   chunks as the pool keeps them, ~1/2.7 of 2 MiB on mixed data) into frames,
//!   checksummed (xxh3 over its blocks) and written with one request to the first
//!   blocks of the unit's own cluster (a *blob*): no slot more than the unit had, and
//!   the whole clusters that units evicted whole need stay whole (blobs in slots of
//!   their own took ~2/5 more slots and broke the free clusters up: docs/design.md). The pages keep their slots,
//!   which name them for the page map, the swap cache and fork. The entry leaves the
//!   pool at once, as zswap's does at writeback: until the write completes the frames
//!   are the blob's bytes (charged to the budget), as a page being written lives in
//!   the swap cache. A write that fails is tried again in place (three tries in all);
//!   one that fails for good leaves the blob in its frames, in RAM, charged, until its
//!   pages go (its slots bad on an I/O error), and writeback pauses as for any refused
//!   write: no byte is lost.
//! - Read (`fault`, under the unit's lock, on the faulting engine thread): from the
//!   frames while they hold the blob, else from the back tier, synchronously (O_DIRECT,
//!   up to three tries) and checked; decoded into a 2 MiB frame. A read fault maps a
//!   blob read from the back tier clean, its pages keeping their slots and the blob
//!   as their copy (a page read from a swap file keeps its slot alike): a unit that is
//!   only read leaves again without a write. A write fault, or a blob still in frames,
//!   maps dirty: the pages' slots go, as a compressed entry goes at its load (a write
//!   to a clean unit lets them go too, whatever the stale-slot policy: a blob is never
//!   rewritten in place). A blob that cannot be
//!   read or fails its checksum or decoding poisons the unit's pages still packed
//!   (SIGBUS when touched), never wrong bytes. Unit readahead does not cover packed
//!   units (each costs its fault one read).
//! - Lifetime: the blob holds one more reference on each slot it is written to, so
//!   that a page going frees no block another page still needs; it lets them go with
//!   the last reference on any of its pages' slots (`ref_gone`, from
//!   `Tiers::release` and `Tiers::put_child_ref`; `ref_added` counts the references a
//!   fork takes for its child). A forked child takes the pages of a blob still being
//!   written back into its regions from the frames (`fork_child_unit`).
//! - The blobs' table is engine heap like the compressed tier's `unit_live`, not
//!   charged to the budget: ~100 bytes per packed unit (50 KiB per GiB packed).
//!
//! Only for regions that swap units in whole (`--unit 2m`: under `auto` a random fault
//! takes one page, and a packed unit would cost it a 2 MiB read and decode), with a
//! compressed tier in front of a swap file, in the clear (`--encrypt`
//! seals each page with its own tag; the remote tier has values of its own).
//! `USWAP_PACKED_WRITEBACK=off` writes units back decompressed, to compare.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::{Slot, SlotRun};
use crate::threads::ThreadCtx;
use crate::tier::compressed::Compressed;
use crate::tier::{Location, Op, OpKind};
use crate::{PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use uswap_zpool::Handle;

/// Tries of a blob read whose result is wrong (an I/O error, a short read, bytes that
/// fail their checksum) before its pages are given up.
const READ_TRIES: u32 = 3;

/// A unit's bytes, compressed, on the back tier (or in frames while written).
#[derive(Debug, Clone)]
struct Blob {
    /// Its unit's first slot (the table's key): its blocks are the first `blocks`.
    base: Slot,
    blocks: u32,
    /// xxh3 of the blocks as written (the packed bytes, zero-padded).
    hash: u64,
    /// References on its pages' slots (this process's pages, and a fork's children).
    live: u32,
    /// It holds a reference on each of its blocks (from its write on; given up when
    /// the write failed for good).
    held: bool,
    /// Its write is in flight.
    writing: bool,
    /// The frames holding its bytes: while it is written, or for good after its write
    /// failed.
    mem: Option<Arc<PackedWrite>>,
}

impl Blob {
    /// Its blocks, as a run of slots.
    fn run(&self) -> SlotRun {
        SlotRun {
            start: self.base,
            len: self.blocks,
        }
    }
}

/// What a blob held when it went: to give back outside its lock.
#[derive(Default)]
struct Gone {
    runs: Vec<SlotRun>,
    /// Frames and the pages of the budget they were charged as.
    frames: Vec<usize>,
    charged: i64,
}

/// The packed units of this process.
pub(crate) struct Packed {
    on: bool,
    /// Blobs by their unit's first page slot.
    blobs: Mutex<HashMap<Slot, Blob>>,
    /// What blobs that went held, to give back outside the blobs' lock; `gone_n` says
    /// whether there is any.
    gone: Mutex<Gone>,
    gone_n: AtomicUsize,
    /// A packed write failed (said once).
    said_write_error: AtomicBool,
}

impl Packed {
    /// `allowed`: a compressed tier in front of a swap file, pages in the clear.
    pub(crate) fn new(allowed: bool) -> Packed {
        let off = std::env::var("USWAP_PACKED_WRITEBACK").is_ok_and(|v| v == "off");
        Packed {
            on: allowed && !off,
            blobs: Mutex::new(HashMap::new()),
            gone: Mutex::new(Gone::default()),
            gone_n: AtomicUsize::new(0),
            said_write_error: AtomicBool::new(false),
        }
    }

    /// Whether units are written back packed.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    fn blobs(&self) -> std::sync::MutexGuard<'_, HashMap<Slot, Blob>> {
        self.blobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn blob(&self, base: Slot) -> Option<Blob> {
        self.blobs().get(&base).cloned()
    }

    /// Blob `b` (out of the table) is done with: what it held, to give back (its
    /// slots only where they are this process's: an inherited file's are the
    /// parent's).
    fn bury(&self, e: &Engine, b: Blob) {
        let own = e.tiers.file().base();
        let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        if b.held && b.base >= own {
            g.runs.push(b.run());
        }
        if let Some(m) = b.mem {
            g.frames.extend_from_slice(&m.frames);
            g.charged += i64::from(m.blocks);
        }
        self.gone_n.fetch_add(1, Relaxed);
    }

    /// A reference on slot `s` (packed) went: the blob goes with its last, unless its
    /// write is in flight (its completion buries it).
    pub(crate) fn ref_gone(&self, e: &Engine, s: Slot) {
        let base = s - s % UNIT_PAGES as u64;
        let mut g = self.blobs();
        let Some(b) = g.get_mut(&base) else {
            return;
        };
        b.live = b.live.saturating_sub(1);
        if b.live == 0 && !b.writing {
            let b = g.remove(&base).expect("just found");
            drop(g);
            self.bury(e, b);
            self.give_back_freed(e);
        }
    }

    /// A fork took a reference on slot `s` (packed) for its child.
    pub(crate) fn ref_added(&self, s: Slot) {
        let base = s - s % UNIT_PAGES as u64;
        if let Some(b) = self.blobs().get_mut(&base) {
            b.live += 1;
        }
    }

    /// Give back what buried blobs held (not under a slot lock).
    pub(crate) fn give_back_freed(&self, e: &Engine) {
        if self.gone_n.load(Relaxed) == 0 {
            return;
        }
        let gone = {
            let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            self.gone_n.store(0, Relaxed);
            std::mem::take(&mut *g)
        };
        for run in gone.runs {
            e.tiers.put_run(e, run);
        }
        e.frames.free(&e.zapper, &gone.frames);
        e.budget.uncharge(Gauge::Cached, gone.charged);
    }

    /// In a forked child, once its regions were seen to (`fork_child_unit`): what the
    /// parent buried is not ours to give back.
    pub(crate) fn reset_after_fork(&self) {
        *self.gone.lock().unwrap_or_else(|p| p.into_inner()) = Gone::default();
        self.gone_n.store(0, Relaxed);
    }
}

/// A packed write: whose blob, and the frames holding its bytes.
#[derive(Debug)]
pub(crate) struct PackedWrite {
    base: Slot,
    first_page: u64,
    blocks: u32,
    /// The frames holding the packed bytes, one run.
    frames: Vec<usize>,
}

/// What `write` did with a unit entry.
pub(crate) enum Write {
    /// Its writes were started; its pages (512) left the pool.
    Started(u64),
    /// No room for its frames now: try again later.
    NoRoom,
    /// Not packed (off, part of the unit gone, no slots or frames): write it back
    /// decompressed.
    NotPacked,
}

/// Write unit entry `h` (pages from `first_page`, slots from `base`, under the unit's
/// lock `u`) back packed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    e: &Engine,
    ctx: &mut ThreadCtx,
    c: &Compressed,
    r: &Arc<RegionInner>,
    u: &UnitPages,
    first_page: u64,
    base: Slot,
    h: Handle,
) -> Write {
    let p = &e.tiers.packed;
    // Every page still swapped to the entry, and no slot shared with a fork's child:
    // `live` starts at one reference per page (references a fork takes later are
    // counted as they are taken, `ref_added`).
    let still = |i: usize| {
        let s = base + i as u64;
        u.get(i) == PageState::Swapped(s)
            && c.handle_of(s) == Some((h, true))
            && e.slots.count(s) == 1
    };
    // Only where units come back whole (`Huge`): under `Auto` a random fault takes a
    // page, and a packed unit would cost it a 2 MiB read and decode.
    if !p.on || r.policy.unit != crate::UnitPolicy::Huge || !(0..UNIT_PAGES).all(still) {
        return Write::NotPacked;
    }
    let Ok(len) = c.pool().packed_len(h) else {
        return Write::NotPacked;
    };
    let blocks = len.div_ceil(PAGE_SIZE);
    if blocks >= UNIT_PAGES {
        return Write::NotPacked; // saves nothing
    }
    // The frames holding the packed bytes until written: out of reclaim's reserve
    // (with what faults left), leaving a store its part, as writeback's decompressed
    // copies do. The entry they replace leaves the pool at once, but the pool shrinks
    // only by the zspages it empties, and the blob's frames stay until the write
    // completes: taken down to the limit, they left the next unit store's growth
    // (charged unconditionally) past the budget.
    if !e
        .budget
        .charge_if_room(Gauge::Cached, blocks as i64, c.store_reserve())
    {
        return Write::NoRoom;
    }
    let undo = |frames: &[usize]| {
        e.frames.free(&e.zapper, frames);
        e.budget.uncharge(Gauge::Cached, blocks as i64);
    };
    // One run of frames: the blob is one span (to export, hash, decode).
    let Some(frames) = frames_in_one_run(e, blocks, crate::frames::Site::Writing) else {
        undo(&[]);
        return Write::NotPacked;
    };
    let span = e.frames.span_mut(frames[0], blocks * PAGE_SIZE);
    if c.pool().export_unit(h, span).ok() != Some(len) {
        undo(&frames);
        return Write::NotPacked;
    }
    span[len..].fill(0);
    let hash = crate::tier::page_hash(span);
    // The blob's hold on the blocks it is written to.
    for k in 0..blocks as u64 {
        e.slots.dup(base + k);
    }
    let pw = Arc::new(PackedWrite {
        base,
        first_page,
        blocks: blocks as u32,
        frames: frames.clone(),
    });
    // The blob first, then the pages that name it, then the entry goes.
    p.blobs().insert(
        base,
        Blob {
            base,
            blocks: blocks as u32,
            hash,
            live: UNIT_PAGES as u32,
            held: true,
            writing: true,
            mem: Some(pw.clone()),
        },
    );
    for i in 0..UNIT_PAGES {
        let s = base + i as u64;
        e.tiers.meta.set(s, Location::Packed, 0);
        c.release(s);
    }
    r.counters.zswpwb.fetch_add(UNIT_PAGES as u64, Relaxed);
    r.counters.zswpwb_packed_units.fetch_add(1, Relaxed);
    // `pages` only name the unit (completions lock it) and size the request.
    let pages: Vec<u64> = (first_page..first_page + blocks as u64).collect();
    let mut op = Op::new(OpKind::Write, r.clone(), pages, frames, base);
    op.packed = Some(pw);
    r.counters.write_requests.fetch_add(1, Relaxed);
    e.tiers.submit(e, ctx, op);
    Write::Started(UNIT_PAGES as u64)
}

/// A packed write finished: the blob is on the back tier (its frames go) or, after
/// its last try failed, stays in them.
pub(crate) fn complete_write(e: &Engine, ctx: &mut ThreadCtx, mut op: Op, res: i32) {
    let p = &e.tiers.packed;
    let pw = op.packed.clone().expect("a packed write");
    let r = op.region.clone();
    let ok = res >= 0 && res as usize == op.bytes();
    if !ok && !r.is_dead() {
        r.counters.io_errors.fetch_add(1, Relaxed);
        if op.attempt + 1 < crate::writeback::WRITE_TRIES {
            // Tried again in place: the blob's blocks are the unit's own cluster.
            op.attempt += 1;
            e.tiers.submit(e, ctx, op);
            return;
        }
    }
    // Under the unit's lock: a fault decoding from the frames holds it.
    let u = r.unit_of(pw.first_page).lock();
    let mut g = p.blobs();
    let Some(b) = g.get_mut(&pw.base) else {
        return; // (a blob goes only once its write is done)
    };
    b.writing = false;
    let mut done = Gone::default();
    if ok {
        r.counters.pswpout.fetch_add(u64::from(pw.blocks), Relaxed);
        if let Some(m) = b.mem.take() {
            done.frames = m.frames.clone();
            done.charged = i64::from(m.blocks);
        }
    } else {
        // The blob stays in its frames; its holds on its blocks go (bad where the
        // device failed: marked below, out of the blobs' lock).
        b.held = false;
        done.runs.push(b.run());
    }
    let gone = if b.live == 0 {
        g.remove(&pw.base)
    } else {
        None
    };
    drop(g);
    if let Some(b) = gone {
        p.bury(e, b);
    }
    let bad = !ok && (res == -libc::EIO || res >= 0);
    for run in done.runs {
        if bad {
            for k in 0..u64::from(run.len) {
                e.slots.mark_bad(run.start + k);
            }
        }
        e.tiers.put_run(e, run);
    }
    e.frames.free(&e.zapper, &done.frames);
    e.budget.uncharge(Gauge::Cached, done.charged);
    p.give_back_freed(e);
    drop(u);
    if ok {
        crate::writeback::accepted(e);
        return;
    }
    if !p.said_write_error.swap(true, Relaxed) {
        let what = if res < 0 {
            std::io::Error::from_raw_os_error(-res).to_string()
        } else {
            format!("short write: {res} bytes")
        };
        say!("uswap: writing a packed unit failed ({what}): it stays compressed in RAM");
    }
    crate::writeback::refused(e, if res < 0 { -res } else { libc::EIO });
}

/// `n` frames in one run (consecutive), or none (any taken given back).
fn frames_in_one_run(e: &Engine, n: usize, site: crate::frames::Site) -> Option<Vec<usize>> {
    let mut runs = Vec::new();
    let got = e.frames.alloc(n, &mut runs, site);
    let frames: Vec<usize> = runs
        .iter()
        .flat_map(|&(a, k)| (0..k).map(move |i| a + i * PAGE_SIZE))
        .collect();
    if got == n && runs.len() == 1 {
        return Some(frames);
    }
    e.frames.free(&e.zapper, &frames);
    None
}

/// Read blob `b` from the back tier into the `b.blocks` pages at `buf` (the caller's
/// frames, one run), checked.
fn read_blob(e: &Engine, b: &Blob, buf: usize) -> bool {
    let len = b.blocks as usize * PAGE_SIZE;
    let (fd, off) = e.tiers.file().locate(b.base);
    // SAFETY: reads `len` bytes into frames this thread owns (`buf` spans `b.blocks`
    // O_DIRECT-aligned pages of one arena run, which take only ordinary kernel faults).
    let n = unsafe { libc::pread(fd, buf as *mut libc::c_void, len, off as i64) };
    b.held && n == len as isize && crate::tier::page_hash(e.frames.span(buf, len)) == b.hash
}

/// The room a fault on `page` needs beyond its unit's pages for reading a packed
/// blob: a unit's worth (the read buffer, at most a 2 MiB frame) when the page is
/// packed now, else none. A hint taken before the fault reserves its room (the unit's
/// lock is not held across reclaim); `fault` takes what it lacks, or retries.
pub(crate) fn read_room(e: &Engine, r: &RegionInner, page: u64) -> i64 {
    // Only `Huge` regions pack: other faults take no lock here.
    if !e.tiers.packed.on() || r.policy.unit != crate::UnitPolicy::Huge {
        return 0;
    }
    let u = r.unit_of(page).lock();
    match u.get(page as usize % UNIT_PAGES) {
        PageState::Swapped(s) if e.tiers.meta.location(s) == Location::Packed => UNIT_PAGES as i64,
        _ => 0,
    }
}

/// A fault on a page of a packed unit (slot `slot`; `write`: by a write access): read
/// the blob, decode it, map the unit's pages still packed. Under the unit's lock.
///
/// A read fault on a blob on the back tier maps the unit clean, the blob kept as its
/// copy (as a page read from a swap file keeps its slot): if no write comes, eviction
/// drops the unit without a write (a stream's verify pass rewrote every unit it read
/// back, compressed again). Each page's checksum is recorded for that eviction, which
/// checks a unit mapped clean by a move (`evict.rs`). A write fault, or a blob still in
/// its frames (its write in flight, or failed), maps dirty: the pages' slots go.
pub(crate) fn fault(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    write: bool,
) {
    let p = &e.tiers.packed;
    let base = slot - slot % UNIT_PAGES as u64;
    let first = page - page % UNIT_PAGES as u64;
    let (Some(b), Some(c)) = (p.blob(base), e.tiers.compressed.as_ref()) else {
        e.diag.internal(&format!(
            "page {page} of region {} is packed at slot {slot}, which has no blob",
            r.id
        ));
        crate::fault::poison_page(e, r, u, page, slot);
        return;
    };
    let blocks = b.blocks as usize;
    let retry = || {
        e.threads.wake_kswapd();
        let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
    };
    let Some(huge) = e.frames.alloc_huge_to_fill(crate::frames::Site::Compressed) else {
        return retry();
    };
    let unit_frames: Vec<usize> = (0..UNIT_PAGES).map(|i| huge + i * PAGE_SIZE).collect();
    // A page evicted clean from a unit mapped clean may still be in the swap cache:
    // its own fault maps it from there.
    let packed_here = |i: usize, s: Slot| {
        s == base + i as u64
            && e.tiers.meta.location(s) == Location::Packed
            && e.cache.get(s).is_none()
    };
    let clean = !write && b.mem.is_none();
    let decoded = match &b.mem {
        // Being written (or kept in RAM): decode from its frames, which stay while
        // this fault holds the unit's lock.
        Some(m) => {
            // Its room, like the decode of a unit stored whole in the pool: all of
            // it, or the fault comes again.
            if !e.budget.take_room_all(UNIT_PAGES as i64) {
                e.frames.free(&e.zapper, &unit_frames);
                return retry();
            }
            e.budget.charge(Gauge::Cached, UNIT_PAGES as i64);
            let ok = c
                .pool()
                .decode_packed_unit(
                    e.frames.span(m.frames[0], blocks * PAGE_SIZE),
                    e.frames.span_mut(huge, UNIT_SIZE),
                )
                .is_ok();
            if ok {
                r.counters.minflt.fetch_add(1, Relaxed);
            } else {
                e.budget.uncharge(Gauge::Cached, UNIT_PAGES as i64);
            }
            ok
        }
        None => {
            // The read lands in one run of frames (decoding wants one span): a warm
            // 2 MiB frame (no page to fault in and zero, none to zap after), else small
            // frames, else an empty 2 MiB frame.
            let site = crate::frames::Site::SwapIn;
            let huge_buf = |h: usize| (0..UNIT_PAGES).map(|i| h + i * PAGE_SIZE).collect();
            let buf = match e.frames.take_warm_huge(site) {
                Some(h) => huge_buf(h),
                None => match frames_in_one_run(e, blocks, site) {
                    Some(buf) => buf,
                    None => match e.frames.alloc_huge(site) {
                        Some(h) => huge_buf(h),
                        None => {
                            e.frames.free(&e.zapper, &unit_frames);
                            return retry();
                        }
                    },
                },
            };
            // The decoded unit and the buffer, inside the fault's room (`read_room`
            // reserved it; a unit packed since then takes free room or comes again).
            let charged = (UNIT_PAGES + buf.len()) as i64;
            if !e.budget.take_room_all(charged) {
                e.frames.free(&e.zapper, &buf);
                e.frames.free(&e.zapper, &unit_frames);
                return retry();
            }
            e.budget.charge(Gauge::Cached, charged);
            let mut good = false;
            for attempt in 0..READ_TRIES {
                let seq = e.diag.read_seq.fetch_add(1, Relaxed) + 1;
                let inj = e.cfg.inject;
                let injected = inj.fail_read_every > 0
                    && seq.is_multiple_of(inj.fail_read_every)
                    && (attempt == 0 || !inj.transient);
                if !injected && read_blob(e, &b, buf[0]) {
                    good = true;
                    break;
                }
                r.counters.io_errors.fetch_add(1, Relaxed);
            }
            let ok = good
                && c.pool()
                    .decode_packed_unit(
                        e.frames.span(buf[0], blocks * PAGE_SIZE),
                        e.frames.span_mut(huge, UNIT_SIZE),
                    )
                    .is_ok();
            e.frames.free(&e.zapper, &buf);
            // The decoded unit stays charged into its mapping (`map_decoded_unit`).
            let kept = if ok { UNIT_PAGES as i64 } else { 0 };
            e.budget.uncharge(Gauge::Cached, charged - kept);
            if ok {
                r.counters.majflt.fetch_add(1, Relaxed);
                r.counters.pswpin.fetch_add(blocks as u64, Relaxed);
            }
            ok
        }
    };
    if !decoded {
        e.frames.free(&e.zapper, &unit_frames);
        r.counters.swap_csum_fail.fetch_add(1, Relaxed);
        e.diag.say_packed_lost(slot);
        for i in 0..UNIT_PAGES {
            if let PageState::Swapped(s) = u.get(i) {
                if packed_here(i, s) {
                    crate::fault::poison_page(e, r, u, first + i as u64, s);
                }
            }
        }
        return;
    }
    if clean {
        for i in 0..UNIT_PAGES {
            if let PageState::Swapped(s) = u.get(i) {
                if packed_here(i, s) {
                    let hash = crate::tier::page_hash(e.frames.page(huge + i * PAGE_SIZE));
                    e.tiers.meta.set(s, Location::Packed, hash);
                }
            }
        }
    }
    // Mapped dirty, a page lets its slot go (`fault::stale_slot_of`); a page whose copy
    // failed to map stays packed, for its retrying fault.
    crate::tier::compressed::map_decoded_unit(e, r, u, first, huge, !clean, packed_here);
}

/// In a forked child, before its frames are let go: the pages of unit `u` (from page
/// `first`) packed in a blob whose writes were in flight come back into the region
/// from its frames (the parent's writes may not finish), dirty; pages that cannot are
/// poisoned. Returns the pages made resident.
pub(crate) fn fork_child_unit(e: &Engine, r: &RegionInner, u: &mut UnitPages, first: u64) -> i64 {
    let p = &e.tiers.packed;
    let Some(base) = (0..UNIT_PAGES).find_map(|i| match u.get(i) {
        PageState::Swapped(s) if e.tiers.meta.location(s) == Location::Packed => {
            Some(s - s % UNIT_PAGES as u64)
        }
        _ => None,
    }) else {
        return 0;
    };
    let Some(m) = p.blob(base).and_then(|b| b.mem) else {
        return 0;
    };
    let Some(c) = e.tiers.compressed.as_ref() else {
        return 0;
    };
    p.blobs().remove(&base);
    let mut unit = vec![0u8; UNIT_SIZE];
    let ok = c
        .pool()
        .decode_packed_unit(
            e.frames.span(m.frames[0], m.blocks as usize * PAGE_SIZE),
            &mut unit,
        )
        .is_ok();
    let mut back = 0;
    for i in 0..UNIT_PAGES {
        let s = base + i as u64;
        if u.get(i) != PageState::Swapped(s) || e.tiers.meta.location(s) != Location::Packed {
            continue;
        }
        e.tiers.release(e, s);
        let src = ok.then(|| unit[i * PAGE_SIZE..].as_ptr());
        back += i64::from(crate::fork::take_back_page(r, u, first + i as u64, src));
    }
    back
}
