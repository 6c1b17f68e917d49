//! The reclaim lists: units with resident pages (a CLOCK) and clean pages in the
//! swap cache (oldest first), and trimming the latter.

use crate::budget::Gauge;
use crate::engine::Engine;
use crate::pagemap::{PageState, RegionInner, UnitPages};
use crate::slots::Slot;
use crate::{UnitPolicy, UNIT_PAGES};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
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

/// Put the unit of `page` on the reclaim list if it has resident pages and is not
/// there yet; note the peak. Called under the unit's lock.
pub(crate) fn lru_add(e: &Engine, r: &RegionInner, page: u64, u: &UnitPages) {
    let unit = r.unit_of(page);
    if u.resident > 0 && !unit.on_lru.swap(true, Relaxed) {
        let key = ((r.id as u64) << 32) | (page / UNIT_PAGES as u64);
        e.lists.lru().push_back(key);
    }
    e.budget.note_peak();
}

/// A clean copy joins the tail of the inactive list.
pub(crate) fn push_inactive(e: &Engine, region: u32, page: u64, slot: Slot) {
    e.lists
        .inactive()
        .push_back(CachedRef { region, page, slot });
}

/// Drop up to `need` clean cache pages, oldest first, with one zap per batch.
/// Returns pages freed.
pub(super) fn trim_inactive(e: &Engine, need: i64) -> i64 {
    let mut freed = 0;
    let mut busy: Vec<CachedRef> = Vec::new();
    while freed < need {
        let mut batch: Vec<CachedRef> = {
            let mut q = e.lists.inactive();
            let n = ((need - freed) as usize).min(q.len()).min(4096);
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            break;
        }
        batch.sort_by_key(|c| (c.region, c.page));
        let mut frames: Vec<usize> = Vec::new();
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
                let u = r.unit_of(batch[i].page).lock();
                if r.is_dead() {
                } else if u.unit_reads > 0 {
                    // Parts of a whole-unit read are still in flight: its completion
                    // looks at every page's copy. Later.
                    busy.extend_from_slice(&batch[i..j]);
                } else {
                    freed += trim_unit(e, &r, &u, unit_no, &batch[i..j], &mut frames);
                }
            }
            i = j;
        }
        // Under no unit lock: a frame is handed out again only after it is zapped.
        e.frames.free(&e.zapper, &frames);
        e.budget.uncharge(Gauge::Cached, frames.len() as i64);
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
        e.slots.clear_cache(c.slot);
        frames.push(en.frame);
        freed += 1;
    }
    freed
}
