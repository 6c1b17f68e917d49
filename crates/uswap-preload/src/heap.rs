//! Memory this library carves itself from a few large uswap-backed areas, so that
//! mid-size blocks and the small blocks of threads do not each cost a region:
//!
//! - one address span, reserved PROT_NONE at first use, holds a mid-size part and one
//!   part per thread arena; each part is committed from its start in slabs, each slab
//!   a uswap region placed there (`Pool::region_at`), so "is this ours" is one
//!   comparison and which part it is one division;
//! - mid-size blocks (threshold <= size < `MID_MAX`), from `malloc` and `mmap` alike:
//!   page-aligned extents of 64 MiB slabs, best fit, recorded in the block table like
//!   whole regions; a released extent is discarded (its RAM and swap freed, it reads
//!   as zeros again) and coalesced with its free neighbours in its slab;
//! - thread arenas: the small blocks (< threshold) of threads other than the main
//!   one, which glibc would put in its per-thread arenas (heaps it reserves and
//!   commits with internal `__mmap`/`__mprotect` calls that no preloaded library can
//!   see, so they would never count against the budget): a TLSF allocator (rlsf) per
//!   arena, threads spread over the arenas round robin, slabs growing 2 MiB, 4 MiB,
//!   ... up to 64 MiB.
//!
//! Every function runs with the "inside uswap" guard set (see `crate::enter`).

use crate::sys;
use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use uswap::Region;

const UNIT: usize = 2 << 20;
/// Address space of the mid-size part.
const MID_SPAN: usize = 1 << 38;
/// Address space of each thread arena.
const ARENA_SPAN: usize = 1 << 36;
pub const ARENAS: usize = 16;
const SPAN: usize = MID_SPAN + ARENAS * ARENA_SPAN;
/// Blocks from the threshold up to this size are heap extents; larger ones get a
/// region each (whose fixed costs are then small against their size).
pub const MID_MAX: usize = 8 << 20;
/// Slab size of the mid-size heap, and the largest slab of an arena.
const SLAB: usize = 64 << 20;
/// Alignment of arena blocks (glibc's malloc alignment on x86-64 and aarch64).
pub const ARENA_ALIGN: usize = 16;

/// Start of the span (0: not reserved, or reserving it failed: no heap).
static SPAN_LO: AtomicUsize = AtomicUsize::new(0);
static SPAN_INIT: std::sync::Once = std::sync::Once::new();

pub static MID_SLABS: AtomicUsize = AtomicUsize::new(0);
pub static ARENA_SLABS: AtomicUsize = AtomicUsize::new(0);
pub static ARENA_BYTES: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The span's start, reserving it at the first call. None: no span.
fn span() -> Option<usize> {
    SPAN_INIT.call_once(|| {
        let total = SPAN + UNIT;
        let p = sys::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return;
        }
        let start = p as usize;
        let lo = (start + UNIT - 1) & !(UNIT - 1);
        if lo > start {
            sys::munmap(p, lo - start);
        }
        let tail = start + total - (lo + SPAN);
        if tail > 0 {
            sys::munmap((lo + SPAN) as *mut libc::c_void, tail);
        }
        SPAN_LO.store(lo, Relaxed);
    });
    Some(SPAN_LO.load(Relaxed)).filter(|&lo| lo != 0)
}

/// Whether `p` is in the mid-size part of the span.
pub fn in_mid(p: usize) -> bool {
    let lo = SPAN_LO.load(Relaxed);
    lo != 0 && p.wrapping_sub(lo) < MID_SPAN
}

/// The arena whose part of the span holds `p`.
pub fn arena_of(p: usize) -> Option<usize> {
    let lo = SPAN_LO.load(Relaxed);
    let off = p.wrapping_sub(lo.wrapping_add(MID_SPAN));
    (lo != 0 && off < ARENAS * ARENA_SPAN).then_some(off / ARENA_SPAN)
}

/// A slab: a region at `addr` inside the span (replacing its PROT_NONE reservation).
fn new_slab(addr: usize, len: usize) -> Option<Arc<Region>> {
    crate::new_region_at(addr, len)
}

// ---- mid-size blocks ----------------------------------------------------------------

struct Mid {
    /// Slab start → its region.
    slabs: BTreeMap<usize, Arc<Region>>,
    /// Next free address of the part.
    frontier: usize,
    /// Free extents: start → length, and (length, start) for best fit. Extents never
    /// straddle slabs (a block's table entry names one region).
    free: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
}

static MID: Mutex<Mid> = Mutex::new(Mid {
    slabs: BTreeMap::new(),
    frontier: 0,
    free: BTreeMap::new(),
    by_size: BTreeSet::new(),
});

impl Mid {
    fn take(&mut self, a: usize, n: usize) {
        self.free.remove(&a);
        self.by_size.remove(&(n, a));
    }
    fn put(&mut self, a: usize, n: usize) {
        self.free.insert(a, n);
        self.by_size.insert((n, a));
    }
    fn slab_of(&self, a: usize) -> Option<(usize, &Arc<Region>)> {
        let (&b, r) = self.slabs.range(..=a).next_back()?;
        (a < b + r.len()).then_some((b, r))
    }
}

/// A mid-size extent of `len` bytes (a page multiple): (start, its slab's region).
/// It reads as zeros. None: no room (the caller falls back).
pub fn mid_alloc(len: usize) -> Option<(usize, Arc<Region>)> {
    let lo = span()?;
    let mut m = lock(&MID);
    if m.frontier == 0 {
        m.frontier = lo;
    }
    let found = m.by_size.range((len, 0)..).next().copied();
    let (n, a) = match found {
        Some(x) => x,
        None => {
            let slab_len = SLAB.max(len.next_multiple_of(UNIT));
            let at = m.frontier;
            if at + slab_len > lo + MID_SPAN {
                return None;
            }
            let r = new_slab(at, slab_len)?;
            // Free extents are inaccessible, as unmapped memory would be.
            sys::mprotect(at, slab_len, libc::PROT_NONE);
            MID_SLABS.fetch_add(1, Relaxed);
            m.frontier = at + slab_len;
            m.slabs.insert(at, r);
            m.put(at, slab_len);
            (slab_len, at)
        }
    };
    m.take(a, n);
    if n > len {
        m.put(a + len, n - len);
    }
    let (_, r) = m.slab_of(a).expect("extent in a slab");
    let r = r.clone();
    drop(m);
    sys::mprotect(a, len, libc::PROT_READ | libc::PROT_WRITE);
    Some((a, r))
}

/// Give an extent back: its pages are discarded (freed, zeros again), it becomes
/// PROT_NONE (an access after munmap or free faults, as it would on glibc's unmapped
/// blocks) and is free for reuse.
pub fn mid_release(base: usize, len: usize, region: &Arc<Region>) {
    let _ = region.discard(base - region.as_ptr() as usize, len);
    sys::mprotect(base, len, libc::PROT_NONE);
    let mut m = lock(&MID);
    let (slab_lo, slab_hi) = match m.slab_of(base) {
        Some((b, r)) => (b, b + r.len()),
        None => return,
    };
    let (mut a, mut n) = (base, len);
    if a > slab_lo {
        if let Some((&pa, &pn)) = m.free.range(..a).next_back() {
            if pa + pn == a {
                m.take(pa, pn);
                a = pa;
                n += pn;
            }
        }
    }
    if a + n < slab_hi {
        if let Some(&nn) = m.free.get(&(a + n)) {
            m.take(a + n, nn);
            n += nn;
        }
    }
    m.put(a, n);
}

// ---- thread arenas ------------------------------------------------------------------

/// FLLEN 59 with 32-byte granules: no largest pool, so slabs appended to an arena's
/// pool coalesce with it.
type Tlsf = rlsf::Tlsf<'static, u64, u32, 59, 32>;

struct Arena {
    tlsf: Tlsf,
    /// Next free address of the arena's part (0: no slab yet).
    frontier: usize,
    next_slab: usize,
}

// SAFETY: the TLSF structure holds pointers into the arena's own slabs, which live for
// the rest of the process; every use is under the arena's mutex.
unsafe impl Send for Arena {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_ARENA: Mutex<Arena> = Mutex::new(Arena {
    tlsf: Tlsf::new(),
    frontier: 0,
    next_slab: UNIT,
});
static ARENA: [Mutex<Arena>; ARENAS] = [EMPTY_ARENA; ARENAS];
static NEXT_ARENA: AtomicUsize = AtomicUsize::new(0);

/// The arena of a thread that has none yet: round robin.
pub fn next_arena() -> usize {
    NEXT_ARENA.fetch_add(1, Relaxed) % ARENAS
}

impl Arena {
    /// Add a slab big enough for `need` bytes to the pool. False: no room. (With the
    /// guard set: the engine's own allocations must not come back to this arena,
    /// whose lock this thread holds.)
    fn grow(&mut self, idx: usize, need: usize) -> bool {
        let _g = crate::enter();
        let Some(lo) = span() else { return false };
        let part = lo + MID_SPAN + idx * ARENA_SPAN;
        if self.frontier == 0 {
            self.frontier = part;
        }
        let len = self.next_slab.max((need + 4096).next_multiple_of(UNIT));
        if self.frontier + len > part + ARENA_SPAN {
            return false;
        }
        let Some(r) = new_slab(self.frontier, len) else {
            return false;
        };
        let block = NonNull::slice_from_raw_parts(
            NonNull::new(self.frontier as *mut u8).expect("slab address"),
            len,
        );
        // SAFETY: the slab is fresh memory of `len` bytes that nothing else uses and
        // that lives for the rest of the process (the region is leaked below); it
        // starts where the pool ends when the pool exists.
        unsafe {
            if self.frontier == part {
                self.tlsf.insert_free_block_ptr(block);
            } else {
                self.tlsf.append_free_block_ptr(block);
            }
        }
        std::mem::forget(r);
        ARENA_SLABS.fetch_add(1, Relaxed);
        ARENA_BYTES.fetch_add(len, Relaxed);
        self.frontier += len;
        self.next_slab = (self.next_slab * 2).min(SLAB);
        true
    }
}

/// A block of `size` bytes from arena `idx`, or None.
pub fn arena_alloc(idx: usize, size: usize) -> Option<NonNull<u8>> {
    let layout = Layout::from_size_align(size.max(1), ARENA_ALIGN).ok()?;
    let mut a = lock(&ARENA[idx]);
    if let Some(p) = a.tlsf.allocate(layout) {
        return Some(p);
    }
    if !a.grow(idx, size) {
        return None;
    }
    a.tlsf.allocate(layout)
}

/// # Safety
/// `p` is a live block of arena `idx` (`arena_of(p) == Some(idx)`).
pub unsafe fn arena_free(idx: usize, p: NonNull<u8>) {
    let mut a = lock(&ARENA[idx]);
    // SAFETY: the caller's contract; all arena blocks have ARENA_ALIGN.
    unsafe { a.tlsf.deallocate(p, ARENA_ALIGN) }
}

/// Usable bytes of an arena block.
///
/// # Safety
/// `p` is a live block of arena `idx`.
pub unsafe fn arena_usable(idx: usize, p: NonNull<u8>) -> usize {
    let _a = lock(&ARENA[idx]);
    // SAFETY: the caller's contract.
    unsafe { Tlsf::allocation_usable_size(p) }
}

/// Resize an arena block in its arena (None: it cannot; the block is unchanged).
///
/// # Safety
/// `p` is a live block of arena `idx`.
pub unsafe fn arena_realloc(idx: usize, p: NonNull<u8>, size: usize) -> Option<NonNull<u8>> {
    let layout = Layout::from_size_align(size.max(1), ARENA_ALIGN).ok()?;
    let mut a = lock(&ARENA[idx]);
    // SAFETY: the caller's contract; the alignment is the one it was allocated with.
    unsafe { a.tlsf.reallocate(p, layout) }
}

// ---- fork ---------------------------------------------------------------------------

thread_local! {
    static FORK_GUARDS: std::cell::RefCell<Vec<MutexGuard<'static, Arena>>> =
        const { std::cell::RefCell::new(Vec::new()) };
    static FORK_MID: std::cell::RefCell<Option<MutexGuard<'static, Mid>>> =
        const { std::cell::RefCell::new(None) };
}

/// Hold every heap lock across a fork, so that the child gets consistent heaps.
pub fn fork_prepare() {
    FORK_MID.with(|m| *m.borrow_mut() = Some(lock(&MID)));
    FORK_GUARDS.with(|g| g.borrow_mut().extend(ARENA.iter().map(lock)));
}

pub fn fork_done() {
    FORK_GUARDS.with(|g| g.borrow_mut().clear());
    FORK_MID.with(|m| m.borrow_mut().take());
}

// ---- per-thread cache of small arena blocks ----------------------------------------

const CACHE_CLASSES: usize = 64;
const CACHE_DEPTH: usize = 8;

/// Freed arena blocks kept by the thread that freed them, by size class (16-byte steps
/// up to 1 KiB, as glibc's tcache), so that most small `malloc`/`free` pairs take no
/// lock and no TLSF work. A block in class `k` has at least `16 * (k + 1)` usable
/// bytes. Flushed back to the arenas when the thread exits (`flush`).
pub struct ThreadCache {
    bins: UnsafeCell<[[*mut u8; CACHE_DEPTH]; CACHE_CLASSES]>,
    counts: UnsafeCell<[u8; CACHE_CLASSES]>,
    /// Whether the thread-exit flush is registered for this thread.
    registered: std::cell::Cell<bool>,
}

impl ThreadCache {
    pub const fn new() -> Self {
        ThreadCache {
            bins: UnsafeCell::new([[std::ptr::null_mut(); CACHE_DEPTH]; CACHE_CLASSES]),
            counts: UnsafeCell::new([0; CACHE_CLASSES]),
            registered: std::cell::Cell::new(false),
        }
    }

    /// A cached block of at least `size` bytes.
    pub fn take(&self, size: usize) -> Option<NonNull<u8>> {
        let k = size.max(1).div_ceil(16) - 1;
        if k >= CACHE_CLASSES {
            return None;
        }
        // SAFETY: only this thread touches its cache, and not reentrantly (nothing
        // here calls out).
        let (bins, counts) = unsafe { (&mut *self.bins.get(), &mut *self.counts.get()) };
        if counts[k] == 0 {
            return None;
        }
        counts[k] -= 1;
        NonNull::new(bins[k][counts[k] as usize])
    }

    /// Keep a freed block of arena `idx`; false: the cache has no room for it.
    ///
    /// # Safety
    /// `p` is a live block of an arena, no longer used by the program.
    pub unsafe fn keep(&self, p: NonNull<u8>) -> bool {
        // SAFETY: the caller's contract: a live TLSF block, whose header precedes it.
        let usable = unsafe { Tlsf::allocation_usable_size(p) };
        let k = usable / 16;
        if k == 0 || k > CACHE_CLASSES {
            return false;
        }
        let k = k - 1;
        // SAFETY: as in `take`.
        let (bins, counts) = unsafe { (&mut *self.bins.get(), &mut *self.counts.get()) };
        if counts[k] as usize == CACHE_DEPTH {
            return false;
        }
        if !self.registered.replace(true) {
            register_flush();
        }
        bins[k][counts[k] as usize] = p.as_ptr();
        counts[k] += 1;
        true
    }

    /// Give every cached block back to its arena.
    pub fn flush(&self) {
        // SAFETY: as in `take`.
        let (bins, counts) = unsafe { (&mut *self.bins.get(), &mut *self.counts.get()) };
        for k in 0..CACHE_CLASSES {
            for &p in &bins[k][..counts[k] as usize] {
                if let (Some(idx), Some(np)) = (arena_of(p as usize), NonNull::new(p)) {
                    // SAFETY: a cached block is a live block of its arena.
                    unsafe { arena_free(idx, np) };
                }
            }
            counts[k] = 0;
        }
        self.registered.set(false);
    }
}

/// A pthread key whose destructor flushes the exiting thread's cache.
static FLUSH_KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();

extern "C" fn flush_at_thread_exit(_: *mut libc::c_void) {
    crate::flush_thread_cache();
}

fn register_flush() {
    let key = FLUSH_KEY.get_or_init(|| {
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: creates a key with a plain extern "C" destructor.
        (unsafe { libc::pthread_key_create(&mut k, Some(flush_at_thread_exit)) } == 0).then_some(k)
    });
    if let Some(k) = *key {
        // SAFETY: a non-null value makes the destructor run at this thread's exit.
        unsafe { libc::pthread_setspecific(k, NonNull::<u8>::dangling().as_ptr().cast()) };
    }
}
