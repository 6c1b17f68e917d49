//! The table of memory this library handed out from uswap regions: region base →
//! entry. Every function here runs with the "inside uswap" guard set (see
//! `crate::enter`), so the allocations the table itself makes go straight to glibc and
//! never come back here; the lock is never held while the engine is called.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use uswap::Region;

pub const PAGE: usize = 4096;

/// One block of uswap memory (a whole region, or an extent of a heap slab) and what
/// the program still uses of it.
pub struct Entry {
    pub region: Arc<Region>,
    /// Block length (a whole region: a 2 MiB multiple; a heap extent: pages).
    pub len: usize,
    /// Carved from the mid-size heap (`crate::heap`): given back there when unused.
    pub heap: bool,
    /// `Some(requested size)` for a malloc block (whose pointer is the region base).
    pub malloc_size: Option<usize>,
    /// Parts of the region's address range still mapped by the engine (a MAP_FIXED
    /// mapping placed over the region by the program takes its part away).
    pub owned: Vec<(usize, usize)>,
    /// Parts the program has mapped and not unmapped.
    pub live: Vec<(usize, usize)>,
    /// Never drop (a foreign MAP_FIXED mapping lies inside): leak it when unused.
    pub pinned: bool,
}

static TABLE: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());
/// Lowest region base and highest region end ever handed out: a quick "not ours".
static LO: AtomicUsize = AtomicUsize::new(usize::MAX);
static HI: AtomicUsize = AtomicUsize::new(0);

pub static REGIONS_CREATED: AtomicUsize = AtomicUsize::new(0);
pub static MALLOC_BLOCKS: AtomicUsize = AtomicUsize::new(0);
pub static MMAP_REGIONS: AtomicUsize = AtomicUsize::new(0);
pub static LIVE_REGIONS: AtomicUsize = AtomicUsize::new(0);
pub static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
pub static PEAK_LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Regions placed in the program's own reservations when it committed them.
pub static RESERVATION_REGIONS: AtomicUsize = AtomicUsize::new(0);
/// Blocks and mappings carved from the mid-size heap instead of a region each.
pub static HEAP_BLOCKS: AtomicUsize = AtomicUsize::new(0);

pub fn lock() -> MutexGuard<'static, BTreeMap<usize, Entry>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `[s, e)` may touch a region (false: certainly not).
pub fn may_overlap(s: usize, e: usize) -> bool {
    s < HI.load(Relaxed) && e > LO.load(Relaxed)
}

pub fn page_up(n: usize) -> usize {
    n.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// What a new entry is.
pub enum Kind {
    /// A malloc block of this requested size (its pointer is the block start).
    Malloc(usize),
    /// An mmap mapping of the program (`live_len` bytes of it mapped).
    Map,
    /// A region put into a reservation of the program when it committed part of it.
    Reservation,
}

/// Record a whole region as one block.
pub fn insert(region: Arc<Region>, kind: Kind, live_len: usize) -> usize {
    let (base, len) = (region.as_ptr() as usize, region.len());
    insert_block(region, base, len, false, kind, live_len)
}

/// Record a block `[base, base + len)` of `region` (a heap extent when `heap`).
pub fn insert_block(
    region: Arc<Region>,
    base: usize,
    len: usize,
    heap: bool,
    kind: Kind,
    live_len: usize,
) -> usize {
    LO.fetch_min(base, Relaxed);
    HI.fetch_max(base + len, Relaxed);
    if heap {
        HEAP_BLOCKS.fetch_add(1, Relaxed);
    } else {
        REGIONS_CREATED.fetch_add(1, Relaxed);
    }
    LIVE_REGIONS.fetch_add(1, Relaxed);
    let live = LIVE_BYTES.fetch_add(len, Relaxed) + len;
    PEAK_LIVE_BYTES.fetch_max(live, Relaxed);
    let malloc_size = match kind {
        Kind::Malloc(size) => {
            MALLOC_BLOCKS.fetch_add(1, Relaxed);
            Some(size)
        }
        Kind::Map => {
            MMAP_REGIONS.fetch_add(1, Relaxed);
            None
        }
        Kind::Reservation => {
            RESERVATION_REGIONS.fetch_add(1, Relaxed);
            None
        }
    };
    let entry = Entry {
        region,
        len,
        heap,
        malloc_size,
        owned: vec![(base, base + len)],
        live: vec![(base, base + live_len.min(len))],
        pinned: false,
    };
    lock().insert(base, entry);
    crate::mlock::on_new_block(base, live_len.min(len));
    base
}

fn retire(e: &Entry) {
    LIVE_REGIONS.fetch_sub(1, Relaxed);
    LIVE_BYTES.fetch_sub(e.len, Relaxed);
}

/// The malloc block at `p`: (region, requested size).
pub fn block(p: usize) -> Option<(Arc<Region>, usize)> {
    if !may_overlap(p, p + 1) {
        return None;
    }
    let t = lock();
    let e = t.get(&p)?;
    e.malloc_size.map(|s| (e.region.clone(), s))
}

pub fn set_block_size(p: usize, size: usize) {
    if let Some(e) = lock().get_mut(&p) {
        e.malloc_size = Some(size);
    }
}

/// Take the malloc block at `p` out of the table; the caller releases it (outside the
/// lock). None: not one of ours.
pub fn take_block(p: usize) -> Option<Released> {
    if !may_overlap(p, p + 1) {
        return None;
    }
    let mut t = lock();
    t.get(&p)?.malloc_size?;
    let e = t.remove(&p)?;
    retire(&e);
    Some(Released::of(p, e))
}

/// A block the program no longer uses at all: its region is dropped (unregistered and
/// unmapped) or, for a heap extent, the extent goes back to the heap.
pub enum Released {
    /// Dropping it destroys the region.
    Region { _region: Arc<Region> },
    Heap {
        base: usize,
        len: usize,
        region: Arc<Region>,
    },
}

impl Released {
    fn of(base: usize, e: Entry) -> Released {
        if e.heap {
            Released::Heap {
                base,
                len: e.len,
                region: e.region,
            }
        } else {
            Released::Region { _region: e.region }
        }
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        if let Released::Heap { base, len, region } = self {
            crate::heap::mid_release(*base, *len, region);
        }
    }
}

/// Remove `[s, e)` from a list of disjoint intervals.
pub fn subtract(v: &mut Vec<(usize, usize)>, s: usize, e: usize) {
    let mut out = Vec::with_capacity(v.len() + 1);
    for &(a, b) in v.iter() {
        if b <= s || a >= e {
            out.push((a, b));
            continue;
        }
        if a < s {
            out.push((a, s));
        }
        if b > e {
            out.push((e, b));
        }
    }
    *v = out;
}

fn intersects(v: &[(usize, usize)], s: usize, e: usize) -> bool {
    v.iter().any(|&(a, b)| a < e && b > s)
}

/// What an operation on `[s, e)` must do after the lock is released.
#[derive(Default)]
pub struct Plan {
    /// Parts of the range that are not ours: the kernel handles them.
    pub gaps: Vec<(usize, usize)>,
    /// (region, offset, len) to discard.
    pub discard: Vec<(Arc<Region>, usize, usize)>,
    /// Ranges the program unmapped in blocks that live on: PROT_NONE after their
    /// discard, so that a stray access gets SIGSEGV as on unmapped memory.
    pub holes: Vec<(usize, usize)>,
    /// Blocks no longer used at all.
    pub drop: Vec<Released>,
}

impl Plan {
    /// Carry out the discards, hole protection and drops (outside the lock).
    pub fn finish(self) {
        for (r, off, len) in self.discard {
            let _ = r.discard(off, len);
        }
        for (a, z) in self.holes {
            crate::sys::mprotect(a, z - a, libc::PROT_NONE);
        }
        drop(self.drop);
    }
}

/// `[s, e)` (inside one region) as (region, offset in it, len).
fn region_part(r: &Arc<Region>, s: usize, e: usize) -> (Arc<Region>, usize, usize) {
    (r.clone(), s - r.as_ptr() as usize, e - s)
}

/// Bases of the entries whose owned part meets `[s, e)`, ascending.
fn meeting(t: &BTreeMap<usize, Entry>, s: usize, e: usize) -> Vec<usize> {
    let mut v: Vec<usize> = t
        .range(..e)
        .rev()
        .take_while(|(b, en)| **b + en.len > s)
        .filter(|(_, en)| intersects(&en.owned, s, e))
        .map(|(b, _)| *b)
        .collect();
    v.reverse();
    v
}

/// Our pieces of `[s, e)` (clipped owned intervals, ascending) with their entry base,
/// and the gaps between them.
/// (entry base, start, end) of each of our pieces of a range.
type Pieces = Vec<(usize, usize, usize)>;

fn pieces(t: &BTreeMap<usize, Entry>, s: usize, e: usize) -> (Pieces, Vec<(usize, usize)>) {
    let mut ours = Vec::new();
    for b in meeting(t, s, e) {
        for &(a, z) in &t[&b].owned {
            let (ps, pe) = (a.max(s), z.min(e));
            if ps < pe {
                ours.push((b, ps, pe));
            }
        }
    }
    ours.sort_by_key(|p| p.1);
    let mut gaps = Vec::new();
    let mut cur = s;
    for &(_, ps, pe) in &ours {
        if ps > cur {
            gaps.push((cur, ps));
        }
        cur = cur.max(pe);
    }
    if cur < e {
        gaps.push((cur, e));
    }
    (ours, gaps)
}

/// munmap of `[s, e)` (page aligned). `fixed`: a MAP_FIXED mapping is about to replace
/// the range, so the engine gives up those addresses for good.
pub fn unmap(s: usize, e: usize, fixed: bool) -> Plan {
    let mut plan = Plan::default();
    let mut t = lock();
    let (ours, gaps) = pieces(&t, s, e);
    plan.gaps = gaps;
    let mut touched = Vec::new();
    for (b, ps, pe) in ours {
        let en = t.get_mut(&b).expect("entry");
        subtract(&mut en.live, ps, pe);
        if fixed {
            subtract(&mut en.owned, ps, pe);
            en.pinned = true;
        }
        plan.discard.push(region_part(&en.region, ps, pe));
        if !fixed {
            plan.holes.push((ps, pe));
        }
        touched.push(b);
    }
    touched.dedup();
    for b in touched {
        if t[&b].live.is_empty() {
            let en = t.remove(&b).expect("entry");
            retire(&en);
            // Its discards and holes are moot once it is dropped.
            plan.discard.retain(|(r, off, _)| {
                let a = r.as_ptr() as usize + off;
                !(Arc::ptr_eq(r, &en.region) && a >= b && a < b + en.len)
            });
            plan.holes.retain(|&(a, _)| !(a >= b && a < b + en.len));
            if en.pinned {
                // A foreign mapping lies inside: dropping would unmap it too. Keep the
                // block (its pages are discarded) for the rest of the process.
                for &(a, z) in &en.owned {
                    plan.discard.push(region_part(&en.region, a, z));
                    plan.holes.push((a, z));
                }
                std::mem::forget(en.region);
            } else {
                plan.drop.push(Released::of(b, en));
            }
        }
    }
    plan
}

/// madvise(DONTNEED/FREE/REMOVE) of `[s, e)`: discard our pieces.
pub fn discard(s: usize, e: usize) -> Plan {
    let t = lock();
    let (ours, gaps) = pieces(&t, s, e);
    let mut plan = Plan {
        gaps,
        ..Default::default()
    };
    for (b, ps, pe) in ours {
        plan.discard.push(region_part(&t[&b].region, ps, pe));
    }
    plan
}

/// A mapping the program placed over `[s, e)` (MAP_FIXED, anonymous private,
/// read-write or PROT_NONE): our pieces of it stay ours, their contents discarded
/// (a fresh mapping reads as zeros) and mapped for the program again. Returns the
/// pieces (to protect as asked, after the discards) and the gaps (the kernel's).
pub fn remap_fresh(s: usize, e: usize) -> (Plan, Vec<(usize, usize)>) {
    let mut t = lock();
    let (ours, gaps) = pieces(&t, s, e);
    let mut plan = Plan {
        gaps,
        ..Default::default()
    };
    let mut protect = Vec::new();
    for (b, ps, pe) in ours {
        let en = t.get_mut(&b).expect("entry");
        plan.discard.push(region_part(&en.region, ps, pe));
        add_live_to(en, ps, pe);
        protect.push((ps, pe));
    }
    (plan, protect)
}

/// The parts of `[s, e)` the program has mapped in our blocks (for mprotect), the
/// parts it unmapped (holes), and the gaps that are not ours.
pub type Parts = Vec<(usize, usize)>;
pub fn live_parts(s: usize, e: usize) -> (Parts, Parts, Parts) {
    let t = lock();
    let (ours, gaps) = pieces(&t, s, e);
    let (mut live, mut holes) = (Vec::new(), Vec::new());
    for (b, ps, pe) in ours {
        let mut rest = vec![(ps, pe)];
        for &(a, z) in &t[&b].live {
            let (ls, le) = (a.max(ps), z.min(pe));
            if ls < le {
                live.push((ls, le));
                subtract(&mut rest, ls, le);
            }
        }
        holes.extend(rest);
    }
    (live, holes, gaps)
}

/// Only the gaps of `[s, e)` (for advice that is a no-op on our memory).
pub fn gaps(s: usize, e: usize) -> Vec<(usize, usize)> {
    pieces(&lock(), s, e).1
}

/// What mremap finds at `[old, old + old_len)`.
pub enum Remap {
    /// Not ours at all.
    NotOurs,
    /// Partly ours, or across regions: refused.
    Mixed,
    /// Inside one region: its base, and whether `[old + old_len,
    /// old + new_len)` is free inside the region).
    Ours { base: usize, room: bool },
}

pub fn remap_target(old: usize, old_len: usize, new_len: usize) -> Remap {
    let t = lock();
    let end = old + old_len;
    let (ours, gaps) = pieces(&t, old, end);
    if ours.is_empty() {
        return Remap::NotOurs;
    }
    if !gaps.is_empty() || ours.iter().any(|p| p.0 != ours[0].0) {
        return Remap::Mixed;
    }
    let base = ours[0].0;
    let en = &t[&base];
    let new_end = old.saturating_add(new_len);
    let room = new_end <= base + en.len
        && !intersects(&en.live, end, new_end)
        && en.owned.iter().any(|&(a, z)| a <= end && z >= new_end);
    Remap::Ours { base, room }
}

/// Grow a live part in place: `[s, e)` becomes live.
pub fn add_live(base: usize, s: usize, e: usize) {
    if let Some(en) = lock().get_mut(&base) {
        add_live_to(en, s, e);
    }
}

fn add_live_to(en: &mut Entry, s: usize, e: usize) {
    en.live.push((s, e));
    en.live.sort_unstable();
    // Merge touching intervals.
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(en.live.len());
    for &(a, z) in &en.live {
        match out.last_mut() {
            Some(l) if l.1 >= a => l.1 = l.1.max(z),
            _ => out.push((a, z)),
        }
    }
    en.live = out;
}

#[cfg(test)]
mod tests {
    use super::subtract;

    #[test]
    fn subtract_cuts_head_middle_tail() {
        let mut v = vec![(0, 100)];
        subtract(&mut v, 0, 10);
        assert_eq!(v, [(10, 100)]);
        subtract(&mut v, 40, 50);
        assert_eq!(v, [(10, 40), (50, 100)]);
        subtract(&mut v, 90, 200);
        assert_eq!(v, [(10, 40), (50, 90)]);
        subtract(&mut v, 0, 1000);
        assert!(v.is_empty());
    }
}
