//! Reservations of the program: anonymous private PROT_NONE mappings of at least the
//! threshold (a JVM heap, its metaspace, an allocator's arena) that it commits later,
//! piece by piece, with mprotect or with mmap(MAP_FIXED) over them.
//!
//! When the program commits a piece, the 2 MiB chunks that hold it become a uswap
//! region placed at their own address (`Pool::region_at`) — grown to the 64 MiB cell
//! around them, as far as the reservation is still empty, so that a heap committed
//! bit by bit takes a few regions, not one per commit — and the region's parts the
//! program did not commit are made PROT_NONE again. From then on the region is a block
//! of the table like any other (`crate::table`). Here only the parts still empty
//! (reserved, PROT_NONE, never committed by the kernel) are kept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

const UNIT: usize = 2 << 20;
/// Regions in a reservation are grown to this grid.
const CELL: usize = 64 << 20;

/// Reservation start → its parts still empty (PROT_NONE, nothing committed), sorted.
static RESV: Mutex<BTreeMap<usize, Vec<(usize, usize)>>> = Mutex::new(BTreeMap::new());
static LO: AtomicUsize = AtomicUsize::new(usize::MAX);
static HI: AtomicUsize = AtomicUsize::new(0);

pub static RESERVATIONS: AtomicUsize = AtomicUsize::new(0);

fn lock() -> MutexGuard<'static, BTreeMap<usize, Vec<(usize, usize)>>> {
    RESV.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `[s, e)` may touch a reservation.
pub fn may_overlap(s: usize, e: usize) -> bool {
    s < HI.load(Relaxed) && e > LO.load(Relaxed)
}

/// The program reserved `[s, e)`.
pub fn record(s: usize, e: usize) {
    LO.fetch_min(s, Relaxed);
    HI.fetch_max(e, Relaxed);
    RESERVATIONS.fetch_add(1, Relaxed);
    lock().insert(s, vec![(s, e)]);
}

/// Apply `f` to the empty-part lists of the reservations that meet `[s, e)`, and
/// forget reservations left with no empty part.
fn each(s: usize, e: usize, mut f: impl FnMut(&mut Vec<(usize, usize)>)) {
    if !may_overlap(s, e) {
        return;
    }
    let mut t = lock();
    let keys: Vec<usize> = t
        .range(..e)
        .rev()
        .take_while(|(_, v)| v.last().is_some_and(|l| l.1 > s) || v.is_empty())
        .map(|(k, _)| *k)
        .collect();
    for k in keys {
        let v = t.get_mut(&k).expect("reservation");
        f(v);
        if v.is_empty() {
            t.remove(&k);
        }
    }
}

/// `[s, e)` is no longer empty reserved space: committed by the kernel, unmapped, or
/// given to a region.
pub fn taken(s: usize, e: usize) {
    each(s, e, |v| crate::table::subtract(v, s, e));
}

/// Ranges of `[s, e)` to turn into regions now that the program commits `[s, e)`:
/// 2 MiB-aligned runs of empty reservation covering what can be covered, grown to
/// their 64 MiB cell inside the empty part. They are taken out of the empty parts
/// (`give_back` if the region cannot be made).
pub fn take_for_commit(s: usize, e: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    each(s, e, |v| {
        let mut cut = Vec::new();
        for &(a, z) in v.iter() {
            let (cs, ce) = (s.max(a), e.min(z));
            if cs >= ce {
                continue;
            }
            // Chunks holding committed pages, inside the empty part.
            let lo = (a + UNIT - 1) & !(UNIT - 1);
            let hi = z & !(UNIT - 1);
            let first = (cs & !(UNIT - 1)).max(lo);
            let last = ((ce + UNIT - 1) & !(UNIT - 1)).min(hi);
            if first >= last {
                continue;
            }
            let rs = (first & !(CELL - 1)).max(lo);
            let re = ((last + CELL - 1) & !(CELL - 1)).min(hi);
            cut.push((rs, re));
        }
        for &(rs, re) in &cut {
            crate::table::subtract(v, rs, re);
        }
        out.extend(cut);
    });
    out
}

/// A range taken for a region that could not be made: empty reserved space again (the
/// engine leaves it mapped PROT_NONE).
pub fn give_back(s: usize, e: usize) {
    let mut t = lock();
    if let Some((_, v)) = t.range_mut(..=s).next_back() {
        v.push((s, e));
        v.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MB: usize = 1 << 20;

    #[test]
    fn commits_take_whole_chunks_grown_to_their_cell() {
        // A reservation at 1 GiB + 1 MiB (unaligned head), 200 MiB long.
        let base = (1 << 30) + MB;
        record(base, base + 200 * MB);
        // A 1 MiB commit in the middle: its 2 MiB chunk, grown to the 64 MiB cell.
        let got = take_for_commit(base + 99 * MB, base + 100 * MB);
        assert_eq!(got, vec![((1 << 30) + 64 * MB, (1 << 30) + 128 * MB)]);
        // Again in the same cell: nothing left to take there.
        assert!(take_for_commit(base + 99 * MB, base + 100 * MB).is_empty());
        // In the unaligned head chunk: only from the first whole chunk on.
        let got = take_for_commit(base, base + 4 * MB);
        assert_eq!(got, vec![((1 << 30) + 2 * MB, (1 << 30) + 64 * MB)]);
        // Committed by the kernel: not empty any more.
        taken(base + 150 * MB, base + 152 * MB);
        let got = take_for_commit(base + 150 * MB, base + 151 * MB);
        assert!(got.is_empty(), "{got:?}");
        // A region that could not be made gives its range back.
        let got = take_for_commit(base + 190 * MB, base + 191 * MB);
        assert_eq!(got.len(), 1);
        give_back(got[0].0, got[0].1);
        assert_eq!(take_for_commit(base + 190 * MB, base + 191 * MB), got);
    }
}
