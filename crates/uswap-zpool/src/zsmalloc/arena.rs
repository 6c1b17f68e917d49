//! Backing memory: spans of whole 4 KiB pages carved out of large anonymous mappings.
//!
//! Each mapping ("arena chunk") is reserved with `mmap(MAP_PRIVATE | MAP_ANONYMOUS |
//! MAP_NORESERVE)` and `MADV_NOHUGEPAGE`: reserving costs no memory, and no 2 MiB page
//! can appear that a 4 KiB `MADV_DONTNEED` would only split instead of freeing. A span is
//! touched (every page written once) when it is handed out, and given back to the kernel
//! with `MADV_DONTNEED` when it is freed, so that the pages resident in the arena are
//! exactly the pages of the spans held: [`Arena::held_bytes`] is what the process pays.
//!
//! A [`Span`] owns its pages the way a `Box<[u8]>` owns its bytes (unique, not `Clone`),
//! so all reads and writes of object bytes are ordinary safe slice accesses whose
//! aliasing the borrow checker and the size classes' locks keep in order; the only
//! `unsafe` of the crate is here, at the mapping boundary.

use crate::PAGE_SIZE;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Largest span handed out, in pages.
pub(crate) const MAX_SPAN_PAGES: usize = 16;

/// Virtual size of one arena chunk (reserved, not committed).
const CHUNK_BYTES: usize = 64 << 20;

/// A run of whole pages owned by one zspage.
pub(crate) struct Span {
    ptr: NonNull<u8>,
    pages: usize,
}

// SAFETY: a Span is the unique owner of its pages (like Box<[u8]>): moving it to another
// thread moves that ownership, and `&Span` gives only shared reads.
unsafe impl Send for Span {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for Span {}

impl Span {
    /// Pages in this span.
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Start address (for tests that look at the process's page tables).
    #[cfg(test)]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl std::ops::Deref for Span {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+pages*PAGE_SIZE lies in a live arena chunk mapping (chunks are
        // unmapped only when the Arena drops, and every Span lives inside the pool that
        // owns the Arena); this Span is its only owner, and `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.pages * PAGE_SIZE) }
    }
}

impl std::ops::DerefMut for Span {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.pages * PAGE_SIZE) }
    }
}

/// Why no span was handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanError {
    /// Holding it would pass the pool's byte limit.
    OverLimit,
    /// The kernel refused to reserve more address space.
    NoAddressSpace,
}

struct Chunk {
    addr: usize,
    len: usize,
}

/// Guarded by `Arena::inner`.
struct ArenaInner {
    /// Every mapping made so far (all unmapped on drop).
    chunks: Vec<Chunk>,
    /// Next never-used address in the last chunk, and its end.
    bump: usize,
    bump_end: usize,
    /// Addresses of freed spans, by length in pages (index = pages); their memory was
    /// given back with MADV_DONTNEED.
    free: Vec<Vec<usize>>,
}

impl ArenaInner {
    fn heap_bytes(&self) -> u64 {
        let lists: usize = self.free.iter().map(|l| l.capacity()).sum();
        (self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self.free.capacity() * std::mem::size_of::<Vec<usize>>()
            + lists * std::mem::size_of::<usize>()) as u64
    }
}

/// The pool's backing memory and its byte limit.
pub(crate) struct Arena {
    inner: Mutex<ArenaInner>,
    /// Pages of spans handed out and not yet freed.
    held_pages: AtomicU64,
    /// Bytes that held pages plus `extra` (the pool's metadata) may not pass.
    limit_bytes: AtomicU64,
    /// Heap bytes of `inner`'s vectors (capacities), kept up to date under its lock.
    bookkeeping: AtomicU64,
}

impl Arena {
    pub(crate) fn new(limit_bytes: u64) -> Arena {
        let inner = ArenaInner {
            chunks: Vec::new(),
            bump: 0,
            bump_end: 0,
            free: (0..=MAX_SPAN_PAGES).map(|_| Vec::new()).collect(),
        };
        Arena {
            bookkeeping: AtomicU64::new(inner.heap_bytes()),
            inner: Mutex::new(inner),
            held_pages: AtomicU64::new(0),
            limit_bytes: AtomicU64::new(limit_bytes),
        }
    }

    /// Bytes of the spans held now (all of them resident: touched when handed out).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64
    }

    pub(crate) fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn set_limit_bytes(&self, bytes: u64) {
        self.limit_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Heap bytes of the arena's own bookkeeping (chunk list and free lists).
    pub(crate) fn bookkeeping_bytes(&self) -> u64 {
        self.bookkeeping.load(Ordering::Relaxed)
    }

    /// A span of `pages` pages, every page resident, if holding it keeps held bytes +
    /// the arena's bookkeeping + `extra_bytes` (the rest of the pool's metadata) within
    /// the limit.
    pub(crate) fn alloc(&self, pages: usize, extra_bytes: u64) -> Result<Span, SpanError> {
        debug_assert!((1..=MAX_SPAN_PAGES).contains(&pages));
        let limit = self.limit_bytes();
        let extra_bytes = extra_bytes + self.bookkeeping_bytes();
        let want = pages as u64;
        // Reserve the pages against the limit first, so two threads never both take
        // the last room.
        self.held_pages
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                let bytes = (held + want) * PAGE_SIZE as u64 + extra_bytes;
                (bytes <= limit).then_some(held + want)
            })
            .map_err(|_| SpanError::OverLimit)?;
        let addr = match self.take_address(pages) {
            Some(a) => a,
            None => {
                self.held_pages.fetch_sub(want, Ordering::Relaxed);
                return Err(SpanError::NoAddressSpace);
            }
        };
        let mut span = Span {
            ptr: NonNull::new(addr as *mut u8).expect("arena address is never null"),
            pages,
        };
        // Touch every page now, so that a held span is resident from the start and
        // `held_bytes` is what the kernel charges (the pages get written anyway).
        for page in span.chunks_exact_mut(PAGE_SIZE) {
            page[0] = 0;
        }
        Ok(span)
    }

    /// Give a span's memory back to the kernel and keep its addresses for reuse.
    pub(crate) fn free(&self, span: Span) {
        let Span { ptr, pages } = span;
        let addr = ptr.as_ptr() as usize;
        // SAFETY: the span was the only owner of these pages and is gone; discarding
        // private anonymous pages only makes them read as zeros again.
        let rc = unsafe {
            libc::madvise(
                addr as *mut libc::c_void,
                pages * PAGE_SIZE,
                libc::MADV_DONTNEED,
            )
        };
        // MADV_DONTNEED on our own private anonymous mapping cannot fail; if it ever
        // did, the memory would stay resident but the span is still reusable.
        debug_assert_eq!(rc, 0, "MADV_DONTNEED failed");
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let before = inner.free[pages].capacity();
        inner.free[pages].push(addr);
        let grown = inner.free[pages].capacity() - before;
        self.bookkeeping.fetch_add(
            (grown * std::mem::size_of::<usize>()) as u64,
            Ordering::Relaxed,
        );
        drop(inner);
        self.held_pages.fetch_sub(pages as u64, Ordering::Relaxed);
    }

    fn take_address(&self, pages: usize) -> Option<usize> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(addr) = inner.free[pages].pop() {
            return Some(addr);
        }
        let len = pages * PAGE_SIZE;
        if inner.bump_end - inner.bump < len {
            let addr = map_chunk(CHUNK_BYTES)?;
            let before = inner.chunks.capacity();
            inner.chunks.push(Chunk {
                addr,
                len: CHUNK_BYTES,
            });
            let grown = inner.chunks.capacity() - before;
            self.bookkeeping.fetch_add(
                (grown * std::mem::size_of::<Chunk>()) as u64,
                Ordering::Relaxed,
            );
            // The tail of the previous chunk is left unused (less than one span).
            inner.bump = addr;
            inner.bump_end = addr + CHUNK_BYTES;
        }
        let addr = inner.bump;
        inner.bump += len;
        Some(addr)
    }

    /// Address ranges of every mapping (for tests that read /proc/self/pagemap).
    #[cfg(test)]
    pub(crate) fn mappings(&self) -> Vec<(usize, usize)> {
        let inner = self.inner.lock().unwrap();
        inner.chunks.iter().map(|c| (c.addr, c.len)).collect()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for c in inner.chunks.drain(..) {
            // SAFETY: the pool is being dropped: no Span of this arena is used any more
            // (they live in the pool's size classes, dropped with it).
            unsafe { libc::munmap(c.addr as *mut libc::c_void, c.len) };
        }
    }
}

/// Reserve `len` bytes of address space (no memory is committed until touched).
fn map_chunk(len: usize) -> Option<usize> {
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks; it
    // aliases nothing.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: advice on the mapping just made. Without it a THP could back several
    // spans, and freeing one of them with MADV_DONTNEED would free nothing.
    unsafe { libc::madvise(addr, len, libc::MADV_NOHUGEPAGE) };
    Some(addr as usize)
}
