//! A region: an anonymous private mapping registered with userfaultfd, whose pages
//! the engine moves between RAM, the swap cache and the backend.

use crate::engine::Engine;
use crate::pagemap::RegionInner;
use crate::pool::{ReadaheadPolicy, UnitPolicy};
use crate::stats::Counters;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Per-region policies; `None` takes the pool's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegionOptions {
    /// Swap unit.
    pub unit: Option<UnitPolicy>,
    /// Readahead policy.
    pub readahead: Option<ReadaheadPolicy>,
    /// Who serves its faults (in-thread regions use 4 KiB units).
    pub fault_mode: Option<crate::FaultMode>,
}

/// Out-of-core memory: read and write it like any memory; the pool pages it.
///
/// Dropping the region unregisters and unmaps it and frees its slots.
pub struct Region {
    pub(crate) engine: Arc<Engine>,
    pub(crate) inner: Arc<RegionInner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &(self.inner.base as *const u8))
            .field("len", &self.inner.len)
            .finish()
    }
}

impl Region {
    /// Length in bytes (the size asked for, rounded up to 2 MiB).
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the length is zero (never: regions are at least 2 MiB).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address, for FFI. Valid while the region lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base as *mut u8
    }
    /// The bytes. Takes `&mut self`: a shared `&[u8]` must not coexist with stores
    /// through [`Region::as_words`] on another thread.
    pub fn as_slice(&mut self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, alive as long as `self`; the
        // engine only changes which physical page backs an address, never the bytes a
        // reader sees; `&mut self` keeps every `as_words` view away meanwhile.
        unsafe { std::slice::from_raw_parts(self.inner.base as *const u8, self.inner.len) }
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.inner.base as *mut u8, self.inner.len) }
    }
    /// The region as 64-bit words that any number of threads may read and write at once.
    pub fn as_words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is 2 MiB aligned and a multiple of 8 bytes long; atomics
        // make shared mutation sound; alive as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.inner.base as *const AtomicU64, self.inner.len / 8)
        }
    }
    /// For tests (corruption injection): where the page at byte `offset` has its only
    /// copy in this process's swap file or device, as a byte offset in it; None when
    /// the page is not swapped out to it, or has a copy in RAM (the swap cache, the
    /// compressed tier), or is in a file inherited from a parent process. A page with
    /// an offset is read from there at its next touch. Not a stable interface.
    #[doc(hidden)]
    pub fn swap_offset(&self, offset: usize) -> Option<u64> {
        use crate::pagemap::PageState;
        let e = &self.engine;
        if offset >= self.len() {
            return None;
        }
        let _a = e.fork.enter_from_program();
        let page = (offset / crate::PAGE_SIZE) as u64;
        let u = self.inner.unit_of(page).lock();
        let PageState::Swapped(slot) = u.get(page as usize % crate::UNIT_PAGES) else {
            return None;
        };
        if e.cache.get(slot).is_some() || e.tiers.meta.location(slot) != crate::tier::Location::Back
        {
            return None;
        }
        let file = e.tiers.file();
        let (fd, at) = file.locate(slot);
        (fd >= 0 && fd == file.raw()).then_some(at)
    }
    /// This region's counters, with the pool's gauges.
    pub fn counters(&self) -> Counters {
        let _a = self.engine.fork.enter_from_program();
        self.engine.with_gauges(self.inner.counters.snapshot())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        crate::regions::destroy(&self.engine, &self.inner);
        self.engine.drop_user();
    }
}

impl Region {
    /// Throw away the contents of `[offset, offset + len)` (page aligned, inside the
    /// region), as MADV_DONTNEED does on anonymous memory: the pages read as zeros
    /// afterwards and their slots and cache copies are freed.
    pub fn discard(&self, offset: usize, len: usize) -> crate::Result<()> {
        let (first, n) = self.page_range("discard", offset, len)?;
        crate::regions::discard(&self.engine, &self.inner, first, n);
        Ok(())
    }

    /// Lock `[offset, offset + len)` (page aligned, inside the region) as mlock does:
    /// every page is faulted in now from this thread, and reclaim never swaps it out
    /// until [`Region::unlock`] (or a discard, or the region's end). Locked pages are
    /// counted outside the budget (`Counters::locked_bytes`). Returns the bytes newly
    /// locked. Call it before locking the range in the kernel, if at all: the engine
    /// cannot move pages into a locked mapping, so they must all be there first.
    pub fn lock(&self, offset: usize, len: usize) -> crate::Result<u64> {
        let (first, n) = self.page_range("lock", offset, len)?;
        // No fork guard around the fault-in: a fork being prepared waits for active
        // callers, and the faults need the fault thread, which would wait for the
        // fork (`lock` takes the guard around each unit's marking instead).
        Ok(crate::lock::lock(&self.engine, &self.inner, first, n) * crate::PAGE_SIZE as u64)
    }

    /// Undo [`Region::lock`] on `[offset, offset + len)`: the pages are swappable
    /// again and count against the budget. Returns the bytes that were locked.
    pub fn unlock(&self, offset: usize, len: usize) -> crate::Result<u64> {
        let (first, n) = self.page_range("unlock", offset, len)?;
        Ok(crate::lock::unlock(&self.engine, &self.inner, first, n) * crate::PAGE_SIZE as u64)
    }

    fn page_range(&self, what: &str, offset: usize, len: usize) -> crate::Result<(u64, u64)> {
        if !offset.is_multiple_of(crate::PAGE_SIZE)
            || !len.is_multiple_of(crate::PAGE_SIZE)
            || offset.checked_add(len).is_none_or(|e| e > self.len())
        {
            return Err(crate::Error::InvalidRegionSize {
                size: len as u64,
                reason: format!(
                    "{what} range {offset:#x}+{len:#x} is not page aligned inside the region"
                ),
            });
        }
        Ok((
            (offset / crate::PAGE_SIZE) as u64,
            (len / crate::PAGE_SIZE) as u64,
        ))
    }
}
