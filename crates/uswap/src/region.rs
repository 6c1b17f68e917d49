//! A region: an anonymous private mapping registered with userfaultfd, whose pages
//! the engine moves between RAM, the swap cache and the backend.

use crate::pool::{ReadaheadPolicy, UnitPolicy};
use crate::stats::Counters;
use std::sync::atomic::AtomicU64;

/// Per-region policies; `None` takes the pool's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegionOptions {
    /// Swap unit.
    pub unit: Option<UnitPolicy>,
    /// Readahead policy.
    pub readahead: Option<ReadaheadPolicy>,
}

/// Out-of-core memory: read and write it like any memory; the pool pages it.
pub struct Region {
    pub(crate) inner: std::sync::Arc<crate::pagemap::RegionInner>,
}

impl Region {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        todo!()
    }
    /// Whether the length is zero (never: regions are at least 2 MiB).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address, for FFI. Valid while the region lives.
    pub fn as_ptr(&self) -> *mut u8 {
        todo!()
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        todo!()
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        todo!()
    }
    /// The region as 64-bit words that any number of threads may read and write at once.
    pub fn as_words(&self) -> &[AtomicU64] {
        todo!()
    }
    /// This region's counters.
    pub fn counters(&self) -> Counters {
        todo!()
    }
}
