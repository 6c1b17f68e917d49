//! The pool: a resident budget, a swap backend, the fault-handling and reclaim
//! threads, and the regions created from it.

use crate::engine::Engine;
use crate::error::Result;
use crate::pagemap::RegionPolicy;
use crate::region::{Region, RegionOptions};
use crate::stats::Counters;
use std::path::PathBuf;
use std::sync::Arc;

/// How big a unit a region swaps in and out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnitPolicy {
    /// 4 KiB pages.
    Small,
    /// Whole 2 MiB units where the region allows it (counted fallbacks otherwise).
    Huge,
    /// 2 MiB units where the access pattern says it pays (the default).
    #[default]
    Auto,
}

/// Which readahead a region uses on swap-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadaheadPolicy {
    /// Around the faulting virtual address, per region (seed 004).
    #[default]
    Vma,
    /// Neighbouring swap slots with one global hit estimate (the pre-seed-004 kernel).
    Cluster,
    /// Only the faulting page.
    Off,
}

/// What happens to a slot when a clean page that owns it is written (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StaleSlotPolicy {
    /// Free the slot at once.
    #[default]
    FreeOnWrite,
    /// Keep the stale slot until reclaim evicts the page again.
    KeepUntilReclaim,
}

/// Slot allocation policy of the backend (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// Read `queue/rotational` of the backing device from sysfs.
    #[default]
    Auto,
    /// Per-thread clusters and scan bases.
    Ssd,
    /// One shared scan base, for sequential I/O.
    Rotational,
}

/// Deterministic backend failures for tests: every Nth read or write completes with EIO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultInjection {
    /// Fail every Nth read request (0: never).
    pub fail_read_every: u64,
    /// Fail every Nth write request (0: never).
    pub fail_write_every: u64,
}

/// Builder of a [`Pool`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    pub(crate) budget: u64,
    pub(crate) swap_file: Option<PathBuf>,
    pub(crate) swap_size: Option<u64>,
    pub(crate) fault_threads: usize,
    pub(crate) device_kind: DeviceKind,
    pub(crate) stale_slot_policy: StaleSlotPolicy,
    pub(crate) readahead: ReadaheadPolicy,
    pub(crate) readahead_max_pages: u32,
    pub(crate) readahead_stream: bool,
    pub(crate) readahead_units: u32,
    pub(crate) unit: UnitPolicy,
    pub(crate) spin_us: u32,
    pub(crate) inject: FaultInjection,
}

impl Default for PoolBuilder {
    fn default() -> Self {
        PoolBuilder {
            budget: 256 << 20,
            swap_file: None,
            swap_size: None,
            fault_threads: 1,
            device_kind: DeviceKind::Auto,
            stale_slot_policy: StaleSlotPolicy::FreeOnWrite,
            readahead: ReadaheadPolicy::Vma,
            readahead_max_pages: 8,
            readahead_stream: true,
            readahead_units: 2,
            unit: UnitPolicy::Auto,
            spin_us: 0,
            inject: FaultInjection::default(),
        }
    }
}

impl PoolBuilder {
    /// Bytes the engine may hold in RAM: resident pages, swap cache, metadata.
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }
    /// Where the swap file goes: a directory (an unnamed file is made in it), a new file
    /// path (an unnamed file in its directory: the name is never created, so processes
    /// given the same path never collide), or a block device. Default: `$TMPDIR`.
    pub fn swap_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.swap_file = Some(path.into());
        self
    }
    /// Swap capacity in bytes. Default: grows to back every region created.
    pub fn swap_size(mut self, bytes: u64) -> Self {
        self.swap_size = Some(bytes);
        self
    }
    /// Threads that serve faults (each with its own io_uring). Default 1.
    pub fn fault_threads(mut self, n: usize) -> Self {
        self.fault_threads = n.max(1);
        self
    }
    /// Slot allocation policy (SSD / rotational), detected by default.
    pub fn device_kind(mut self, kind: DeviceKind) -> Self {
        self.device_kind = kind;
        self
    }
    /// Free stale slots on write (default) or keep them until reclaim.
    pub fn stale_slot_policy(mut self, p: StaleSlotPolicy) -> Self {
        self.stale_slot_policy = p;
        self
    }
    /// Default readahead policy of regions.
    pub fn readahead(mut self, p: ReadaheadPolicy) -> Self {
        self.readahead = p;
        self
    }
    /// Largest readahead window in pages (the kernel's `1 << page-cluster`, default 8).
    pub fn readahead_max_pages(mut self, n: u32) -> Self {
        self.readahead_max_pages = n.clamp(1, crate::UNIT_PAGES as u32);
        self
    }
    /// Beyond the kernel: let a confirmed sequential stream grow its readahead window
    /// past `readahead_max_pages`, up to a whole 2 MiB unit (default on).
    pub fn readahead_stream(mut self, on: bool) -> Self {
        self.readahead_stream = on;
        self
    }

    /// Beyond the kernel: when faults stream through units swapped out whole, read
    /// this many following units ahead (0-16, default 2), so that the disk reads
    /// the next unit while the program works on this one. At most a sixteenth of the
    /// budget; off with readahead off.
    pub fn readahead_units(mut self, n: u32) -> Self {
        self.readahead_units = n.min(16);
        self
    }
    /// Default unit policy of regions.
    pub fn unit(mut self, u: UnitPolicy) -> Self {
        self.unit = u;
        self
    }
    /// Microseconds a fault thread polls for the next fault before it sleeps.
    pub fn spin_us(mut self, us: u32) -> Self {
        self.spin_us = us;
        self
    }
    /// Inject backend I/O errors (for tests).
    pub fn inject_io_errors(mut self, f: FaultInjection) -> Self {
        self.inject = f;
        self
    }
    /// Open userfaultfd and the swap file, start the threads.
    pub fn build(self) -> Result<Pool> {
        Pool::new(self)
    }
}

/// A resident budget and a swap backend shared by regions.
///
/// Dropping the pool stops its threads once every region made from it is dropped
/// too; the swap file disappears with it.
pub struct Pool {
    pub(crate) engine: Arc<Engine>,
}

impl Pool {
    /// Start building a pool (defaults: 256 MiB budget, swap file in `$TMPDIR`).
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }

    fn new(cfg: PoolBuilder) -> Result<Pool> {
        Ok(Pool {
            engine: Engine::start(cfg)?,
        })
    }

    /// A region of `size` bytes (rounded up to 2 MiB) with the pool's default policies.
    pub fn region(&self, size: u64) -> Result<Region> {
        self.region_with(size, RegionOptions::default())
    }

    /// A region with its own policies.
    pub fn region_with(&self, size: u64, opts: RegionOptions) -> Result<Region> {
        let policy = RegionPolicy {
            unit: opts.unit.unwrap_or(self.engine.cfg.unit),
            readahead: opts.readahead.unwrap_or(self.engine.cfg.readahead),
        };
        let inner = self.engine.create_region(size, policy)?;
        // Its page map counts against the budget: make room before handing it out.
        self.engine.commit_metadata(&inner);
        self.engine.add_user();
        Ok(Region {
            engine: self.engine.clone(),
            inner,
        })
    }

    /// Totals over all regions, with the pool's gauges.
    pub fn counters(&self) -> Counters {
        self.engine.counters()
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.engine.cfg.budget
    }

    /// Swap capacity in bytes now.
    pub fn swap_capacity(&self) -> u64 {
        self.engine.swap().capacity()
    }

    /// Where the swap lives (the directory of an unnamed file, or the device).
    pub fn swap_location(&self) -> std::path::PathBuf {
        self.engine.swap().desc().to_path_buf()
    }

    /// Where the swap is, for people: "an unnamed file in /var/tmp (on vda)"; for the
    /// default place, also which of $TMPDIR, /var/tmp, /tmp were skipped and why.
    pub fn swap_place(&self) -> String {
        self.engine.swap().place().to_string()
    }

    /// The zram device under the swap, if any (swapped pages then still take RAM,
    /// compressed).
    pub fn swap_zram(&self) -> Option<String> {
        self.engine.swap().zram().map(str::to_string)
    }

    /// Whether slots are allocated the rotational way (shared scan base) or SSD way.
    pub fn rotational(&self) -> bool {
        self.engine.slots.policy() == crate::slots::AllocPolicy::Rotational
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("budget", &self.budget())
            .field("swap", &self.swap_location())
            .field("swap_capacity", &self.swap_capacity())
            .finish()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.engine.drop_user();
    }
}
