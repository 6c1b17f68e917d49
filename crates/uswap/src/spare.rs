//! Zeroed THPs made ahead for first touch under `--unit 2m`.
//!
//! A first write to an untouched unit needs one zeroed 2 MiB page. Made on the fault
//! thread (MADV_POPULATE_WRITE into the shadow), it costs the waiting program 0.1-0.2 ms
//! per unit, and 4.4 ms on this VM when the memory was handed back to the host (free
//! page reporting): the first budget's worth of a sequential writer then took ~0.5 s
//! on one thread while the other vCPU idled. The reclaim thread keeps a few zeroed THPs
//! in an arena of its own instead, while there is room under the budget, and a first
//! touch moves one into the region with UFFDIO_MOVE (the PMD moves whole).
//!
//! Spares count against the budget (gauge `Spare`), like every page the engine holds. Only a
//! few are kept (`min(4, budget / 64 MiB)`), and only while first touches go on: each
//! zero-filled unit allows that many more to be made. Reclaim drops them first once no
//! unit was zero-filled for 50 ms; before that, only when nothing else can make room,
//! not even I/O in flight (dropped, the memory goes back to the host on this VM, and
//! making it again costs more than waiting for a write).

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::sys::mem::{map_aligned, populate_write, unmap};
use crate::sys::uffd::Wake;
use crate::{Result, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Most spares kept.
const MAX_SPARES: usize = 4;

/// The arena and which of its units hold a zeroed THP.
pub(crate) struct Spares {
    arena: usize,
    units: usize,
    /// Arena units that hold a zeroed THP, and those that are empty.
    state: Mutex<(Vec<usize>, Vec<usize>)>,
    /// Spares still to make: set by every zero-filled unit (first touches go on),
    /// used up by making them.
    credit: AtomicUsize,
    /// When the last unit was zero-filled (ns since `epoch`).
    last_fill_ns: AtomicU64,
    epoch: std::time::Instant,
}

impl Spares {
    /// An arena for `min(4, budget / 64 MiB)` spares (none below 64 MiB).
    pub(crate) fn new(budget: u64) -> Result<Spares> {
        let units = MAX_SPARES.min((budget / (64 << 20)) as usize);
        let arena = if units > 0 {
            map_aligned(units * UNIT_SIZE, true)?
        } else {
            0
        };
        Ok(Spares {
            arena,
            units,
            state: Mutex::new((Vec::new(), (0..units).collect())),
            credit: AtomicUsize::new(0),
            last_fill_ns: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        })
    }

    /// A unit was zero-filled: keep spares ready for the next ones.
    pub(crate) fn want(&self) {
        self.credit.store(self.units, Relaxed);
        self.last_fill_ns
            .store(self.epoch.elapsed().as_nanos() as u64, Relaxed);
    }

    /// No unit was zero-filled for 50 ms: spares are not about to be taken.
    pub(crate) fn idle(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now.saturating_sub(self.last_fill_ns.load(Relaxed)) > 50_000_000
    }

    fn addr(&self, i: usize) -> usize {
        self.arena + i * UNIT_SIZE
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (Vec<usize>, Vec<usize>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        if self.units > 0 {
            unmap(self.arena, self.units * UNIT_SIZE);
        }
    }
}

/// Move a spare zeroed THP to `dst` (a 2 MiB-aligned unit of a region, whose lock
/// the caller holds; the caller charges the pages where they now belong and wakes
/// the faulting thread). Returns the bytes moved from the unit's start, or None with
/// no spare: a move that stops part-way (`UnitPolicy::Huge`'s first touch,
/// `unit::zero_move_len`) has still moved its first pages, which are the caller's
/// now; what stayed behind is dropped.
pub(crate) fn take_to(e: &Engine, uffd: &crate::sys::uffd::Uffd, dst: usize) -> Option<usize> {
    let sp = &e.spares;
    let i = sp.state().0.pop()?;
    let src = sp.addr(i);
    let (moved, _) = uffd.move_pages_partial(dst, src, crate::unit::zero_move_len(e), Wake::No);
    if moved < UNIT_SIZE {
        e.zapper.zap(&[(src, UNIT_SIZE)]);
    }
    e.budget.uncharge(Gauge::Spare, UNIT_PAGES as i64);
    sp.state().1.push(i);
    e.threads.wake_kswapd();
    Some(moved)
}

/// Reclaim thread: make one spare if one is wanted, missing, and fits under the high
/// watermark with every fault's reservation. True if it made one.
pub(crate) fn refill(e: &Engine) -> bool {
    let sp = &e.spares;
    if sp.credit.load(Relaxed) == 0 || e.threads.is_shutdown() {
        return false;
    }
    let Some(i) = sp.state().1.pop() else {
        return false;
    };
    let n = UNIT_PAGES as i64;
    // Room under the high watermark, checked and taken as one step against faults'
    // reservations (charged first and checked after, the charge itself crossed the
    // limit for a moment, and the peak saw it).
    let keep = e.budget.limit_pages() - e.budget.high_pages();
    if !e.budget.charge_if_room(Gauge::Spare, n, keep) {
        sp.state().1.push(i);
        return false;
    }
    let ok = populate_write(sp.addr(i), UNIT_SIZE);
    if ok {
        let _ = sp
            .credit
            .fetch_update(Relaxed, Relaxed, |c| c.checked_sub(1));
        sp.state().0.push(i);
    } else {
        e.zapper.zap(&[(sp.addr(i), UNIT_SIZE)]);
        e.budget.uncharge(Gauge::Spare, n);
        sp.state().1.push(i);
    }
    ok
}

/// Drop up to `max` spares (reclaim, fork). Returns pages freed.
pub(crate) fn drop(e: &Engine, max: usize) -> i64 {
    let sp = &e.spares;
    let mut freed = 0;
    for _ in 0..max {
        let Some(i) = sp.state().0.pop() else {
            break;
        };
        e.zapper.zap(&[(sp.addr(i), UNIT_SIZE)]);
        e.budget.uncharge(Gauge::Spare, UNIT_PAGES as i64);
        sp.state().1.push(i);
        freed += UNIT_PAGES as i64;
    }
    freed
}
