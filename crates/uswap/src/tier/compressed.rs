//! The compressed tier (zswap's place): evicted pages are compressed into a pool in
//! RAM (`uswap-zpool`: lz4 or zstd, zsmalloc-like size classes, same-filled pages kept
//! as their word) in front of the back tier.
//!
//! - Store: an evicted page (or a whole 2 MiB unit, compressed as one entry) goes to
//!   the pool if it compresses under the accept threshold and the pool is under its
//!   share of the budget; otherwise to the back tier. With no back tier (`--tier
//!   compressed`) a page that compresses poorly stays resident, marked so that
//!   reclaim passes over it (`UnitPages::keep`). Its slot (every swapped page has
//!   one) keys the entry; the slot's record says `Compressed`.
//! - Load: a fault decompresses straight into a frame and maps it; the entry goes
//!   (an exclusive load, as zswap does since 6.x: keeping both copies would spend the
//!   budget twice), so the page comes back dirty. A unit stored whole comes back whole.
//! - Writeback: past its share (with hysteresis) the oldest entries go to the back
//!   tier (`zswpwb`); the reclaim thread does it. A unit stored whole is written as it
//!   is stored, compressed, to slots of its own (`packed.rs`); pages, and units where
//!   that cannot be done, are decompressed and written at their own slots, in runs.
//! - The pool's memory, metadata included, is the budget's `Pool` gauge: honestly
//!   charged (zram's is not charged to the program's memory cgroup).

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::threads::ThreadCtx;
use crate::tier::{Location, SlotWords};
use crate::{PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use uswap_zpool::{Handle, Reject, Zpool};

pub use uswap_zpool::Compressor;

/// A slot's word: the handle + 1 (0: none), and whether it is a unit's.
const UNIT_BIT: u64 = 1 << 63;

/// An entry in writeback order: whose page, which slot (a unit's first slot).
#[derive(Clone, Copy)]
struct Stored {
    region: u32,
    page: u64,
    slot: Slot,
    unit: bool,
    /// A page stored as it is, uncompressed (`stores_incompressible`).
    raw: bool,
}

/// Entries in writeback order: pages stored as they are first, then the rest, the
/// oldest first in each. A raw page frees a page of the pool for one write, two or
/// three times what a compressed one frees: at the pool's share, raw pages leave and
/// compressed ones stay (pmbench 80/20 4k at 513 MiB, share 50%: 0.92x the accesses of
/// passing raw pages on; the oldest first alone, 0.82x, raw pages holding ~40 of the
/// pool's 220 MiB and pushing compressed ones to the file; docs/design.md).
#[derive(Default)]
struct Order {
    raw: VecDeque<Stored>,
    rest: VecDeque<Stored>,
}

impl Order {
    fn queue(&mut self, raw: bool) -> &mut VecDeque<Stored> {
        if raw {
            &mut self.raw
        } else {
            &mut self.rest
        }
    }

    fn pop_front(&mut self) -> Option<Stored> {
        self.raw.pop_front().or_else(|| self.rest.pop_front())
    }

    /// Back in front of its queue (its writeback must wait).
    fn push_front(&mut self, st: Stored) {
        self.queue(st.raw).push_front(st);
    }
}

/// The compressed tier.
pub(crate) struct Compressed {
    pool: Zpool,
    handles: SlotWords,
    /// Pages of each unit entry still swapped to it, by the entry's first slot (units
    /// take whole clusters; handles of same-filled units are equal, so they cannot
    /// key this); the entry goes with the last.
    unit_live: Mutex<HashMap<Slot, u16>>,
    /// Entries, oldest first (may be stale: checked when popped).
    order: Mutex<Order>,
    /// The pool's share of the budget, in bytes (its limit); it follows the budget's
    /// limit down where a memory cgroup leaves less (`follow_limit`).
    share: AtomicU64,
    /// The share of the whole budget, as started.
    share_max: u64,
    /// Bytes the budget's reclaim takes usage down to (its low watermark, from
    /// `charge_pool`): the share in use is at most this (`share_now`).
    low_cap: AtomicU64,
    /// Whether entries may be written back to the back tier.
    writeback: bool,
    /// Pages that compress poorly are stored as they are (`stores_incompressible`).
    store_incompressible: bool,
    /// Stores in a row of pages or units that compress poorly (refused, or stored as
    /// they are); past `POOR_RUN`, only one store in `POOR_RUN` is tried, the others
    /// pass on untried (data that does not compress costs a compression each time, ~1
    /// ms per unit, for nothing; and copied into the pool as it is, a stream of it
    /// would only wait there to be written out).
    poor_run: std::sync::atomic::AtomicU32,
    /// Serializes updates of the budget's `Pool` gauge and of `floor`.
    charging: Mutex<()>,
    /// While a store runs: pages the `Pool` gauge stays at or above, taken as room
    /// before the pool grows into them (`grow_room`), so that no growth is a charge
    /// nobody reserved. 0 otherwise.
    floor: std::sync::atomic::AtomicI64,
    /// Units are stored whole (the pool keeps the one scratch buffer a unit store
    /// needs, ~2 MiB, charged from the start; only with a share of 8 MiB or more).
    whole_units: bool,
    /// One store at a time grows the pool: `floor` covers the one store that grows
    /// it. A unit is compressed before, outside this lock (`lanes`).
    storing: Mutex<()>,
    /// Units compressed at once, one per lane, each into a scratch buffer of the pool
    /// reserved (and charged) from the start: a buffer made in the middle of an
    /// eviction would grow the pool by 2 MiB that nobody reserved. Two lanes where
    /// there are two CPUs and the share is 32 MiB or more: the reclaim thread and a
    /// fault's direct reclaim then compress side by side (swap-w-seq 2m: one at a
    /// time, each waited for the other's ~2 ms per unit; docs/design.md, "Tiers").
    lanes: Vec<Mutex<()>>,
    /// A store was refused for want of room (zswap's `zswap_pool_reached_full`):
    /// writeback runs until the largest entry fits again, even below the share's
    /// high mark (a unit is ~1/8 of a 12 MiB share: the pool stuck between "too full
    /// for a unit" and "full enough to write back" refused every unit).
    limit_hit: std::sync::atomic::AtomicBool,
}

/// What became of a unit offered to the compressed tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitStore {
    /// Stored whole: its pages are swapped, its frames free.
    Stored,
    /// Refused (compresses poorly, or the pool is full): write it to the file whole.
    Refused,
    /// Not offered (no compressed tier, or it stores pages, not units).
    NotTried,
}

/// See `Compressed::poor_run`.
const POOR_RUN: u32 = 32;

/// Pages one store may grow the pool by beyond its object: a new zspage (at most 8
/// pages; 16 for a page stored as it is, ~4.1 KiB with its header) and a step of the
/// tables that index it (~2 pages).
const STORE_GROWTH: i64 = 18;

/// Pages stored between frees of their frames (one zap each time).
const STORE_CHUNK: usize = 16;

/// Pages writeback may hold decompressed at the limit when entries are pages (each is
/// written and let go on its own).
const WRITEBACK_PAGES: i64 = 64;

/// Room a chunk of page stores grows the pool by before its frames are freed: its
/// objects (16 pages stored as they are take 17 pages of slots) and one growth step.
const CHUNK_GROWTH: i64 = STORE_CHUNK as i64 + 1 + STORE_GROWTH;

impl Compressed {
    pub(crate) fn new(
        compressor: Compressor,
        share_bytes: u64,
        max_slots: u64,
        writeback: bool,
        store_incompressible: bool,
    ) -> crate::Result<Compressed> {
        let pool = Zpool::new(uswap_zpool::Config {
            compressor,
            limit_bytes: share_bytes,
            ..Default::default()
        })
        .map_err(|e| crate::Error::InvalidSize {
            input: compressor.to_string(),
            reason: e.0,
        })?;
        let whole_units = share_bytes >= 8 << 20 && pool.reserve_unit_scratch();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let lanes = if whole_units && cpus > 1 && share_bytes >= 32 << 20 {
            pool.reserve_unit_scratches(2)
        } else {
            1
        };
        Ok(Compressed {
            pool,
            handles: SlotWords::new(max_slots),
            unit_live: Mutex::new(HashMap::new()),
            order: Mutex::new(Order::default()),
            share: AtomicU64::new(share_bytes),
            share_max: share_bytes,
            low_cap: AtomicU64::new(u64::MAX),
            writeback,
            store_incompressible,
            poor_run: std::sync::atomic::AtomicU32::new(0),
            charging: Mutex::new(()),
            floor: std::sync::atomic::AtomicI64::new(0),
            whole_units,
            storing: Mutex::new(()),
            lanes: (0..lanes.max(1)).map(|_| Mutex::new(())).collect(),
            limit_hit: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The pages of the budget that faults leave to reclaim: what one store may grow
    /// the pool by before it frees the frames it stored (one store at a time; a unit
    /// is the most: 80% of 2 MiB with the default threshold), and room for writeback's
    /// decompressed copies (`write_back`).
    pub(crate) fn reclaim_reserve(&self) -> i64 {
        self.store_reserve()
            + if self.writeback {
                self.writeback_reserve()
            } else {
                0
            }
    }

    /// The part of `reclaim_reserve` a store needs: writeback's copies leave it free.
    pub(crate) fn store_reserve(&self) -> i64 {
        if self.whole_units {
            self.unit_growth()
        } else {
            CHUNK_GROWTH
        }
    }

    /// Writeback's copies in flight at the limit: one unit, or `WRITEBACK_PAGES`.
    fn writeback_reserve(&self) -> i64 {
        if self.whole_units {
            UNIT_PAGES as i64
        } else {
            WRITEBACK_PAGES
        }
    }

    /// A lane to compress a unit in (see `lanes`): a free one, else the first once free.
    fn lane(&self) -> std::sync::MutexGuard<'_, ()> {
        for l in &self.lanes {
            match l.try_lock() {
                Ok(g) => return g,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        self.lanes[0].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unit_growth(&self) -> i64 {
        (self.pool.max_stored(UNIT_SIZE).div_ceil(PAGE_SIZE) as i64 + STORE_GROWTH)
            .max(CHUNK_GROWTH)
    }

    /// Whether a page that compresses poorly stays resident, kept out of reclaim's
    /// way (`UnitPages::keep`): with no tier behind the pool. Else it could only go
    /// back into the region, and reclaim would pick it again and again
    /// (`pmbench --tier compressed`, mixed data: a third of all evictions were such
    /// round trips).
    fn keeps_incompressible(&self) -> bool {
        !self.writeback
    }

    /// Whether a page that compresses poorly is stored as it is, uncompressed
    /// (`PoolBuilder::store_incompressible`, with a tier behind the pool: with none it
    /// stays resident instead, `keeps_incompressible`), as zswap does since Linux 6.18:
    /// a fault on it is then a copy from RAM, not a read. Only while the pool is under
    /// the mark writeback takes it down to (`low_mark`): a page stored raw takes what
    /// would hold two or three compressed ones, and at the share it would push them out
    /// to the back tier, each to be read back (pmbench 80/20 4k at 513 MiB, its share
    /// 50%: 0.89x the accesses with raw pages pushing, docs/benchmarks.md). In the pool
    /// it is the first to leave at writeback (`Order`).
    fn stores_incompressible(&self) -> bool {
        self.writeback && self.store_incompressible && self.bytes() < self.low_mark()
    }

    /// Whether evicted pages go into the pool now: it is not refusing stores for want of
    /// room (`limit_hit`) or for compressing poorly (`poor_run`). Reclaim evicts ahead
    /// of need only when not (`evict::may_evict_ahead`).
    pub(crate) fn takes_stores(&self) -> bool {
        !self.limit_hit.load(Relaxed) && self.poor_run.load(Relaxed) < POOR_RUN
    }

    /// Whether to try a store now (see `poor_run`). Always where refused pages are
    /// kept: a page refused untried would be kept for nothing.
    fn worth_trying(&self) -> bool {
        if self.keeps_incompressible() {
            return true;
        }
        let n = self.poor_run.load(Relaxed);
        n < POOR_RUN || n.is_multiple_of(POOR_RUN) || {
            self.poor_run.fetch_add(1, Relaxed);
            false
        }
    }

    /// How many evicted pages this pool can surely take now: the room left in its
    /// share, a page each (a stored page takes less, one stored as it is ~6% more: the
    /// last of those may be refused, and stays); none while stores are skipped
    /// for compressing poorly (one try in `POOR_RUN`).
    /// While the back tier takes no writes (none, or refusing), reclaim moves out only
    /// what this (or a clean copy) can take: pages moved out only to be put back cost
    /// two moves each and free nothing (a livelock at every fault once the pool is
    /// full: `pmbench --tier compressed` moved 1.2 M pages for 117 k stored).
    pub(crate) fn room_pages(&self) -> usize {
        // Less what one store may grow the pool by beyond its object (a new zspage):
        // else the last pages "with room" are refused as the pool grows, and go back.
        let used = self.bytes() + (STORE_GROWTH as u64) * PAGE_SIZE as u64;
        let room = self.share_now().saturating_sub(used) as usize / PAGE_SIZE;
        // (Asked only with room: each skipped try counts towards the next real one.)
        if room == 0 || !self.worth_trying() {
            return 0;
        }
        room
    }

    /// The budget's limit is now `limit` bytes of `budget` (its memory cgroup leaves
    /// less room, or more again): the share shrinks or grows in proportion, so that
    /// the pool writes back before it fills the whole limit.
    pub(crate) fn follow_limit(&self, limit: u64, budget: u64) {
        let share = if limit >= budget {
            self.share_max
        } else {
            (self.share_max as u128 * limit as u128 / budget.max(1) as u128) as u64
        };
        self.share.store(share, Relaxed);
    }

    /// The share in use, bytes: the setting (`follow_limit`), and at most the budget's
    /// low watermark. Above it the pool would only write back once reclaim had evicted
    /// every resident page into it: on a small budget (32 MiB, its page map and
    /// reclaim's reserve taken out) a 90% share sits above the watermarks, resident
    /// pages went to nearly none, and entries were written back only on reclaim's
    /// critical path (found by review).
    fn share_now(&self) -> u64 {
        self.share.load(Relaxed).min(self.low_cap.load(Relaxed))
    }

    /// The budget's low watermark is now `pages` (see `low_cap`).
    fn follow_low(&self, pages: i64) {
        self.low_cap
            .store(pages.max(0) as u64 * PAGE_SIZE as u64, Relaxed);
    }

    /// Whether the pool wants writeback: past 15/16 of its share, or a store was
    /// refused for room (`limit_hit`).
    fn over_share(&self) -> bool {
        let share = self.share_now();
        self.limit_hit.load(Relaxed) || self.bytes() >= share - share / 16
    }

    /// Where writeback takes the pool down to: 7/8 of its share, and to where the
    /// largest entry fits.
    fn low_mark(&self) -> u64 {
        let share = self.share_now();
        let largest = if self.whole_units {
            self.unit_growth() as u64 * PAGE_SIZE as u64
        } else {
            PAGE_SIZE as u64
        };
        (share - share / 8).min(share.saturating_sub(largest))
    }

    /// A store's outcome, for `poor_run`.
    fn note(&self, poor: bool) {
        if poor {
            self.poor_run.fetch_add(1, Relaxed);
        } else {
            self.poor_run.store(0, Relaxed);
        }
    }

    /// Entries in writeback order: push one, and drop the stale ones at the front of its queue.
    fn push_order(&self, st: Stored) {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let q = order.queue(st.raw);
        q.push_back(st);
        while let Some(f) = q.front() {
            if self.handle_of(f.slot).is_some() {
                break;
            }
            q.pop_front();
        }
    }

    /// Bytes the pool holds, metadata included.
    pub(crate) fn bytes(&self) -> u64 {
        self.pool.total_bytes()
    }

    /// The pool's statistics.
    pub(crate) fn stats(&self) -> uswap_zpool::ZpoolStats {
        self.pool.stats()
    }

    pub(crate) fn handle_of(&self, slot: Slot) -> Option<(Handle, bool)> {
        let w = self.handles.word(slot, false)?.load(Relaxed);
        if w == 0 {
            return None;
        }
        Handle::from_raw((w & !UNIT_BIT) - 1).map(|h| (h, w & UNIT_BIT != 0))
    }

    fn set_handle(&self, slot: Slot, h: Handle, unit: bool) {
        if let Some(w) = self.handles.word(slot, true) {
            w.store((h.to_raw() + 1) | if unit { UNIT_BIT } else { 0 }, Relaxed);
        }
    }

    /// Slot `s` no longer holds anything here: its entry (or its share of a unit's)
    /// goes. Returns whether it had one.
    pub(crate) fn release(&self, slot: Slot) -> bool {
        let Some(w) = self.handles.word(slot, false) else {
            return false;
        };
        let w = w.swap(0, Relaxed);
        if w == 0 {
            return false;
        }
        let raw = (w & !UNIT_BIT) - 1;
        let Some(h) = Handle::from_raw(raw) else {
            return false;
        };
        if w & UNIT_BIT != 0 {
            let base = slot - slot % UNIT_PAGES as u64;
            let mut g = self.unit_live.lock().unwrap_or_else(|p| p.into_inner());
            let left = g.get_mut(&base).map(|n| {
                *n -= 1;
                *n
            });
            if left == Some(0) {
                g.remove(&base);
                drop(g);
                let _ = self.pool.free(h);
            }
        } else {
            let _ = self.pool.free(h);
        }
        true
    }

    /// The compressed pool (packed writes export from it and decode with it).
    pub(crate) fn pool(&self) -> &Zpool {
        &self.pool
    }
}

/// The budget's view of the pool: its bytes, in pages (at least the floor a store in
/// progress took).
pub(crate) fn charge_pool(e: &Engine, c: &Compressed) {
    // Read and set as one step: two threads doing it at once would leave the older,
    // larger reading.
    let _g = c.charging.lock().unwrap_or_else(|p| p.into_inner());
    e.budget
        .set(Gauge::Pool, pool_pages(c).max(c.floor.load(Relaxed)));
    c.follow_low(e.budget.low_pages());
}

fn pool_pages(c: &Compressed) -> i64 {
    c.bytes().div_ceil(PAGE_SIZE as u64) as i64
}

/// Before a store (under `storing`): room for the pool to grow by `pages`, held in
/// the floor, taken out of the reserve faults leave to reclaim (`reclaim_reserve`:
/// the store frees its frames right after).
fn grow_room(e: &Engine, c: &Compressed, pages: i64) {
    let _g = c.charging.lock().unwrap_or_else(|p| p.into_inner());
    let want = pool_pages(c) + pages;
    let now = e.budget.pages_in(Gauge::Pool);
    if want > now {
        e.budget.charge_reclaim(Gauge::Pool, want - now);
    }
    c.floor.store(want.max(now), Relaxed);
}

/// A store is done: the floor goes, the gauge is the pool's size again.
fn end_store(e: &Engine, c: &Compressed) {
    c.floor.store(0, Relaxed);
    charge_pool(e, c);
}

/// Try to store a whole unit, its pages in the contiguous frames at `frames[0]`, under
/// one cluster of slots. True: stored (the pages are swapped, the frames free).
pub(crate) fn store_unit(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &RegionInner,
    u: &mut UnitPages,
    first: u64,
    frames: &[usize],
) -> UnitStore {
    let Some(c) = e.tiers.compressed.as_ref() else {
        return UnitStore::NotTried;
    };
    if !c.whole_units
        || frames.len() != UNIT_PAGES
        || frames[UNIT_PAGES - 1] != frames[0] + UNIT_SIZE - PAGE_SIZE
    {
        return UnitStore::NotTried;
    }
    if !c.worth_trying() {
        r.counters
            .zswap_reject_compress
            .fetch_add(UNIT_PAGES as u64, Relaxed);
        return UnitStore::Refused;
    }
    if e.tiers.packed.on() && r.policy.unit == crate::UnitPolicy::Huge && wants_writeback(e) {
        // Packing the oldest entries costs a copy each: room now, rather than this
        // unit refused and written whole (a stream's pass stores units faster than
        // the rounds of the reclaim loop write back).
        balance_with(e, ctx, 0, true);
    }
    let bytes: &[u8; UNIT_SIZE] = e
        .frames
        .span(frames[0], UNIT_SIZE)
        .try_into()
        .expect("a unit's span");
    // Compressed in a lane, beside another thread's unit; nothing grows the pool yet.
    let lane = c.lane();
    let prepared = match c.pool.prepare_unit(bytes) {
        Ok(p) => p,
        Err(why) => {
            c.note(why == Reject::PoorCompression);
            rejected(e, c, r, why, UNIT_PAGES as u64);
            return UnitStore::Refused;
        }
    };
    let _one = c.storing.lock().unwrap_or_else(|p| p.into_inner());
    // The unit's frames are freed only once it is stored: room for what it may take.
    grow_room(e, c, c.unit_growth());
    let stored = prepared.commit();
    drop(lane);
    let h = match stored {
        Ok(h) => h,
        Err(why) => {
            end_store(e, c);
            c.note(why == Reject::PoorCompression);
            rejected(e, c, r, why, UNIT_PAGES as u64);
            return UnitStore::Refused;
        }
    };
    c.note(false);
    let Some(base) = crate::writeback::alloc_cluster(e, ctx) else {
        let _ = c.pool.free(h);
        end_store(e, c);
        return UnitStore::NotTried;
    };
    c.unit_live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(base, UNIT_PAGES as u16);
    for i in 0..UNIT_PAGES {
        let s = base + i as u64;
        if let PageState::Resident {
            slot: Some(old), ..
        } = u.get(i)
        {
            e.tiers.release(e, old);
        }
        c.set_handle(s, h, true);
        e.tiers.meta.set(s, Location::Compressed, 0);
        u.set(i, PageState::Swapped(s));
    }
    c.push_order(Stored {
        region: r.id,
        page: first,
        slot: base,
        unit: true,
        raw: false,
    });
    e.frames.free(&e.zapper, frames);
    e.budget.uncharge(Gauge::Cached, UNIT_PAGES as i64);
    end_store(e, c);
    r.counters.zswpout.fetch_add(UNIT_PAGES as u64, Relaxed);
    UnitStore::Stored
}

/// Try to store evicted pages (page map still `Resident`) one by one. Returns the
/// pages (with their frames) the pool refused, for the back tier.
///
/// In chunks of `STORE_CHUNK`: each page's store first charges what the pool may grow
/// by (`grow_room`, out of reclaim's reserve), and each chunk's frames are freed
/// before the next, so that the stores stay within the reserve.
pub(crate) fn store_pages(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &RegionInner,
    u: &mut UnitPages,
    pages: &[u64],
    frames: &[usize],
) -> (Vec<u64>, Vec<usize>) {
    let Some(c) = e.tiers.compressed.as_ref() else {
        return (pages.to_vec(), frames.to_vec());
    };
    let _one = c.storing.lock().unwrap_or_else(|p| p.into_inner());
    let (mut rest_p, mut rest_f) = (Vec::new(), Vec::new());
    let mut full = false;
    let mut n_stored = 0;
    for (chunk_p, chunk_f) in pages.chunks(STORE_CHUNK).zip(frames.chunks(STORE_CHUNK)) {
        let mut stored: Vec<(u64, usize, Handle, bool)> = Vec::new();
        for (&p, &f) in chunk_p.iter().zip(chunk_f) {
            if full {
                rest_p.push(p);
                rest_f.push(f);
                continue;
            }
            if !c.worth_trying() {
                r.counters.zswap_reject_compress.fetch_add(1, Relaxed);
                rest_p.push(p);
                rest_f.push(f);
                continue;
            }
            grow_room(e, c, 1 + STORE_GROWTH);
            let page: &[u8; PAGE_SIZE] = e.frames.page(f).try_into().expect("a page");
            let mut poor = false;
            let outcome = match c.pool.store_page(page) {
                Err(Reject::PoorCompression) if c.stores_incompressible() => {
                    poor = true;
                    c.pool.store_page_raw(page)
                }
                o => o,
            };
            match outcome {
                Ok(h) => {
                    if poor {
                        r.counters.zswap_reject_compress.fetch_add(1, Relaxed);
                    }
                    c.note(poor);
                    stored.push((p, f, h, poor))
                }
                Err(why) => {
                    // (Stored as it was, a page compressing poorly found the pool full.)
                    c.note(poor || why == Reject::PoorCompression);
                    full = why == Reject::PoolFull;
                    if why == Reject::PoorCompression && c.keeps_incompressible() {
                        u.keep(p as usize % UNIT_PAGES);
                    }
                    rejected(e, c, r, why, 1);
                    rest_p.push(p);
                    rest_f.push(f);
                }
            }
        }
        // Slots for the stored ones (any slots: they are written only on writeback).
        let mut runs = Vec::new();
        let got = crate::writeback::alloc_slots(e, ctx, stored.len(), &mut runs);
        let slots: Vec<Slot> = runs.iter().flat_map(|run| run.slots()).collect();
        let mut freed = Vec::with_capacity(stored.len());
        for (k, &(p, f, h, raw)) in stored.iter().enumerate() {
            if k >= got {
                // No slot: the page goes the other way (its bytes are still in the frame).
                let _ = c.pool.free(h);
                rest_p.push(p);
                rest_f.push(f);
                continue;
            }
            let s = slots[k];
            c.set_handle(s, h, false);
            e.tiers.meta.set(s, Location::Compressed, 0);
            u.set(p as usize % UNIT_PAGES, PageState::Swapped(s));
            c.push_order(Stored {
                region: r.id,
                page: p,
                slot: s,
                unit: false,
                raw,
            });
            freed.push(f);
        }
        n_stored += freed.len();
        e.frames.free(&e.zapper, &freed);
        e.budget.uncharge(Gauge::Cached, freed.len() as i64);
        charge_pool(e, c);
    }
    end_store(e, c);
    r.counters.zswpout.fetch_add(n_stored as u64, Relaxed);
    (rest_p, rest_f)
}

fn rejected(e: &Engine, c: &Compressed, r: &RegionInner, why: Reject, pages: u64) {
    match why {
        Reject::PoorCompression => r.counters.zswap_reject_compress.fetch_add(pages, Relaxed),
        Reject::PoolFull => {
            // Make room for newer pages: the reclaim thread writes the oldest back.
            c.limit_hit.store(true, Relaxed);
            e.threads.wake_kswapd();
            r.counters.zswap_reject_full.fetch_add(pages, Relaxed)
        }
    };
}

/// A fault on a page whose bytes are in the pool: decompress and map it (and with it
/// the rest of a unit stored whole, or on a stream the pages after it: fault-around),
/// dirty: the entry goes. `write`: the access (fault-around maps copies from the swap
/// cache as it). Under the unit's lock.
pub(crate) fn fault(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    write: bool,
) {
    let Some(c) = e.tiers.compressed.as_ref() else {
        e.diag.internal(&format!(
            "slot {slot} is in a compressed tier this pool lacks"
        ));
        crate::fault::poison_page(e, r, u, page, slot);
        return;
    };
    match c.handle_of(slot) {
        Some((h, true)) => load_unit(e, c, r, u, page, h),
        Some((h, false)) => {
            if load_one(e, c, r, u, page, slot, |out| c.pool.load(h, out)) {
                crate::fault::swapin::fault_around(e, r, u, page, write);
            }
        }
        None => {
            e.diag.internal(&format!(
                "page {page} is compressed at slot {slot}, which has no entry"
            ));
            crate::fault::poison_page(e, r, u, page, slot);
        }
    }
}

/// Pages `first..end` of `r` (one unit's), as far as they are in the pool each as an
/// entry of its own: decompressed and mapped dirty now, up to the first that is not,
/// as many as the fault's room allows (`swapin::fault_around`, on a stream). Returns
/// how many were decompressed (from `first` on) and how many of those were mapped (a
/// page whose copy failed to map stays swapped, for its own fault). Each would
/// otherwise take a fault of its own, a userfaultfd round trip. Under the unit's lock.
pub(crate) fn load_run(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    first: u64,
    end: u64,
) -> (u64, u64) {
    let Some(c) = e.tiers.compressed.as_ref() else {
        return (0, 0);
    };
    // The run first, then room for it: room taken for pages that are not there would
    // hold other faults and reclaim's goal off until this fault ends.
    let mut run = Vec::new();
    for q in first..end {
        let PageState::Swapped(s) = u.get(q as usize % UNIT_PAGES) else {
            break;
        };
        // (A unit's entry comes back whole on its own fault; a copy in the swap cache
        // is on its way to the back tier.)
        let Some((h, false)) = c.handle_of(s) else {
            break;
        };
        if e.cache.get(s).is_some() {
            break;
        }
        run.push((q, s, h));
    }
    let room = e.budget.take_room(run.len() as i64).max(0) as usize;
    let mut loaded = Vec::with_capacity(room);
    for &(q, s, h) in run.iter().take(room) {
        // A page that does not decode: its own fault finds it damaged and says so.
        let Ok(f) = decode_to_frame(e, |out| c.pool.load(h, out)) else {
            break;
        };
        loaded.push((q, s, f));
    }
    if loaded.is_empty() {
        return (0, 0);
    }
    let mapped = map_loaded(e, c, r, u, &loaded);
    r.counters.zswpin.fetch_add(mapped, Relaxed);
    charge_pool(e, c);
    (loaded.len() as u64, mapped)
}

/// Map pages just decompressed into their frames (charged), dirty, as copies from the
/// cache (the mapping drops each slot's cache reference and applies the stale-slot
/// policy to it); then `drop_mapped`. Returns how many were mapped: a page whose copy failed
/// to map stays swapped, and is loaded (and counted) again by its retrying fault.
fn map_loaded(
    e: &Engine,
    c: &Compressed,
    r: &RegionInner,
    u: &mut UnitPages,
    loaded: &[(u64, Slot, usize)],
) -> u64 {
    map_copies_dirty(e, r, u, loaded);
    drop_mapped(e, c, u, loaded.iter().map(|&(p, s, _)| (p, s)));
    loaded
        .iter()
        .filter(|&&(p, s, _)| u.get(p as usize % UNIT_PAGES) != PageState::Swapped(s))
        .count() as u64
}

/// The compressed entries of pages just mapped go (zswap's exclusive load: the page is
/// dirty now). Only once mapped: a page whose copy failed to map (UFFDIO_COPY's ENOMEM
/// under a memory limit) stays swapped to its entry, which its retrying fault
/// decompresses again; released first, the page's bytes were nowhere. With
/// `FreeOnWrite` the mapping released the slot, and the entry with it; a slot kept
/// (`KeepUntilReclaim`) loses its entry here.
fn drop_mapped(
    e: &Engine,
    c: &Compressed,
    u: &UnitPages,
    pages: impl Iterator<Item = (u64, Slot)>,
) {
    for (p, s) in pages {
        if let PageState::Resident { slot: Some(k), .. } = u.get(p as usize % UNIT_PAGES) {
            if k == s && c.release(s) {
                e.tiers.meta.set(s, Location::None, 0);
            }
        }
    }
}

/// A fault on the 4 KiB path on a page whose bytes are in the pool: as `fault`, but a
/// unit stored whole is split (`split_unit`), not mapped whole. Under the unit's lock.
pub(crate) fn fault_page(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    write: bool,
) {
    match e.tiers.compressed.as_ref().map(|c| (c, c.handle_of(slot))) {
        Some((c, Some((h, true)))) => split_unit(e, ctx, c, r, u, page, slot, h, write),
        _ => fault(e, r, u, page, slot, write),
    }
}

/// A unit stored whole, decoded into a 2 MiB frame whose 512 pages are charged as
/// cached (the caller took a unit's room first: `Budget::take_room_all`). None when no
/// frame is free (the fault is woken to retry) or the entry is damaged (every page
/// still swapped to it is poisoned).
fn decode_unit(
    e: &Engine,
    c: &Compressed,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    h: Handle,
) -> Option<usize> {
    let first = page - page % UNIT_PAGES as u64;
    let Some(huge) = e.frames.alloc_huge_to_fill(crate::frames::Site::Compressed) else {
        e.threads.wake_kswapd();
        let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
        return None;
    };
    e.budget.charge(Gauge::Cached, UNIT_PAGES as i64);
    if c.pool.load(h, e.frames.span_mut(huge, UNIT_SIZE)).is_err() {
        let frames: Vec<usize> = (0..UNIT_PAGES).map(|i| huge + i * PAGE_SIZE).collect();
        e.frames.free(&e.zapper, &frames);
        e.budget.uncharge(Gauge::Cached, UNIT_PAGES as i64);
        r.counters.swap_csum_fail.fetch_add(1, Relaxed);
        // Every page of the unit is lost with its entry.
        for i in 0..UNIT_PAGES {
            if let PageState::Swapped(s) = u.get(i) {
                if c.handle_of(s).map(|x| x.0) == Some(h) {
                    e.diag.say_compressed_corrupt(s);
                    crate::fault::poison_page(e, r, u, first + i as u64, s);
                }
            }
        }
        return None;
    }
    Some(huge)
}

/// A unit stored whole: decompress it and map every page still swapped to it. The
/// decode takes a unit's room through the budget whatever the fault reserved (a fault
/// sizes its room from a hint taken before it holds the unit's lock); where the room
/// is not free, only the faulting page is decoded and mapped, the rest staying in the
/// entry for their own faults.
fn load_unit(e: &Engine, c: &Compressed, r: &RegionInner, u: &mut UnitPages, page: u64, h: Handle) {
    let first = page - page % UNIT_PAGES as u64;
    if !e.budget.take_room_all(UNIT_PAGES as i64) {
        return load_page_of_unit(e, c, r, u, page, h);
    }
    let Some(huge) = decode_unit(e, c, r, u, page, h) else {
        return;
    };
    r.counters.minflt.fetch_add(1, Relaxed);
    let mapped = map_decoded_unit(e, r, u, first, huge, true, |_, s| {
        c.handle_of(s) == Some((h, true))
    });
    r.counters.zswpin.fetch_add(mapped.len() as u64, Relaxed);
    drop_mapped(e, c, u, mapped.into_iter());
    charge_pool(e, c);
}

/// Page `page` of a unit stored whole (entry `h`), decoded alone (the chunks it lies
/// in) and mapped dirty; its share of the entry goes, the other pages stay in it.
fn load_page_of_unit(
    e: &Engine,
    c: &Compressed,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    h: Handle,
) {
    let i = page as usize % UNIT_PAGES;
    let PageState::Swapped(slot) = u.get(i) else {
        return;
    };
    if load_one(e, c, r, u, page, slot, |out| {
        c.pool.load_part(h, i * PAGE_SIZE, out)
    }) {
        r.counters.thp_swpin_fallback.fetch_add(1, Relaxed);
    }
}

/// Why [`decode_to_frame`] has no frame to give.
enum DecodeFailed {
    /// No frame free: reclaim must make one first.
    NoFrame,
    /// The entry did not decode (damaged).
    Corrupt,
}

/// A frame, charged as `Cached`, that `decode` filled with one page's bytes; on a
/// failed decode the frame and its charge go back.
fn decode_to_frame<E>(
    e: &Engine,
    decode: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, DecodeFailed> {
    let frame = e
        .frames
        .alloc_to_fill(crate::frames::Site::Compressed)
        .ok_or(DecodeFailed::NoFrame)?;
    e.budget.charge(Gauge::Cached, 1);
    if decode(e.frames.page_mut(frame)).is_err() {
        e.frames.free(&e.zapper, &[frame]);
        e.budget.uncharge(Gauge::Cached, 1);
        return Err(DecodeFailed::Corrupt);
    }
    Ok(frame)
}

/// The fault of `page` (swapped to `slot`), whose bytes `decode` writes from the pool:
/// decoded into a frame and mapped dirty. With no frame free, reclaim is woken and the
/// fault retries; an entry that does not decode poisons the page (SIGBUS for it, never
/// wrong bytes). Whether the page was decoded. Under the unit's lock.
fn load_one<E>(
    e: &Engine,
    c: &Compressed,
    r: &RegionInner,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    decode: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> bool {
    match decode_to_frame(e, decode) {
        Ok(frame) => {
            r.counters.minflt.fetch_add(1, Relaxed);
            let mapped = map_loaded(e, c, r, u, &[(page, slot, frame)]);
            r.counters.zswpin.fetch_add(mapped, Relaxed);
            charge_pool(e, c);
            true
        }
        Err(DecodeFailed::NoFrame) => {
            e.threads.wake_kswapd();
            let _ = r.uffd.wake(r.page_addr(page), PAGE_SIZE);
            false
        }
        Err(DecodeFailed::Corrupt) => {
            r.counters.swap_csum_fail.fetch_add(1, Relaxed);
            e.diag.say_compressed_corrupt(slot);
            crate::fault::poison_page(e, r, u, page, slot);
            false
        }
    }
}

/// A fault at `page` (swapped to `slot`) of a unit stored whole, where the region
/// takes 4 KiB pages (`unit::loads_stored_unit_whole`): decompress the unit, map the
/// page, and store the unit's other pages again as pages of their own, in the pool
/// where it takes them, else on the back tier (`write_refused`), each to come back at
/// its own fault. Mapped whole, 511 pages a random fault does not want would push out
/// 511 that the program uses, and leave whole again at the next eviction; left in the
/// entry, each fault on the unit would decompress 2 MiB for 4 KiB (pmbench
/// `compressed+file` with a full pool: 0.15-0.5x `--unit 4k`). Under the unit's lock.
#[allow(clippy::too_many_arguments)]
fn split_unit(
    e: &Engine,
    ctx: &mut ThreadCtx,
    c: &Compressed,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    page: u64,
    slot: Slot,
    h: Handle,
    write: bool,
) {
    if !e.budget.take_room_all(UNIT_PAGES as i64) {
        return load_page_of_unit(e, c, r, u, page, h);
    }
    let Some(huge) = decode_unit(e, c, r, u, page, h) else {
        return;
    };
    let first = page - page % UNIT_PAGES as u64;
    let (mut rest, mut rest_p, mut rest_f, mut unused) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..UNIT_PAGES {
        let (p, f) = (first + i as u64, huge + i * PAGE_SIZE);
        match u.get(i) {
            _ if p == page => {}
            PageState::Swapped(s) if c.handle_of(s) == Some((h, true)) => {
                rest.push((i, s));
                rest_p.push(p);
                rest_f.push(f);
            }
            _ => unused.push(f),
        }
    }
    // The faulting page's piece stays charged into its mapping (`map_loaded`), the
    // rest until they are stored; what no page needs goes.
    e.budget.uncharge(Gauge::Cached, unused.len() as i64);
    e.frames.free(&e.zapper, &unused);
    r.counters.minflt.fetch_add(1, Relaxed);
    let mapped = map_loaded(
        e,
        c,
        r,
        u,
        &[(page, slot, huge + (page - first) as usize * PAGE_SIZE)],
    );
    r.counters.zswpin.fetch_add(mapped, Relaxed);
    let (refused_p, refused_f) = store_pages(e, ctx, r, u, &rest_p, &rest_f);
    let left = write_refused(e, ctx, r, u, &refused_p, &refused_f);
    for &(i, s) in &rest {
        if u.get(i) == PageState::Swapped(s) {
            // Refused: still the unit entry's.
            u.unkeep(i);
        } else {
            // Stored at a slot of its own: its share of the unit's entry goes.
            e.tiers.release(e, s);
        }
    }
    if left == 0 {
        r.counters.zswap_unit_split.fetch_add(1, Relaxed);
    }
    charge_pool(e, c);
    crate::fault::swapin::fault_around(e, r, u, page, write);
}

/// Pages of a split unit that the pool refused, their bytes in `frames` (pieces of the
/// unit's 2 MiB frame, charged as cached): written to the back tier from frames of
/// their own, so that the 2 MiB frame goes back now (a write holds its frames until it
/// completes, and faults that found no 2 MiB frame free spun on it). Those that cannot
/// be written (no back tier, no frames, no slots) stay in the unit's entry. Every
/// piece is freed. Returns how many stay.
fn write_refused(
    e: &Engine,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    pages: &[u64],
    frames: &[usize],
) -> usize {
    let mut own = Vec::new();
    if !pages.is_empty() && crate::writeback::can_write(e) {
        let mut runs = Vec::new();
        let got = e
            .frames
            .alloc(pages.len(), &mut runs, crate::frames::Site::Compressed);
        own = runs
            .iter()
            .flat_map(|&(a, n)| (0..n).map(move |k| a + k * PAGE_SIZE))
            .collect();
        if got < pages.len() {
            e.frames.free(&e.zapper, &own);
            own.clear();
        }
    }
    for (&to, &from) in own.iter().zip(frames) {
        e.frames.page_mut(to).copy_from_slice(e.frames.page(from));
    }
    e.frames.free(&e.zapper, frames);
    if own.is_empty() {
        e.budget.uncharge(Gauge::Cached, pages.len() as i64);
        return pages.len();
    }
    // (The copies take over the pieces' charge.)
    let unbacked = crate::writeback::write_pages(e, ctx, r, u, pages, &own, 0);
    let left: Vec<usize> = unbacked.iter().map(|&(_, f)| f).collect();
    e.frames.free(&e.zapper, &left);
    e.budget.uncharge(Gauge::Cached, left.len() as i64);
    left.len()
}

/// A unit just decoded into the 2 MiB frame `huge` (owned, charged as a unit's pages
/// to `Cached`, so that its room is never let go between the decode and the
/// mapping): map every
/// page still swapped to what was decoded (`of_it(i, slot)`) as copies from the cache
/// (the mapping drops each slot's cache reference and, dirty, applies the stale-slot
/// policy to it); the rest of the frame goes back. Whole where every page is (one move
/// of the frame), dirty unless `!dirty` (then clean and write-protected, keeping the
/// slots, when the protection takes); else page by page, dirty (part of the unit was
/// rewritten or discarded since). Returns the pages it tried to map, with their slots
/// (a page whose copy failed to map stays swapped, for its retrying fault).
pub(crate) fn map_decoded_unit(
    e: &Engine,
    r: &RegionInner,
    u: &mut UnitPages,
    first: u64,
    huge: usize,
    dirty: bool,
    of_it: impl Fn(usize, Slot) -> bool,
) -> Vec<(u64, Slot)> {
    let frames: Vec<usize> = (0..UNIT_PAGES).map(|i| huge + i * PAGE_SIZE).collect();
    let mut slots = [0 as Slot; UNIT_PAGES];
    let whole = (0..UNIT_PAGES).all(|i| match u.get(i) {
        PageState::Swapped(s) if of_it(i, s) => {
            slots[i] = s;
            true
        }
        _ => false,
    });
    if whole {
        for &s in &slots {
            e.slots.set_cache(s);
        }
        let copies: Vec<(Slot, usize)> =
            slots.iter().copied().zip(frames.iter().copied()).collect();
        let drop = crate::fault::IfUnmapped::Drop;
        crate::unit::map_unit(e, r, u, first, &copies, dirty, drop);
        return (0..UNIT_PAGES)
            .map(|i| (first + i as u64, slots[i]))
            .collect();
    }
    let mut loaded = Vec::new();
    let mut unused = Vec::new();
    for (i, &f) in frames.iter().enumerate() {
        match u.get(i) {
            PageState::Swapped(s) if of_it(i, s) => loaded.push((first + i as u64, s, f)),
            _ => unused.push(f),
        }
    }
    e.frames.free(&e.zapper, &unused);
    e.budget.uncharge(Gauge::Cached, unused.len() as i64);
    map_copies_dirty(e, r, u, &loaded);
    loaded.into_iter().map(|(p, s, _)| (p, s)).collect()
}

/// Map pages just decoded into their own frames (charged), dirty, as copies from the
/// cache.
fn map_copies_dirty(e: &Engine, r: &RegionInner, u: &mut UnitPages, loaded: &[(u64, Slot, usize)]) {
    for &(p, s, f) in loaded {
        e.slots.set_cache(s);
        let drop = crate::fault::IfUnmapped::Drop;
        crate::fault::map_copies(e, r, u, p, &[(s, f)], true, drop);
    }
}

/// Whether the pool wants writeback now (cheap: the reclaim thread asks every round).
pub(crate) fn wants_writeback(e: &Engine) -> bool {
    e.tiers
        .compressed
        .as_ref()
        .is_some_and(|c| c.writeback && c.over_share())
}

/// Past the pool's share, write the oldest entries back to the back tier (zswap's
/// writeback) down to 7/8 of it; with `need` > 0 (reclaim found nothing else to free),
/// also that many pages' worth below where the pool is. Compacts when much is
/// compactable. Returns pages whose writes were started.
pub(crate) fn balance(e: &Engine, ctx: &mut ThreadCtx, need: u64) -> u64 {
    balance_with(e, ctx, need, false)
}

/// `balance`; `nested`: the caller holds a unit's lock, so other units' locks are only
/// tried (an entry whose unit is busy waits for the next round).
fn balance_with(e: &Engine, ctx: &mut ThreadCtx, need: u64, nested: bool) -> u64 {
    let Some(c) = e.tiers.compressed.as_ref() else {
        return 0;
    };
    let st = c.pool.stats();
    if st.compactable_bytes > 4 << 20 {
        c.pool.compact();
        charge_pool(e, c);
    }
    let hit = c.limit_hit.load(Relaxed);
    let over = c.over_share();
    let low = c.low_mark();
    if !c.writeback || !(over || need > 0) || !crate::writeback::can_write(e) {
        // Loads and frees made room without writeback (always so with no back tier):
        // the pool takes stores again (`takes_stores`).
        if hit && c.bytes() <= low {
            c.limit_hit.store(false, Relaxed);
        }
        return 0;
    }
    let target = if need > 0 {
        c.bytes().saturating_sub(need * PAGE_SIZE as u64)
    } else {
        low
    };
    let mut started = 0;
    let base = e.tiers.file().base();
    while c.bytes() > target {
        let Some(st) = c
            .order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
        else {
            break;
        };
        if st.slot < base {
            continue; // a slot of a parent's file: not ours to write
        }
        let Some(r) = e.regions.by_id(st.region) else {
            continue;
        };
        let mut u = if nested {
            match r.unit_of(st.page).try_lock() {
                Some(u) => u,
                None => {
                    c.order
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_front(st);
                    break;
                }
            }
        } else {
            r.unit_of(st.page).lock()
        };
        if r.is_dead() {
            continue;
        }
        match write_back(e, c, ctx, &r, &mut u, st) {
            Some(n) => started += n,
            None => break,
        }
        charge_pool(e, c);
    }
    charge_pool(e, c);
    if hit && c.bytes() <= low {
        c.limit_hit.store(false, Relaxed);
    }
    started
}

/// Write one entry (a page, or a unit whole) back to the back tier at its slots.
fn write_back(
    e: &Engine,
    c: &Compressed,
    ctx: &mut ThreadCtx,
    r: &Arc<RegionInner>,
    u: &mut UnitPages,
    st: Stored,
) -> Option<u64> {
    let i = st.page as usize % UNIT_PAGES;
    if u.get(i) != PageState::Swapped(st.slot) {
        return Some(0); // stale
    }
    let Some((h, unit)) = c.handle_of(st.slot) else {
        return Some(0);
    };
    if unit != st.unit {
        return Some(0);
    }
    if unit {
        let first = st.page - st.page % UNIT_PAGES as u64;
        match crate::tier::packed::write(e, ctx, c, r, u, first, st.slot, h) {
            crate::tier::packed::Write::Started(n) => {
                charge_pool(e, c);
                return Some(n);
            }
            crate::tier::packed::Write::NoRoom => {
                c.order
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_front(st);
                return None;
            }
            crate::tier::packed::Write::NotPacked => {}
        }
    }
    // The decompressed copy needs room until its write completes and it is freed:
    // out of reclaim's reserve (with what faults left), leaving a store its part,
    // taken as one step against faults' reservations, or the entry waits.
    let n = if unit { UNIT_PAGES } else { 1 };
    let requeue = || {
        c.order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_front(st);
    };
    if !e
        .budget
        .charge_if_room(Gauge::Cached, n as i64, c.store_reserve())
    {
        requeue();
        return None;
    }
    let frames: Vec<usize> = if unit {
        e.frames
            .alloc_huge_to_fill(crate::frames::Site::Compressed)
            .map(|huge| (0..UNIT_PAGES).map(|k| huge + k * PAGE_SIZE).collect())
            .unwrap_or_default()
    } else {
        // Not a warm frame: written, it is zapped in the reclaim thread, and the warm
        // ones are the fault path's (`Frames::free_mapped`).
        e.frames
            .alloc_one(crate::frames::Site::Compressed)
            .map(|f| vec![f])
            .unwrap_or_default()
    };
    if frames.is_empty() {
        e.budget.uncharge(Gauge::Cached, n as i64);
        requeue();
        return None;
    }
    let out = if unit {
        e.frames.span_mut(frames[0], UNIT_SIZE)
    } else {
        e.frames.page_mut(frames[0])
    };
    if c.pool.load(h, out).is_err() {
        // Corrupt in RAM: nothing to write; the fault that comes will say so.
        e.frames.free(&e.zapper, &frames);
        e.budget.uncharge(Gauge::Cached, n as i64);
        return Some(0);
    }
    let first_page = st.page - if unit { st.page % UNIT_PAGES as u64 } else { 0 };
    let mut pages = Vec::with_capacity(n);
    let mut fr = Vec::with_capacity(n);
    for k in 0..n {
        let p = first_page + k as u64;
        let s = st.slot + k as u64;
        // Only pages still swapped to this entry go back; a unit's others were
        // rewritten or discarded.
        if u.get(p as usize % UNIT_PAGES) == PageState::Swapped(s)
            && c.handle_of(s) == Some((h, unit))
        {
            c.release(s);
            pages.push(p);
            fr.push(frames[k]);
        } else {
            e.frames.free(&e.zapper, &frames[k..k + 1]);
            e.budget.uncharge(Gauge::Cached, 1);
        }
    }
    // Runs of consecutive slots, one write each.
    let mut a = 0;
    while a < pages.len() {
        let mut b = a + 1;
        while b < pages.len() && pages[b] == pages[b - 1] + 1 {
            b += 1;
        }
        let s0 = st.slot + (pages[a] - first_page);
        crate::writeback::write_run(e, ctx, r, u, &pages[a..b], &fr[a..b], s0, 0);
        a = b;
    }
    r.counters.zswpwb.fetch_add(pages.len() as u64, Relaxed);
    Some(pages.len() as u64)
}
