//! A heap of plain memory (never uswap) for the library's own allocations when the
//! program's `malloc` belongs to another allocator (`crate::owner`).
//!
//! With glibc owning `malloc`, what runs with the guard set (the engine, the table,
//! the libc state that `dlopen`/`setlocale` build) takes glibc's blocks. With jemalloc,
//! tcmalloc or mimalloc owning it, glibc's blocks would be freed by the program through
//! the other allocator (and the reverse), and that allocator's own blocks lie in
//! mappings that are uswap memory, which an engine thread must never touch. So those
//! allocations come from here: one TLSF pool (rlsf) over slabs committed in a span this
//! library reserves, so that `free` knows its blocks by address, whoever calls it.

use crate::sys;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

const UNIT: usize = 2 << 20;
const SPAN: usize = 1 << 36;
const MAX_SLAB: usize = 64 << 20;
/// Every block is allocated with at least this alignment (rlsf's granularity), so that
/// `deallocate` finds its header the same way for every block, whatever alignment it
/// was asked for.
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
pub static BYTES: AtomicUsize = AtomicUsize::new(0);

fn lock() -> MutexGuard<'static, Heap> {
    HEAP.lock().unwrap_or_else(|p| p.into_inner())
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
            let p = sys::mmap(
                std::ptr::null_mut(),
                SPAN,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return false;
            }
            self.frontier = p as usize;
            LO.store(p as usize, Relaxed);
        }
        let lo = LO.load(Relaxed);
        let len = self.next_slab.max((need + 4096).next_multiple_of(UNIT));
        if self.frontier + len > lo + SPAN
            || sys::mprotect(self.frontier, len, libc::PROT_READ | libc::PROT_WRITE) != 0
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
        BYTES.fetch_add(len, Relaxed);
        self.frontier += len;
        self.next_slab = (self.next_slab * 2).min(MAX_SLAB);
        true
    }
}

/// A block of `size` bytes aligned to `align` (a power of two), or null.
pub fn alloc(size: usize, align: usize) -> *mut libc::c_void {
    let Ok(layout) = Layout::from_size_align(size.max(1), align.max(MIN_ALIGN)) else {
        return std::ptr::null_mut();
    };
    let mut h = lock();
    if let Some(p) = h.tlsf.allocate(layout) {
        return p.as_ptr().cast();
    }
    if !h.grow(size + layout.align()) {
        return std::ptr::null_mut();
    }
    h.tlsf
        .allocate(layout)
        .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast())
}

/// # Safety
/// `p` is a live block of this heap (`contains(p)`).
pub unsafe fn free(p: *mut libc::c_void) {
    let mut h = lock();
    // SAFETY: the caller's contract; every block was allocated with an alignment of at
    // least MIN_ALIGN, for which rlsf keeps the header pointer in front of the block.
    unsafe {
        h.tlsf
            .deallocate(NonNull::new_unchecked(p.cast()), MIN_ALIGN)
    }
}

/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn usable(p: *mut libc::c_void) -> usize {
    // SAFETY: the caller's contract.
    unsafe { Tlsf::allocation_usable_size(NonNull::new_unchecked(p.cast())) }
}

/// Move a block to one of `size` bytes (malloc alignment), or null (the block stays).
///
/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void {
    let n = alloc(size, MIN_ALIGN);
    if !n.is_null() {
        // SAFETY: the caller's contract; `n` is a distinct fresh block of `size` bytes.
        unsafe {
            sys::copy(n, p, usable(p).min(size));
            free(p);
        }
    }
    n
}

thread_local! {
    static FORK_GUARD: std::cell::RefCell<Option<MutexGuard<'static, Heap>>> =
        const { std::cell::RefCell::new(None) };
}

/// Hold the heap's lock across a fork (take it last: nothing may allocate here after).
pub fn fork_prepare() {
    FORK_GUARD.with(|g| *g.borrow_mut() = Some(lock()));
}

/// Release it (first thing after the fork, before anything allocates).
pub fn fork_done() {
    FORK_GUARD.with(|g| g.borrow_mut().take());
}
