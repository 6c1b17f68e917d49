//! The pool: a resident budget, a swap backend, the fault-handling and reclaim
//! threads, and the regions created from it.

use crate::engine::Engine;
use crate::error::Result;
use crate::pagemap::RegionPolicy;
use crate::region::{Region, RegionOptions};
use crate::stats::Counters;
use std::path::PathBuf;
use std::sync::Arc;

/// Default of [`PoolBuilder::own_read_poll_us`]: past the disk's 4 KiB read p99 here
/// (~100-150 µs), so that nearly every read ends while its thread still polls.
pub const OWN_READ_POLL_US: u32 = 250;

/// How big a unit a region swaps in and out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnitPolicy {
    /// 4 KiB pages.
    Small,
    /// Whole 2 MiB units where the region allows it (counted fallbacks otherwise).
    Huge,
    /// 2 MiB units where the access pattern says it pays (the default): decided per
    /// region from its faults, whole for streams, 4 KiB pages for random access
    /// (`thp_swpin_declined`, `thp_swpout_declined`).
    #[default]
    Auto,
}

/// Where swapped pages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierKind {
    /// The swap file (or block device) only.
    #[default]
    File,
    /// Compressed RAM only (zram's place, but charged to the budget): what does not
    /// compress, or does not fit in the pool, stays resident (over budget, said once).
    Compressed,
    /// Compressed RAM in front of the swap file (zswap's place): what does not
    /// compress goes to the file, and the oldest compressed pages are written back
    /// to it when the pool passes its share of the budget.
    CompressedFile,
    /// Other machines' RAM on a Redis Cluster (`PoolBuilder::remote`); a clear error
    /// at start if the cluster cannot be used.
    Remote,
    /// Compressed RAM in front of the remote tier.
    CompressedRemote,
}

impl TierKind {
    /// Every tier choice.
    pub const ALL: [TierKind; 5] = [
        TierKind::File,
        TierKind::Compressed,
        TierKind::CompressedFile,
        TierKind::Remote,
        TierKind::CompressedRemote,
    ];

    /// Its name in settings and on command lines: `file`, `compressed`,
    /// `compressed+file`, `remote`, `compressed+remote`.
    pub fn name(self) -> &'static str {
        match self {
            TierKind::File => "file",
            TierKind::Compressed => "compressed",
            TierKind::CompressedFile => "compressed+file",
            TierKind::Remote => "remote",
            TierKind::CompressedRemote => "compressed+remote",
        }
    }

    /// Whether pages are compressed into RAM first (the compressor and the pool's
    /// share apply).
    pub fn is_compressed(self) -> bool {
        matches!(
            self,
            TierKind::Compressed | TierKind::CompressedFile | TierKind::CompressedRemote
        )
    }

    /// Whether pages go to a Redis Cluster (`PoolBuilder::remote` is needed).
    pub fn is_remote(self) -> bool {
        matches!(self, TierKind::Remote | TierKind::CompressedRemote)
    }

    /// Whether a compressed pool has a tier behind it to write back to.
    pub fn has_writeback(self) -> bool {
        matches!(self, TierKind::CompressedFile | TierKind::CompressedRemote)
    }

    /// The compressed pool's share of the budget, percent, when not set
    /// (`PoolBuilder::compressed_max_percent`): 90 with a tier behind the pool, 50 with
    /// none.
    ///
    /// With a tier behind, a page in the pool costs a fault ~15 us, one on the file a
    /// read, and resident pages are kept in fault order (no accessed bits in user space),
    /// so the budget holds most when most of it is pool: pmbench 80/20 4k, 1 GiB at
    /// issue 12's equal memory (513 MiB), 48.3 k accesses/s at 90% against 43.8 k at 80%
    /// and 36.6 k at 50% (that one passing poor pages on); at 256 MiB 90% and 80% alike,
    /// 1.4x 50%; the 2 MiB streams no slower and writing ~12% fewer bytes
    /// (docs/benchmarks.md). With no tier behind it, the share is all the pool can hold
    /// and the rest of the budget is what stays resident of what does not fit.
    pub fn default_compressed_max_percent(self) -> u32 {
        if self.has_writeback() {
            90
        } else {
            50
        }
    }
}

impl std::fmt::Display for TierKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TierKind {
    type Err = String;

    /// A name of [`TierKind::name`].
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        TierKind::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = TierKind::ALL.iter().map(|t| t.name()).collect();
                format!("unknown tier {s:?}: expected {}", names.join(", "))
            })
    }
}

/// The compressor of the compressed tier.
pub use crate::tier::compressed::Compressor;

/// How large a growable swap file may get (`--max-swap`, `USWAP_MAX_SWAP`): the file
/// grows as pages are evicted, never past this, and never so far that its filesystem
/// keeps less free space than the cap left it when the pool started (so a pool and the
/// processes it forks share one cap). Parsed and checked here only: the command line,
/// the preload library's environment and the builder all go through `FromStr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxSwap {
    /// At most this many bytes (at least one 2 MiB unit).
    Bytes(u64),
    /// At most this percentage (1-100) of the filesystem's free space when the pool
    /// starts.
    PercentOfFree(u32),
}

impl MaxSwap {
    /// The default: half the free space of the swap file's filesystem. The other half
    /// stays for everything else on the machine (a stress-ng run once grew two swap
    /// files to 35 GiB each and filled the root filesystem).
    pub const DEFAULT: MaxSwap = MaxSwap::PercentOfFree(50);

    /// Itself if it can be used, else why not (the builder's pool checks it too).
    pub fn check(self) -> std::result::Result<Self, String> {
        match self {
            MaxSwap::PercentOfFree(1..=100) => Ok(self),
            MaxSwap::PercentOfFree(p) => Err(format!(
                "max swap {p}%: a percentage of the filesystem's free space must be 1% to 100%"
            )),
            MaxSwap::Bytes(b) if b < crate::UNIT_SIZE as u64 => Err(format!(
                "max swap of {b} bytes is too small: the minimum is 2M (one 2 MiB swap unit)"
            )),
            MaxSwap::Bytes(_) => Ok(self),
        }
    }

    /// The cap in bytes for a filesystem with `free` bytes free now (rounded down to
    /// a 2 MiB unit).
    pub fn bytes_of(self, free: u64) -> u64 {
        let b = match self {
            MaxSwap::Bytes(b) => b,
            MaxSwap::PercentOfFree(p) => free / 100 * u64::from(p),
        };
        b & !(crate::UNIT_SIZE as u64 - 1)
    }
}

impl Default for MaxSwap {
    fn default() -> Self {
        MaxSwap::DEFAULT
    }
}

impl std::fmt::Display for MaxSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxSwap::Bytes(b) => write!(f, "{b}"),
            MaxSwap::PercentOfFree(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for MaxSwap {
    type Err = String;
    /// `SIZE` (`8G`, at least 2M) or `N%` (1-100, of the filesystem's free space).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim();
        let v = match t.strip_suffix('%') {
            Some(p) => MaxSwap::PercentOfFree(
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("max swap {s:?}: not a percentage"))?,
            ),
            None => MaxSwap::Bytes(crate::parse_size(t).map_err(|e| format!("max swap: {e}"))?),
        };
        v.check()
    }
}

/// Who serves a region's page faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultMode {
    /// The pool's fault threads (the faulting thread sleeps until its page is mapped).
    /// Works with everything, system calls on swapped memory included.
    #[default]
    Handler,
    /// The faulting thread itself, in a SIGBUS handler: no thread is woken, so a
    /// fault costs the read plus a few microseconds. A system call that touches a page
    /// of the region that is not resident fails with EFAULT; 4 KiB units only. See
    /// `docs/design.md` ("In-thread faults").
    InThread,
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

/// Deterministic backend failures for tests: every Nth read or write completes with
/// EIO, or short (half its bytes). Build it with `..Default::default()`: more kinds
/// of failure may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultInjection {
    /// Fail every Nth read request (0: never).
    pub fail_read_every: u64,
    /// Fail every Nth write request (0: never).
    pub fail_write_every: u64,
    /// Every Nth read request of more than one page reads only half (0: never).
    pub short_read_every: u64,
    /// Every Nth write request of more than one page writes only half (0: never).
    pub short_write_every: u64,
    /// Fail every Nth mapping of a swapped-in copy into the region, as UFFDIO_COPY
    /// fails with ENOMEM under a memory limit (0: never): the copy must wait for the
    /// retrying fault, wherever it came from.
    pub fail_map_every: u64,
    /// Every Nth 2 MiB move of a zeroed page into a region (a first touch under
    /// `UnitPolicy::Huge`, from a spare THP or a frame) moves only its first half, as
    /// UFFDIO_MOVE does when it stops part-way (0: never).
    pub partial_move_every: u64,
    /// Inject only into a request's first attempt, so that the engine's retry succeeds:
    /// the failures are transient and no data may be lost to them (what a test that
    /// checks every byte needs). False: every Nth request, retries included.
    pub transient: bool,
}

/// Builder of a [`Pool`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    pub(crate) budget: u64,
    pub(crate) swap_file: Option<PathBuf>,
    pub(crate) swap_size: Option<u64>,
    pub(crate) max_swap: MaxSwap,
    pub(crate) keep_free: Option<u64>,
    pub(crate) fault_threads: usize,
    pub(crate) device_kind: DeviceKind,
    pub(crate) stale_slot_policy: StaleSlotPolicy,
    pub(crate) readahead: ReadaheadPolicy,
    pub(crate) readahead_max_pages: u32,
    pub(crate) readahead_stream: bool,
    pub(crate) readahead_units: u32,
    pub(crate) unit: UnitPolicy,
    pub(crate) spin_us: u32,
    pub(crate) io_poll_us: u32,
    pub(crate) own_read_poll_us: u32,
    pub(crate) fault_mode: FaultMode,
    pub(crate) fork_hooks: bool,
    pub(crate) tier: TierKind,
    pub(crate) compressor: Compressor,
    /// None: `TierKind::default_compressed_max_percent`.
    pub(crate) compressed_max_percent: Option<u32>,
    /// None: stored where the pool has a tier behind it.
    pub(crate) store_incompressible: Option<bool>,
    pub(crate) remote: Option<String>,
    pub(crate) inject: FaultInjection,
    pub(crate) encrypt: bool,
    pub(crate) checksums: bool,
    pub(crate) follow_memcg: bool,
    pub(crate) live: bool,
}

impl Default for PoolBuilder {
    fn default() -> Self {
        PoolBuilder {
            budget: 256 << 20,
            swap_file: None,
            swap_size: None,
            max_swap: MaxSwap::DEFAULT,
            keep_free: None,
            fault_threads: 1,
            device_kind: DeviceKind::Auto,
            stale_slot_policy: StaleSlotPolicy::FreeOnWrite,
            readahead: ReadaheadPolicy::Vma,
            readahead_max_pages: 8,
            readahead_stream: true,
            readahead_units: 2,
            unit: UnitPolicy::Auto,
            spin_us: 0,
            io_poll_us: 0,
            own_read_poll_us: OWN_READ_POLL_US,
            fault_mode: FaultMode::Handler,
            fork_hooks: true,
            tier: TierKind::File,
            compressor: Compressor::Lz4,
            compressed_max_percent: None,
            store_incompressible: None,
            remote: None,
            inject: FaultInjection::default(),
            encrypt: false,
            checksums: true,
            follow_memcg: true,
            live: true,
        }
    }
}

impl PoolBuilder {
    /// Bytes the engine may hold in RAM: resident pages, swap cache, metadata.
    /// In a memory cgroup, the engine holds at most what the cgroup leaves it (see
    /// [`follow_memcg`](Self::follow_memcg)); [`memcg::limit`](crate::memcg::limit)
    /// as the budget fills the cgroup.
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }

    /// Whether the budget gives way to the process's memory cgroup (default on): the
    /// engine then holds at most the cgroup's limit less what the process holds
    /// outside it, read every 5 ms, so that a budget bigger than the cgroup's room
    /// or a program's growing heap does not end in the OOM killer.
    pub fn follow_memcg(mut self, on: bool) -> Self {
        self.follow_memcg = on;
        self
    }
    /// Where the swap file goes: a directory (an unnamed file is made in it), a new file
    /// path (an unnamed file in its directory: the name is never created, so processes
    /// given the same path never collide), or a block device. Default: `$TMPDIR`.
    pub fn swap_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.swap_file = Some(path.into());
        self
    }
    /// How large the swap file may grow (default [`MaxSwap::DEFAULT`]: half of its
    /// filesystem's free space). The file grows as pages are evicted and gives back
    /// the space of freed clusters; a pool that reaches the cap keeps further pages
    /// resident, over the budget, and says so (see `docs/run.md`, "When the swap place
    /// is full"). Ignored with a fixed [`swap_size`](Self::swap_size) or a block device.
    pub fn max_swap(mut self, cap: MaxSwap) -> Self {
        self.max_swap = cap;
        self
    }
    /// Free space the swap file never takes its filesystem below (default: what
    /// [`max_swap`](Self::max_swap) leaves free when the pool starts). `uswap run` gives
    /// every process of a run the first one's (`Pool::swap_keep_free`), so that they
    /// share one cap rather than each taking its own.
    pub fn keep_free(mut self, bytes: u64) -> Self {
        self.keep_free = Some(bytes);
        self
    }
    /// Fixed swap capacity in bytes, preallocated at start; a region that would take
    /// the committed total past it is refused (`Error::SwapFull`). Default: none (the
    /// file grows as pages are evicted, up to [`max_swap`](Self::max_swap)).
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
    /// Microseconds a fault thread polls its completion queue (in memory, no system
    /// call) while reads are in flight, before it sleeps: the completion is handled
    /// at once instead of after a wake-up. 0: never poll.
    pub fn io_poll_us(mut self, us: u32) -> Self {
        self.io_poll_us = us;
        self
    }
    /// Microseconds a faulting thread that reads its own page (in-thread faults: the
    /// file tier's read, the remote tier's reply) polls for the read's end before it
    /// sleeps, giving its CPU to any other runnable thread between looks
    /// (`sched_yield`). 0: sleep at once. Default 250: the thread has nothing else to
    /// do, and on this VM a sleep and its wake-up add ~10 µs to a 4 KiB read
    /// (docs/design.md, "Own reads, polled").
    pub fn own_read_poll_us(mut self, us: u32) -> Self {
        self.own_read_poll_us = us;
        self
    }
    /// Default fault mode of regions (fault threads, or in the faulting thread).
    pub fn fault_mode(mut self, m: FaultMode) -> Self {
        self.fault_mode = m;
        self
    }
    /// Where swapped pages go (default: the swap file).
    pub fn tier(mut self, t: TierKind) -> Self {
        self.tier = t;
        self
    }
    /// The Redis Cluster of the remote tier: `redis://HOST:PORT[,HOST:PORT...]` (seeds;
    /// `rediss://` for TLS, `redis://USER:PASSWORD@HOST:PORT` for AUTH/ACL). Used by
    /// `TierKind::Remote` and `CompressedRemote`.
    pub fn remote(mut self, nodes: impl Into<String>) -> Self {
        self.remote = Some(nodes.into());
        self
    }
    /// The compressor of the compressed tier (default lz4).
    pub fn compressor(mut self, c: Compressor) -> Self {
        self.compressor = c;
        self
    }
    /// The compressed pool's share of the budget, in percent (1-90, like zswap's
    /// max_pool_percent; default 90 with a tier behind the pool, 50 with none:
    /// `TierKind::default_compressed_max_percent` says why): past it, the oldest
    /// compressed pages are written back to the file (`compressed+file`) or new ones are
    /// refused (`compressed`).
    pub fn compressed_max_percent(mut self, p: u32) -> Self {
        self.compressed_max_percent = Some(p.clamp(1, 90));
        self
    }
    /// Whether pages that compress poorly (over the accept threshold, 80%) are stored
    /// in the compressed pool as they are, uncompressed, where a tier is behind it, as
    /// zswap does since Linux 6.18 (default on; off, such pages go straight to that
    /// tier, as zswap did before). Stored, a fault on one costs a copy from RAM, not a
    /// read from the file or the cluster; they are stored only while the pool is under
    /// 7/8 of its share, and are the first that writeback sends on. Either way each
    /// takes a page of the budget while in RAM, so storing pays where the pool has room
    /// (pmbench 80/20 4k at issue 12's equal memory, default share 90%: 1.33x the
    /// accesses of passing them on) and costs where a small share binds (at 50%: 0.92x; a
    /// raw page takes the room of two or three compressed ones). With no tier behind
    /// the pool (`TierKind::Compressed`) such pages stay resident.
    pub fn store_incompressible(mut self, on: bool) -> Self {
        self.store_incompressible = Some(on);
        self
    }
    /// Register the fork hooks (`prepare_fork`, `after_fork_*`) with `pthread_atfork`
    /// when the pool starts (default on), so that fork(2) just works. A caller that
    /// calls the hooks from its own `pthread_atfork` handlers, and must order them with
    /// its own locks (the LD_PRELOAD library does), turns this off.
    pub fn fork_hooks(mut self, on: bool) -> Self {
        self.fork_hooks = on;
        self
    }
    /// Encrypt what goes to the swap file (default off; see the README): AES-256-GCM
    /// per 4 KiB page under a key made at start from the OS RNG and never written
    /// anywhere, so the file is unreadable once the process is gone, or to anybody who
    /// copies it meanwhile. The tag is each page's checksum: a changed byte is caught as
    /// with checksums. Costs the encryption (hardware AES: a few GB/s per core) and 24
    /// bytes per swapped page. The compressed tier holds its pages in this process's
    /// RAM, unencrypted; what it writes back to the file is encrypted.
    pub fn encrypt(mut self, on: bool) -> Self {
        self.encrypt = on;
        self
    }
    /// A measurement knob, not a setting: `false` stops hashing the pages written to
    /// the swap file and checking them when read back, so that the cost of checksums
    /// can be measured (`docs/benchmarks.md`). A page the device changed then comes
    /// back as wrong bytes. Default and only sane value: `true`. With `encrypt`, the
    /// tag still checks every page.
    #[doc(hidden)]
    pub fn checksums(mut self, on: bool) -> Self {
        self.checksums = on;
        self
    }
    /// Publish the pool's counters for other processes of this user to read while it
    /// runs (`uswap stat`, `uswap top`, `uswap export`) and take budget changes from
    /// them (`uswap set`): a small file in `$USWAP_LIVE_DIR` or `/dev/shm/uswap-<uid>`,
    /// written every 250 ms (`live.rs`). Default on.
    pub fn live(mut self, on: bool) -> Self {
        self.live = on;
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
        self.make_region(size, opts, None)
    }

    /// A region placed at `addr` (2 MiB aligned), for callers that reserved address
    /// space first and put uswap memory into it later (`uswap run` for a JVM heap, an
    /// allocator's arena). The region replaces whatever was mapped at
    /// `[addr, addr + size rounded up to 2 MiB)` (MAP_FIXED); if creation fails, that
    /// range is left mapped PROT_NONE. Dropping the region unmaps the range.
    ///
    /// # Safety
    /// The caller owns that range (an empty reservation of its own, e.g. a PROT_NONE
    /// mapping) and nothing else uses it: its contents are lost.
    pub unsafe fn region_at(
        &self,
        addr: *mut u8,
        size: u64,
        opts: RegionOptions,
    ) -> Result<Region> {
        self.make_region(size, opts, Some(addr as usize))
    }

    fn make_region(&self, size: u64, opts: RegionOptions, at: Option<usize>) -> Result<Region> {
        let in_thread =
            opts.fault_mode.unwrap_or(self.engine.cfg.fault_mode) == FaultMode::InThread;
        let policy = RegionPolicy {
            // The in-thread path maps 4 KiB pages.
            unit: if in_thread {
                UnitPolicy::Small
            } else {
                opts.unit.unwrap_or(self.engine.cfg.unit)
            },
            readahead: opts.readahead.unwrap_or(self.engine.cfg.readahead),
        };
        let inner = crate::regions::create(&self.engine, size, policy, in_thread, at)?;
        // Its page map counts against the budget: make room before handing it out.
        self.engine.commit_metadata(&inner);
        self.engine.threads.add_user();
        Ok(Region {
            engine: self.engine.clone(),
            inner,
        })
    }

    /// Totals over all regions, with the pool's gauges.
    pub fn counters(&self) -> Counters {
        self.engine.counters()
    }

    /// The budget in bytes: as the pool started, or as [`set_budget`](Self::set_budget)
    /// changed it.
    pub fn budget(&self) -> u64 {
        self.engine.budget.requested_bytes()
    }

    /// Change the budget while the pool runs: growing, the engine may hold more at
    /// once; shrinking, the limit drops now and the reclaim thread, woken, evicts down
    /// to it (a fault meanwhile waits for room, as at any budget; nothing is lost or
    /// killed). At most the budget the pool started with (its swap-cache frames are
    /// sized for it), at least 8 MiB.
    pub fn set_budget(&self, bytes: u64) -> Result<()> {
        self.engine.set_budget(bytes)
    }

    /// The memory cgroup whose room the budget follows (its directory and limit), if one
    /// limits the process.
    pub fn memcg(&self) -> Option<String> {
        self.engine.memcg.as_ref().map(|m| m.describe())
    }

    /// Free space the swap file never takes its filesystem below (see
    /// [`PoolBuilder::keep_free`]).
    pub fn swap_keep_free(&self) -> u64 {
        self.engine.tiers.file().keep_free()
    }

    /// Swap capacity in bytes now.
    pub fn swap_capacity(&self) -> u64 {
        self.engine.tiers.capacity()
    }

    /// Where the swap lives (the directory of an unnamed file, or the device).
    pub fn swap_location(&self) -> std::path::PathBuf {
        self.engine.tiers.file().desc().to_path_buf()
    }

    /// Check the engine's own consistency, for tests: `Err` describes every problem
    /// found. Always checked: internal errors the engine recovered from, slot double
    /// frees and invalid slot operations, engine threads that died. When no region is
    /// alive, also that nothing leaked: no slot in use but bad ones, nothing cached or
    /// resident (it waits up to 5 s for I/O still in flight after the last region was
    /// dropped). Each problem is an engine bug; tests assert `Ok`.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let t = std::time::Instant::now();
        let mut settle = 0;
        let mut errors = loop {
            let (errors, io_busy) = self.engine.invariant_errors();
            // A request that just finished may still be handled on its thread (its
            // frames not yet freed): a leak must last before it is one.
            if !io_busy && (errors.is_empty() || settle == 20) {
                break errors;
            }
            settle += usize::from(!io_busy);
            if t.elapsed() > std::time::Duration::from_secs(5) {
                let mut errors = errors;
                errors.push("I/O still in flight 5 s after the last region was dropped".into());
                break errors;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        errors.dedup();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Where the swap is, for people: "an unnamed file in /var/tmp (on vda)"; for the
    /// default place, also which of $TMPDIR, /var/tmp, /tmp were skipped and why.
    pub fn swap_place(&self) -> String {
        self.engine.tiers.file().place().to_string()
    }

    /// The zram device under the swap, if any (swapped pages then still take RAM,
    /// compressed).
    pub fn swap_zram(&self) -> Option<String> {
        self.engine.tiers.file().zram().map(str::to_string)
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

impl Pool {
    /// For a pool that is never dropped (one in a `static`, which lives until the process
    /// exits): removes its live record now (`PoolBuilder::live`), as the pool's end
    /// would; nothing more is published. (A reader would remove the record once the
    /// process is gone anyway.)
    pub fn close_live_at_exit(&self) {
        let _a = self.engine.fork.enter_from_program();
        self.engine.live.close();
    }

    /// For a pool that is never dropped (one in a `static`, which lives until the process
    /// exits): deletes the remote tier's values now, as the pool's end would (those a live
    /// forked child may still read are left to it). Call it as the process exits; a page
    /// still on the remote tier cannot be read after it (SIGBUS). Nothing to do without a
    /// remote tier.
    pub fn close_remote_at_exit(&self) {
        if self.engine.tiers.remote.is_none() {
            return;
        }
        // On a thread of its own: at exit the calling thread's thread-locals (the remote
        // tier's runtime context among them) may be gone already.
        let engine = self.engine.clone();
        let done = std::thread::Builder::new()
            .name("uswap-exit".into())
            .spawn(move || engine.close_remote())
            .map(|t| t.join());
        if done.is_err() {
            say!("uswap: at exit: no thread to delete the remote tier's values (they expire)");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.engine.drop_user();
    }
}
