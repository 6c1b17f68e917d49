//! The reclaim lists: units with resident pages (a CLOCK) and clean pages in the
//! swap cache (oldest first), and trimming the latter.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::{UnitPolicy, UNIT_PAGES};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

/// A page that went to the swap cache, in the order it went there (the kernel's
/// inactive list). Entries may be stale; they are checked when popped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedRef {
    pub region: u32,
    pub page: u64,
    pub slot: Slot,
}

/// Both lists.
#[derive(Default)]
pub(crate) struct ReclaimLists {
    /// Units with resident pages, oldest first: `region << 32 | unit`.
    pub(super) lru: Mutex<VecDeque<u64>>,
    /// Pages in the swap cache, oldest first.
    inactive: Mutex<VecDeque<CachedRef>>,
    /// How often evicted pages come back.
    pub(super) refaults: Refaults,
}

/// Evicted pages wanted back while their copies are still in the swap cache: the
/// kernel's refault detection (mm/workingset.c), coarse. User space sees no accessed
/// bits, so a unit in use but fully resident looks as cold as one nobody touches; what
/// it can see is an evicted page faulted on again soon. When many are (the working set
/// does not fit: `sort` at twice its budget), reclaim stops evicting ahead of need,
/// which would only throw out pages that are coming back.
#[derive(Default)]
pub(crate) struct Refaults {
    evicted: AtomicU64,
    refaulted: AtomicU64,
    /// `evicted` and `refaulted` at the start of the current window.
    window: Mutex<(u64, u64)>,
    thrashing: AtomicBool,
}

/// Evictions per measurement window, at least (`Refaults::thrashing`).
pub(super) const REFAULT_WINDOW: u64 = 4096;

impl Refaults {
    /// `n` pages left the region.
    pub(super) fn evicted(&self, n: u64) {
        self.evicted.fetch_add(n, Relaxed);
    }

    /// Whether evicted pages came back often in the last window of `window` evictions:
    /// over one in eight turns it on, under one in thirty-two off again (hysteresis:
    /// with evicting ahead off, fewer copies wait in the cache to be found).
    pub(super) fn thrashing(&self, window: u64) -> bool {
        let evicted = self.evicted.load(Relaxed);
        if let Ok(mut w) = self.window.try_lock() {
            if evicted - w.0 >= window {
                let refaulted = self.refaulted.load(Relaxed);
                let (de, dr) = (evicted - w.0, refaulted.saturating_sub(w.1));
                if dr * 8 > de {
                    self.thrashing.store(true, Relaxed);
                } else if dr * 32 < de {
                    self.thrashing.store(false, Relaxed);
                }
                *w = (evicted, refaulted);
            }
        }
        self.thrashing.load(Relaxed)
    }
}

impl ReclaimLists {
    pub(super) fn lru(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn inactive(&self) -> std::sync::MutexGuard<'_, VecDeque<CachedRef>> {
        self.inactive.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget every cached page (a forked child, whose cache starts empty).
    pub(crate) fn clear_inactive(&self) {
        self.inactive().clear();
    }
}

/// A fault in `r` found `n` evicted copies still in the swap cache (not ones read
/// ahead).
pub(crate) fn note_refault(e: &Engine, r: &RegionInner, n: u64) {
    e.lists.refaults.refaulted.fetch_add(n, Relaxed);
    r.counters.workingset_refault.fetch_add(n, Relaxed);
}

/// Put the unit of `page` on the reclaim list if it has resident pages and is not
/// there yet. Called under the unit's lock.
pub(crate) fn lru_add(e: &Engine, r: &RegionInner, page: u64, u: &UnitPages) {
    let unit = r.unit_of(page);
    if u.resident > 0 && !unit.on_lru.swap(true, Relaxed) {
        let key = ((r.id as u64) << 32) | (page / UNIT_PAGES as u64);
        e.lists.lru().push_back(key);
    }
}

/// [`lru_add`] for a fault served in the faulting thread, which may be a program's
/// signal handler that interrupted malloc: never grows the list (an allocation would
/// wait for the allocator's lock that thread holds). The list has room for every unit
/// of the regions made (`reserve_lru`); a unit that finds it full all the same stays
/// off it until a later fault of its own.
pub(crate) fn lru_add_in_place(e: &Engine, r: &RegionInner, page: u64, u: &UnitPages) {
    let unit = r.unit_of(page);
    if u.resident == 0 || unit.on_lru.load(Relaxed) {
        return;
    }
    let mut lru = e.lists.lru();
    if lru.len() < lru.capacity() && !unit.on_lru.swap(true, Relaxed) {
        let key = ((r.id as u64) << 32) | (page / UNIT_PAGES as u64);
        lru.push_back(key);
    }
}

/// Room on the reclaim list for `units` more units (a region is made).
pub(crate) fn reserve_lru(e: &Engine, units: usize) {
    e.lists.lru().reserve(units);
}

/// A clean copy joins the tail of the inactive list.
pub(crate) fn push_inactive(e: &Engine, region: u32, page: u64, slot: Slot) {
    e.lists
        .inactive()
        .push_back(CachedRef { region, page, slot });
}

/// Drop up to `need` clean cache pages, oldest first, with one zap per batch.
/// With `spare_ahead`, units read ahead of a stream that it has not reached yet are
/// passed over (moved to the back): dropped, they are read again a moment later (a
/// swap-w-seq run on the remote tier dropped 133 of its 1,061 units read ahead that
/// way, each a 2 MiB read for nothing, when the copies of units just written back
/// arrived in the list after them). Returns pages freed.
pub(super) fn trim_inactive(e: &Engine, need: i64, spare_ahead: bool) -> i64 {
    let mut freed = 0;
    let mut busy: Vec<CachedRef> = Vec::new();
    // Entries looked at, at most once each: spared ones go back to the tail batch by
    // batch (never held off the list, where another reclaimer would miss them).
    let mut unseen = e.lists.inactive().len();
    // At most a sixteenth of the budget spared (the most one stream reads ahead): with
    // many streams in a small budget, sparing every unit read ahead left nothing to
    // drop (8 threads streaming in 64 MiB ran 66 s instead of 14 s, or hung).
    let mut spare_left = if spare_ahead {
        e.budget.limit_pages().max(0) / 16
    } else {
        0
    };
    while freed < need && unseen > 0 {
        let mut batch: Vec<CachedRef> = {
            let mut q = e.lists.inactive();
            let n = ((need - freed) as usize).min(q.len()).min(4096).min(unseen);
            unseen -= n;
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            break;
        }
        batch.sort_by_key(|c| (c.region, c.page));
        let mut frames: Vec<usize> = Vec::new();
        let mut spared: Vec<CachedRef> = Vec::new();
        let mut i = 0;
        while i < batch.len() {
            let (rid, unit_no) = (batch[i].region, batch[i].page / UNIT_PAGES as u64);
            let mut j = i;
            while j < batch.len()
                && batch[j].region == rid
                && batch[j].page / UNIT_PAGES as u64 == unit_no
            {
                j += 1;
            }
            if let Some(r) = e.regions.by_id(rid) {
                let mut u = r.unit_of(batch[i].page).lock();
                if r.is_dead() {
                } else if spare_left >= (j - i) as i64
                    && u.prefetched
                    && ahead_of_stream(e, &r, unit_no)
                {
                    spare_left -= (j - i) as i64;
                    spared.extend_from_slice(&batch[i..j]);
                } else if u.unit_reads > 0 {
                    // Parts of a whole-unit read are still in flight: its completion
                    // looks at every page's copy. Later.
                    busy.extend_from_slice(&batch[i..j]);
                } else {
                    let dropped = trim_unit(e, &r, &u, unit_no, &batch[i..j], &mut frames);
                    if dropped > 0 {
                        // what was read ahead is gone: no longer a unit to spare
                        u.prefetched = false;
                    }
                    freed += dropped;
                }
            }
            i = j;
        }
        // Under no unit lock: a frame is zapped here (or kept warm, for a read only).
        e.frames.free(&e.zapper, &frames);
        e.budget.uncharge(Gauge::Cached, frames.len() as i64);
        e.lists.inactive().extend(spared);
        if !busy.is_empty() {
            break;
        }
    }
    let mut q = e.lists.inactive();
    for c in busy.into_iter().rev() {
        q.push_front(c);
    }
    freed
}

/// Whether whole unit `unit_no` of `r` lies within reach of the region's stream through
/// whole units (twice its readahead distance, either way): the stream reads it next.
fn ahead_of_stream(e: &Engine, r: &RegionInner, unit_no: u64) -> bool {
    let reach = 2 * crate::unit::units_ahead(e).max(1);
    unit_no.abs_diff(r.last_whole_unit.load(Relaxed)) <= reach
}

/// Drop the clean copies of `refs` (pages of one locked unit). A copy in a 2 MiB
/// frame takes the unit's other clean copies in that frame with it: the frame's
/// memory goes only with its last page (zapping part would split its THP and keep
/// every later read into it in 4 KiB pages). Returns pages dropped; their frames are
/// appended to `frames`.
fn trim_unit(
    e: &Engine,
    r: &RegionInner,
    u: &UnitPages,
    unit_no: u64,
    refs: &[CachedRef],
    frames: &mut Vec<usize>,
) -> i64 {
    let first = unit_no * UNIT_PAGES as u64;
    let whole: Vec<CachedRef>;
    let in_huge_frame = r.policy.unit == UnitPolicy::Huge
        && refs.iter().any(|c| {
            e.cache
                .get(c.slot)
                .is_some_and(|en| e.frames.is_huge(en.frame))
        });
    let refs = if in_huge_frame {
        whole = (0..UNIT_PAGES)
            .filter_map(|k| match u.get(k) {
                PageState::Swapped(slot) => Some(CachedRef {
                    region: r.id,
                    page: first + k as u64,
                    slot,
                }),
                _ => None,
            })
            .collect();
        &whole[..]
    } else {
        refs
    };
    let mut freed = 0;
    for c in refs {
        if u.get(c.page as usize % UNIT_PAGES) != PageState::Swapped(c.slot) {
            continue;
        }
        let Some(en) = e.cache.remove_clean(c.slot) else {
            continue;
        };
        e.tiers.clear_cache(e, c.slot);
        frames.push(en.frame);
        freed += 1;
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(r: &Refaults, evicted: u64, refaulted: u64) -> bool {
        r.evicted(evicted);
        r.refaulted.fetch_add(refaulted, Relaxed);
        r.thrashing(REFAULT_WINDOW)
    }

    #[test]
    fn refaults_turn_thrashing_on_and_off_with_hysteresis() {
        let r = Refaults::default();
        assert!(!r.thrashing(REFAULT_WINDOW), "starts off");
        // Not a whole window yet: no verdict, however many came back.
        assert!(!window(&r, REFAULT_WINDOW - 1, REFAULT_WINDOW));
        assert!(window(&r, 1, 0), "over 1 in 8 came back: on");
        // Between 1 in 32 and 1 in 8: stays as it is.
        assert!(window(&r, REFAULT_WINDOW, REFAULT_WINDOW / 16));
        assert!(
            !window(&r, REFAULT_WINDOW, REFAULT_WINDOW / 64),
            "under 1 in 32: off"
        );
        assert!(!window(&r, REFAULT_WINDOW, REFAULT_WINDOW / 16));
        assert!(
            !window(&r, REFAULT_WINDOW, REFAULT_WINDOW / 8),
            "exactly 1 in 8: off"
        );
        assert!(window(&r, REFAULT_WINDOW, REFAULT_WINDOW / 8 + 1));
    }
}
