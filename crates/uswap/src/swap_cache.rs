//! The swap cache: slot → the page being read, being written, or a clean copy kept
//! in RAM (the kernel's swap_address_space).
//!
//! The page's bytes live in a frame (see `frames`) that the entry owns until it
//! ends; this table says what state they are in and who owns them. An entry whose
//! I/O is in flight ends only when that I/O completes: if its page stops wanting
//! it meanwhile (discarded, region dropped), it becomes an orphan, and the
//! completion frees its frame and slot reference. It is sharded by 64 MiB trunks of
//! swap (16384 slots), like the kernel's per-trunk address spaces: with per-thread
//! clusters (seed 003) threads work in different trunks and never share a lock.
//!
//! Concurrent faults on one page cost one I/O: the first fault inserts a `Reading`
//! entry, later ones find it and only mark that a waiter needs the page mapped when
//! the read completes ([`SwapCache::fault_lookup`]).
//!
//! Lock order: a region unit's lock is always taken before a shard lock.

use crate::slots::Slot;
// Slots are dense integers: FxHash (one multiply) instead of SipHash, which took
// ~15% of a thread's time in 512-entry unit operations (perf, swap-w-seq --unit 2m).
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Slots per shard (64 MiB of swap).
pub const TRUNK_SLOTS: u64 = 16384;

/// Entries a shard's table keeps room for however empty it gets (a few KiB).
const SHARD_KEEP: usize = 128;

/// What the cached copy is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// A backend read into the shadow page is in flight.
    Reading,
    /// A backend write from the shadow page is in flight.
    Writing,
    /// The shadow page holds a copy identical to the slot.
    Clean,
}

/// Who owns the cached page: a region and a page index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Region id.
    pub region: u32,
    /// Page index within the region.
    pub page: u64,
}

/// One cached slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Owner of the page.
    pub owner: Owner,
    /// State of the copy.
    pub state: CacheState,
    /// Address of the 4 KiB frame that holds the page's bytes.
    pub frame: usize,
    /// The page no longer wants this copy (discarded or its region dropped while the
    /// I/O was in flight): the completion drops it.
    pub orphan: bool,
    /// Brought in by readahead and not yet asked for (a later hit counts `swap_ra_hit`).
    pub readahead: bool,
    /// A fault is waiting: map the page when the I/O completes.
    pub waiters: bool,
    /// A waiting fault is a write: map the page writable (dirty) at once.
    pub write: bool,
}

/// What a fault found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Nothing cached: the caller reads the page (and inserts a `Reading` entry).
    Miss,
    /// I/O in flight: the fault was recorded as a waiter; no new I/O.
    InFlight,
    /// A clean copy: the entry was removed and is returned; map it from its frame.
    Hit(Entry),
}

impl Entry {
    /// A new entry for `owner`'s page in `frame`.
    pub fn new(owner: Owner, state: CacheState, frame: usize) -> Entry {
        Entry {
            owner,
            state,
            frame,
            orphan: false,
            readahead: false,
            waiters: false,
            write: false,
        }
    }
}

/// The sharded table.
pub struct SwapCache {
    /// One shard per 64 MiB trunk of swap; each guards its own map.
    shards: Box<[Mutex<HashMap<Slot, Entry>>]>,
    /// Entries in the cache (any state).
    len: AtomicU64,
}

impl SwapCache {
    /// A cache for a swap of at most `max_slots` slots.
    pub fn new(max_slots: u64) -> Self {
        // Trunks beyond 4096 share shards (a swap area over 256 GiB).
        let n = max_slots.div_ceil(TRUNK_SLOTS).clamp(1, 4096) as usize;
        SwapCache {
            shards: (0..n).map(|_| Mutex::new(HashMap::default())).collect(),
            len: AtomicU64::new(0),
        }
    }

    fn shard(&self, slot: Slot) -> std::sync::MutexGuard<'_, HashMap<Slot, Entry>> {
        let i = (slot / TRUNK_SLOTS) as usize % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fault on a page swapped to `slot`: take a clean copy, or dedup against
    /// I/O in flight (the fault becomes a waiter), or nothing cached.
    pub fn fault_lookup(&self, slot: Slot, write: bool) -> Lookup {
        let mut s = self.shard(slot);
        match s.get_mut(&slot) {
            Some(e) if e.state == CacheState::Clean => {
                Lookup::Hit(self.take(&mut s, slot).expect("entry just seen"))
            }
            Some(e) => {
                e.waiters = true;
                e.write |= write;
                Lookup::InFlight
            }
            None => Lookup::Miss,
        }
    }

    /// A fault waits for `slot`'s copy, whatever its state (a part of a unit whose
    /// read is still in flight): the unit's last completion maps it. False if absent.
    pub fn mark_waiter(&self, slot: Slot, write: bool) -> bool {
        let mut s = self.shard(slot);
        match s.get_mut(&slot) {
            Some(e) => {
                e.waiters = true;
                e.write |= write;
                true
            }
            None => false,
        }
    }

    /// The page stopped wanting `slot`'s copy. A clean entry is removed and returned
    /// (the caller frees its frame); one with I/O in flight becomes an orphan and
    /// stays until its completion, which frees it (None is returned).
    pub fn orphan(&self, slot: Slot) -> Option<Entry> {
        let mut s = self.shard(slot);
        let e = s.get_mut(&slot)?;
        if e.state == CacheState::Clean {
            return self.take(&mut s, slot);
        }
        e.orphan = true;
        None
    }

    /// Insert an entry for a read ahead or a write; false (and nothing changed) if the
    /// slot is already cached.
    #[must_use]
    pub fn insert(&self, slot: Slot, entry: Entry) -> bool {
        let mut s = self.shard(slot);
        if s.contains_key(&slot) {
            return false;
        }
        s.insert(slot, entry);
        self.len.fetch_add(1, Relaxed);
        true
    }

    /// The entry for `slot`, if any.
    pub fn get(&self, slot: Slot) -> Option<Entry> {
        self.shard(slot).get(&slot).copied()
    }

    /// I/O on `slot` finished: if a fault waits, the entry is removed and returned with
    /// `waiters` set (map the page); otherwise it becomes `Clean` and is returned.
    pub fn complete_io(&self, slot: Slot) -> Option<Entry> {
        let mut s = self.shard(slot);
        let e = s.get_mut(&slot)?;
        if e.waiters {
            self.take(&mut s, slot)
        } else {
            e.state = CacheState::Clean;
            Some(*e)
        }
    }

    /// I/O on `slot` finished: the copy becomes `Clean`, whoever waits; the entry is
    /// returned as it was (for whole-unit reads, mapped together later).
    pub fn finish_io(&self, slot: Slot) -> Option<Entry> {
        let mut s = self.shard(slot);
        let e = s.get_mut(&slot)?;
        let before = *e;
        e.state = CacheState::Clean;
        Some(before)
    }

    /// Remove the entry for `slot` (any state).
    pub fn remove(&self, slot: Slot) -> Option<Entry> {
        self.take(&mut self.shard(slot), slot)
    }

    /// Remove `slot`'s entry from its locked shard `s`. A shard left a quarter full
    /// gives memory back (to twice its entries): each shard is 64 MiB of swap, the
    /// write cursor sweeps through them, and their tables kept the size of their
    /// busiest moment for the pool's life (~1 MiB per trunk written through, ~20 MiB
    /// outside the budget after a pmbench run on a 1 GiB region).
    fn take(&self, s: &mut HashMap<Slot, Entry>, slot: Slot) -> Option<Entry> {
        let e = s.remove(&slot)?;
        self.len.fetch_sub(1, Relaxed);
        if s.capacity() > SHARD_KEEP && s.len() * 4 < s.capacity() {
            s.shrink_to((s.len() * 2).max(SHARD_KEEP));
        }
        Some(e)
    }

    /// Remove the entry only if it is a clean copy nobody waits for (reclaim).
    pub fn remove_clean(&self, slot: Slot) -> Option<Entry> {
        let mut s = self.shard(slot);
        match s.get(&slot) {
            Some(e) if e.state == CacheState::Clean && !e.waiters && !e.orphan => {
                self.take(&mut s, slot)
            }
            _ => None,
        }
    }

    /// Remove every entry (a forked child, whose cache starts empty).
    pub fn drain(&self) -> Vec<(Slot, Entry)> {
        let mut out = Vec::new();
        for sh in self.shards.iter() {
            out.extend(sh.lock().unwrap_or_else(|p| p.into_inner()).drain());
        }
        self.len.store(0, Relaxed);
        out
    }

    /// Entries in the cache.
    pub fn len(&self) -> u64 {
        self.len.load(Relaxed)
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of shards (for tests and diagnostics).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: Owner = Owner { region: 1, page: 7 };

    fn reading(frame: usize) -> Entry {
        let mut e = Entry::new(O, CacheState::Reading, frame);
        e.waiters = true;
        e
    }

    /// What a fault handler does: look up, and on a miss insert the read's entry.
    fn fault(c: &SwapCache, slot: Slot) -> Lookup {
        let l = c.fault_lookup(slot, false);
        if l == Lookup::Miss && !c.insert(slot, reading(0x1000)) {
            return Lookup::InFlight;
        }
        l
    }

    /// A trunk filled whole and emptied again keeps a table of a few KiB, not one of
    /// 16k entries, and what is left stays findable through every shrink.
    #[test]
    fn an_emptied_shard_gives_its_table_back() {
        let c = SwapCache::new(4 * TRUNK_SLOTS);
        let trunk = TRUNK_SLOTS..2 * TRUNK_SLOTS;
        for slot in trunk.clone() {
            assert!(c.insert(slot, Entry::new(O, CacheState::Clean, 0x1000)));
        }
        let cap = |c: &SwapCache| c.shards[1].lock().unwrap().capacity();
        assert!(cap(&c) >= TRUNK_SLOTS as usize);
        // Keep every 64th entry; the others go by each way of removing.
        for (k, slot) in trunk.clone().enumerate() {
            if k % 64 == 0 {
                continue;
            }
            let gone = match k % 3 {
                0 => c.remove(slot),
                1 => c.remove_clean(slot),
                _ => match c.fault_lookup(slot, false) {
                    Lookup::Hit(e) => Some(e),
                    _ => None,
                },
            };
            assert!(gone.is_some(), "slot {slot}");
        }
        assert_eq!(c.len(), TRUNK_SLOTS / 64);
        assert!(
            cap(&c) <= 4 * (TRUNK_SLOTS as usize / 64),
            "capacity {}",
            cap(&c)
        );
        for slot in trunk.step_by(64) {
            assert!(c.get(slot).is_some(), "slot {slot} lost");
            assert!(c.remove(slot).is_some());
        }
        assert!(c.is_empty());
        assert!(cap(&c) <= 2 * SHARD_KEEP, "capacity {}", cap(&c));
    }

    #[test]
    fn concurrent_faults_cost_one_read() {
        let c = SwapCache::new(1 << 20);
        assert_eq!(fault(&c, 42), Lookup::Miss);
        // Second and third faults on the same slot: no new I/O.
        assert_eq!(fault(&c, 42), Lookup::InFlight);
        assert_eq!(fault(&c, 42), Lookup::InFlight);
        let e = c.complete_io(42).unwrap();
        assert!(e.waiters);
        assert!(c.is_empty());
    }

    #[test]
    fn dedup_under_threads() {
        let c = std::sync::Arc::new(SwapCache::new(1 << 20));
        let misses = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for slot in 0..2000u64 {
                        if fault(&c, slot) == Lookup::Miss {
                            misses.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(
            misses.load(Relaxed),
            2000,
            "each slot must be read exactly once"
        );
        assert_eq!(c.len(), 2000);
    }

    #[test]
    fn readahead_then_hit_and_reuse() {
        let c = SwapCache::new(1 << 20);
        let mut ra = Entry::new(O, CacheState::Reading, 0x2000);
        ra.readahead = true;
        assert!(c.insert(9, ra));
        assert!(!c.insert(9, ra), "double insert must be refused");
        // The read completes with nobody waiting: a clean readahead copy stays.
        assert_eq!(c.complete_io(9).unwrap().state, CacheState::Clean);
        match c.fault_lookup(9, false) {
            Lookup::Hit(e) => assert!(e.readahead && e.frame == 0x2000),
            other => panic!("expected a hit, got {other:?}"),
        }
        assert!(c.is_empty());
        // The slot can be cached again (reuse after free).
        assert_eq!(c.fault_lookup(9, false), Lookup::Miss);
    }

    #[test]
    fn writeback_then_fault_waits_then_reclaim_only_clean() {
        let c = SwapCache::new(1 << 20);
        let w = Entry::new(O, CacheState::Writing, 0x3000);
        assert!(c.insert(5, w));
        assert_eq!(
            c.remove_clean(5),
            None,
            "pages under writeback are not reclaimable"
        );
        c.complete_io(5);
        assert!(c.remove_clean(5).is_some());
        assert!(c.insert(6, w));
        assert_eq!(c.fault_lookup(6, true), Lookup::InFlight);
        let e = c.complete_io(6).unwrap();
        assert!(
            e.waiters && e.write,
            "a write fault waiting on writeback maps the page dirty"
        );
    }

    #[test]
    fn orphans_stay_until_their_io_completes() {
        let c = SwapCache::new(1 << 20);
        assert!(c.insert(7, Entry::new(O, CacheState::Writing, 0x4000)));
        assert_eq!(c.orphan(7), None, "in flight: stays, marked");
        assert!(c.get(7).unwrap().orphan);
        assert_eq!(c.remove_clean(7), None, "reclaim never takes an orphan");
        assert!(c.insert(8, Entry::new(O, CacheState::Clean, 0x5000)));
        assert_eq!(c.orphan(8).map(|e| e.frame), Some(0x5000), "clean: removed");
        assert!(c.get(8).is_none());
    }

    #[test]
    fn trunks_do_not_share_locks() {
        let c = SwapCache::new(64 * TRUNK_SLOTS);
        assert_eq!(c.shard_count(), 64);
    }
}
