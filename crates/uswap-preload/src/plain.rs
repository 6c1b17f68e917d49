//! Plain memory (never uswap) for the library's own allocations: the engine's heap
//! (`uswap::heap`), reached by hand from the interposed `malloc` family.
//!
//! Everything allocated with the guard set or on an engine thread comes from here,
//! whoever owns `malloc`:
//! - with jemalloc, tcmalloc or mimalloc owning it, glibc's blocks would be freed by
//!   the program through the other allocator (and the reverse), and that allocator's
//!   own blocks lie in mappings that are uswap memory, which an engine thread must
//!   never touch;
//! - with glibc owning it, an engine thread that frees a block of the arena a program
//!   thread holds while its signal handler faults on uswap memory would wait for it
//!   forever (`uswap::heap` says why).
//!
//! `free` knows these blocks by address, whoever calls it.

use libc::c_void;

pub use uswap::heap::{committed_bytes, contains};

/// A block of `size` bytes aligned to `align` (a power of two), or null.
pub fn alloc(size: usize, align: usize) -> *mut c_void {
    uswap::heap::alloc(size, align).cast()
}

/// # Safety
/// `p` is a live block of this heap (`contains(p)`).
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { uswap::heap::free(p.cast()) }
}

/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn usable(p: *mut c_void) -> usize {
    // SAFETY: the caller's contract.
    unsafe { uswap::heap::usable(p.cast()) }
}

/// Move a block to one of `size` bytes (malloc alignment), or null (the block stays).
///
/// # Safety
/// `p` is a live block of this heap.
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { uswap::heap::realloc(p.cast(), size).cast() }
}
