//! uswap: out-of-core memory for one process.
//!
//! A [`Pool`] owns a resident budget and a swap backend; [`Region`]s created from it
//! are anonymous private mappings registered with userfaultfd. The engine keeps at
//! most the budget resident and pages the rest to the backend and back on faults,
//! with the design of the Linux swap subsystem (clustered slots, a sharded swap
//! cache, VMA readahead, 2 MiB units, stale-slot freeing).
//!
//! ```no_run
//! use uswap::Pool;
//! let pool = Pool::builder().budget(256 << 20).build()?;
//! let mut region = pool.region(1 << 30)?; // 1 GiB, 4x the budget
//! region.as_mut_slice().fill(7);
//! assert!(region.as_slice().iter().all(|&b| b == 7));
//! println!("{:?}", pool.counters());
//! # Ok::<(), uswap::Error>(())
//! ```
//!
//! A program whose signal handlers touch memory under uswap sets [`EngineHeap`] as its
//! global allocator, so that the engine never waits for a `malloc` lock a handler's
//! thread holds (`#[global_allocator] static HEAP: uswap::EngineHeap = uswap::EngineHeap;`;
//! uswap's C library, Python module and command do).

/// An engine message on stderr: `eprintln!` that never panics. `eprintln!` panics when
/// stderr is a closed pipe (`prog 2>&1 | head` once `head` has gone), and a panic in
/// an engine thread stops it with the program's faults unserved: the program hangs.
/// A message that cannot be written is lost; the engine goes on.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod budget;
mod engine;
pub mod error;
mod fault;
pub mod fork;
mod frames;
pub mod host;
pub mod live;
mod lock;
pub mod memcg;
pub mod pagemap;
pub mod pool;
pub mod readahead;
mod reclaim;
pub mod region;
mod regions;
mod ring;
pub mod size;
pub mod slots;
mod spare;
pub mod stats;
pub mod swap_cache;
mod sys;
mod threads;
mod tier;
mod unit;
mod writeback;

pub use error::{Error, Result};
pub use fork::{after_fork_child, after_fork_parent, prepare_fork};
pub use pool::{
    Compressor, DeviceKind, FaultInjection, FaultMode, MaxSwap, Pool, PoolBuilder, ReadaheadPolicy,
    StaleSlotPolicy, TierKind, UnitPolicy, OWN_READ_POLL_US,
};
pub use region::{Region, RegionOptions};
#[doc(hidden)]
pub use ring::read_own;
pub use size::{format_size, parse_size};
pub use stats::Counters;
pub use sys::heap;
pub use sys::heap::EngineHeap;
/// The file tier's swap file or device (placement, growth), for tools and tests.
pub use tier::file::SwapFile;

/// The address ranges of the engine's own mappings in this process (its regions,
/// frame arenas and spare THPs), as `(start, end)`. A library that locks a program's
/// memory for it (mlockall) leaves these to [`Region::lock`]: the kernel moves no page
/// between a locked and an unlocked mapping, and a frame arena locked whole would be
/// populated whole.
pub fn engine_mappings() -> Vec<(usize, usize)> {
    sys::mem::own_mappings()
}

/// Base page size the engine manages.
pub const PAGE_SIZE: usize = 4096;
/// Pages in one 2 MiB unit (= one swap cluster).
pub const UNIT_PAGES: usize = 512;
/// Bytes in one 2 MiB unit.
pub const UNIT_SIZE: usize = PAGE_SIZE * UNIT_PAGES;
