//! The engine's own heap, apart from the program's `malloc`.
//!
//! A program's signal handler may touch memory under uswap while its thread is inside
//! `malloc`, holding an arena lock. Its fault then waits for the engine: for a lock an
//! engine thread holds, or for work an engine thread finishes. If that engine thread
//! allocates or frees through the same `malloc` at that moment, it waits for the arena
//! lock, and nobody moves again (found as a reclaim thread blocked in `free` under a
//! swap-cache shard lock). So what the engine allocates, on its own threads and inside
//! its calls (where the program's signals are held, `SignalsHeld`), comes from this
//! heap, whose lock is never held where a program's handler can run: on a thread whose
//! signals uswap does not hold, the signals are held around each use of the lock.
//!
//! `EngineHeap` is the global allocator that routes there; uswap's C library, Python
//! module and command set it, and a Rust program sets it to get the same guarantee
//! (`#[global_allocator] static HEAP: uswap::EngineHeap = uswap::EngineHeap;`). Every
//! other allocation of the program goes to the system allocator, unchanged.
//!
//! One TLSF pool (the `rlsf` crate: constant-time, no per-thread state to go stale
//! across a fork) over slabs committed in a span reserved once, so that any thread
//! frees a block by its address. The lock is taken across `fork()` (hooks registered
//! before the engine's, so that its quiesced threads release it first), so the child
//! finds the heap whole.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

const UNIT: usize = 2 << 20;
/// The address span reserved for the heap (virtual only: slabs are committed in it as
/// it grows).
const SPAN: usize = 1 << 38;
const MAX_SLAB: usize = 64 << 20;
/// Every block is allocated with at least this alignment (rlsf's granularity), so that
/// `deallocate` finds its header the same way for every block.
const MIN_ALIGN: usize = 32;

type Tlsf = rlsf::Tlsf<'static, u64, u32, 59, 32>;

struct Heap {
    tlsf: Tlsf,
    /// Next free address of the span (0: not reserved yet).
    frontier: usize,
    next_slab: usize,
}

// SAFETY: the TLSF structure holds pointers into the heap's own slabs, which live for
// the rest of the process; every use is under the mutex.
unsafe impl Send for Heap {}

static HEAP: Mutex<Heap> = Mutex::new(Heap {
    tlsf: Tlsf::new(),
    frontier: 0,
    next_slab: UNIT,
});
/// The span's start (0: not reserved).
static LO: AtomicUsize = AtomicUsize::new(0);
/// Bytes committed to the heap.
static COMMITTED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// How many reasons this thread has to keep the program's signals held (an engine
    /// thread, an engine call): while above 0, its allocations come from this heap.
    static HELD: Cell<u32> = const { Cell::new(0) };
    static FORK_GUARD: std::cell::RefCell<Option<MutexGuard<'static, Heap>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether this thread is inside uswap (its program signals held by uswap).
fn inside() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// Called by `SignalsHeld`: this thread's signals are held by uswap from now on (`true`)
/// or one reason fewer (`false`).
pub(crate) fn note_held(on: bool) {
    HELD.with(|h| h.set(if on { h.get() + 1 } else { h.get() - 1 }));
}

/// Inside uswap on this thread while alive, its signals already held by other means
/// (the SIGBUS handler's mask): its allocations come from this heap. A handler that
/// interrupted `malloc` and allocated there would wait for its own thread.
pub(crate) struct Inside(());

impl Inside {
    pub(crate) fn enter() -> Inside {
        note_held(true);
        Inside(())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        note_held(false);
    }
}

/// Mark this thread as one of the engine's for the rest of its life (a thread the
/// engine does not start itself: the remote tier's runtime), with the program's
/// signals held, as `threads::spawn_named` does for its own.
pub(crate) fn engine_thread_for_good() {
    super::mem::SignalsHeld::new().for_good();
}

/// The heap's lock, with the program's signals held around it on a thread where uswap
/// does not hold them already (a program thread freeing a block the engine gave it).
struct Locked {
    heap: MutexGuard<'static, Heap>,
    _signals: Option<super::mem::SignalsHeld>,
}

fn lock() -> Locked {
    let signals = (!inside()).then(super::mem::SignalsHeld::new);
    Locked {
        heap: HEAP.lock().unwrap_or_else(|p| p.into_inner()),
        _signals: signals,
    }
}

/// Whether `p` is a block of this heap.
pub fn contains(p: usize) -> bool {
    let lo = LO.load(Relaxed);
    lo != 0 && p.wrapping_sub(lo) < SPAN
}

impl Heap {
    /// Commit a slab of at least `need` bytes at the end of the pool. False: no room.
    fn grow(&mut self, need: usize) -> bool {
        if self.frontier == 0 {
            register_fork_hooks();
            // SAFETY: a fresh private reservation; nothing else refers to it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    SPAN,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return false;
            }
            self.frontier = p as usize;
            LO.store(p as usize, Relaxed);
        }
        let lo = LO.load(Relaxed);
        let len = self.next_slab.max((need + 4096).next_multiple_of(UNIT));
        // SAFETY: commits pages of the heap's own reservation, past everything in use.
        if self.frontier + len > lo + SPAN
            || unsafe {
                libc::mprotect(
                    self.frontier as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            } != 0
        {
            return false;
        }
        let block = NonNull::slice_from_raw_parts(
            NonNull::new(self.frontier as *mut u8).expect("slab address"),
            len,
        );
        // SAFETY: the slab is fresh read-write memory of `len` bytes that nothing else
        // uses and that is never unmapped; it starts where the pool ends when the pool
        // exists.
        unsafe {
            if self.frontier == lo {
                self.tlsf.insert_free_block_ptr(block);
            } else {
                self.tlsf.append_free_block_ptr(block);
            }
        }
        COMMITTED.fetch_add(len, Relaxed);
        self.frontier += len;
        self.next_slab = (self.next_slab * 2).min(MAX_SLAB);
        true
    }

    fn allocate(&mut self, layout: Layout) -> *mut u8 {
        if let Some(p) = self.tlsf.allocate(layout) {
            return p.as_ptr();
        }
        if !self.grow(layout.size() + layout.align()) {
            return std::ptr::null_mut();
        }
        self.tlsf
            .allocate(layout)
            .map_or(std::ptr::null_mut(), |p| p.as_ptr())
    }
}

fn heap_layout(layout: Layout) -> Option<Layout> {
    Layout::from_size_align(layout.size().max(1), layout.align().max(MIN_ALIGN)).ok()
}

/// Bytes the engine's heap has committed (a gauge for the stats).
pub fn committed_bytes() -> usize {
    COMMITTED.load(Relaxed)
}

/// A block of `size` bytes aligned to `align` (a power of two), or null. For an
/// allocator that serves uswap's own memory from this heap by hand (the preload's
/// `malloc`, which no global allocator reaches).
pub fn alloc(size: usize, align: usize) -> *mut u8 {
    match Layout::from_size_align(size.max(1), align.max(MIN_ALIGN)) {
        Ok(l) => lock().heap.allocate(l),
        Err(_) => std::ptr::null_mut(),
    }
}

/// # Safety
/// `p` is a live block of this heap (`contains(p)`).
pub unsafe fn free(p: *mut u8) {
    // SAFETY: the caller's contract; every block was allocated with an alignment of at
    // least MIN_ALIGN, for which rlsf keeps the header pointer in front of the block.
    unsafe {
        lock()
            .heap
            .tlsf
            .deallocate(NonNull::new_unchecked(p), MIN_ALIGN)
    }
}

/// The bytes a block can hold.
///
/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn usable(p: *mut u8) -> usize {
    // SAFETY: the caller's contract.
    unsafe { Tlsf::allocation_usable_size(NonNull::new_unchecked(p)) }
}

/// Move a block to one of `size` bytes (MIN_ALIGN), or null (the block stays).
///
/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn realloc(p: *mut u8, size: usize) -> *mut u8 {
    let n = alloc(size, MIN_ALIGN);
    if !n.is_null() {
        // SAFETY: the caller's contract; `n` is a distinct fresh block of `size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(p, n, usable(p).min(size));
            free(p);
        }
    }
    n
}

/// The global allocator that keeps uswap's allocations apart from the program's (see
/// the module's text): allocations made inside uswap come from its own heap, all
/// others from the system allocator.
pub struct EngineHeap;

// SAFETY: every block is allocated and freed by the allocator it came from: the
// engine's heap for blocks in its span (found by address), the system allocator for
// the rest; alignment and size follow `Layout`.
unsafe impl GlobalAlloc for EngineHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !inside() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { System.alloc(layout) };
        }
        match heap_layout(layout) {
            Some(l) => lock().heap.allocate(l),
            None => std::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !contains(ptr as usize) {
            // SAFETY: not the heap's, so the system allocator's block, as the caller
            // allocated it.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: a live block of this heap (the caller's contract).
        unsafe { free(ptr) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let ours = contains(ptr as usize);
        if !ours && !inside() {
            // SAFETY: a system block resized by the system allocator: the caller's
            // contract, passed on.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new` has a non-zero size (the caller's contract) and the old
        // alignment; the old block is live and holds `layout.size()` bytes, copied
        // into the distinct fresh block before it is freed.
        unsafe {
            let n = self.alloc(new);
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(ptr, n, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            n
        }
    }
}

extern "C" fn fork_prepare() {
    FORK_GUARD.with(|g| *g.borrow_mut() = Some(HEAP.lock().unwrap_or_else(|p| p.into_inner())));
}

extern "C" fn fork_done() {
    FORK_GUARD.with(|g| g.borrow_mut().take());
}

/// Hold the heap's lock across a fork. Registered before the engine's hooks (called
/// from `fork::register_hooks` too, and by the preload before its own), so that the
/// lock is taken after their prepare steps, which may allocate, and released before
/// the child starts its threads.
pub fn register_fork_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers `extern "C"` functions without arguments, which live as
        // long as the program.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_done), Some(fork_done)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_inside_come_from_the_heap_and_others_from_the_system() {
        let h = EngineHeap;
        let l = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: non-zero layouts; each block is freed once with its layout.
        unsafe {
            let outside = h.alloc(l);
            assert!(!contains(outside as usize));
            note_held(true);
            let ours = h.alloc(l);
            assert!(contains(ours as usize));
            assert!((ours as usize).is_multiple_of(MIN_ALIGN));
            ours.write_bytes(7, 100);
            let grown = h.realloc(ours, l, 1 << 20);
            assert!(contains(grown as usize));
            assert_eq!(*grown.add(99), 7);
            // A system block resized inside moves to the heap, bytes kept.
            outside.write_bytes(9, 100);
            let moved = h.realloc(outside, l, 200);
            assert!(contains(moved as usize));
            assert_eq!(*moved.add(99), 9);
            note_held(false);
            // Freed outside, by address.
            h.dealloc(grown, Layout::from_size_align(1 << 20, 8).unwrap());
            h.dealloc(moved, Layout::from_size_align(200, 8).unwrap());
            let big = Layout::from_size_align(3 << 20, 4096).unwrap();
            note_held(true);
            let b = h.alloc(big);
            note_held(false);
            assert!(contains(b as usize) && (b as usize).is_multiple_of(4096));
            h.dealloc(b, big);
        }
        assert!(committed_bytes() >= 4 << 20);
    }
}
