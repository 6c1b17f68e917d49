//! `uswap`: benchmarks of the user-space swap engine, and running programs under it.

/// The engine's allocations apart from the rest (`uswap::EngineHeap`), as in the C
/// library and the Python module, so that `bench` measures what they run.
#[global_allocator]
static HEAP: uswap::EngineHeap = uswap::EngineHeap;

mod against;
mod bench;
mod cgroup;
mod data;
mod doctor;
mod harness;
mod kswap;
mod latency;
mod ledger;
mod live;
mod lost;
mod memory;
mod mounts;
mod plot;
mod preload;
mod report;
mod run;
mod run_against;
mod tier;
mod workloads;

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

const MAIN_EXAMPLES: &str = "\
Examples:
  uswap bench                      the main job: a 1 GiB region paged under a 256 MiB budget
  uswap bench pmbench --json       random accesses; one JSON object on the last line of stdout
  uswap bench --help               workloads and every option
  uswap run --budget 2G -- ./prog  run a program with its large memory under uswap

uswap needs userfaultfd: run as root, or `sudo sysctl vm.unprivileged_userfaultfd=1`;
`uswap doctor` checks what a run needs here and says how to fix what is missing.
Exit status: 0 ok, 1 verification failure (wrong or lost data) or runtime error, 2 bad usage.";

/// User-space swap: memory regions far bigger than the RAM they may use, paged by
/// userfaultfd to a swap file under an honest resident budget.
#[derive(Debug, Parser)]
#[command(name = "uswap", version, after_help = MAIN_EXAMPLES, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a benchmark workload (swap-w-seq, swap-w-rand, pmbench, seq-read, combined) on a
    /// uswap region or on plain memory, verify every byte it reads, and report.
    #[command(after_help = bench::EXAMPLES)]
    Bench(bench::BenchArgs),
    /// Run PROGRAM with its large anonymous memory (big malloc blocks, big anonymous
    /// private mmaps) under uswap; exit status, signals and stdio pass through.
    #[command(after_help = run::HELP)]
    Run(RunArgs),
    /// Show the live counters of running processes under uswap (another shell, the same
    /// user), once or every few seconds with rates.
    #[command(after_help = live::STAT_HELP)]
    Stat(live::StatArgs),
    /// Every process under uswap on this machine (this user's), like top, with rates.
    #[command(after_help = live::TOP_HELP)]
    Top(live::TopArgs),
    /// Serve (or print) the live counters of every process under uswap in the
    /// Prometheus text format.
    #[command(after_help = live::EXPORT_HELP)]
    Export(live::ExportArgs),
    /// Change a running process's budget (growing or shrinking), without a restart.
    #[command(after_help = live::SET_HELP)]
    Set(live::SetArgs),
    /// Check that `uswap run` works here, with the same settings: userfaultfd, kernel
    /// features, io_uring, the swap place, the memory cgroup, THP, locked memory; say
    /// how to fix what does not. Exit 0 only when a run will work.
    #[command(after_help = doctor::HELP)]
    Doctor(doctor::DoctorArgs),
}

/// `uswap run` options (the command is in `run.rs`).
/// The budget and the swap place of a run: options of `uswap run` that `uswap doctor`
/// checks too.
#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// Resident budget for the program's uswap memory [default: 256M]. In a memory cgroup
    /// (a container), uswap also stays under the room the cgroup leaves it: its limit less
    /// what the program holds itself, read every 5 ms.
    #[arg(long, value_name = "SIZE", default_value = "256M", hide_default_value = true,
          value_parser = bench::parse_size_arg)]
    pub budget: u64,
    /// Swap file place: a directory, a new file, or a block device [default: an unlinked file
    /// in $TMPDIR].
    #[arg(long, value_name = "PATH")]
    pub swap_file: Option<PathBuf>,
    /// Most each process's swap file may grow to: SIZE, or N% of its filesystem's free
    /// space at start [default: 50%]; a process and the ones it forks together never
    /// take the filesystem below what the cap left free. The file grows as pages are
    /// evicted and gives back freed space. At the cap, pages stay in RAM over the
    /// budget: said on stderr, counted in --stats (docs/run.md).
    #[arg(long, value_name = "SIZE|N%")]
    pub max_swap: Option<uswap::MaxSwap>,
    /// Encrypt what goes to the swap file (AES-256-GCM under a key each process makes at
    /// start and never writes anywhere).
    #[arg(long)]
    pub encrypt: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub place: PlaceArgs,
    /// Use the memory cgroup's whole room instead of --budget: its limit less what the
    /// program holds itself, followed as that changes (kernel swap in a container does
    /// the same). The cgroup (e.g. a container's) must have a limit.
    #[arg(long, conflicts_with = "against")]
    pub fill_memcg: bool,
    /// Swap unit: 4k, 2m or auto [default: auto: 2 MiB units out, and in where the access
    /// is sequential; 4 KiB pages in for random access].
    #[arg(long, value_enum, value_name = "UNIT", ignore_case = true, default_value_t = bench::Unit::Auto,
          hide_default_value = true)]
    pub unit: bench::Unit,
    #[command(flatten)]
    pub tiers: tier::TierArgs,
    /// Allocations and mappings of at least SIZE go under uswap [default: 1M].
    #[arg(long, value_name = "SIZE", default_value = "1M", hide_default_value = true,
          value_parser = bench::parse_size_arg)]
    pub threshold: u64,
    /// On exit, print the counters, peak resident memory and swap place (one JSON line
    /// per process that used uswap) to stderr, or append them to FILE; on stderr, also say
    /// where the swap goes at the start.
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true)]
    pub stats: Option<Option<PathBuf>>,
    /// Serve the live counters of the program and every process it starts in the
    /// Prometheus text format at http://ADDR/metrics (e.g. 127.0.0.1:9477; port 0: any
    /// free port, said on stderr), until they are all gone (`uswap export`).
    #[arg(long, value_name = "ADDR", conflicts_with = "against")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Time PROGRAM under kernel swap (a swap file next to uswap's, zram, or zswap) and
    /// under uswap, each in a fresh memory cgroup limited to the budget + an allowance
    /// (`--against-allowance`, default 64 MiB); print
    /// both, the medians and the speed ratio. Needs root.
    #[arg(long, value_enum, value_name = "KIND")]
    pub against: Option<bench::Against>,
    /// With --against: runs of each side, alternating [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, hide_default_value = true,
          requires = "against", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// With --against: the kernel side's swap area size [default: 4G].
    #[arg(long, value_name = "SIZE", default_value = "4G", hide_default_value = true,
          requires = "against", value_parser = bench::parse_size_arg)]
    pub against_swap: u64,
    /// With --against: the memory each side's cgroup gets beyond the budget, for the
    /// program's memory outside uswap and its page cache. The default leaves room for a
    /// runtime's own memory; a small one (e.g. 8M) compares equal memory for a program
    /// whose memory is nearly all under uswap (the kernel side may use all of it for
    /// that memory, where uswap keeps to the budget) [default: 64M].
    #[arg(long, value_name = "SIZE", default_value = "64M", hide_default_value = true,
          requires = "against", value_parser = bench::parse_size_arg)]
    pub against_allowance: u64,
    /// With --against: the uswap side runs PROGRAM without the preload library, for a
    /// program that uses uswap itself (e.g. Python's `uswap.Pool`); it reads
    /// USWAP_AGAINST_SIDE=kernel|uswap to pick its memory.
    #[arg(long, requires = "against")]
    pub direct: bool,
    /// With --against: one JSON object (sides, runs, medians, ratio) on the last line of
    /// stdout.
    #[arg(long, requires = "against")]
    pub json: bool,
    /// With --against: PROGRAM's stdout and stderr go to DIR/<side>-<run>.log instead of
    /// uswap's stderr.
    #[arg(long, value_name = "DIR", requires = "against")]
    pub log_dir: Option<PathBuf>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    pub program: Vec<OsString>,
}

fn main() {
    let cli = Cli::parse();
    // An engine panic is a bug, not a verdict on the data: report it as a runtime error
    // (exit 1) rather than Rust's 101. The panic message itself is printed by the hook.
    let code = std::panic::catch_unwind(move || match cli.command {
        Command::Bench(args) => bench::main(args),
        Command::Run(args) if args.against.is_some() => run_against::main(args),
        Command::Run(args) => run::main(args),
        Command::Stat(args) => live::stat(args),
        Command::Top(args) => live::top(args),
        Command::Export(args) => live::export(args),
        Command::Set(args) => live::set(args),
        Command::Doctor(args) => doctor::main(args),
    })
    .unwrap_or_else(|_| {
        eprintln!("uswap: error: internal error (panic); please report it");
        1
    });
    std::process::exit(code);
}
