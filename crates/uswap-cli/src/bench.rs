//! `uswap bench`: its options, and one run of a workload on uswap or plain memory.

use crate::data::{DataKind, Pattern};
use crate::memory::{peak_rss_bytes, Memory, Snapshot};
use crate::report::Report;
use crate::workloads::{self, Mark, Outcome, Params, Ui, DEFAULT_DURATION, PAGE_BYTES};
use clap::builder::TypedValueParser as _;
use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Examples shown after `uswap bench --help`.
pub const EXAMPLES: &str = "\
Examples:
  uswap bench
      The main job: swap-w-seq on a 1 GiB region under a 256 MiB budget (4x), swap file in $TMPDIR.
  uswap bench swap-w-seq --size 2G --budget 256M --unit 2m --json
      Two sequential write passes in 2 MiB units; one JSON object on the last line of stdout.
  uswap bench pmbench --size 2G --budget 256M --duration 30s --read-pct 80 --threads 2
      Uniform random 4 KiB accesses, 80% reads, latency percentiles.
  uswap bench seq-read --readahead off
      Populate, then read everything twice; compare with --readahead vma.
  uswap bench combined --readahead cluster --bg-threads 2
      Seed 004's test: sequential read+write of one region, random writes to another.
  uswap bench pmbench --memory plain --size 256M --duration 2s
      The same workload on ordinary memory (no uswap): the kernel-swap side of a comparison.
  uswap bench swap-w-seq --against kernel --repeat 3 --plot cmp.png
      Side by side with Linux swap in fresh memory cgroups (needs root).

Sizes: 4k, 256M, 2G, 1.5G, 2GiB or bytes (binary units). Durations: 500ms, 10s, 2m, 1h, or seconds.
Throughput is in MB/s (10^6 bytes); latencies in microseconds.
Exit status: 0 ok, 1 verification failure (wrong or lost data) or runtime error, 2 bad usage.";

/// The workloads, shaped like the seeds' benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// T threads each write their own contiguous slice, two passes with different patterns
    /// (vm-scalability swap-w-seq; the second checks each word before overwriting it), then
    /// verify; throughput = bytes written / write time.
    SwapWSeq,
    /// Populate, then T threads rewrite random 4 KiB pages, checking each first (as many as
    /// the region has, or for --duration), then verify every page; throughput = bytes
    /// written / write time.
    SwapWRand,
    /// Populate, then uniform random 4 KiB-page accesses (one word each) for --duration with
    /// --read-pct reads; accesses/s and latency percentiles.
    Pmbench,
    /// Populate, then read the region sequentially twice, checking every word;
    /// throughput = bytes read / read time.
    SeqRead,
    /// Seed 004: T threads read-verify and rewrite their slice of one region pass after pass,
    /// while --bg-threads write random pages of a second region; latency percentiles, ra_hit%.
    Combined,
    /// What one 4 KiB fault costs: p50/p90/p99 of a major fault, of a swap-cache hit, and of
    /// an O_DIRECT 4 KiB pread on the swap file's disk, interleaved in one run (4 KiB units).
    FaultLatency,
}

impl Workload {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::SwapWSeq => "swap-w-seq",
            Workload::SwapWRand => "swap-w-rand",
            Workload::Pmbench => "pmbench",
            Workload::SeqRead => "seq-read",
            Workload::Combined => "combined",
            Workload::FaultLatency => "fault-latency",
        }
    }
}

/// Who serves faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FaultModeArg {
    /// The pool's fault threads.
    Handler,
    /// The faulting thread, in a SIGBUS handler.
    InThread,
}

impl FaultModeArg {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FaultModeArg::Handler => "handler",
            FaultModeArg::InThread => "in-thread",
        }
    }
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

impl OnOff {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OnOff::On => "on",
            OnOff::Off => "off",
        }
    }
}

/// Swap unit of the regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Unit {
    /// 4 KiB pages.
    #[value(name = "4k")]
    Small,
    /// Whole 2 MiB units (plain memory: MADV_HUGEPAGE).
    #[value(name = "2m")]
    Huge,
    /// 2 MiB where the access pattern says it pays.
    Auto,
}

impl Unit {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Small => "4k",
            Unit::Huge => "2m",
            Unit::Auto => "auto",
        }
    }
    fn policy(self) -> uswap::UnitPolicy {
        match self {
            Unit::Small => uswap::UnitPolicy::Small,
            Unit::Huge => uswap::UnitPolicy::Huge,
            Unit::Auto => uswap::UnitPolicy::Auto,
        }
    }
}

/// Swap-in readahead policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Readahead {
    /// Around the faulting address, per region (seed 004).
    Vma,
    /// Neighbouring swap slots, one global hit estimate (the older kernel policy).
    Cluster,
    /// Only the faulting page.
    Off,
}

impl Readahead {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Readahead::Vma => "vma",
            Readahead::Cluster => "cluster",
            Readahead::Off => "off",
        }
    }
    fn policy(self) -> uswap::ReadaheadPolicy {
        match self {
            Readahead::Vma => uswap::ReadaheadPolicy::Vma,
            Readahead::Cluster => uswap::ReadaheadPolicy::Cluster,
            Readahead::Off => uswap::ReadaheadPolicy::Off,
        }
    }
}

/// What happens to a swap slot when a clean page that owns it is written (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StaleSlot {
    /// Free it at once.
    Free,
    /// Keep it until reclaim evicts the page again.
    Keep,
}

impl StaleSlot {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StaleSlot::Free => "free",
            StaleSlot::Keep => "keep",
        }
    }
}

/// Slot allocation policy of the swap device (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// Per-thread clusters and scan bases.
    Ssd,
    /// One shared scan base, for sequential I/O.
    Rotational,
    /// Read queue/rotational of the device holding the swap file.
    Auto,
}

impl Device {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Device::Ssd => "ssd",
            Device::Rotational => "rotational",
            Device::Auto => "auto",
        }
    }
}

/// Parse `--data`: `zeros`, `text`, `random` or `mixed`.
pub fn parse_data(s: &str) -> Result<DataKind, String> {
    s.parse()
}

/// Which memory the workload runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MemoryKind {
    /// uswap regions from a pool with --budget.
    Uswap,
    /// Ordinary anonymous memory (no uswap; the kernel swaps it, if anything does).
    Plain,
}

impl MemoryKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Uswap => "uswap",
            MemoryKind::Plain => "plain",
        }
    }
}

/// What `--against` compares uswap with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Against {
    /// Kernel swap to a swap file next to uswap's.
    Kernel,
    /// Kernel swap to zram of the same size; zram's memory is not charged to the kernel
    /// side's memory cgroup, so each uswap run's budget gets zram's peak memory of the
    /// kernel run before it too (equal total memory).
    Zram,
    /// Kernel swap with zswap in front of the swap file; zswap's pool is not charged to a
    /// v1 memory cgroup either, so each uswap run's budget gets its peak too.
    Zswap,
}

impl Against {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Against::Kernel => "kernel",
            Against::Zram => "zram",
            Against::Zswap => "zswap",
        }
    }
}

/// Parse a size argument with uswap's parser (`4k`, `256M`, `2G`, `1.5G`, bytes).
pub fn parse_size_arg(s: &str) -> Result<u64, uswap::Error> {
    uswap::parse_size(s)
}

/// Parse a duration: a number with `ns`, `us`, `ms`, `s`, `m` or `h` (no unit: seconds),
/// e.g. `500ms`, `10s`, `1.5s`, `2m`. Zero and negative durations are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = |why: &str| format!("invalid duration {s:?}: {why} (examples: 500ms, 10s, 2m)");
    if num.is_empty() {
        return Err(bad("no number"));
    }
    let v: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let secs = match unit.trim() {
        "ns" => v / 1e9,
        "us" | "µs" => v / 1e6,
        "ms" => v / 1e3,
        "" | "s" | "sec" | "secs" => v,
        "m" | "min" | "mins" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(bad("unknown unit (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs > 1e9 {
        return Err(bad("too long"));
    }
    let d = Duration::from_secs_f64(secs);
    if d.is_zero() {
        return Err(bad("must be greater than zero"));
    }
    Ok(d)
}

fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms * 1_000_000 == d.as_nanos() {
        if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    } else {
        format!("{}ns", d.as_nanos())
    }
}

/// `uswap bench` options. Also what `--against` (in `against.rs`) gets to run both sides.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workload to run.
    #[arg(value_enum, default_value_t = Workload::SwapWSeq)]
    pub workload: Workload,

    /// Region size [default: 1G]; with uswap, a region this big is paged under --budget.
    #[arg(long, value_name = "SIZE", default_value = "1G", hide_default_value = true, value_parser = parse_size_arg)]
    pub size: u64,

    /// Resident budget of the uswap pool [default: 256M]: resident pages, swap cache and
    /// metadata stay under it. In a memory cgroup, the pool also stays under the room the
    /// cgroup leaves it (its limit less the program's own memory), read every 5 ms.
    #[arg(long, value_name = "SIZE", default_value = "256M", hide_default_value = true, value_parser = parse_size_arg)]
    pub budget: u64,

    /// The uswap pool's budget is its memory cgroup's whole room: the limit less what the
    /// program holds itself, followed as that changes (as kernel swap uses a cgroup). With
    /// --against or --cgroup-limit, --budget still sizes the cgroup (budget + 64 MiB under
    /// --against) and the uswap side fills it; alone, the process's cgroup must have a limit.
    #[arg(long)]
    pub fill_memcg: bool,

    /// Workload threads; each owns its slice (sequential) or its pages (random) [default: 1].
    #[arg(short = 't', long, value_name = "N", default_value_t = 1, hide_default_value = true,
          value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub threads: usize,

    /// How long pmbench and combined run [default: 10s]; swap-w-rand writes for this long
    /// instead of one region's worth of pages.
    #[arg(short = 'd', long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// pmbench: percent of accesses that are reads, 0-100 [default: 80].
    #[arg(long, value_name = "PCT", default_value_t = 80, hide_default_value = true,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub read_pct: u8,

    /// combined: size of the background region [default: half of --size].
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub bg_size: Option<u64>,

    /// combined: background random-writer threads; 0 runs without the background region
    /// [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, hide_default_value = true,
          value_parser = clap::value_parser!(u16).range(0..=1024).map(usize::from))]
    pub bg_threads: usize,

    /// Which memory to run on: uswap, or plain anonymous memory with no uswap (the
    /// kernel-swap side of a comparison; --unit 2m then means MADV_HUGEPAGE) [default: uswap].
    #[arg(long, value_enum, value_name = "KIND", default_value_t = MemoryKind::Uswap, hide_default_value = true)]
    pub memory: MemoryKind,

    /// Swap file place: a directory (an unlinked file is made in it), a new file, or a block
    /// device [default: an unlinked file in $TMPDIR].
    #[arg(long, value_name = "PATH")]
    pub swap_file: Option<PathBuf>,

    /// Fixed swap capacity, preallocated [default: none: the file grows as pages are
    /// evicted, up to --max-swap].
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, conflicts_with = "max_swap")]
    pub swap_size: Option<u64>,

    /// Most the swap file may grow to: SIZE, or N% of its filesystem's free space at
    /// start [default: 50%]. Past it, pages stay in RAM over the budget, said on stderr.
    #[arg(long, value_name = "SIZE|N%")]
    pub max_swap: Option<uswap::MaxSwap>,

    /// Encrypt what goes to the swap file (AES-256-GCM under a key made at start and
    /// never written anywhere; the tag checks every page read back).
    #[arg(long)]
    pub encrypt: bool,

    /// Write pages without their checksums and read them back unchecked: only to measure
    /// what checksums cost (a bit flipped on the device then comes back as a wrong byte).
    /// No effect with --encrypt, whose tag checks every page.
    #[arg(long)]
    pub no_checksums: bool,

    /// Swap unit: 4k pages, whole 2m units (real THPs), or auto: 2 MiB I/O for sequential
    /// streams, 4 KiB with readahead for random faults [default: auto].
    #[arg(long, value_enum, value_name = "UNIT", ignore_case = true, default_value_t = Unit::Auto, hide_default_value = true)]
    pub unit: Unit,

    /// Swap-in readahead: vma (around the faulting address, seed 004), cluster (neighbouring
    /// slots), or off [default: vma].
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = Readahead::Vma, hide_default_value = true)]
    pub readahead: Readahead,

    /// Largest readahead window in 4 KiB pages, 1-512 [default: the engine's, 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=512))]
    pub ra_max_pages: Option<u32>,

    /// Beyond the kernel: a confirmed sequential stream grows its readahead window past
    /// --ra-max-pages up to a whole 2 MiB unit, and shrinks back when hits fall [default: on].
    #[arg(long, value_enum, value_name = "ON|OFF", default_value_t = OnOff::On, hide_default_value = true)]
    pub ra_stream: OnOff,

    /// Beyond the kernel: a stream of faults through units swapped out whole also
    /// reads the next N units ahead (2 MiB each), so the disk reads while the program
    /// works, 0-16 [default: 2; at most 1/16 of the budget; none with --readahead off].
    #[arg(long, value_name = "N", default_value_t = 2, hide_default_value = true, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub ra_units: u32,

    /// Slot of a clean page that gets written: free it at once, or keep it until reclaim
    /// (seed 001) [default: free].
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = StaleSlot::Free, hide_default_value = true)]
    pub stale_slot: StaleSlot,

    /// Slot allocation: ssd (per-thread scan bases), rotational (shared), or auto from sysfs
    /// (seed 003) [default: auto].
    #[arg(long, value_enum, value_name = "KIND", default_value_t = Device::Auto, hide_default_value = true)]
    pub device: Device,

    /// Threads serving faults [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, hide_default_value = true,
          value_parser = clap::value_parser!(u16).range(1..=256).map(usize::from))]
    pub fault_threads: usize,

    /// Microseconds a fault thread polls for the next fault before sleeping [default: 0].
    #[arg(
        long,
        value_name = "US",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub spin_us: u32,

    /// Who serves faults: the pool's fault threads (handler), or the faulting thread itself
    /// in a SIGBUS handler (in-thread: no wake-ups; system calls on swapped memory fail with
    /// EFAULT; 4 KiB units) [default: handler].
    #[arg(long, value_enum, value_name = "MODE", default_value_t = FaultModeArg::Handler, hide_default_value = true)]
    pub fault_mode: FaultModeArg,

    /// Microseconds a fault thread polls for the completion of reads in flight before it
    /// sleeps [default: 0].
    #[arg(
        long,
        value_name = "US",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub io_poll_us: u32,

    /// With `--fault-mode in-thread`: microseconds a faulting thread polls for the end of
    /// its own page's read (the file's, or the cluster's reply), yielding its CPU to any
    /// runnable thread between looks, before it sleeps; 0: sleep at once [default: 250].
    #[arg(
        long,
        value_name = "US",
        default_value_t = uswap::OWN_READ_POLL_US,
        hide_default_value = true
    )]
    pub own_read_poll_us: u32,

    #[command(flatten)]
    pub tiers: crate::tier::TierArgs,

    /// What the workload writes: zeros, text (log lines and prose), random
    /// (incompressible), or mixed (like real anonymous memory: zero pages, text, heap
    /// objects, some random; ~2.6:1 with lz4) [default: mixed].
    #[arg(long, value_name = "KIND", default_value = "mixed", hide_default_value = true,
          value_parser = parse_data)]
    pub data: DataKind,

    /// Seed of the data pattern and of the random choices [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, hide_default_value = true)]
    pub seed: u64,

    /// Print one JSON object on the last line of stdout instead of the table (no progress bar).
    #[arg(long)]
    pub json: bool,

    /// Run the same workload on kernel swap (a swap file next to uswap's, zram, or zswap) and
    /// on uswap, each in a fresh memory cgroup limited to the budget; print both and the
    /// ratios. Needs root.
    #[arg(long, value_enum, value_name = "KIND")]
    pub against: Option<Against>,

    /// With --against: runs of each side, alternating; medians are reported [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, hide_default_value = true,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,

    /// With --against: write a chart of the ratios (and pmbench's latency CDF) to FILE
    /// (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// With --against: run the kernel side with the swap disk's queue/rotational set to 0
    /// (SSD paths), restored afterwards.
    #[arg(long)]
    pub kernel_ssd: bool,

    /// With --against: set vm.page-cluster (kernel swap readahead of 2^N pages) for the
    /// comparison, restored afterwards [default: 0 against zram and zswap, as zram setups
    /// ship it; the machine's own against kernel].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub kernel_page_cluster: Option<u32>,

    /// Run this invocation's work inside a fresh memory cgroup limited to SIZE (removed
    /// afterwards). Needs root.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub cgroup_limit: Option<u64>,

    /// Test hook: every Nth read from the swap device fails (the engine retries twice,
    /// then poisons the page: 1 loses every page that is swapped in).
    #[arg(long, value_name = "N", hide = true)]
    pub inject_read_errors: Option<u64>,

    /// Test hook: flip a bit of word 5 of this page of the region once the data is in place
    /// (after the populate, or swap-w-seq's first pass), to check that the next access to
    /// the page fails loudly, before anything overwrites it.
    #[arg(long, value_name = "PAGE", hide = true)]
    pub inject_corruption: Option<u64>,
}

impl BenchArgs {
    /// The duration the timed part runs for (pmbench, combined).
    pub fn effective_duration(&self) -> Duration {
        self.duration.unwrap_or(DEFAULT_DURATION)
    }

    /// The background region's size for `combined` (0 when there is none).
    pub fn effective_bg_size(&self) -> u64 {
        if self.bg_threads == 0 {
            0
        } else {
            self.bg_size.unwrap_or(self.size / 2).max(1)
        }
    }

    /// Arguments after `uswap bench` that reproduce the workload and engine settings, without
    /// `--memory`, `--json` and the comparison flags (`--against`, `--repeat`, `--plot`,
    /// `--kernel-ssd`, `--cgroup-limit`): what a harness passes to each side.
    pub fn to_cli_args(&self) -> Vec<String> {
        let mut a = vec![self.workload.name().to_string()];
        let mut push = |k: &str, v: String| {
            a.push(k.to_string());
            a.push(v);
        };
        push("--size", self.size.to_string());
        push("--budget", self.budget.to_string());
        push("--threads", self.threads.to_string());
        if let Some(d) = self.duration {
            push("--duration", fmt_duration(d));
        }
        push("--read-pct", self.read_pct.to_string());
        if let Some(s) = self.bg_size {
            push("--bg-size", s.to_string());
        }
        push("--bg-threads", self.bg_threads.to_string());
        if let Some(p) = &self.swap_file {
            push("--swap-file", p.display().to_string());
        }
        if let Some(s) = self.swap_size {
            push("--swap-size", s.to_string());
        }
        if let Some(m) = self.max_swap {
            push("--max-swap", m.to_string());
        }
        push("--unit", self.unit.name().to_string());
        push("--readahead", self.readahead.name().to_string());
        if let Some(n) = self.ra_max_pages {
            push("--ra-max-pages", n.to_string());
        }
        push("--ra-stream", self.ra_stream.name().to_string());
        push("--ra-units", self.ra_units.to_string());
        push("--stale-slot", self.stale_slot.name().to_string());
        push("--device", self.device.name().to_string());
        push("--fault-threads", self.fault_threads.to_string());
        push("--spin-us", self.spin_us.to_string());
        push("--io-poll-us", self.io_poll_us.to_string());
        push("--own-read-poll-us", self.own_read_poll_us.to_string());
        push("--fault-mode", self.fault_mode.name().to_string());
        a.extend(self.tiers.to_cli_args());
        let mut push = |k: &str, v: String| {
            a.push(k.to_string());
            a.push(v);
        };
        push("--data", self.data.name().to_string());
        push("--seed", self.seed.to_string());
        if self.encrypt {
            a.push("--encrypt".into());
        }
        if self.no_checksums {
            a.push("--no-checksums".into());
        }
        if self.fill_memcg {
            a.push("--fill-memcg".into());
        }
        a
    }

    /// The whole command line, every setting spelled out.
    pub fn command_line(&self) -> String {
        let mut a = vec!["uswap".to_string(), "bench".to_string()];
        a.extend(self.to_cli_args());
        a.extend(["--memory".to_string(), self.memory.name().to_string()]);
        if self.json {
            a.push("--json".into());
        }
        if let Some(k) = self.against {
            a.extend([
                "--against".to_string(),
                k.name().to_string(),
                "--repeat".into(),
                self.repeat.to_string(),
            ]);
        }
        if let Some(p) = &self.plot {
            a.extend(["--plot".to_string(), p.display().to_string()]);
        }
        if self.kernel_ssd {
            a.push("--kernel-ssd".into());
        }
        if let Some(n) = self.kernel_page_cluster {
            a.extend(["--kernel-page-cluster".to_string(), n.to_string()]);
        }
        if let Some(l) = self.cgroup_limit {
            a.extend(["--cgroup-limit".to_string(), l.to_string()]);
        }
        a.iter()
            .map(|s| {
                if s.contains(' ') {
                    format!("'{s}'")
                } else {
                    s.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The engine settings as a pool builder.
    pub fn pool_builder(&self) -> uswap::PoolBuilder {
        let mut b = uswap::Pool::builder()
            .budget(self.budget)
            .fault_threads(self.fault_threads)
            .device_kind(match self.device {
                Device::Ssd => uswap::DeviceKind::Ssd,
                Device::Rotational => uswap::DeviceKind::Rotational,
                Device::Auto => uswap::DeviceKind::Auto,
            })
            .stale_slot_policy(match self.stale_slot {
                StaleSlot::Free => uswap::StaleSlotPolicy::FreeOnWrite,
                StaleSlot::Keep => uswap::StaleSlotPolicy::KeepUntilReclaim,
            })
            .readahead(self.readahead.policy())
            .readahead_stream(self.ra_stream == OnOff::On)
            .readahead_units(self.ra_units)
            .unit(self.unit.policy())
            .spin_us(self.spin_us)
            .io_poll_us(self.io_poll_us)
            .own_read_poll_us(self.own_read_poll_us)
            .fault_mode(match self.fault_mode {
                FaultModeArg::Handler => uswap::FaultMode::Handler,
                FaultModeArg::InThread => uswap::FaultMode::InThread,
            });
        b = self.tiers.apply(b);
        if let Some(n) = self.ra_max_pages {
            b = b.readahead_max_pages(n);
        }
        if let Some(p) = &self.swap_file {
            b = b.swap_file(p);
        }
        if let Some(s) = self.swap_size {
            b = b.swap_size(s);
        }
        if let Some(m) = self.max_swap {
            b = b.max_swap(m);
        }
        b = b.encrypt(self.encrypt).checksums(!self.no_checksums);
        if let Some(n) = self.inject_read_errors {
            b = b.inject_io_errors(uswap::FaultInjection {
                fail_read_every: n,
                fail_write_every: 0,
                ..Default::default()
            });
        }
        b
    }

    /// Usage errors clap cannot see.
    pub fn check(&self) -> Result<(), String> {
        self.tiers.check()?;
        if self.size == 0 {
            return Err("--size must be greater than zero".into());
        }
        if let Some(s) = self.swap_size.filter(|&s| s < uswap::UNIT_SIZE as u64) {
            return Err(format!(
                "--swap-size {} is too small: the minimum is 2M (one 2 MiB swap unit)",
                uswap::format_size(s)
            ));
        }
        if self.bg_size == Some(0) {
            return Err(
                "--bg-size must be greater than zero (use --bg-threads 0 for no background region)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Why a run could not report.
#[derive(Debug)]
pub enum BenchError {
    /// Bad usage (exit 2).
    Usage(String),
    /// The engine or the system refused (exit 1).
    Engine(uswap::Error),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Usage(m) => f.write_str(m),
            BenchError::Engine(e) => write!(f, "{e}"),
        }
    }
}

/// The exit status for an engine error: 2 when the input was wrong (sizes, budget,
/// swap place), 1 when the system failed (userfaultfd, a full disk, a system call).
pub fn exit_status(e: &uswap::Error) -> i32 {
    use uswap::Error as E;
    match e {
        E::UffdNotPermitted { .. } | E::UffdFeatureMissing { .. } | E::Sys { .. } => 1,
        E::SwapFile { source, .. }
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EIO | libc::ENOMEM)
            ) =>
        {
            1
        }
        _ => 2,
    }
}

fn mbps(bytes: u64, d: Duration) -> Option<f64> {
    let s = d.as_secs_f64();
    (s > 0.0).then(|| bytes as f64 / 1e6 / s)
}

/// Run the workload once, in this process, and return its report (verification failures
/// are in the report, not an error). `show_progress` draws bars on stderr.
pub fn run_bench(args: &BenchArgs, show_progress: bool) -> Result<Report, BenchError> {
    args.check().map_err(BenchError::Usage)?;
    let started = Instant::now();
    let bg_size = if args.workload == Workload::Combined {
        args.effective_bg_size()
    } else {
        0
    };
    let mut sizes = vec![args.size];
    if bg_size > 0 {
        sizes.push(bg_size);
    }
    crate::lost::install();
    let memory = match args.memory {
        MemoryKind::Uswap => Memory::uswap(args.pool_builder(), &sizes),
        MemoryKind::Plain => Memory::plain(&sizes, args.unit == Unit::Huge),
    }
    .map_err(BenchError::Engine)?;

    // A page lost to a failed swap-in is SIGBUS in a workload thread: say which.
    let names: &[&'static str] = if args.workload == Workload::Combined {
        &["seq", "bg"]
    } else {
        &["main"]
    };
    let regions: Vec<_> = names
        .iter()
        .enumerate()
        .take(sizes.len())
        .map(|(i, &n)| (n, memory.words(i).as_ptr() as usize, memory.len(i) as usize))
        .collect();
    crate::lost::watch(
        &regions,
        &memory
            .swap_place()
            .unwrap_or_else(|| "kernel swap".to_string()),
    );
    let ui = Ui::new(show_progress);
    let pattern = Pattern::new(args.data, args.seed);
    let params = Params {
        pattern: &pattern,
        seed: args.seed,
        threads: args.threads,
        duration: args.duration,
        read_pct: args.read_pct,
        bg_threads: args.bg_threads,
    };
    let first = memory.snapshot();
    let mut measure_start = first.clone();
    let mut measure_end = None;
    let words = memory.words(0);
    let mut mark = |m: Mark| {
        match m {
            Mark::Start => measure_start = memory.snapshot(),
            Mark::End => measure_end = Some(memory.snapshot()),
            Mark::Written => {}
        }
        // Once the data is in place: the next phase that brings the page back must
        // catch it, before anything overwrites it.
        if let (Some(page), Mark::Written) = (args.inject_corruption, m) {
            let pages = workloads::page_count(words);
            let w = &words[(page % pages) as usize * workloads::PAGE_WORDS + 5];
            w.fetch_xor(1 << 20, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let out: Outcome = match args.workload {
        Workload::SwapWSeq => workloads::swap_w_seq(words, &params, &ui, &mut mark),
        Workload::SwapWRand => workloads::swap_w_rand(words, &params, &ui, &mut mark),
        Workload::Pmbench => workloads::pmbench(words, &params, &ui, &mut mark),
        Workload::SeqRead => workloads::seq_read(words, &params, &ui, &mut mark),
        Workload::Combined => {
            let bg = (bg_size > 0).then(|| memory.words(1));
            workloads::combined(words, bg, &params, &ui, &mut mark)
        }
        Workload::FaultLatency => {
            return Err(BenchError::Usage(
                "fault-latency has its own report: run it with `uswap bench fault-latency`".into(),
            ))
        }
    };
    crate::lost::unwatch();
    let last = memory.snapshot();
    let whole = last.since(&first);
    let measured = measure_end
        .unwrap_or_else(|| last.clone())
        .since(&measure_start);
    Ok(build_report(
        args,
        &memory,
        &out,
        &whole,
        &measured,
        started.elapsed(),
    ))
}

fn build_report(
    args: &BenchArgs,
    memory: &Memory,
    out: &Outcome,
    whole: &Snapshot,
    measured: &Snapshot,
    total: Duration,
) -> Report {
    let elapsed = out.measured;
    let secs = elapsed.as_secs_f64();
    let per_s = |n: u64| (secs > 0.0).then(|| n as f64 / secs);
    let combined = args.workload == Workload::Combined;
    let timed = matches!(args.workload, Workload::Pmbench | Workload::Combined)
        || (args.workload == Workload::SwapWRand && args.duration.is_some());
    let q = |p: f64| {
        out.latency
            .as_ref()
            .map(|h| h.value_at_quantile(p) as f64 / 1000.0)
    };
    let only_combined = |p: f64| if combined { q(p) } else { None };
    let (swapin, swapout) = measured.swapped();
    let has_bg = memory_regions(memory) > 1;
    let on_uswap = matches!(memory, Memory::Uswap { .. });
    let tier = args.tiers.tier.kind();
    let compressed = on_uswap && tier.is_compressed();
    Report {
        workload: args.workload.name().to_string(),
        memory: memory.kind_name().to_string(),
        data: args.data.name().to_string(),
        tier: on_uswap.then(|| tier.name().to_string()),
        compressor: compressed.then(|| args.tiers.compressor().to_string()),
        compressed_max_pct: compressed.then_some(args.tiers.compressed_max()),
        incompressible: (on_uswap && tier.has_writeback())
            .then(|| args.tiers.incompressible().name().to_string()),
        remote: (on_uswap && tier.is_remote())
            .then(|| args.tiers.remote.as_deref().map(crate::tier::redacted))
            .flatten(),
        zswap_ratio: if compressed {
            measured.uswap_total().map(|c| c.zswap_ratio())
        } else {
            None
        },
        size: args.size,
        region_bytes: memory.len(0),
        budget: args.budget,
        swap: memory.swap_place(),
        threads: args.threads,
        unit: args.unit.name().to_string(),
        readahead: args.readahead.name().to_string(),
        seed: args.seed,
        elapsed_s: secs,
        total_s: total.as_secs_f64(),
        throughput_MBps: out.bytes.and_then(|b| mbps(b, elapsed)),
        accesses_per_s: out.accesses.and_then(per_s),
        lat_avg_us: out.latency.as_ref().map(|h| h.mean() / 1000.0),
        lat_p50_us: q(0.50),
        lat_p60_us: only_combined(0.60),
        lat_p70_us: only_combined(0.70),
        lat_p80_us: only_combined(0.80),
        lat_p90_us: q(0.90),
        lat_p95_us: only_combined(0.95),
        lat_p99_us: q(0.99),
        lat_p999_us: q(0.999),
        lat_max_us: out.latency.as_ref().map(|h| h.max() as f64 / 1000.0),
        read_pct: (args.workload == Workload::Pmbench).then_some(args.read_pct),
        duration_s: timed.then(|| args.effective_duration().as_secs_f64()),
        swapin_MBps: mbps(swapin * PAGE_BYTES, elapsed),
        swapout_MBps: mbps(swapout * PAGE_BYTES, elapsed),
        ra_hit_pct: whole.ra_hit_pct(),
        ra_hit_pct_seq: if combined {
            whole.region_ra_hit_pct(0)
        } else {
            None
        },
        ra_hit_pct_bg: if combined && has_bg {
            whole.region_ra_hit_pct(1)
        } else {
            None
        },
        bg_threads: combined.then_some(if has_bg { args.bg_threads } else { 0 }),
        bg_size: if combined && has_bg {
            Some(memory.len(1))
        } else {
            None
        },
        bg_accesses_per_s: if combined {
            out.bg_accesses.and_then(per_s)
        } else {
            None
        },
        verify: if out.mismatch.is_some() {
            "failed"
        } else {
            "ok"
        }
        .to_string(),
        mismatch: out.mismatch.as_deref().cloned(),
        peak_rss_bytes: peak_rss_bytes(),
        phases: out.phases.clone(),
        counters: whole.to_json(),
        counters_measured: measured.to_json(),
        counters_seq: if combined { whole.region_json(0) } else { None },
        counters_bg: if combined && has_bg {
            whole.region_json(1)
        } else {
            None
        },
        command: args.command_line(),
    }
}

fn memory_regions(m: &Memory) -> usize {
    match m {
        Memory::Uswap { regions, .. } => regions.len(),
        Memory::Plain(maps) => maps.len(),
    }
}

/// `uswap bench`: run, print, and return the exit status.
pub fn main(mut args: BenchArgs) -> i32 {
    if let Err(e) = args.check() {
        eprintln!("uswap: error: {e}");
        return 2;
    }
    // The run itself (not a harness that places it in a cgroup): the budget is the
    // cgroup's limit, and the engine follows the room left in it.
    if args.fill_memcg
        && args.memory == MemoryKind::Uswap
        && args.against.is_none()
        && args.cgroup_limit.is_none()
    {
        match uswap::memcg::limit() {
            Some(l) => args.budget = l,
            None => {
                eprintln!(
                    "uswap: error: --fill-memcg: this process's memory cgroup has no limit below \
                     the machine's RAM; run it in a limited cgroup (sudo: --cgroup-limit SIZE, or \
                     --against) or give --budget alone"
                );
                return 2;
            }
        }
    }
    if args.workload == Workload::FaultLatency {
        if args.against.is_some() || args.cgroup_limit.is_some() || args.memory != MemoryKind::Uswap
        {
            eprintln!("uswap: error: fault-latency runs on uswap only (no --against, --cgroup-limit or --memory plain)");
            return 2;
        }
        return crate::latency::main(&args);
    }
    if args.against.is_some() || args.cgroup_limit.is_some() {
        let r = if args.against.is_some() {
            crate::against::run(&args)
        } else {
            crate::against::run_in_cgroup(&args)
        };
        // Every guard has run: strike out the record (or keep what is left, said).
        crate::ledger::end();
        return match r {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("uswap: error: {e}");
                1
            }
        };
    }
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let report = match run_bench(&args, show_progress) {
        Ok(r) => r,
        Err(BenchError::Usage(e)) => {
            eprintln!("uswap: error: {e}");
            return 2;
        }
        Err(BenchError::Engine(e)) => {
            eprintln!("uswap: error: {e}");
            return exit_status(&e);
        }
    };
    if let Some(m) = &report.mismatch {
        eprintln!("uswap: verify FAILED: {m}");
    }
    if args.json {
        println!("{}", report.to_json_line());
    } else {
        print!("{}", report.to_table());
    }
    if report.verify == "ok" {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|t| t.a)
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        for bad in ["", "s", "0", "0s", "-1s", "10x", "1.2.3s", "1e400", "nan"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_duration("10q").unwrap_err().contains("\"10q\""));
        for d in ["10s", "500ms", "1500ms", "2m", "250us"] {
            let v = parse_duration(d).unwrap();
            assert_eq!(parse_duration(&fmt_duration(v)).unwrap(), v);
        }
    }

    #[test]
    fn defaults_are_the_main_job() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.workload, Workload::SwapWSeq);
        assert_eq!((a.size, a.budget, a.threads), (1 << 30, 256 << 20, 1));
        assert_eq!(
            (a.unit, a.readahead, a.memory),
            (Unit::Auto, Readahead::Vma, MemoryKind::Uswap)
        );
        assert_eq!((a.read_pct, a.repeat, a.json), (80, 1, false));
        assert_eq!(a.effective_duration(), Duration::from_secs(10));
        assert_eq!(a.effective_bg_size(), 512 << 20);
    }

    #[test]
    fn options_parse_and_round_trip_through_to_cli_args() {
        let a = parse(&[
            "pmbench",
            "--size",
            "2G",
            "--budget",
            "64M",
            "-t",
            "3",
            "--duration",
            "1500ms",
            "--read-pct",
            "50",
            "--unit",
            "2M",
            "--readahead",
            "cluster",
            "--ra-max-pages",
            "64",
            "--stale-slot",
            "keep",
            "--device",
            "ssd",
            "--fault-threads",
            "2",
            "--spin-us",
            "20",
            "--seed",
            "9",
            "--swap-file",
            "/tmp/x y",
            "--swap-size",
            "4G",
            "--encrypt",
            "--no-checksums",
            "--memory",
            "plain",
            "--against",
            "zram",
            "--repeat",
            "3",
            "--kernel-ssd",
            "--kernel-page-cluster",
            "1",
            "--cgroup-limit",
            "320M",
        ])
        .unwrap();
        assert_eq!(a.workload.name(), "pmbench");
        assert_eq!(
            (a.size, a.budget, a.threads, a.read_pct),
            (2 << 30, 64 << 20, 3, 50)
        );
        assert_eq!(a.unit, Unit::Huge);
        assert_eq!(a.against, Some(Against::Zram));
        assert_eq!(a.cgroup_limit, Some(320 << 20));
        let b = parse(
            &a.to_cli_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(b.to_cli_args(), a.to_cli_args());
        assert_eq!(b.duration, a.duration);
        assert_eq!(b.swap_file, a.swap_file);
        assert!(a.encrypt && b.encrypt);
        assert!(a.no_checksums && b.no_checksums);
        assert_eq!(
            b.memory,
            MemoryKind::Uswap,
            "--memory is left to the harness"
        );
        assert!(a.command_line().contains("--against zram --repeat 3"));
    }

    #[test]
    fn bad_input_is_refused_with_the_input_named() {
        let e = parse(&["--size", "12Q"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("12Q"), "{e}");
        assert!(parse(&["--read-pct", "101"]).is_err());
        assert!(parse(&["--threads", "0"]).is_err());
        assert!(parse(&["--duration", "soon"]).is_err());
        assert!(parse(&["nosuch"]).is_err());
        let a = parse(&["--size", "0"]).unwrap();
        assert!(a.check().is_err());
    }

    #[test]
    fn plain_runs_report_and_verify() {
        let a = parse(&["seq-read", "--memory", "plain", "--size", "8M", "-t", "2"]).unwrap();
        let r = run_bench(&a, false).unwrap();
        assert_eq!(r.verify, "ok");
        assert_eq!(r.region_bytes, 8 << 20);
        assert!(r.throughput_MBps.unwrap() > 0.0);
        assert!(r.accesses_per_s.is_none() && r.lat_p50_us.is_none());
        assert!(r.counters.get("pswpout").is_some());
        let a = parse(&[
            "combined",
            "--memory",
            "plain",
            "--size",
            "8M",
            "--duration",
            "200ms",
        ])
        .unwrap();
        let r = run_bench(&a, false).unwrap();
        assert_eq!(r.verify, "ok");
        assert_eq!(r.bg_size, Some(4 << 20));
        assert!(r.lat_p70_us.is_some() && r.lat_avg_us.is_some());
    }
}
