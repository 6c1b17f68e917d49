//! Locked memory (mlock of region memory): resident for good and never swapped, as the
//! kernel promises locked memory.
//!
//! The pages are faulted in by the locking thread (the fault thread serves those
//! faults as any other), then marked in their unit under its lock: reclaim never picks
//! a locked page, and its charge moves from the budget's resident gauge to the locked
//! one, which is outside the limit (reclaim could never bring locked pages under it;
//! the program's other memory keeps to the budget). The caller then locks the range
//! in the kernel (`mlock`): the pages are present and writable by then, so the kernel
//! faults none, and the engine never moves a page out of or into the locked VMA (the
//! kernel refuses UFFDIO_MOVE between a locked and an unlocked VMA).

use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::{PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Tries to bring a unit's part in before its pages that are still not resident are
/// left unlocked (reclaim took them again between the fault-in and the marking, or
/// the program made them inaccessible).
const TRIES: usize = 8;

/// Lock pages `[first, first + n)` of `r`. Returns how many were locked now (pages
/// already locked and pages that cannot be brought in, PROT_NONE ones, are not
/// counted).
pub(crate) fn lock(e: &Engine, r: &RegionInner, first: u64, n: u64) -> u64 {
    let end = (first + n).min(r.pages());
    let mut total = 0;
    let mut p = first;
    while p < end {
        let stop = (((p / UNIT_PAGES as u64) + 1) * UNIT_PAGES as u64).min(end);
        for _ in 0..TRIES {
            populate(r.page_addr(p), (stop - p) as usize);
            let _a = e.fork.enter_from_program();
            let mut u = r.unit_of(p).lock();
            if r.is_dead() {
                return total;
            }
            let (mut newly, mut missing) = (0, false);
            for q in p..stop {
                let i = q as usize % UNIT_PAGES;
                match u.get(i) {
                    PageState::Resident { .. } => newly += u.set_locked(i, true) as i64,
                    _ => missing = true,
                }
            }
            e.budget.lock(newly);
            total += newly as u64;
            if !missing {
                break;
            }
        }
        p = stop;
    }
    if total > 0 && !SAID.swap(true, Relaxed) {
        say!(
            "uswap: the program locked {} MiB of its memory (mlock): kept resident, never \
             swapped, outside the {} MiB budget; the rest keeps to the budget",
            (e.budget.locked_pages().max(0) as u64 * PAGE_SIZE as u64) >> 20,
            e.budget.bytes() >> 20
        );
    }
    total
}

static SAID: AtomicBool = AtomicBool::new(false);

/// Unlock pages `[first, first + n)` of `r`: ordinary resident pages again, under the
/// budget (reclaim makes room if they take it over). Returns how many were locked.
pub(crate) fn unlock(e: &Engine, r: &RegionInner, first: u64, n: u64) -> u64 {
    let _a = e.fork.enter_from_program();
    let end = (first + n).min(r.pages());
    let mut total = 0;
    let mut p = first;
    while p < end {
        let stop = (((p / UNIT_PAGES as u64) + 1) * UNIT_PAGES as u64).min(end);
        let mut u = r.unit_of(p).lock();
        if r.is_dead() {
            return total;
        }
        for q in p..stop {
            total += release(e, &mut u, q as usize % UNIT_PAGES) as u64;
        }
        drop(u);
        p = stop;
    }
    if total > 0 {
        e.threads.wake_kswapd();
    }
    total
}

/// Page `i` of a locked unit is about to stop being resident (discarded, dropped,
/// poisoned): its lock goes and its charge is back in the resident gauge, for the
/// caller to uncharge. Returns whether it was locked.
pub(crate) fn release(e: &Engine, u: &mut UnitPages, i: usize) -> bool {
    let was = u.set_locked(i, false);
    if was {
        e.budget.unlock(1);
    }
    was
}

/// Fault in `pages` pages at `addr` for writing, from this thread: all at once, or
/// page by page where that fails (a page the program made PROT_NONE fails alone).
fn populate(addr: usize, pages: usize) {
    if crate::sys::mem::populate_write(addr, pages * PAGE_SIZE) {
        return;
    }
    for k in 0..pages {
        crate::sys::mem::populate_write(addr + k * PAGE_SIZE, PAGE_SIZE);
    }
}
