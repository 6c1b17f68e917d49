//! `uswap bench --against kernel|zram|zswap`: the same workload on kernel swap and on uswap.
//!
//! Each side runs as a child of this process: the same command line minus the comparison
//! flags, plus `--memory plain|uswap --json`, placed in a fresh memory cgroup (before it
//! allocates anything) limited to the budget plus [`ALLOWANCE`] for the program itself.
//!
//! * kernel side: kernel swap on (a swap file next to uswap's, zram, or zswap in front of a
//!   swap file), the cgroup allowed to swap; /proc/vmstat deltas recorded around the child.
//! * uswap side: kernel swap off, the cgroup not allowed to swap.
//!
//! Sides alternate for `--repeat N`; the report gives medians and ratios uswap/kernel.
//! Everything set up is undone by guards (`Drop`) on success, error, child failure and
//! SIGINT/SIGTERM/SIGHUP; and written down first (`ledger.rs`), so that after a SIGKILL
//! the next run undoes it. Children die with the harness (PR_SET_PDEATHSIG).
//!
//! `run_in_cgroup` (`--cgroup-limit SIZE`) runs the bench alone in a memcg of that size
//! with no kernel swap and says whether the OOM killer struck: the "honest budget" check.
//!
//! Environment (for tests and partial runs):
//! * `USWAP_BENCH_FAIL_SIDE=uswap|kernel`: that side's child gets a bogus argument and fails;
//!   `kernel-oom`: the kernel side's memcg may not swap, so that it is OOM-killed.
//!
//! A kernel side OOM-killed in its memcg is a result, not a failure: the report counts
//! such runs and gives medians over the runs that finished. An OOM-killed uswap side is
//! an error (uswap promises to hold the budget).
//! * `USWAP_BENCH_SIDES=kernel|uswap`: run only that side (no ratios).
//! * `USWAP_CGROUP_VERSION=v1|v2`: force a cgroup interface.
//! * `USWAP_BENCH_TIMEOUT=SECONDS`: kill a child that runs longer (default 1800).

use crate::bench::BenchArgs;
use crate::cgroup::{self, Hierarchy, Memcg, OomStats, SwapPolicy};
use crate::harness::{
    check_interrupted, child_done, describe_status, fmt_size, install_signals, median, need_root,
    tail, Side, Watchdog,
};
use crate::kswap::{self, KernelSwap, Kind};
use crate::plot;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Memory allowed on top of the budget for the program itself (binary, heap, histograms),
/// the same on both sides.
pub const ALLOWANCE: u64 = 64 << 20;

/// The argument the injected failure adds.
const BOGUS_ARG: &str = "--injected-failure-uswap-bench-fail-side";

const MIB: f64 = 1048576.0;
const PAGE: f64 = 4096.0;

/// The child's arguments: `bench`, every workload and engine setting of ours, then `extra`.
fn child_argv(args: &BenchArgs, extra: &[&str]) -> Vec<OsString> {
    std::iter::once("bench".to_string())
        .chain(args.to_cli_args())
        .chain(extra.iter().map(|s| s.to_string()))
        .map(OsString::from)
        .collect()
}

fn side_argv(args: &BenchArgs, side: Side) -> Vec<OsString> {
    let mut extra = vec!["--memory", side.memory(), "--json"];
    if std::env::var("USWAP_BENCH_FAIL_SIDE").ok().as_deref() == Some(side.name()) {
        extra.push(BOGUS_ARG);
    }
    child_argv(args, &extra)
}

/// Start `argv` of our own binary as a child inside `cg`.
fn spawn_in(cg: &Memcg, argv: &[OsString], capture: bool) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("find our own executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(argv)
        .env("USWAP_BENCH_CHILD", "1")
        .stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped());
    }
    crate::harness::spawn_in(cg, cmd, "bench child")
}

/// What one child run produced.
#[derive(Debug, Clone)]
struct RunOut {
    side: Side,
    bench: Value,
    wall_s: f64,
    vmstat: BTreeMap<String, u64>,
    oom: OomStats,
    memcg_peak: Option<u64>,
    zram_mem_used_max: Option<u64>,
    /// zswap's largest pool during the run (sampled; not charged to a v1 memcg).
    zswap_pool_max: Option<u64>,
    /// The kernel side was OOM-killed in its memcg (`bench` is null).
    oom_killed: bool,
}

fn verify_ok(v: &Value) -> Option<bool> {
    match v.get("verify")? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => Some(matches!(
            s.to_ascii_lowercase().as_str(),
            "ok" | "pass" | "passed"
        )),
        _ => Some(false),
    }
}

fn run_side(
    args: &BenchArgs,
    h: &Hierarchy,
    side: Side,
    limit: u64,
    ks: Option<&mut KernelSwap>,
) -> Result<RunOut, String> {
    check_interrupted()?;
    let oom_test = std::env::var("USWAP_BENCH_FAIL_SIDE").ok().as_deref() == Some("kernel-oom");
    let swap = match side {
        Side::Kernel if oom_test => SwapPolicy::Forbidden,
        Side::Kernel => SwapPolicy::Allowed,
        Side::Uswap => SwapPolicy::Forbidden,
    };
    let mut ks = ks;
    crate::harness::swap_for_side(side, ks.as_deref_mut())?;
    let cg = Memcg::create(h, limit, swap)?;
    let argv = side_argv(args, side);
    let before = kswap::vmstat();
    let t0 = Instant::now();
    let mut child = spawn_in(&cg, &argv, true)?;
    let zswap_peak = ks
        .as_deref()
        .filter(|k| k.is_zswap())
        .map(|_| kswap::ZswapPeak::start());
    let dog = Watchdog::start(child.id());
    let mut out = String::new();
    let read = child.stdout.take().map(|mut s| s.read_to_string(&mut out));
    let status = child.wait();
    child_done();
    let zswap_pool_max = zswap_peak.and_then(|p| {
        let peak = p.stop();
        if peak.is_none() {
            eprintln!(
                "uswap: warning: no `Zswap:` line in /proc/meminfo: zswap's pool could not be \
                 measured, and uswap's budget does not include it"
            );
        }
        peak
    });
    let timeout_s = dog.limit_s;
    let timed_out = dog.fired();
    let wall_s = t0.elapsed().as_secs_f64();
    let after = kswap::vmstat();
    let status = status.map_err(|e| format!("wait for the {} side: {e}", side.name()))?;
    if let Some(Err(e)) = read {
        eprintln!("uswap: reading the {} side's output: {e}", side.name());
    }
    let oom = cg.oom_stats();
    let memcg_peak = cg.peak_bytes();
    let limit_s = fmt_size(limit);
    drop(cg);
    let zram_mem_used_max = ks.as_deref().and_then(|k| k.zram_mem_used_max());
    if let Some(k) = ks {
        k.off()?;
    }
    check_interrupted()?;
    if timed_out {
        return Err(format!(
            "the {} side did not finish within {timeout_s} s (USWAP_BENCH_TIMEOUT) and was killed{}",
            side.name(),
            tail(&out, 10)
        ));
    }
    if oom.oom_kill > 0 && side == Side::Kernel {
        return Ok(RunOut {
            side,
            bench: Value::Null,
            wall_s,
            vmstat: kswap::vmstat_delta(&before, &after),
            oom,
            memcg_peak,
            zram_mem_used_max,
            zswap_pool_max,
            oom_killed: true,
        });
    }
    if oom.oom_kill > 0 {
        return Err(format!(
            "the {} side was OOM-killed in its memory cgroup (limit {limit_s}, budget + {} \
             allowance){}",
            side.name(),
            fmt_size(ALLOWANCE),
            tail(&out, 10)
        ));
    }
    if !status.success() {
        return Err(format!(
            "the {} side failed ({}); command: {} {}{}",
            side.name(),
            describe_status(status),
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            argv.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            tail(&out, 10)
        ));
    }
    let last = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let bench: Value = serde_json::from_str(last).map_err(|e| {
        format!(
            "the {} side's last output line is not JSON ({e}): {last:?}",
            side.name()
        )
    })?;
    match verify_ok(&bench) {
        Some(true) => {}
        Some(false) => {
            return Err(format!(
                "the {} side's data verification failed: verify = {}",
                side.name(),
                bench["verify"]
            ))
        }
        None => eprintln!(
            "uswap: warning: the {} side reported no `verify`",
            side.name()
        ),
    }
    Ok(RunOut {
        side,
        bench,
        wall_s,
        vmstat: kswap::vmstat_delta(&before, &after),
        oom,
        memcg_peak,
        zram_mem_used_max,
        zswap_pool_max,
        oom_killed: false,
    })
}

/// Headline numbers: key, label, whether higher is better for uswap.
const HEADLINES: &[(&str, &str, Option<bool>)] = &[
    ("throughput_MBps", "throughput MB/s", Some(true)),
    ("accesses_per_s", "accesses/s", Some(true)),
    ("lat_p50_us", "latency p50 µs", Some(false)),
    ("lat_p90_us", "latency p90 µs", Some(false)),
    ("lat_p99_us", "latency p99 µs", Some(false)),
    ("lat_p999_us", "latency p99.9 µs", Some(false)),
    ("elapsed_s", "elapsed s", Some(false)),
    ("wall_s", "child wall time s", Some(false)),
    ("swapout_MBps", "swap-out MB/s", None),
    ("swapin_MBps", "swap-in MB/s", None),
    ("swap_out_MB", "swapped out MB", None),
    ("swap_in_MB", "swapped in MB", None),
    ("ra_hit_pct", "readahead hit %", Some(true)),
    ("peak_rss_MiB", "peak RSS MiB", None),
    ("memcg_peak_MiB", "memcg peak MiB", None),
];

/// Headlines shown as bars in the plot.
const PLOTTED: &[&str] = &[
    "throughput_MBps",
    "accesses_per_s",
    "lat_p50_us",
    "lat_p90_us",
    "lat_p99_us",
    "lat_p999_us",
    "elapsed_s",
    "swapout_MBps",
    "swapin_MBps",
    "ra_hit_pct",
];

fn num(v: &Value, k: &str) -> Option<f64> {
    v.get(k)?.as_f64()
}

/// The swap counters of a run, by vmstat name: the kernel's /proc/vmstat deltas for the
/// kernel side, the engine's own counters for the uswap side.
fn counters(r: &RunOut) -> BTreeMap<String, f64> {
    match r.side {
        Side::Kernel => r
            .vmstat
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64))
            .collect(),
        Side::Uswap => r
            .bench
            .get("counters")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The numbers of one run, by headline key.
fn metrics(r: &RunOut) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    if let Some(o) = r.bench.as_object() {
        for (k, v) in o {
            if let Some(x) = v.as_f64() {
                m.insert(k.clone(), x);
            }
        }
    }
    m.insert("wall_s".into(), r.wall_s);
    let c = counters(r);
    let g = |k: &str| c.get(k).copied().unwrap_or(0.0);
    // Pages that left RAM / came back: for zswap, pages stored in the pool count and
    // pool writebacks (also in pswpout) are not counted twice.
    let out_pages = g("pswpout") + g("zswpout") - g("zswpwb");
    let in_pages = g("pswpin") + g("zswpin");
    m.insert("swap_out_MB".into(), out_pages * PAGE / MIB);
    m.insert("swap_in_MB".into(), in_pages * PAGE / MIB);
    if g("swap_ra") > 0.0 {
        m.insert("ra_hit_pct".into(), 100.0 * g("swap_ra_hit") / g("swap_ra"));
    }
    if let Some(p) = num(&r.bench, "peak_rss_bytes") {
        m.insert("peak_rss_MiB".into(), p / MIB);
    }
    if let Some(p) = r.memcg_peak {
        m.insert("memcg_peak_MiB".into(), p as f64 / MIB);
    }
    if let Some(z) = r.zram_mem_used_max {
        m.insert("zram_mem_used_max_MiB".into(), z as f64 / MIB);
    }
    if let Some(z) = r.zswap_pool_max {
        m.insert("zswap_pool_max_MiB".into(), z as f64 / MIB);
    }
    m
}

fn medians(maps: &[BTreeMap<String, f64>]) -> BTreeMap<String, f64> {
    let mut keys: Vec<&String> = maps.iter().flat_map(|m| m.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            Some((
                k.clone(),
                median(maps.iter().filter_map(|m| m.get(k).copied()).collect())?,
            ))
        })
        .collect()
}

fn fmt_num(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x.abs() >= 1e5 => format!("{x:.0}"),
        Some(x) if x.abs() >= 100.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
    }
}

fn ratio(u: Option<f64>, k: Option<f64>) -> Option<f64> {
    match (u, k) {
        (Some(u), Some(k)) if k != 0.0 => Some(u / k),
        _ => None,
    }
}

fn json_map(m: &BTreeMap<String, f64>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<Map<_, _>>(),
    )
}

fn run_json(r: &RunOut) -> Value {
    let mut o = Map::new();
    o.insert("side".into(), json!(r.side.name()));
    o.insert("wall_s".into(), json!(r.wall_s));
    o.insert("bench".into(), r.bench.clone());
    o.insert("vmstat_delta".into(), json!(r.vmstat));
    o.insert("memcg_peak_bytes".into(), json!(r.memcg_peak));
    o.insert("memcg_limit_hits".into(), json!(r.oom.limit_hits));
    o.insert("oom_kill".into(), json!(r.oom.oom_kill));
    o.insert("oom_killed".into(), json!(r.oom_killed));
    if let Some(z) = r.zram_mem_used_max {
        o.insert("zram_mem_used_max_bytes".into(), json!(z));
    }
    if let Some(z) = r.zswap_pool_max {
        o.insert("zswap_pool_max_bytes".into(), json!(z));
    }
    Value::Object(o)
}

/// `--against kernel|zram|zswap`.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    need_root()?;
    let kind = Kind::parse(args.against.map_or("kernel", |a| a.name()))?;
    let sides: Vec<Side> = match std::env::var("USWAP_BENCH_SIDES").ok().as_deref() {
        None | Some("") | Some("both") => vec![Side::Kernel, Side::Uswap],
        Some("kernel") => vec![Side::Kernel],
        Some("uswap") => vec![Side::Uswap],
        Some(o) => {
            return Err(format!(
                "USWAP_BENCH_SIDES={o}: expected kernel, uswap or both"
            ))
        }
    };
    // Before looking at the machine: undo what a killed earlier run left.
    let h = crate::harness::start(&args.command_line())?;
    let size = args.size;
    let budget = args.budget;
    let limit = budget + ALLOWANCE;
    let repeat = args.repeat.max(1);
    let fs = fmt_size;
    // The kernel's swap holds everything the workload maps (combined: both regions).
    let mapped = size
        + if args.workload == crate::bench::Workload::Combined {
            args.effective_bg_size()
        } else {
            0
        };
    let margin = (mapped / 16).max(64 << 20);
    let swap_size = (mapped + margin + 4095) & !4095;
    let dir = kswap::swap_dir(args.swap_file.as_deref());

    let mut ks = if sides.contains(&Side::Kernel) {
        Some(KernelSwap::setup(
            kind,
            &dir,
            swap_size,
            args.kernel_ssd,
            args.kernel_page_cluster,
        )?)
    } else {
        None
    };
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| {
            let a = s.find('[')?;
            let b = s.find(']')?;
            Some(s[a + 1..b].to_string())
        })
        .unwrap_or_else(|| "?".into());
    let workload = args.workload.name().to_string();
    let mut header = vec![format!(
        "uswap bench {workload} --against {}: size {}, unit {}, budget {} + {} allowance = memcg \
         limit {} (cgroup {} at {}), {repeat} run(s) per side, alternating",
        kind.name(),
        fs(size),
        args.unit.name(),
        fs(budget),
        fs(ALLOWANCE),
        fs(limit),
        h.version.name(),
        h.root.display()
    )];
    if let Some(k) = &ks {
        header.push(format!(
            "kernel side: {} {} ({}) on {} in {} mode{}; {}; memcg swappiness 60 / swap \
             unlimited; THP {thp}",
            match kind {
                Kind::Zram => "zram",
                Kind::File => "swap file",
                Kind::Zswap => "zswap in front of swap file",
            },
            k.area().display(),
            fs(k.size()),
            k.device(),
            match k.mode() {
                "rotational" => "rotational (HDD paths)",
                "ssd" if args.kernel_ssd => "SSD (--kernel-ssd: queue/rotational=0 while on)",
                "ssd" => "SSD",
                m => m,
            },
            k.compressor()
                .map(|c| format!(", compressor {c}"))
                .unwrap_or_default(),
            k.page_cluster_note()
        ));
    }
    header.push(format!(
        "uswap side: kernel swap off, memcg swappiness 0{}",
        if args.fill_memcg {
            "; the pool's budget fills the memcg (--fill-memcg: its limit less the program's \
             own memory)"
        } else {
            ""
        }
    ));
    // zram's memory and zswap's pool are not charged to the kernel side's (v1) memory
    // cgroup: at equal total memory, uswap's budget (its compressed pool included)
    // gets them as well.
    let equal_memory = matches!(kind, Kind::Zram | Kind::Zswap);
    if equal_memory {
        header.push(format!(
            "equal total memory: each uswap run's budget is {} + the {} (peak) of the \
             kernel run before it{}",
            fs(budget),
            match kind {
                Kind::Zram => "zram memory",
                _ => "zswap pool",
            },
            if sides.contains(&Side::Kernel) {
                ""
            } else {
                " (no kernel run here: uswap keeps its budget)"
            }
        ));
    }
    let mut uswap_args = args.clone();
    for l in &header {
        eprintln!("{l}");
    }

    let mut runs: Vec<RunOut> = Vec::new();
    for i in 0..repeat {
        for &side in &sides {
            let (side_args, side_limit) = match side {
                Side::Kernel => (args, limit),
                Side::Uswap => (&uswap_args, uswap_args.budget + ALLOWANCE),
            };
            eprintln!(
                "[{}/{repeat}] {} side ...{}",
                i + 1,
                side.name(),
                if side == Side::Uswap && equal_memory {
                    format!(" (budget {})", fs(side_args.budget))
                } else {
                    String::new()
                }
            );
            let r = run_side(
                side_args,
                &h,
                side,
                side_limit,
                if side == Side::Kernel {
                    ks.as_mut()
                } else {
                    None
                },
            )?;
            eprintln!(
                "[{}/{repeat}] {} side: {:.2} s{}",
                i + 1,
                side.name(),
                r.wall_s,
                if r.oom_killed {
                    format!(
                        ", OOM-killed in its memory cgroup (limit {}): counted, not measured",
                        fs(limit)
                    )
                } else if side == Side::Kernel {
                    format!(
                        ", pswpout {} pswpin {}",
                        r.vmstat.get("pswpout").unwrap_or(&0),
                        r.vmstat.get("pswpin").unwrap_or(&0)
                    )
                } else {
                    String::new()
                }
            );
            if let (true, Some(z)) = (equal_memory, r.zram_mem_used_max.or(r.zswap_pool_max)) {
                uswap_args.budget = budget + z.next_multiple_of(1 << 20);
            }
            runs.push(r);
        }
    }
    let mode = ks.as_ref().map(|k| k.mode()).unwrap_or("none");
    let page_cluster = ks.as_ref().and_then(|k| k.page_cluster()).map(|p| p.0);
    let (area, area_size, device, compressor) = ks
        .as_ref()
        .map(|k| {
            (
                k.area().display().to_string(),
                k.size(),
                k.device(),
                k.compressor().map(str::to_string),
            )
        })
        .unwrap_or_default();
    if let Some(mut k) = ks.take() {
        k.teardown()?;
    }

    // Medians and ratios.
    // Medians over the runs that finished; OOM-killed kernel runs are counted.
    let of = |s: Side| {
        runs.iter()
            .filter(|r| r.side == s && !r.oom_killed)
            .collect::<Vec<_>>()
    };
    let (kr, ur) = (of(Side::Kernel), of(Side::Uswap));
    let killed = |s: Side| runs.iter().filter(|r| r.side == s && r.oom_killed).count();
    let kernel_killed = killed(Side::Kernel);
    let km = medians(&kr.iter().map(|r| metrics(r)).collect::<Vec<_>>());
    let um = medians(&ur.iter().map(|r| metrics(r)).collect::<Vec<_>>());
    let kc = medians(&kr.iter().map(|r| counters(r)).collect::<Vec<_>>());
    let uc = medians(&ur.iter().map(|r| counters(r)).collect::<Vec<_>>());
    let mut ratios = BTreeMap::new();
    let mut table = Vec::new();
    table.push(format!(
        "{:<22} {:>14} {:>14} {:>13}",
        "metric (median)",
        kind.name(),
        "uswap",
        "uswap/kernel"
    ));
    for (key, label, _) in HEADLINES {
        let (k, u) = (km.get(*key).copied(), um.get(*key).copied());
        if k.is_none() && u.is_none() {
            continue;
        }
        let r = ratio(u, k);
        if let Some(r) = r {
            ratios.insert(key.to_string(), r);
        }
        table.push(format!(
            "{label:<22} {:>14} {:>14} {:>13}",
            fmt_num(k),
            fmt_num(u),
            r.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into())
        ));
    }
    let show = |m: &BTreeMap<String, f64>, keys: &[&str]| {
        keys.iter()
            .filter_map(|k| Some(format!("{k}={}", m.get(*k)?.round())))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if kernel_killed > 0 {
        table.push(format!(
            "{} side: OOM-killed in its memory cgroup (limit {}) in {kernel_killed} of {repeat} \
             run(s){}",
            kind.name(),
            fs(limit),
            if kr.is_empty() {
                ": the kernel could not run this workload in this limit (no kernel figures)"
                    .to_string()
            } else {
                format!(
                    "; its medians are over the {} run(s) that finished",
                    kr.len()
                )
            }
        ));
    }
    if !kr.is_empty() {
        table.push(format!(
            "{} side, /proc/vmstat deltas (median): {}",
            kind.name(),
            show(&kc, kswap::VMSTAT_KEYS)
        ));
        if kind == Kind::Zswap {
            table.push(
                "  zswap: pages kept in its pool count as zswpout/zswpin, not pswpout/pswpin \
                 (so the bench's swap MB/s miss them; swapped MB counts them)"
                    .into(),
            );
        }
        if let Some(z) = km.get("zswap_pool_max_MiB") {
            table.push(format!(
                "  zswap pool (not charged to a v1 memcg): max {z:.1} MiB; uswap's budget had \
                 it too (equal total memory)"
            ));
        }
        if let Some(z) = km.get("zram_mem_used_max_MiB") {
            table.push(format!(
                "  zram compressed memory (not charged to a v1 memcg): max {z:.1} MiB; uswap's \
                 budget had it too (equal total memory)"
            ));
        }
    }
    if !ur.is_empty() {
        table.push(format!(
            "uswap side, engine counters (median): {}",
            show(
                &uc,
                &[
                    "pswpin",
                    "pswpout",
                    "swap_ra",
                    "swap_ra_hit",
                    "thp_swpout",
                    "thp_swpout_fallback",
                    "thp_swpin",
                    "majflt",
                    "direct_reclaim"
                ]
            )
        ));
    }
    table.push(
        "swap MB/s: the bench's own, over its measured phases (kernel: /proc/vmstat, uswap: \
         engine counters); swapped MB: over the whole child; MB = MiB"
            .into(),
    );

    let side_json = |s: Side, m: &BTreeMap<String, f64>, c: &BTreeMap<String, f64>| {
        json!({
            "runs": runs.iter().filter(|r| r.side == s).map(run_json).collect::<Vec<_>>(),
            "oom_killed_runs": killed(s),
            "median": json_map(m),
            "counters_median": json_map(c),
        })
    };
    let report = json!({
        "workload": workload,
        "command": args.command_line(),
        "unit": args.unit.name(),
        "against": kind.name(),
        "size": size,
        "budget": budget,
        "allowance": ALLOWANCE,
        "memcg_limit": limit,
        "equal_memory": equal_memory,
        "threads": args.threads,
        "repeat": repeat,
        "cgroup": h.version.name(),
        "thp": thp,
        "kernel_swap": {
            "kind": kind.name(),
            "area": area,
            "size": area_size,
            "device": device,
            "mode": mode,
            "kernel_ssd": args.kernel_ssd,
            "kernel_page_cluster": page_cluster,
            "compressor": compressor,
        },
        "kernel": side_json(Side::Kernel, &km, &kc),
        "uswap": side_json(Side::Uswap, &um, &uc),
        "ratios": json_map(&ratios),
    });

    if let Some(path) = &args.plot {
        let input = plot_input(&workload, kind, mode, &km, &um, &ratios);
        plot::draw(path, &input)?;
        table.push(format!("plot written to {}", path.display()));
    }
    if args.json {
        for l in &table {
            eprintln!("{l}");
        }
        println!("{report}");
    } else {
        for l in &table {
            println!("{l}");
        }
    }
    Ok(())
}

fn plot_input(
    workload: &str,
    kind: Kind,
    mode: &str,
    km: &BTreeMap<String, f64>,
    um: &BTreeMap<String, f64>,
    ratios: &BTreeMap<String, f64>,
) -> plot::PlotInput {
    let bars = PLOTTED
        .iter()
        .filter_map(|k| {
            let (_, label, better) = HEADLINES.iter().find(|h| h.0 == *k)?;
            Some(plot::Bar {
                label: label.to_string(),
                ratio: *ratios.get(*k)?,
                higher_is_better: *better,
            })
        })
        .collect();
    let pts = |m: &BTreeMap<String, f64>| -> Vec<(f64, f64)> {
        [
            ("lat_p50_us", 50.0),
            ("lat_p60_us", 60.0),
            ("lat_p70_us", 70.0),
            ("lat_p80_us", 80.0),
            ("lat_p90_us", 90.0),
            ("lat_p95_us", 95.0),
            ("lat_p99_us", 99.0),
            ("lat_p999_us", 99.9),
        ]
        .iter()
        .filter_map(|(k, p)| Some((*p, *m.get(*k)?)))
        .collect()
    };
    // A latency CDF wherever the bench measured latencies (pmbench, combined).
    let cdfs = [
        (format!("{} ({mode})", kind.name()), km),
        ("uswap".to_string(), um),
    ]
    .into_iter()
    .map(|(name, m)| plot::Cdf {
        name,
        points: pts(m),
    })
    .filter(|c| c.points.len() >= 2)
    .collect();
    plot::PlotInput {
        title: format!(
            "{workload}: uswap vs {} ({mode})",
            match kind {
                Kind::File => "kernel swap file",
                Kind::Zram => "kernel zram",
                Kind::Zswap => "kernel zswap + swap file",
            }
        ),
        bars,
        cdfs,
    }
}

/// `--cgroup-limit SIZE`: run the bench alone in a fresh memcg of that size with no kernel
/// swap, pass its output through, and fail if the OOM killer struck.
pub fn run_in_cgroup(args: &BenchArgs) -> Result<(), String> {
    need_root()?;
    let limit = match args.cgroup_limit {
        Some(l) => l,
        None => return Err("--cgroup-limit needs a size".into()),
    };
    crate::ledger::begin(&args.command_line(), false)?;
    let on = kswap::active_swaps();
    if !on.is_empty() {
        return Err(format!(
            "kernel swap is on ({}): a --cgroup-limit run must not be able to swap; swapoff first",
            on.join(", ")
        ));
    }
    install_signals()?;
    let h = cgroup::detect()?;
    let mut cg = Memcg::create(&h, limit, SwapPolicy::Forbidden)?;
    let mut extra = vec!["--memory", args.memory.name()];
    if args.json {
        extra.push("--json");
    }
    let argv = child_argv(args, &extra);
    let fs = fmt_size;
    eprintln!(
        "uswap: running in memcg {} (cgroup {}), limit {}, no swap",
        cg.path().display(),
        h.version.name(),
        fs(limit)
    );
    let mut child = spawn_in(&cg, &argv, false)?;
    let dog = Watchdog::start(child.id());
    let status = child.wait();
    child_done();
    let timeout_s = dog.limit_s;
    let timed_out = dog.fired();
    let status = status.map_err(|e| format!("wait for the bench: {e}"))?;
    let oom = cg.oom_stats();
    let peak = cg.peak_bytes();
    let path: PathBuf = cg.path().to_path_buf();
    cg.remove()?;
    eprintln!(
        "uswap: memcg {}: limit {}, peak usage {}, limit reached {} time(s), oom_kill {}",
        path.display(),
        fs(limit),
        peak.map(fs).unwrap_or_else(|| "?".into()),
        oom.limit_hits,
        oom.oom_kill
    );
    check_interrupted()?;
    if timed_out {
        return Err(format!(
            "the bench did not finish within {timeout_s} s (USWAP_BENCH_TIMEOUT) and was killed"
        ));
    }
    if oom.oom_kill > 0 {
        return Err(format!(
            "OOM: the bench was OOM-killed in its memory cgroup (limit {}, peak {}): it did not \
             stay within the limit",
            fs(limit),
            peak.map(fs).unwrap_or_else(|| "?".into())
        ));
    }
    if !status.success() {
        return Err(format!(
            "the bench failed in its memory cgroup ({})",
            describe_status(status)
        ));
    }
    Ok(())
}
