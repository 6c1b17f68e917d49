//! Swap slot allocator, shaped like the kernel's `mm/swapfile.c`.
//!
//! A [`Slot`] is one 4 KiB page of the swap area; slot `s` lives at byte offset
//! `s * 4096`. Slots are grouped into clusters of [`CLUSTER_SLOTS`] (512 slots,
//! 2 MiB), so that a 2 MiB unit can leave in one write to one whole free cluster
//! (seeds 000/002) and so that threads allocating in different clusters never
//! touch the same lock or the same swap-cache shard (seed 003).
//!
//! # Per-slot state (the kernel's `swap_map`)
//!
//! Every slot has a reference count (how many page-map entries point at it: 1
//! after [`SlotAllocator::alloc`], +1 per [`SlotAllocator::dup`] after a fork)
//! and a `HAS_CACHE` flag (`SWAP_HAS_CACHE`: the swap cache holds a page for the
//! slot, including while its I/O is in flight). A slot is free only when its
//! count is 0 **and** `HAS_CACHE` is clear; [`SlotAllocator::put`] and
//! [`SlotAllocator::clear_cache`] report when that happens. Counts saturate at
//! [`MAX_COUNT`] (the kernel chains continuation pages instead; a slot pinned
//! at the ceiling is leaked rather than freed early, which is the safe failure).
//!
//! A slot marked bad with [`SlotAllocator::mark_bad`] (`SWAP_MAP_BAD`) is never
//! handed out again. It counts as **used** in [`SlotAllocator::used`] (it is not
//! free: nobody can get it) and separately in [`SlotAllocator::bad_slots`], so a
//! caller that wants "slots in use by pages" subtracts the two. Its cluster can
//! never again be wholly free, so [`SlotAllocator::alloc_cluster`] never returns
//! it: a 2 MiB write there would hit the bad page.
//!
//! # Cluster lists (kernel: `free_clusters`, `nonfull_clusters`, per-CPU cluster)
//!
//! Each cluster is in exactly one of these states:
//! - on the `free` list: wholly free, not owned by any cursor;
//! - on the `nonfull` list: partly used, not owned by any cursor;
//! - on no list, unowned: full (every slot used);
//! - on no list, **owned** by one cursor (kernel: a CPU's `percpu_cluster`),
//!   whatever its fill.
//!
//! The lists live under one global mutex. Per-slot counts, the cluster's used
//! count and its `owned` flag live under a per-cluster mutex, so count and
//! `HAS_CACHE` updates on different clusters never share a lock; the global lock
//! is taken only when a cluster changes category (becomes empty, partly used or
//! full) or changes hands, i.e. a few times per 512 slots.
//!
//! # Allocation policy
//!
//! [`AllocPolicy::Ssd`] mirrors `cluster_alloc_swap_entry()` /
//! `alloc_swap_scan_cluster()` with per-CPU clusters and the per-CPU next-scan
//! base `cluster_next_cpu` of seed 003 (`scan_swap_map_slots()`): every
//! [`SlotCursor`] (one per thread) owns a current cluster and hands out its slots
//! sequentially from a next offset, so one thread's consecutive allocations are
//! contiguous and different threads work in different clusters. When the
//! current cluster is used up the cursor gives it back (to `nonfull` if some of
//! its slots were freed meanwhile, to `free` if all were, to no list if full) and
//! takes another:
//! 1. the head of `nonfull`, so that partly used clusters are filled before whole
//!    free ones are broken up, keeping those for 2 MiB units (the kernel's
//!    per-order lists and fragmentation avoidance);
//! 2. else a free cluster, preferring the one at the cursor's next-scan base and
//!    the following ones up to the end of its 64 MiB trunk (so a cursor keeps
//!    walking its own stretch of the device, which starts at a random point as
//!    in seed 003's `1 + prandom_u32_max(highest_bit)`, and threads land in
//!    different swap-cache trunks); else the head of `free`;
//! 3. if both lists are empty, a linear scan for any free slot starting at the
//!    cursor's own next-scan base, wrapping around (seed 003's per-CPU
//!    `cluster_next_cpu`). By then every cluster is full or owned, so this finds
//!    the slots left in other cursors' current clusters (their owners skip slots
//!    taken under them).
//!
//! [`AllocPolicy::Rotational`] mirrors the kernel's HDD path (seed 003: "for HDD,
//! sequential access is more important", shared `si->cluster_next`): all threads
//! share ONE current cluster and ONE next-scan base, kept inside the allocator
//! under its own mutex, so consecutive allocations from any thread are
//! sequential on disk. A [`SlotCursor`] is then only a token.
//!
//! [`SlotAllocator::alloc_cluster`] takes a wholly free cluster off `free` (never
//! one owned by a cursor), like the kernel's order-9 (THP) allocation; callers
//! fall back to [`SlotAllocator::alloc`] and count `thp_swpout_fallback` when it
//! returns `None`. [`SlotAllocator::grow`] appends new clusters to `free`.
//!
//! # Lock order
//!
//! Rotational shared cursor → one cluster's mutex → the lists mutex. Code that
//! needs a list entry's cluster peeks at the list, drops the lists lock, locks
//! the cluster, relocks the lists and re-checks (clusters move between lists
//! only with both locks held, so the re-check is exact).

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Index of a 4 KiB page of the swap area (byte offset = slot * 4096).
pub type Slot = u64;

/// Slots per cluster: 512 × 4 KiB = 2 MiB, one 2 MiB unit.
pub const CLUSTER_SLOTS: u64 = 512;

/// Highest reference count a slot can hold; [`SlotAllocator::dup`] saturates here.
pub const MAX_COUNT: u32 = COUNT_MASK as u32;

/// `CLUSTER_SLOTS` as an index type.
const CS: usize = CLUSTER_SLOTS as usize;

/// Per-slot map value: low 14 bits are the count (kernel `swap_map` count).
const COUNT_MASK: u16 = 0x3fff;
/// Slot is bad and never handed out again (kernel `SWAP_MAP_BAD`).
const BAD: u16 = 0x4000;
/// The swap cache holds a page for this slot (kernel `SWAP_HAS_CACHE`).
const HAS_CACHE: u16 = 0x8000;

/// Clusters in segment 0 of the cluster table; segment k holds `SEG0 << k`.
/// Geometric segments let [`SlotAllocator::grow`] add clusters without moving
/// existing ones, so lookups need no table-wide lock.
const SEG0: u64 = 64;
/// Enough segments for `SEG0 * (2^32 - 1)` clusters, more than `MAX_CLUSTERS`.
const SEGMENTS: usize = 32;
/// Cluster indices are u32 (list links); `NIL` marks "no cluster".
const NIL: u32 = u32::MAX;
/// Most clusters one allocator can hold (u32 index with `NIL` spare): 8 EiB.
const MAX_CLUSTERS: u64 = (u32::MAX - 1) as u64;
/// Clusters per 64 MiB trunk: the unit the swap cache shards by. A cursor looking
/// for a free cluster near its scan base probes at most up to the end of its trunk.
const TRUNK_CLUSTERS: u64 = 32;

/// Which allocation strategy the allocator uses (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocPolicy {
    /// Per-cursor (per-thread) current cluster and next-scan base.
    Ssd,
    /// One shared current cluster and next-scan base, for sequential disk I/O.
    Rotational,
}

/// A run of contiguous slots `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRun {
    /// First slot of the run.
    pub start: Slot,
    /// Number of slots in the run.
    pub len: u32,
}

impl SlotRun {
    /// One past the last slot of the run.
    pub fn end(&self) -> Slot {
        self.start + u64::from(self.len)
    }

    /// The slots of the run.
    pub fn slots(&self) -> Range<Slot> {
        self.start..self.end()
    }
}

/// Which list a cluster is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListId {
    /// Full, or owned by a cursor.
    None,
    /// Wholly free.
    Free,
    /// Partly used.
    Nonfull,
}

/// The list a cluster with `used` used slots belongs on when nobody owns it.
fn category(used: u32) -> ListId {
    match used {
        0 => ListId::Free,
        u if u as usize >= CS => ListId::None,
        _ => ListId::Nonfull,
    }
}

/// Head/tail of an intrusive doubly linked list of cluster indices (links in [`Lists`]).
#[derive(Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl List {
    const fn new() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// The global cluster lists. Intrusive links give O(1) removal from the middle,
/// which a cluster changing category needs (kernel: `list_head` in `swap_cluster_info`).
#[derive(Debug)]
struct Lists {
    free: List,
    nonfull: List,
    /// Per cluster: the list it is on.
    on: Vec<ListId>,
    /// Per cluster: previous / next cluster on the same list, or `NIL`.
    prev: Vec<u32>,
    next: Vec<u32>,
}

impl Lists {
    fn list(&mut self, id: ListId) -> Option<&mut List> {
        match id {
            ListId::None => None,
            ListId::Free => Some(&mut self.free),
            ListId::Nonfull => Some(&mut self.nonfull),
        }
    }

    fn head(&self, id: ListId) -> Option<u32> {
        let h = match id {
            ListId::None => NIL,
            ListId::Free => self.free.head,
            ListId::Nonfull => self.nonfull.head,
        };
        (h != NIL).then_some(h)
    }

    fn push_back(&mut self, id: ListId, c: u32) {
        debug_assert_eq!(self.on[c as usize], ListId::None);
        let Some(list) = self.list(id) else { return };
        let tail = list.tail;
        list.tail = c;
        if tail == NIL {
            list.head = c;
        }
        list.len += 1;
        self.prev[c as usize] = tail;
        self.next[c as usize] = NIL;
        if tail != NIL {
            self.next[tail as usize] = c;
        }
        self.on[c as usize] = id;
    }

    fn unlink(&mut self, c: u32) {
        let id = self.on[c as usize];
        let (p, n) = (self.prev[c as usize], self.next[c as usize]);
        let Some(list) = self.list(id) else { return };
        if p == NIL {
            list.head = n;
        }
        if n == NIL {
            list.tail = p;
        }
        list.len -= 1;
        if p != NIL {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        self.on[c as usize] = ListId::None;
        self.prev[c as usize] = NIL;
        self.next[c as usize] = NIL;
    }
}

/// What a cluster's mutex guards.
struct ClusterState {
    /// Per-slot count | `BAD` | `HAS_CACHE`; 0 means free. Empty until the cluster
    /// is inside capacity (segments are allocated ahead of [`SlotAllocator::grow`]).
    map: Box<[u16]>,
    /// Slots with a non-zero map value (used, cached or bad).
    used: u32,
    /// A cursor (or the rotational shared cursor) owns this cluster; it is then on
    /// no list, and category changes leave the lists alone until it is released.
    owned: bool,
    /// Never hand out slots of this cluster again (after fork, another process may
    /// still read them: see [`SlotAllocator::freeze_below`]). On no list.
    frozen: bool,
}

/// One cluster.
struct Cluster {
    /// Guards this cluster's slot map, used count and owner flag, and nothing else.
    state: Mutex<ClusterState>,
    /// Copy of `state.used`, stored under `state`'s lock; read without it by the
    /// linear scan (to skip full clusters) and by statistics.
    used_hint: AtomicU32,
}

impl Cluster {
    fn empty() -> Self {
        Cluster {
            state: Mutex::new(ClusterState {
                map: Box::new([]),
                used: 0,
                owned: false,
                frozen: false,
            }),
            used_hint: AtomicU32::new(0),
        }
    }
}

/// Allocation state of one cursor (kernel: `percpu_cluster` + `cluster_next_cpu`).
#[derive(Debug, Clone, Copy)]
struct CursorState {
    /// Cluster this cursor owns and allocates from.
    cluster: Option<u32>,
    /// Next offset to try inside `cluster`.
    next: u32,
    /// Next-scan base: one past the last slot handed out.
    scan_base: Slot,
}

/// Lock a mutex, ignoring poisoning: every critical section here leaves the
/// state consistent before anything that can panic, and the allocator must keep
/// working (never panic in release) even if some other thread panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where another thread may slip in between peeking at a list and locking the
/// cluster found there. Tests yield here to make those interleavings common
/// (with few CPUs they would almost never happen); release code does nothing.
#[inline]
fn race_point() {
    #[cfg(test)]
    std::thread::yield_now();
}

/// splitmix64: spreads cursor sequence numbers into random-looking scan bases.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Append `slot` to the runs pushed in this call (from index `base` on),
/// extending the last one when contiguous.
fn push_slot(out: &mut Vec<SlotRun>, base: usize, slot: Slot) {
    if out.len() > base {
        if let Some(last) = out.last_mut() {
            if last.end() == slot && last.len < u32::MAX {
                last.len += 1;
                return;
            }
        }
    }
    out.push(SlotRun {
        start: slot,
        len: 1,
    });
}

/// The shared part of the allocator (cursors hold an `Arc` to it so that a
/// dropped cursor can give its cluster back).
struct Inner {
    policy: AllocPolicy,
    /// Capacity in slots (whole clusters). Written only by `grow` under
    /// `grow_lock`, after the new clusters' maps and list links exist.
    capacity: AtomicU64,
    /// Cluster table in geometric segments; a segment, once set, never moves.
    segments: [OnceLock<Box<[Cluster]>>; SEGMENTS],
    /// Guards the `free` / `nonfull` lists and per-cluster list membership.
    lists: Mutex<Lists>,
    /// Guards the single current cluster and next-scan base shared by all
    /// threads under [`AllocPolicy::Rotational`] (unused under `Ssd`).
    shared: Mutex<CursorState>,
    /// Serialises `grow` calls with each other (nothing else takes it).
    grow_lock: Mutex<()>,
    /// Cursors created so far; seeds each SSD cursor's scan base.
    cursor_seq: AtomicU64,
    /// Diagnostic: puts / clear_caches on slots that had nothing to drop.
    double_free: AtomicU64,
    /// Diagnostic: dup / set_cache on free slots, or any op on a slot beyond capacity.
    invalid: AtomicU64,
    /// Slots marked bad.
    bad: AtomicU64,
    /// Times a cluster joined the free list: what
    /// [`for_each_empty_cluster`](SlotAllocator::for_each_empty_cluster) finds changed.
    emptied: AtomicU64,
}

impl Inner {
    fn nclusters(&self) -> u64 {
        self.capacity.load(Ordering::Acquire) / CLUSTER_SLOTS
    }

    /// (segment, index in segment) of cluster `c`.
    fn seg_of(c: u64) -> (usize, usize) {
        let q = c / SEG0 + 1;
        let k = 63 - q.leading_zeros() as usize;
        let start = SEG0 * ((1u64 << k) - 1);
        (k, (c - start) as usize)
    }

    fn cluster(&self, c: u32) -> Option<&Cluster> {
        let (k, i) = Self::seg_of(u64::from(c));
        self.segments.get(k)?.get()?.get(i)
    }

    /// The cluster and offset of an in-range slot; counts and rejects others.
    fn locate(&self, slot: Slot) -> Option<(u32, usize)> {
        let cap = self.capacity.load(Ordering::Acquire);
        let ok = slot < cap;
        if !ok {
            self.invalid.fetch_add(1, Ordering::Relaxed);
        }
        debug_assert!(ok, "slot {slot} beyond capacity {cap}");
        ok.then_some((
            (slot / CLUSTER_SLOTS) as u32,
            (slot % CLUSTER_SLOTS) as usize,
        ))
    }

    /// Put unowned cluster `c` on the list matching its fill. Caller holds `c`'s lock.
    fn relink(&self, c: u32, g: &ClusterState) {
        let want = if g.owned || g.frozen {
            ListId::None
        } else {
            category(g.used)
        };
        let mut l = lock(&self.lists);
        if l.on[c as usize] != want {
            if want == ListId::Free {
                self.emptied.fetch_add(1, Ordering::Relaxed);
            }
            l.unlink(c);
            l.push_back(want, c);
        }
    }

    /// Run `f` on cluster `c`'s state under its lock, then publish the used count
    /// and move the cluster between lists if its category changed.
    fn with_cluster<R>(&self, c: u32, f: impl FnOnce(&mut ClusterState) -> R) -> Option<R> {
        let cl = self.cluster(c)?;
        let mut g = lock(&cl.state);
        if g.map.is_empty() {
            return None;
        }
        let before = category(g.used);
        let r = f(&mut g);
        cl.used_hint.store(g.used, Ordering::Relaxed);
        if !g.owned && category(g.used) != before {
            self.relink(c, &g);
        }
        Some(r)
    }

    /// Give a cursor's cluster back to the list matching its fill.
    fn release(&self, c: u32) {
        if let Some(cl) = self.cluster(c) {
            let mut g = lock(&cl.state);
            g.owned = false;
            self.relink(c, &g);
        }
    }

    /// A free cluster near `scan_base` (up to the end of its 64 MiB trunk), else
    /// the head of the free list. Caller holds the lists lock.
    fn pick_free(l: &Lists, scan_base: Slot, ncl: u64) -> Option<u32> {
        if ncl > 0 {
            let first = (scan_base / CLUSTER_SLOTS) % ncl;
            let trunk_end = ((first / TRUNK_CLUSTERS + 1) * TRUNK_CLUSTERS).min(ncl);
            for c in first..trunk_end {
                if l.on[c as usize] == ListId::Free {
                    return Some(c as u32);
                }
            }
        }
        l.head(ListId::Free)
    }

    /// Take a cluster for a cursor: `nonfull` first, then `free`. Marks it owned.
    fn acquire(&self, scan_base: Slot) -> Option<u32> {
        loop {
            let ncl = self.nclusters();
            let cand = {
                let l = lock(&self.lists);
                match l.head(ListId::Nonfull) {
                    Some(c) => c,
                    None => Self::pick_free(&l, scan_base, ncl)?,
                }
            };
            // Lock order is cluster → lists: re-check after relocking.
            race_point();
            let cl = self.cluster(cand)?;
            let mut g = lock(&cl.state);
            let mut l = lock(&self.lists);
            if !g.owned && !g.frozen && l.on[cand as usize] != ListId::None {
                l.unlink(cand);
                g.owned = true;
                return Some(cand);
            }
        }
    }

    /// Allocate up to `want` slots sequentially from the cursor's cluster.
    fn take_seq(
        &self,
        c: u32,
        st: &mut CursorState,
        want: usize,
        out: &mut Vec<SlotRun>,
        base: usize,
    ) -> usize {
        let cbase = u64::from(c) * CLUSTER_SLOTS;
        let r = self.with_cluster(c, |g| {
            if g.frozen {
                // Frozen under us by a fork: used up for this cursor.
                st.next = CS as u32;
                return 0;
            }
            let mut got = 0;
            let mut off = st.next as usize;
            while off < CS && got < want {
                if g.map[off] == 0 {
                    g.map[off] = 1;
                    g.used += 1;
                    push_slot(out, base, cbase + off as u64);
                    st.scan_base = cbase + off as u64 + 1;
                    got += 1;
                }
                off += 1;
            }
            st.next = off as u32;
            got
        });
        r.unwrap_or_else(|| {
            // Cannot happen (owned clusters are in range); treat as used up.
            st.next = CS as u32;
            0
        })
    }

    /// Linear scan for any free slots from the cursor's next-scan base, wrapping
    /// around once (kernel `scan_swap_map_slots()` with seed 003's scan base).
    fn scan(
        &self,
        st: &mut CursorState,
        want: usize,
        out: &mut Vec<SlotRun>,
        base: usize,
    ) -> usize {
        let ncl = self.nclusters();
        if ncl == 0 || want == 0 {
            return 0;
        }
        let start = st.scan_base % (ncl * CLUSTER_SLOTS);
        let (c0, off0) = (start / CLUSTER_SLOTS, (start % CLUSTER_SLOTS) as usize);
        let mut got = 0;
        // ncl + 1 steps: the last revisits the first cluster's part before `off0`.
        for i in 0..=ncl {
            let c = (c0 + i) % ncl;
            let (lo, hi) = match i {
                0 => (off0, CS),
                i if i == ncl => (0, off0),
                _ => (0, CS),
            };
            let Some(cl) = self.cluster(c as u32) else {
                continue;
            };
            if lo >= hi || cl.used_hint.load(Ordering::Relaxed) as usize >= CS {
                continue;
            }
            let cbase = c * CLUSTER_SLOTS;
            self.with_cluster(c as u32, |g| {
                if g.frozen {
                    return;
                }
                for off in lo..hi {
                    if got == want {
                        break;
                    }
                    if g.map[off] == 0 {
                        g.map[off] = 1;
                        g.used += 1;
                        push_slot(out, base, cbase + off as u64);
                        st.scan_base = cbase + off as u64 + 1;
                        got += 1;
                    }
                }
            });
            if got == want {
                break;
            }
        }
        got
    }

    /// The allocation loop shared by both policies (`st` is the cursor's own state
    /// on SSD, the shared state under its lock on rotational).
    fn alloc_in(&self, st: &mut CursorState, n: usize, out: &mut Vec<SlotRun>) -> usize {
        let base = out.len();
        let mut got = 0;
        while got < n {
            if let Some(c) = st.cluster {
                got += self.take_seq(c, st, n - got, out, base);
                if st.next as usize >= CS {
                    // Used up: hand it back now so freed slots in it can be reused
                    // by whoever takes it from `nonfull`.
                    self.release(c);
                    st.cluster = None;
                }
                continue;
            }
            if let Some(c) = self.acquire(st.scan_base) {
                st.cluster = Some(c);
                st.next = 0;
                continue;
            }
            got += self.scan(st, n - got, out, base);
            break;
        }
        got
    }

    /// Drop one reference (`put`) on slot `off` of a locked cluster.
    fn put_locked(&self, g: &mut ClusterState, off: usize) -> bool {
        let v = g.map[off];
        let ok = v & COUNT_MASK != 0;
        if !ok {
            self.double_free.fetch_add(1, Ordering::Relaxed);
        }
        debug_assert!(ok, "put on a slot with count 0 (map {v:#x})");
        if !ok {
            return false;
        }
        g.map[off] = v - 1;
        if g.map[off] == 0 {
            g.used -= 1;
            true
        } else {
            false
        }
    }
}

/// The slot allocator of one swap area. `Send + Sync`; share it with `Arc`.
pub struct SlotAllocator {
    inner: Arc<Inner>,
}

/// Per-thread allocation state (kernel: per-CPU cluster and scan base). Owned by
/// one thread and passed as `&mut`; dropping it gives its cluster back.
pub struct SlotCursor {
    /// Allocator this cursor belongs to (to release the cluster on drop).
    inner: Arc<Inner>,
    /// Current cluster, next offset, next-scan base (unused on rotational).
    st: CursorState,
}

impl Drop for SlotCursor {
    fn drop(&mut self) {
        if let Some(c) = self.st.cluster.take() {
            self.inner.release(c);
        }
    }
}

impl fmt::Debug for SlotCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotCursor")
            .field("cluster", &self.st.cluster)
            .field("next", &self.st.next)
            .field("scan_base", &self.st.scan_base)
            .finish()
    }
}

impl fmt::Debug for SlotAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotAllocator")
            .field("policy", &self.policy())
            .field("capacity", &self.capacity())
            .field("used", &self.used())
            .field("free_clusters", &self.free_clusters())
            .finish()
    }
}

impl SlotAllocator {
    /// An allocator for `capacity_slots` slots, rounded down to whole clusters.
    pub fn new(capacity_slots: u64, policy: AllocPolicy) -> Self {
        let inner = Inner {
            policy,
            capacity: AtomicU64::new(0),
            segments: std::array::from_fn(|_| OnceLock::new()),
            lists: Mutex::new(Lists {
                free: List::new(),
                nonfull: List::new(),
                on: Vec::new(),
                prev: Vec::new(),
                next: Vec::new(),
            }),
            shared: Mutex::new(CursorState {
                cluster: None,
                next: 0,
                scan_base: 0,
            }),
            grow_lock: Mutex::new(()),
            cursor_seq: AtomicU64::new(0),
            double_free: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            emptied: AtomicU64::new(0),
        };
        let a = SlotAllocator {
            inner: Arc::new(inner),
        };
        a.grow(capacity_slots);
        a
    }

    /// The allocation policy.
    pub fn policy(&self) -> AllocPolicy {
        self.inner.policy
    }

    /// Capacity in slots (a multiple of [`CLUSTER_SLOTS`]).
    pub fn capacity(&self) -> u64 {
        self.inner.capacity.load(Ordering::Acquire)
    }

    /// Grow to `new_capacity_slots` (rounded down to whole clusters) by appending
    /// clusters at the end, onto the free list. Never shrinks.
    pub fn grow(&self, new_capacity_slots: u64) {
        let inner = &*self.inner;
        let _g = lock(&inner.grow_lock);
        let old = inner.nclusters();
        let new = (new_capacity_slots / CLUSTER_SLOTS).min(MAX_CLUSTERS);
        if new <= old {
            return;
        }
        // 1. Maps: the new clusters are beyond capacity, nobody else touches them.
        for c in old..new {
            let (k, i) = Inner::seg_of(c);
            let seg = inner.segments[k]
                .get_or_init(|| (0..(SEG0 << k)).map(|_| Cluster::empty()).collect());
            let mut g = lock(&seg[i].state);
            g.map = vec![0u16; CS].into_boxed_slice();
            g.used = 0;
            g.owned = false;
        }
        // 2. List links must exist before any thread can reach the new clusters.
        {
            let mut l = lock(&inner.lists);
            l.on.resize(new as usize, ListId::None);
            l.prev.resize(new as usize, NIL);
            l.next.resize(new as usize, NIL);
        }
        // 3. Publish. A scan may now take slots in them before step 4; `relink`
        //    below then files each cluster by its real fill.
        inner.capacity.store(new * CLUSTER_SLOTS, Ordering::Release);
        // 4. Onto the lists (cluster → lists lock order).
        for c in old..new {
            if let Some(cl) = inner.cluster(c as u32) {
                let g = lock(&cl.state);
                inner.relink(c as u32, &g);
            }
        }
    }

    /// Freeze every cluster below `limit` (a slot number): their free slots are never
    /// handed out again, used ones keep their counts and can still be put. After
    /// fork, parent and child each allocate from new clusters only, because either
    /// may still read what the other wrote below the limit.
    pub fn freeze_below(&self, limit: Slot) {
        let inner = &*self.inner;
        let n = (limit / CLUSTER_SLOTS).min(inner.nclusters());
        for c in 0..n as u32 {
            if let Some(cl) = inner.cluster(c) {
                let mut g = lock(&cl.state);
                g.frozen = true;
                lock(&inner.lists).unlink(c);
            }
        }
    }

    /// New per-thread state. On SSD its next-scan base starts at a random-looking
    /// point of the device (seed 003); on rotational it is only a token.
    pub fn cursor(&self) -> SlotCursor {
        let seq = self.inner.cursor_seq.fetch_add(1, Ordering::Relaxed);
        let cap = self.capacity();
        let scan_base = match self.inner.policy {
            AllocPolicy::Ssd if cap > 0 => splitmix64(seq) % cap,
            _ => 0,
        };
        SlotCursor {
            inner: Arc::clone(&self.inner),
            st: CursorState {
                cluster: None,
                next: 0,
                scan_base,
            },
        }
    }

    /// Hand the cursor's current cluster back to the lists (e.g. before a thread
    /// goes idle), so that its free slots count in [`free_clusters`](Self::free_clusters)
    /// and other threads can use them. Under rotational, releases the shared cluster.
    pub fn release(&self, cur: &mut SlotCursor) {
        self.check_cursor(cur);
        let c = match self.inner.policy {
            AllocPolicy::Ssd => cur.st.cluster.take(),
            AllocPolicy::Rotational => lock(&self.inner.shared).cluster.take(),
        };
        if let Some(c) = c {
            self.inner.release(c);
        }
    }

    fn check_cursor(&self, cur: &SlotCursor) {
        assert!(
            Arc::ptr_eq(&cur.inner, &self.inner),
            "SlotCursor used with another SlotAllocator"
        );
    }

    /// Allocate up to `n` slots for one thread, appended to `out` as runs of contiguous slots,
    /// preferring contiguity (sequential within the cursor's current cluster). Returns how many
    /// were allocated (< n only when the device is full). Each allocated slot gets count 1.
    ///
    /// Runs pushed by this call are merged when contiguous; runs already in `out` are left alone.
    /// "Full" is judged by one pass over the device: a slot freed by another thread
    /// behind the scan may be missed until the next call.
    ///
    /// # Panics
    /// If `cur` was made by another allocator.
    pub fn alloc(&self, cur: &mut SlotCursor, n: usize, out: &mut Vec<SlotRun>) -> usize {
        self.check_cursor(cur);
        match self.inner.policy {
            AllocPolicy::Ssd => self.inner.alloc_in(&mut cur.st, n, out),
            AllocPolicy::Rotational => {
                let mut st = lock(&self.inner.shared);
                self.inner.alloc_in(&mut st, n, out)
            }
        }
    }

    /// One whole free cluster (512 contiguous slots, each count 1) for a 2 MiB unit; None when no
    /// cluster is wholly free (caller falls back to alloc() and counts thp_swpout_fallback).
    ///
    /// Never takes a cluster owned by a cursor, even an empty one.
    ///
    /// # Panics
    /// If `cur` was made by another allocator.
    pub fn alloc_cluster(&self, cur: &mut SlotCursor) -> Option<Slot> {
        self.check_cursor(cur);
        let inner = &*self.inner;
        loop {
            let cand = {
                let l = lock(&inner.lists);
                let scan_base = match inner.policy {
                    AllocPolicy::Ssd => cur.st.scan_base,
                    // Not worth the shared lock: any free cluster is equally good here.
                    AllocPolicy::Rotational => 0,
                };
                Inner::pick_free(&l, scan_base, inner.nclusters())?
            };
            race_point();
            let cl = inner.cluster(cand)?;
            let mut g = lock(&cl.state);
            let mut l = lock(&inner.lists);
            if g.owned || g.frozen || g.used != 0 || l.on[cand as usize] != ListId::Free {
                continue; // raced with another taker; look again
            }
            l.unlink(cand);
            drop(l);
            // Full and unowned: on no list, as `category` wants.
            g.map.fill(1);
            g.used = CLUSTER_SLOTS as u32;
            cl.used_hint.store(g.used, Ordering::Relaxed);
            return Some(u64::from(cand) * CLUSTER_SLOTS);
        }
    }

    /// Count += 1: a second owner of the slot (after fork). Saturates at [`MAX_COUNT`].
    pub fn dup(&self, slot: Slot) {
        let Some((c, off)) = self.inner.locate(slot) else {
            return;
        };
        let inner = &*self.inner;
        inner.with_cluster(c, |g| {
            let v = g.map[off];
            let ok = v & (COUNT_MASK | HAS_CACHE) != 0;
            if !ok {
                inner.invalid.fetch_add(1, Ordering::Relaxed);
            }
            debug_assert!(ok, "dup of free slot {slot}");
            let count = v & COUNT_MASK;
            debug_assert!(count < COUNT_MASK, "slot {slot} count overflow");
            if ok && count < COUNT_MASK {
                g.map[off] = v + 1;
            }
        });
    }

    /// Set `HAS_CACHE` (the swap cache holds a page for the slot, including while
    /// its I/O is in flight). The slot must be allocated; setting it twice is harmless.
    pub fn set_cache(&self, slot: Slot) {
        self.try_set_cache(slot);
    }

    /// Set `HAS_CACHE` if it was clear; false if it was already set (another thread
    /// is reading the slot in: the kernel's `swapcache_prepare()` returning -EEXIST)
    /// or the slot is free.
    pub fn try_set_cache(&self, slot: Slot) -> bool {
        let Some((c, off)) = self.inner.locate(slot) else {
            return false;
        };
        let inner = &*self.inner;
        inner
            .with_cluster(c, |g| {
                let v = g.map[off];
                let ok = v & (COUNT_MASK | HAS_CACHE) != 0;
                if !ok {
                    inner.invalid.fetch_add(1, Ordering::Relaxed);
                }
                debug_assert!(ok, "set_cache on free slot {slot}");
                if ok && v & HAS_CACHE == 0 {
                    g.map[off] = v | HAS_CACHE;
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false)
    }

    /// Clear `HAS_CACHE`; true if the slot became free.
    pub fn clear_cache(&self, slot: Slot) -> bool {
        self.clear_cache_with(slot, || ())
    }

    /// [`clear_cache`](Self::clear_cache); `on_free` runs when the slot became free,
    /// under its cluster's lock, so before anyone can be handed it again (what was kept
    /// for the old copy goes before a new copy can be kept).
    pub fn clear_cache_with(&self, slot: Slot, on_free: impl FnOnce()) -> bool {
        let Some((c, off)) = self.inner.locate(slot) else {
            return false;
        };
        let inner = &*self.inner;
        inner
            .with_cluster(c, |g| {
                let v = g.map[off];
                let ok = v & HAS_CACHE != 0;
                if !ok {
                    inner.double_free.fetch_add(1, Ordering::Relaxed);
                }
                debug_assert!(ok, "clear_cache on slot {slot} without HAS_CACHE");
                if !ok {
                    return false;
                }
                g.map[off] = v & !HAS_CACHE;
                if g.map[off] == 0 {
                    g.used -= 1;
                    on_free();
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false)
    }

    /// Count -= 1; true if the slot became free (count 0 and no `HAS_CACHE`).
    ///
    /// A put on a slot whose count is already 0 is a caller bug: it debug-asserts,
    /// and in release is ignored and counted in [`double_frees`](Self::double_frees).
    pub fn put(&self, slot: Slot) -> bool {
        self.put_with(slot, || ())
    }

    /// [`put`](Self::put); `on_free` runs when the slot became free, under its
    /// cluster's lock (as in [`clear_cache_with`](Self::clear_cache_with)).
    pub fn put_with(&self, slot: Slot, on_free: impl FnOnce()) -> bool {
        let Some((c, off)) = self.inner.locate(slot) else {
            return false;
        };
        self.inner
            .with_cluster(c, |g| {
                let freed = self.inner.put_locked(g, off);
                if freed {
                    on_free();
                }
                freed
            })
            .unwrap_or(false)
    }

    /// [`put`](Self::put) for every slot of `[start, start + len)` (e.g. a 2 MiB
    /// cluster), with one lock round trip per cluster spanned.
    pub fn put_run(&self, start: Slot, len: u32) {
        let end = start + u64::from(len);
        let mut s = start;
        while s < end {
            let Some((c, off)) = self.inner.locate(s) else {
                return;
            };
            let chunk_end = ((u64::from(c) + 1) * CLUSTER_SLOTS).min(end);
            let n = (chunk_end - s) as usize;
            self.inner.with_cluster(c, |g| {
                for o in off..off + n {
                    self.inner.put_locked(g, o);
                }
            });
            s = chunk_end;
        }
    }

    /// Never hand this slot out again (an I/O error hit it). Its count and
    /// `HAS_CACHE` keep working; when both drop to zero the slot stays used.
    /// Bad slots count in [`used`](Self::used) and in [`bad_slots`](Self::bad_slots).
    pub fn mark_bad(&self, slot: Slot) {
        let Some((c, off)) = self.inner.locate(slot) else {
            return;
        };
        let inner = &*self.inner;
        inner.with_cluster(c, |g| {
            let v = g.map[off];
            if v == 0 {
                g.used += 1;
            }
            if v & BAD == 0 {
                inner.bad.fetch_add(1, Ordering::Relaxed);
            }
            g.map[off] = v | BAD;
        });
    }

    /// The slot's reference count (without `HAS_CACHE`); 0 for a free slot.
    pub fn count(&self, slot: Slot) -> u32 {
        self.map_value(slot)
            .map_or(0, |v| u32::from(v & COUNT_MASK))
    }

    /// Whether the slot has `HAS_CACHE` set.
    pub fn has_cache(&self, slot: Slot) -> bool {
        self.map_value(slot).is_some_and(|v| v & HAS_CACHE != 0)
    }

    /// Whether the slot is marked bad.
    pub fn is_bad(&self, slot: Slot) -> bool {
        self.map_value(slot).is_some_and(|v| v & BAD != 0)
    }

    fn map_value(&self, slot: Slot) -> Option<u16> {
        let (c, off) = self.inner.locate(slot)?;
        let cl = self.inner.cluster(c)?;
        let g = lock(&cl.state);
        g.map.get(off).copied()
    }

    /// Slots not free (count > 0, `HAS_CACHE`, or bad). Sums per-cluster counters
    /// without locking: exact when no thread is changing slots.
    pub fn used(&self) -> u64 {
        let ncl = self.inner.nclusters();
        (0..ncl)
            .filter_map(|c| self.inner.cluster(c as u32))
            .map(|cl| u64::from(cl.used_hint.load(Ordering::Relaxed)))
            .sum()
    }

    /// Times a cluster became wholly free: unchanged since a
    /// [`for_each_empty_cluster`](Self::for_each_empty_cluster) walk, a new walk finds
    /// nothing that one did not.
    pub fn clusters_emptied(&self) -> u64 {
        self.inner.emptied.load(Ordering::Relaxed)
    }

    /// Run `f(first slot)` for every cluster with no slot in use, no cursor allocating
    /// from it and not frozen, under that cluster's lock: nothing can be written there
    /// until `f` returns (what it finds there is dead).
    pub fn for_each_empty_cluster(&self, mut f: impl FnMut(Slot)) {
        for c in 0..self.inner.nclusters() as u32 {
            let Some(cl) = self.inner.cluster(c) else {
                continue;
            };
            if cl.used_hint.load(Ordering::Relaxed) != 0 {
                continue;
            }
            let g = lock(&cl.state);
            if g.used == 0 && !g.owned && !g.frozen && !g.map.is_empty() {
                f(u64::from(c) * CLUSTER_SLOTS);
            }
        }
    }

    /// Free slots: `capacity() - used()`.
    pub fn free_slots(&self) -> u64 {
        self.capacity().saturating_sub(self.used())
    }

    /// Wholly free clusters on the free list, i.e. what
    /// [`alloc_cluster`](Self::alloc_cluster) can get. A cursor's current cluster
    /// is not counted even when empty; drop the cursor or [`release`](Self::release) it.
    pub fn free_clusters(&self) -> u64 {
        lock(&self.inner.lists).free.len
    }

    /// Partly used clusters on the nonfull list.
    pub fn nonfull_clusters(&self) -> u64 {
        lock(&self.inner.lists).nonfull.len
    }

    /// Slots marked bad.
    pub fn bad_slots(&self) -> u64 {
        self.inner.bad.load(Ordering::Relaxed)
    }

    /// Diagnostic: puts on slots with count 0 and clear_caches without `HAS_CACHE`
    /// (ignored in release builds).
    pub fn double_frees(&self) -> u64 {
        self.inner.double_free.load(Ordering::Relaxed)
    }

    /// Diagnostic: dup / set_cache on free slots and operations on slots beyond
    /// capacity (ignored in release builds).
    pub fn invalid_ops(&self) -> u64 {
        self.inner.invalid.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn slots_of(runs: &[SlotRun]) -> Vec<Slot> {
        runs.iter().flat_map(|r| r.slots()).collect()
    }

    fn alloc_vec(a: &SlotAllocator, cur: &mut SlotCursor, n: usize) -> Vec<Slot> {
        let mut out = Vec::new();
        let got = a.alloc(cur, n, &mut out);
        let s = slots_of(&out);
        assert_eq!(s.len(), got);
        s
    }

    /// Tiny xorshift so the tests need no crates.
    struct Rng(u64);
    impl Rng {
        fn step(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.step() % n
        }
    }

    #[test]
    fn shareable_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<SlotAllocator>();
        send::<SlotCursor>();
    }

    #[test]
    fn capacity_rounds_down_and_grow_appends() {
        let a = SlotAllocator::new(3 * 512 + 100, AllocPolicy::Ssd);
        assert_eq!(a.capacity(), 3 * 512);
        assert_eq!(a.free_clusters(), 3);
        a.grow(100); // never shrinks
        assert_eq!(a.capacity(), 3 * 512);
        // Crosses segment 0 (64 clusters) into segments 1 and 2.
        a.grow(200 * 512);
        assert_eq!(a.capacity(), 200 * 512);
        assert_eq!(a.free_clusters(), 200);
        let mut cur = a.cursor();
        let top = a.capacity() - 1;
        // Fill everything and check the last slot is reachable.
        let s = alloc_vec(&a, &mut cur, 200 * 512);
        assert_eq!(s.len(), 200 * 512);
        assert!(s.contains(&top));
        assert_eq!(a.used(), 200 * 512);
    }

    #[test]
    fn alloc_512_is_one_run() {
        for policy in [AllocPolicy::Ssd, AllocPolicy::Rotational] {
            let a = SlotAllocator::new(8 * 512, policy);
            let mut cur = a.cursor();
            let mut out = Vec::new();
            assert_eq!(a.alloc(&mut cur, 512, &mut out), 512);
            assert_eq!(out.len(), 1, "{policy:?}: {out:?}");
            assert_eq!(out[0].len, 512);
            assert_eq!(out[0].start % 512, 0);
            assert_eq!(a.used(), 512);
            for s in out[0].slots() {
                assert_eq!(a.count(s), 1);
            }
        }
    }

    #[test]
    fn clusters_emptied_counts_each_cluster_that_becomes_free() {
        for policy in [AllocPolicy::Ssd, AllocPolicy::Rotational] {
            let a = SlotAllocator::new(8 * 512, policy);
            let mut cur = a.cursor();
            let mut out = Vec::new();
            assert_eq!(a.alloc(&mut cur, 512, &mut out), 512);
            let run = out[0];
            drop(cur);
            let before = a.clusters_emptied();
            let mut slots = run.slots();
            let first = slots.next().unwrap();
            for s in slots {
                a.put(s);
            }
            assert_eq!(
                a.clusters_emptied(),
                before,
                "{policy:?}: one slot still used"
            );
            a.put(first);
            assert_eq!(a.clusters_emptied(), before + 1, "{policy:?}");
            let mut found = 0;
            a.for_each_empty_cluster(|_| found += 1);
            assert_eq!(found, 8, "{policy:?}");
        }
    }

    #[test]
    fn ssd_cursors_get_different_clusters() {
        let a = SlotAllocator::new(64 * 512, AllocPolicy::Ssd);
        let mut c1 = a.cursor();
        let mut c2 = a.cursor();
        let s1 = alloc_vec(&a, &mut c1, 10);
        let s2 = alloc_vec(&a, &mut c2, 10);
        let s1b = alloc_vec(&a, &mut c1, 10);
        // Each cursor is sequential in its own cluster...
        assert_eq!(s1b[0], s1[9] + 1);
        assert!(s1.windows(2).all(|w| w[1] == w[0] + 1));
        // ...and the clusters differ.
        assert_ne!(s1[0] / 512, s2[0] / 512);
    }

    #[test]
    fn rotational_cursors_interleave_consecutively() {
        let a = SlotAllocator::new(8 * 512, AllocPolicy::Rotational);
        let mut c1 = a.cursor();
        let mut c2 = a.cursor();
        let mut all = Vec::new();
        for i in 0..600 {
            let cur = if i % 2 == 0 { &mut c1 } else { &mut c2 };
            all.extend(alloc_vec(&a, cur, 1));
        }
        // 600 allocations alternating between cursors are slots 0..600 in order
        // (crossing from cluster 0 into cluster 1).
        assert_eq!(all, (0..600).collect::<Vec<_>>());
    }

    #[test]
    fn reuse_full_and_free_all() {
        let a = SlotAllocator::new(4 * 512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let mut held = alloc_vec(&a, &mut cur, 1000);
        assert_eq!(held.len(), 1000);
        // Free 100 of them; filling the device must hand those out again.
        let freed: Vec<Slot> = held.drain(..100).collect();
        for &s in &freed {
            assert!(a.put(s));
        }
        let rest = alloc_vec(&a, &mut cur, 5000);
        assert_eq!(
            rest.len(),
            4 * 512 - 900,
            "alloc returns fewer only when full"
        );
        for s in &freed {
            assert!(rest.contains(s), "freed slot {s} not reused");
        }
        assert_eq!(a.used(), 4 * 512);
        assert_eq!(alloc_vec(&a, &mut cur, 1).len(), 0);
        held.extend(rest);
        let mut sorted = held.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4 * 512, "no slot handed out twice");
        for s in held {
            assert!(a.put(s));
        }
        assert_eq!(a.used(), 0);
        drop(cur);
        assert_eq!(a.free_clusters(), a.capacity() / 512);
        assert_eq!(a.nonfull_clusters(), 0);
    }

    #[test]
    fn has_cache_semantics() {
        let a = SlotAllocator::new(512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.set_cache(s);
        assert!(!a.try_set_cache(s), "second swapcache_prepare must lose");
        assert!(!a.put(s), "count 0 but HAS_CACHE: not free");
        assert_eq!(a.count(s), 0);
        assert!(a.has_cache(s));
        assert_eq!(a.used(), 1);
        assert!(a.clear_cache(s), "now free");
        assert_eq!(a.used(), 0);

        // Cache cleared first, then the last put frees.
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.set_cache(s);
        assert!(!a.clear_cache(s));
        assert!(a.put(s));

        // dup then two puts.
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.dup(s);
        assert_eq!(a.count(s), 2);
        assert!(!a.put(s));
        assert_eq!(a.count(s), 1);
        assert!(a.put(s));
        assert_eq!(a.used(), 0);
        assert_eq!(a.double_frees(), 0);
    }

    /// What is kept for a slot goes exactly when the slot becomes free, whichever of its
    /// last put and its cache bit goes last, and before the slot can be handed out again
    /// (the callback runs under the cluster lock that allocation takes).
    #[test]
    fn on_free_runs_once_when_the_slot_becomes_free() {
        let a = SlotAllocator::new(512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let calls = std::cell::Cell::new(0);
        let seen_used = std::cell::Cell::new(u64::MAX);
        let on_free = || {
            calls.set(calls.get() + 1);
            // Still one used slot for every other thread: not yet free to take.
            seen_used.set(
                a.inner
                    .cluster(0)
                    .map_or(0, |c| c.used_hint.load(Ordering::Relaxed) as u64),
            );
        };
        // Put first while cached: the cache bit's clearing frees it.
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.set_cache(s);
        assert!(!a.put_with(s, on_free));
        assert_eq!(calls.get(), 0, "freed while the cache still holds it");
        assert!(a.clear_cache_with(s, on_free));
        assert_eq!(calls.get(), 1);
        assert_eq!(seen_used.get(), 1, "ran after the slot was handed back");
        // Cache bit first: the put frees it.
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.set_cache(s);
        assert!(!a.clear_cache_with(s, on_free));
        assert_eq!(calls.get(), 1);
        assert!(a.put_with(s, on_free));
        assert_eq!(calls.get(), 2);
        // Two references: only the last.
        let s = alloc_vec(&a, &mut cur, 1)[0];
        a.dup(s);
        assert!(!a.put_with(s, on_free));
        assert!(a.put_with(s, on_free));
        assert_eq!(calls.get(), 3);
        assert_eq!(a.used(), 0);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "put on a slot with count 0")]
    fn double_put_debug_asserts() {
        let a = SlotAllocator::new(512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let s = alloc_vec(&a, &mut cur, 1)[0];
        assert!(a.put(s));
        a.put(s);
    }

    #[cfg(not(debug_assertions))]
    #[test]
    fn double_put_is_counted_in_release() {
        let a = SlotAllocator::new(512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let s = alloc_vec(&a, &mut cur, 1)[0];
        assert!(a.put(s));
        assert!(!a.put(s));
        assert_eq!(a.double_frees(), 1);
        assert_eq!(a.used(), 0);
        // The slot is still usable exactly once.
        let again = alloc_vec(&a, &mut cur, 512);
        assert_eq!(again.len(), 512);
    }

    #[test]
    fn alloc_cluster_fragmentation() {
        let a = SlotAllocator::new(8 * 512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        // Fill everything, then free all but one slot in each cluster:
        // 8*511 slots free, yet no cluster is wholly free.
        let all = alloc_vec(&a, &mut cur, 8 * 512);
        assert_eq!(all.len(), 8 * 512);
        for &s in &all {
            if s % 512 != 7 {
                a.put(s);
            }
        }
        drop(cur);
        let mut cur = a.cursor();
        assert_eq!(a.free_slots(), 8 * 511);
        assert_eq!(a.free_clusters(), 0);
        assert_eq!(a.alloc_cluster(&mut cur), None);
        // Empty cluster 3: it becomes whole again and alloc_cluster gets it.
        assert!(a.put(3 * 512 + 7));
        assert_eq!(a.free_clusters(), 1);
        let c = a.alloc_cluster(&mut cur);
        assert_eq!(c, Some(3 * 512));
        for s in 3 * 512..4 * 512 {
            assert_eq!(a.count(s), 1);
        }
        assert_eq!(a.alloc_cluster(&mut cur), None);
        // Giving the 2 MiB unit back in one call makes the cluster free again.
        a.put_run(3 * 512, 512);
        assert_eq!(a.free_clusters(), 1);
        assert_eq!(a.alloc_cluster(&mut cur), Some(3 * 512));
    }

    #[test]
    fn small_allocs_prefer_nonfull_and_leave_clusters() {
        // 16 clusters. Hold 2 MiB units and scattered 4 KiB slots; free a random
        // half of the 4 KiB slots every round. As long as the 4 KiB data fits in
        // the partly used clusters, alloc_cluster must keep succeeding.
        let a = SlotAllocator::new(16 * 512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let mut rng = Rng(0x1234_5678);
        let mut small: Vec<Slot> = Vec::new();
        let mut units: Vec<Slot> = Vec::new();
        for round in 0..200 {
            // Keep 4 KiB data around 3 clusters' worth.
            let n = 3 * 512 - small.len().min(3 * 512);
            small.extend(alloc_vec(&a, &mut cur, n));
            // 4 KiB data occupies at most ~4 clusters (3 clusters of data spread
            // over partly used clusters plus the cursor's), and units at most 8:
            // there must be a free cluster for the unit.
            if units.len() < 8 {
                let u = a.alloc_cluster(&mut cur);
                assert!(
                    u.is_some(),
                    "round {round}: no free cluster; free={} nonfull={} used={}",
                    a.free_clusters(),
                    a.nonfull_clusters(),
                    a.used()
                );
                units.push(u.unwrap_or(0));
            } else {
                let u = units.swap_remove(rng.below(units.len() as u64) as usize);
                a.put_run(u, 512);
            }
            // Free a random half of the small slots.
            let mut keep = Vec::new();
            for s in small.drain(..) {
                if rng.below(2) == 0 {
                    assert!(a.put(s));
                } else {
                    keep.push(s);
                }
            }
            small = keep;
        }
        // Sanity on the premise: without nonfull-first, the cursor would break
        // whole clusters every round; with it, 4 KiB data stays compact.
        let small_clusters: std::collections::HashSet<u64> =
            small.iter().map(|s| s / 512).collect();
        assert!(
            small_clusters.len() <= 8,
            "4 KiB data spread over {} clusters",
            small_clusters.len()
        );
    }

    #[test]
    fn bad_slot_never_returned() {
        let a = SlotAllocator::new(2 * 512, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let s = alloc_vec(&a, &mut cur, 10);
        let bad = s[4];
        a.mark_bad(bad);
        assert!(!a.put(bad), "a bad slot never becomes free");
        // A free slot can be marked bad too.
        let free_bad = bad + 100;
        a.mark_bad(free_bad);
        assert_eq!(a.bad_slots(), 2);
        for &x in &s {
            if x != bad {
                assert!(a.put(x));
            }
        }
        drop(cur);
        for round in 0..3 {
            let mut cur = a.cursor();
            let got = alloc_vec(&a, &mut cur, 2 * 512);
            assert_eq!(got.len(), 2 * 512 - 2, "round {round}");
            assert!(!got.contains(&bad) && !got.contains(&free_bad));
            for x in got {
                assert!(a.put(x));
            }
        }
        assert_eq!(a.used(), 2, "bad slots count as used");
        // Its cluster can never be a whole 2 MiB unit again.
        let mut cur = a.cursor();
        let u = a.alloc_cluster(&mut cur);
        assert_eq!(u, Some(512 * (1 - bad / 512)));
        assert_eq!(a.alloc_cluster(&mut cur), None);
    }

    #[test]
    fn rotational_reuses_nonfull_in_list_order() {
        let a = SlotAllocator::new(2 * 512, AllocPolicy::Rotational);
        let mut cur = a.cursor();
        let all = alloc_vec(&a, &mut cur, 1024);
        assert_eq!(all, (0..1024).collect::<Vec<_>>());
        // Free two slots in cluster 0 and one in cluster 1: cluster 0 is taken
        // back from nonfull first (its head), giving 5 and 9, then cluster 1's.
        for s in [9, 5, 700] {
            assert!(a.put(s));
        }
        let got = alloc_vec(&a, &mut cur, 3);
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![5, 9, 700]);
    }

    #[test]
    fn ssd_scan_takes_slots_left_in_other_cursors_cluster() {
        let a = SlotAllocator::new(2 * 512, AllocPolicy::Ssd);
        let mut ca = a.cursor();
        let mut cb = a.cursor();
        let sb = alloc_vec(&a, &mut cb, 10);
        let yb = sb[0] / 512;
        assert_eq!(sb, (yb * 512..yb * 512 + 10).collect::<Vec<_>>());
        // A fills the other cluster, then finds both lists empty and scans from
        // its base: the only free slots are the 502 after B's next offset.
        let sa = alloc_vec(&a, &mut ca, 2000);
        assert_eq!(sa.len(), 512 + 502, "its own cluster, then the scan");
        assert!(sa.contains(&(yb * 512 + 10)) && sa.contains(&(yb * 512 + 511)));
        assert_eq!(a.used(), 1024);
        // Free one of A's slots inside B's cluster: B still owns it, so it stays
        // off the lists and only A's scan can find the slot again.
        assert!(a.put(yb * 512 + 300));
        assert_eq!(a.nonfull_clusters(), 0);
        assert_eq!(alloc_vec(&a, &mut ca, 5), vec![yb * 512 + 300]);
        // B's own next slots were all taken under it: it must skip them, give the
        // (full) cluster back, and find the device full.
        assert_eq!(alloc_vec(&a, &mut cb, 1).len(), 0);
        assert_eq!(a.used(), 1024);
        // Now unowned: a freed slot there puts the cluster on nonfull.
        assert!(a.put(yb * 512 + 400));
        assert_eq!(a.nonfull_clusters(), 1);
        assert_eq!(alloc_vec(&a, &mut cb, 5), vec![yb * 512 + 400]);
    }

    /// `threads` threads, each with a cursor, allocate (4 KiB runs and 2 MiB
    /// clusters), dup, pin with HAS_CACHE and free at random, `iters` times each.
    /// A slot must never have two owners at once (a shared bitmap is set on
    /// alloc, must have been clear, and is cleared before the put), and at the
    /// end everything must be free and every cluster whole again.
    fn stress(policy: AllocPolicy, clusters: u64, threads: u64, iters: u32) {
        let a = Arc::new(SlotAllocator::new(clusters * 512, policy));
        let owned: Arc<Vec<AtomicBool>> = Arc::new(
            (0..clusters * 512)
                .map(|_| AtomicBool::new(false))
                .collect(),
        );
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let a = Arc::clone(&a);
                let owned = Arc::clone(&owned);
                std::thread::spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 + t * 7919);
                    let mut cur = a.cursor();
                    let mut held: Vec<Slot> = Vec::new();
                    let mut units: Vec<Slot> = Vec::new();
                    let mut out = Vec::new();
                    let claim = |s: Slot| {
                        assert!(
                            !owned[s as usize].swap(true, Ordering::SeqCst),
                            "slot {s} handed out twice"
                        );
                    };
                    let unclaim = |s: Slot| owned[s as usize].store(false, Ordering::SeqCst);
                    for _ in 0..iters {
                        match rng.below(10) {
                            0..=4 => {
                                out.clear();
                                let n = 1 + rng.below(64) as usize;
                                let got = a.alloc(&mut cur, n, &mut out);
                                let s = slots_of(&out);
                                assert_eq!(s.len(), got);
                                for x in s {
                                    claim(x);
                                    held.push(x);
                                }
                            }
                            5 => {
                                if let Some(u) = a.alloc_cluster(&mut cur) {
                                    (u..u + 512).for_each(claim);
                                    units.push(u);
                                }
                            }
                            6 => {
                                if let Some(u) = units.pop() {
                                    (u..u + 512).for_each(unclaim);
                                    a.put_run(u, 512);
                                }
                            }
                            7 if !held.is_empty() => {
                                // A second reference and a cache pin, dropped in random order.
                                let x = held.swap_remove(rng.below(held.len() as u64) as usize);
                                a.dup(x);
                                a.set_cache(x);
                                assert!(!a.put(x));
                                unclaim(x);
                                if rng.below(2) == 0 {
                                    assert!(!a.put(x));
                                    assert!(a.clear_cache(x));
                                } else {
                                    assert!(!a.clear_cache(x));
                                    assert!(a.put(x));
                                }
                            }
                            _ => {
                                let k = rng.below(64).min(held.len() as u64) as usize;
                                for _ in 0..k {
                                    let x = held.swap_remove(rng.below(held.len() as u64) as usize);
                                    unclaim(x);
                                    assert!(a.put(x));
                                }
                            }
                        }
                    }
                    for x in held {
                        unclaim(x);
                        assert!(a.put(x));
                    }
                    for u in units {
                        (u..u + 512).for_each(unclaim);
                        a.put_run(u, 512);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
        assert_eq!(a.used(), 0, "{policy:?}");
        assert_eq!(a.double_frees(), 0);
        assert_eq!(a.invalid_ops(), 0);
        let mut cur = a.cursor();
        a.release(&mut cur);
        assert_eq!(
            a.free_clusters(),
            clusters,
            "{policy:?}: all clusters whole again"
        );
        assert_eq!(a.nonfull_clusters(), 0);
    }

    #[test]
    fn concurrent_no_double_ownership() {
        for policy in [AllocPolicy::Ssd, AllocPolicy::Rotational] {
            stress(policy, 16, 4, 10_000);
        }
    }

    #[test]
    fn concurrent_tiny_device() {
        // 4 clusters for 8 threads: lists run dry all the time, so the linear
        // scan, stealing from owned clusters and alloc_cluster races get exercised.
        for policy in [AllocPolicy::Ssd, AllocPolicy::Rotational] {
            stress(policy, 4, 8, 10_000);
        }
    }

    #[test]
    fn frozen_clusters_are_never_handed_out_again() {
        let a = SlotAllocator::new(8 * CLUSTER_SLOTS, AllocPolicy::Ssd);
        let mut cur = a.cursor();
        let mut runs = Vec::new();
        assert_eq!(a.alloc(&mut cur, 100, &mut runs), 100);
        let first = runs[0].start;
        a.freeze_below(8 * CLUSTER_SLOTS);
        a.grow(16 * CLUSTER_SLOTS);
        let mut more = Vec::new();
        assert_eq!(a.alloc(&mut cur, 600, &mut more), 600);
        assert!(
            more.iter().all(|r| r.start >= 8 * CLUSTER_SLOTS),
            "{more:?}"
        );
        let c = a.alloc_cluster(&mut cur).unwrap();
        assert!(c >= 8 * CLUSTER_SLOTS);
        // Frozen slots can still be put (their owner drops them) but never return.
        assert!(a.put(first));
        let mut again = Vec::new();
        a.alloc(&mut cur, 2000, &mut again);
        assert!(again.iter().all(|r| r.start >= 8 * CLUSTER_SLOTS));
    }
}
