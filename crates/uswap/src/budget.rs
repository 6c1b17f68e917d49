//! The budget: every byte the engine holds in RAM counts against it — resident
//! region pages, the swap cache (clean copies and pages under I/O), spare zeroed
//! THPs, the compressed tier's pool, and metadata (page maps, slot tables).
//!
//! It holds at every instant, not on average:
//! - what the engine holds is one atomic (`used`, in pages), so that a reader never
//!   sees pages in two gauges at once while they move between them ([`Budget::transfer`]);
//! - a fault reserves the pages it may charge before it maps them ([`Budget::try_reserve`],
//!   called by `reclaim::make_room`): `promised` (pages held plus pages reserved and not
//!   charged yet) is one atomic, added to first and checked after, so two threads never
//!   both take the last room and no reader sees a page in neither term; fault-around and
//!   readahead ask for more with [`Budget::take_room`], which grants only room nobody
//!   holds; reclaim's own short-lived copies (a compressed entry decompressed for
//!   writeback) take room the same way ([`Budget::charge_if_room`]);
//! - faults leave the last pages to reclaim (`reclaim_reserve`, the kernel's min
//!   watermark): a store in the compressed pool grows the pool before it frees the
//!   stored frames, and the pool's writeback decompresses an entry before its write
//!   lets the copy go, so at the limit both need room that no fault may take (faults
//!   keep the limit filled: reclaim taking its copies only from the room faults left
//!   never wrote back a unit on 2 cores).
//! - a new region's page map is reserved first (the limit drops at once), reclaimed
//!   for, and only then counted ([`Budget::commit_metadata`]).

use crate::PAGE_SIZE;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

/// Where pages the engine holds are counted. `used` is always their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gauge {
    /// Mapped in a region.
    Resident,
    /// In swap-cache frames (clean copies, pages under I/O).
    Cached,
    /// Spare zeroed THPs made ahead for first touch.
    Spare,
    /// The compressed tier's pool.
    #[allow(dead_code)] // until the compressed tier lands
    Pool,
}

/// The budget and its gauges (pages unless named bytes). Guarded by atomics only.
pub(crate) struct Budget {
    /// Bytes the engine may hold: the budget the pool started with, and the most
    /// [`Budget::set_requested`] may ask for (the swap-cache frames are sized for it).
    budget: u64,
    /// The budget asked for since the start (`Pool::set_budget`), if less: applied
    /// like the memory cgroup's cap, the limit follows at once and reclaim evicts
    /// down to it.
    requested: AtomicU64,
    /// Bytes the engine may hold now, if less: the room its memory cgroup leaves
    /// (`memcg::follow`, from the reclaim thread or a fault, whichever reads first).
    cap: AtomicU64,
    /// Sum of the gauges: what the limit is checked against and the peak reads.
    used: AtomicI64,
    resident: AtomicI64,
    cached: AtomicI64,
    spare: AtomicI64,
    pool: AtomicI64,
    /// Region pages the program locked (mlock): resident for good, so outside `used`
    /// and the limit (reclaim could never bring them under it); the rest of the
    /// program's memory keeps to the budget.
    locked: AtomicI64,
    /// Highest `locked` seen (pages).
    locked_peak: AtomicI64,
    /// Bytes of metadata charged (page maps, slot tables, fixed buffers).
    metadata: AtomicU64,
    /// Bytes of metadata of regions being created: out of the limit at once, in the
    /// peak only once reclaim made room for them.
    metadata_reserved: AtomicU64,
    /// `used` plus the pages faults in progress reserved and have not charged yet:
    /// what must fit under the limit. Every check of room adds to it first.
    promised: AtomicI64,
    /// Highest usage seen, in bytes (pages + metadata).
    peak: AtomicU64,
    /// Pages under the limit that faults may not reserve: reclaim's own room.
    reclaim_reserve: i64,
}

thread_local! {
    /// This thread's fault in progress: pages reserved (0 outside a fault; grown by
    /// `take_room`) and pages charged so far.
    static OWN: std::cell::Cell<(i64, i64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The room a fault in progress reserved; released when the fault is done, by
/// which time its pages are charged.
pub(crate) struct Room<'a> {
    budget: &'a Budget,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        let (reserved, charged) = OWN.with(|c| c.replace((0, 0)));
        // What the fault did not charge goes back (a charge past the reservation was
        // added to `promised` when made).
        self.budget
            .promised
            .fetch_sub((reserved - charged).max(0), SeqCst);
    }
}

impl Budget {
    /// A budget of `budget` bytes, `reclaim_reserve` pages of which faults leave to
    /// reclaim.
    pub(crate) fn new(budget: u64, reclaim_reserve: i64) -> Budget {
        Budget {
            budget,
            requested: AtomicU64::new(budget),
            cap: AtomicU64::new(u64::MAX),
            used: AtomicI64::new(0),
            resident: AtomicI64::new(0),
            cached: AtomicI64::new(0),
            spare: AtomicI64::new(0),
            pool: AtomicI64::new(0),
            locked: AtomicI64::new(0),
            locked_peak: AtomicI64::new(0),
            metadata: AtomicU64::new(0),
            metadata_reserved: AtomicU64::new(0),
            promised: AtomicI64::new(0),
            peak: AtomicU64::new(0),
            reclaim_reserve,
        }
    }

    /// The budget the pool started with, in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.budget
    }

    /// The budget asked for now (bytes): the start's, or what `set_requested` set.
    pub(crate) fn requested_bytes(&self) -> u64 {
        self.requested.load(Relaxed)
    }

    /// Ask for a budget of `bytes` (at most the start's; the caller checks).
    pub(crate) fn set_requested(&self, bytes: u64) {
        self.requested.store(bytes.min(self.budget), Relaxed);
    }

    fn gauge(&self, g: Gauge) -> &AtomicI64 {
        match g {
            Gauge::Resident => &self.resident,
            Gauge::Cached => &self.cached,
            Gauge::Spare => &self.spare,
            Gauge::Pool => &self.pool,
        }
    }

    /// Pages counted in gauge `g` now.
    pub(crate) fn pages_in(&self, g: Gauge) -> i64 {
        self.gauge(g).load(Relaxed)
    }

    /// Pages enter the engine's hold. Inside a fault they use what is left of its
    /// reservation; what it does not cover is promised now.
    pub(crate) fn charge(&self, g: Gauge, n: i64) {
        let covered = OWN.with(|c| {
            let (reserved, charged) = c.get();
            if reserved == 0 {
                return 0;
            }
            c.set((reserved, charged + n));
            (reserved - charged).clamp(0, n)
        });
        if n > covered {
            self.promised.fetch_add(n - covered, SeqCst);
        }
        self.grow(n);
        self.gauge(g).fetch_add(n, Relaxed);
    }

    /// Charge `n` pages outside any reservation only if they fit under the limit with
    /// `keep` pages still free, checked and taken as one step (reclaim's short-lived
    /// copies, out of its reserve: without it, a fault and reclaim could both take the
    /// last room). False: nothing charged.
    pub(crate) fn charge_if_room(&self, g: Gauge, n: i64, keep: i64) -> bool {
        if self.promised.fetch_add(n, SeqCst) + n > self.limit_pages() - keep {
            self.promised.fetch_sub(n, SeqCst);
            return false;
        }
        self.grow(n);
        self.gauge(g).fetch_add(n, Relaxed);
        true
    }

    /// Charge `n` pages that reclaim takes on its way to freeing more (the compressed
    /// pool's growth before a stored page's frame goes): always, outside any fault's
    /// reservation, out of the room faults leave it (`reclaim_reserve`; the kernel's
    /// PF_MEMALLOC dips below the min watermark the same way).
    pub(crate) fn charge_reclaim(&self, g: Gauge, n: i64) {
        self.promised.fetch_add(n, SeqCst);
        self.grow(n);
        self.gauge(g).fetch_add(n, Relaxed);
    }

    /// Pages leave the engine's hold.
    pub(crate) fn uncharge(&self, g: Gauge, n: i64) {
        self.gauge(g).fetch_sub(n, Relaxed);
        self.used.fetch_sub(n, Relaxed);
        self.promised.fetch_sub(n, SeqCst);
    }

    /// Pages move from one gauge to another; `used` (what the limit reads) does not
    /// change, so no reader ever counts them twice or not at all.
    pub(crate) fn transfer(&self, from: Gauge, to: Gauge, n: i64) {
        self.gauge(from).fetch_sub(n, Relaxed);
        self.gauge(to).fetch_add(n, Relaxed);
    }

    /// `n` resident pages become locked: they leave the limit's count.
    pub(crate) fn lock(&self, n: i64) {
        self.uncharge(Gauge::Resident, n);
        let now = self.locked.fetch_add(n, Relaxed) + n;
        self.locked_peak.fetch_max(now, Relaxed);
    }

    /// `n` locked pages become ordinary resident pages again, counted at once (over
    /// the limit, if so, until reclaim catches up: as a fault that gave up waiting).
    pub(crate) fn unlock(&self, n: i64) {
        self.locked.fetch_sub(n, Relaxed);
        self.charge_reclaim(Gauge::Resident, n);
    }

    /// Locked pages now.
    pub(crate) fn locked_pages(&self) -> i64 {
        self.locked.load(Relaxed)
    }

    /// Most pages locked at once.
    pub(crate) fn locked_peak_pages(&self) -> i64 {
        self.locked_peak.load(Relaxed)
    }

    /// Set gauge `g` to `pages` (a tier that knows its own size, e.g. the compressed
    /// pool after a store or a compaction), charging or uncharging the difference.
    #[allow(dead_code)] // until the compressed tier lands
    pub(crate) fn set(&self, g: Gauge, pages: i64) {
        let old = self.gauge(g).swap(pages, Relaxed);
        if pages > old {
            self.promised.fetch_add(pages - old, SeqCst);
        }
        self.grow(pages - old);
        if pages < old {
            self.promised.fetch_sub(old - pages, SeqCst);
        }
    }

    /// The room the memory cgroup leaves the engine (bytes), or `u64::MAX`: the
    /// limit follows at once; reclaim brings usage under it.
    pub(crate) fn set_cap(&self, bytes: u64) {
        self.cap.store(bytes, Relaxed);
    }

    /// The cgroup's room as last read (bytes; `u64::MAX` when none is followed).
    pub(crate) fn cap_bytes(&self) -> u64 {
        self.cap.load(Relaxed)
    }

    /// Pages under the limit that faults leave to reclaim.
    pub(crate) fn reserve_pages(&self) -> u64 {
        self.reclaim_reserve.max(0) as u64
    }

    /// Bytes the engine may hold now: the budget asked for, or the cgroup's room if
    /// less.
    pub(crate) fn effective_bytes(&self) -> u64 {
        self.requested.load(Relaxed).min(self.cap.load(Relaxed))
    }

    /// Pages the engine may hold: the budget (or the cgroup's room) less metadata
    /// (charged and reserved).
    pub(crate) fn limit_pages(&self) -> i64 {
        let b = self
            .effective_bytes()
            .saturating_sub(self.metadata.load(SeqCst) + self.metadata_reserved.load(SeqCst));
        (b / PAGE_SIZE as u64) as i64
    }

    /// What faults may reserve up to: the limit less reclaim's reserve.
    pub(crate) fn fault_limit_pages(&self) -> i64 {
        self.limit_pages() - self.reclaim_reserve
    }

    /// Background reclaim starts above this (the watermarks are below where faults
    /// stop, reclaim's reserve left out).
    pub(crate) fn high_pages(&self) -> i64 {
        let l = self.limit_pages();
        self.fault_limit_pages() - (l / 32).max(512)
    }

    /// Background reclaim stops at this.
    pub(crate) fn low_pages(&self) -> i64 {
        let l = self.limit_pages();
        self.fault_limit_pages() - (l / 12).max(1024)
    }

    /// Pages held now.
    pub(crate) fn usage_pages(&self) -> i64 {
        self.used.load(Relaxed)
    }

    /// Pages held, or promised to faults in progress: what must fit under the limit.
    pub(crate) fn promised_pages(&self) -> i64 {
        self.promised.load(SeqCst)
    }

    /// Pages reserved by faults in progress and not charged yet.
    pub(crate) fn unclaimed_pages(&self) -> i64 {
        (self.promised_pages() - self.usage_pages()).max(0)
    }

    /// Try to reserve `want` pages for this thread's fault: true if they fit under the
    /// limit (or `force`: the caller gave up making room and goes over the budget).
    /// On false nothing is reserved.
    pub(crate) fn try_reserve(&self, want: i64, force: bool) -> bool {
        if self.promised.fetch_add(want, SeqCst) + want <= self.fault_limit_pages() || force {
            return true;
        }
        self.promised.fetch_sub(want, SeqCst);
        false
    }

    /// After a successful `try_reserve`: the guard that releases it.
    pub(crate) fn room(&self, want: i64) -> Room<'_> {
        OWN.with(|c| c.set((want, 0)));
        Room { budget: self }
    }

    /// Room for up to `n` more pages in this thread's fault: what is left of its
    /// reservation, grown without reclaim into room nobody else holds (fault-around,
    /// a long readahead window, units read ahead). Returns the pages it may charge
    /// (0 outside a fault).
    pub(crate) fn take_room(&self, n: i64) -> i64 {
        let (reserved, charged) = OWN.with(|c| c.get());
        if reserved == 0 || n <= 0 {
            return 0;
        }
        let left = (reserved - charged).max(0);
        if left >= n {
            return n;
        }
        let extra = n - left;
        let over = self.promised.fetch_add(extra, SeqCst) + extra - self.fault_limit_pages();
        let back = over.clamp(0, extra);
        if back > 0 {
            self.promised.fetch_sub(back, SeqCst);
        }
        OWN.with(|c| c.set((reserved + extra - back, charged)));
        left + extra - back
    }

    /// Room for `n` more pages in this thread's fault, all of them or none: what is
    /// left of its reservation, grown into room nobody holds, as `take_room` does. For
    /// work that cannot be done in part (a unit decoded whole). False, nothing taken:
    /// outside a fault, or the room is not free.
    pub(crate) fn take_room_all(&self, n: i64) -> bool {
        let (reserved, charged) = OWN.with(|c| c.get());
        if reserved == 0 {
            return n <= 0;
        }
        // Charges past the reservation are in `promised` already: the new room starts
        // where the charges are.
        let base = reserved.max(charged);
        let extra = n - (base - charged);
        if extra <= 0 {
            return true;
        }
        if self.promised.fetch_add(extra, SeqCst) + extra > self.fault_limit_pages() {
            self.promised.fetch_sub(extra, SeqCst);
            return false;
        }
        OWN.with(|c| c.set((base + extra, charged)));
        true
    }

    /// Whether a new region's page map waits for room that faults have promised.
    pub(crate) fn metadata_waits(&self) -> bool {
        self.metadata_reserved.load(SeqCst) > 0 && self.promised_pages() > self.limit_pages()
    }

    /// Metadata about to be charged: the limit drops at once. (The metadata gauges are
    /// SeqCst like `promised`: a reservation followed by a read of what faults have
    /// promised, against a fault's promise followed by a read of the limit, must not
    /// both miss the other.)
    pub(crate) fn reserve_metadata(&self, bytes: u64) {
        self.metadata_reserved.fetch_add(bytes, SeqCst);
    }

    /// Reserved metadata becomes charged (the caller made room first).
    pub(crate) fn commit_metadata(&self, bytes: u64) {
        self.metadata.fetch_add(bytes, SeqCst);
        self.metadata_reserved.fetch_sub(bytes, SeqCst);
        self.grow(0);
    }

    /// Reserved metadata not made after all.
    pub(crate) fn cancel_metadata(&self, bytes: u64) {
        self.metadata_reserved.fetch_sub(bytes, SeqCst);
    }

    /// Metadata freed.
    pub(crate) fn release_metadata(&self, bytes: u64) {
        self.metadata.fetch_sub(bytes, SeqCst);
    }

    /// Metadata bytes charged and reserved.
    pub(crate) fn metadata_bytes(&self) -> (u64, u64) {
        (
            self.metadata.load(SeqCst),
            self.metadata_reserved.load(SeqCst),
        )
    }

    /// `used` grows by `n` pages (any sign), and the peak follows at every charge, not
    /// at sampled moments: a page held for a few microseconds past the budget (a read
    /// buffer, a decoded copy) shows in it. One load of the peak per charge; the
    /// read-modify-write only while usage climbs past it.
    fn grow(&self, n: i64) {
        let pages = self.used.fetch_add(n, Relaxed) + n;
        let bytes = pages.max(0) as u64 * PAGE_SIZE as u64 + self.metadata.load(SeqCst);
        if bytes > self.peak.load(Relaxed) {
            self.peak.fetch_max(bytes, Relaxed);
        }
    }

    /// Highest usage seen, in bytes.
    pub(crate) fn peak_bytes(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// After fork, in the child: its own engine starts with no fault in progress.
    pub(crate) fn reset_faults(&self) {
        self.promised.store(self.usage_pages(), SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Faults reserving and charging, reclaim charging its copies only with room (leaving
    /// a store its part of the reserve) and one store at a time charging its growth, all
    /// at the limit on many threads: usage never crosses it (a check made apart from its
    /// charge let both take the last room: the compressed tier's writeback copy).
    #[test]
    fn faults_and_reclaim_never_both_take_the_last_room() {
        let limit = 64;
        let b = Budget::new(limit as u64 * PAGE_SIZE as u64, 4);
        let over = AtomicBool::new(false);
        let storing = std::sync::Mutex::new(());
        let check = |b: &Budget| {
            if b.usage_pages() > limit {
                over.store(true, Relaxed);
            }
        };
        // Each thread holds a few charges at a time, so usage stays at the limit.
        std::thread::scope(|s| {
            for t in 0..4i64 {
                let (b, check) = (&b, &check);
                s.spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for i in 0..50_000i64 {
                        let want = 1 + (i + t) % 9;
                        if b.try_reserve(want, false) {
                            let room = b.room(want);
                            b.charge(Gauge::Resident, want);
                            check(b);
                            drop(room);
                            held.push_back(want);
                        }
                        if held.len() > 3 || (i % 7 == 0 && !held.is_empty()) {
                            b.uncharge(Gauge::Resident, held.pop_front().unwrap());
                        }
                    }
                    for n in held {
                        b.uncharge(Gauge::Resident, n);
                    }
                });
            }
            for t in 0..2i64 {
                let (b, check, storing) = (&b, &check, &storing);
                s.spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for i in 0..50_000i64 {
                        let n = 1 + (i + t) % 13;
                        if b.charge_if_room(Gauge::Cached, n, 2) {
                            check(b);
                            held.push_back(n);
                        }
                        {
                            // One store at a time (the compressed tier's `storing`).
                            let _one = storing.lock().unwrap();
                            b.charge_reclaim(Gauge::Pool, 2);
                            check(b);
                            b.uncharge(Gauge::Pool, 2);
                        }
                        if held.len() > 2 || (i % 5 == 0 && !held.is_empty()) {
                            b.uncharge(Gauge::Cached, held.pop_front().unwrap());
                        }
                    }
                    for n in held {
                        b.uncharge(Gauge::Cached, n);
                    }
                });
            }
        });
        assert!(!over.load(Relaxed), "usage crossed the limit");
        assert_eq!(b.usage_pages(), 0);
        assert_eq!(b.promised_pages(), 0, "every reservation given back");
    }
}
