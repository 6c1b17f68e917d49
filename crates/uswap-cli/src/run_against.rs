//! `uswap run --against kernel|zram|zswap -- PROGRAM ARGS`: the same unmodified program
//! timed under kernel swap and under uswap at the same memory limit (docs/run.md).
//!
//! The sides alternate `--repeat` times, each run in a fresh memory cgroup limited to
//! the budget + `--against-allowance` (64 MiB by default, as `uswap bench --against`):
//!
//! * kernel side: kernel swap on (`--against-swap` bytes: a swap file next to uswap's,
//!   zram, or zswap in front of a swap file), the cgroup allowed to swap, PROGRAM run
//!   directly;
//! * uswap side: kernel swap off, the cgroup not allowed to swap, PROGRAM run by
//!   `uswap run` with the same settings (preloaded), or directly with `--direct`.
//!
//! With zram or zswap the kernel side keeps pages in memory its v1 cgroup is not
//! charged for (zram's, zswap's pool): the uswap run after it gets that peak in its
//! budget and its limit (equal total memory, as `uswap bench --against`).
//!
//! Both get `USWAP_AGAINST_SIDE=kernel|uswap` and `USWAP_AGAINST_BUDGET=<bytes>`.
//! PROGRAM's stdin is /dev/null; its stdout and stderr go to our stderr (or to
//! `--log-dir`), so that stdout holds only the report. A kernel side OOM-killed in its
//! cgroup is a result (counted, left out of the medians); a uswap side that fails (exit
//! status, signal, OOM kill, watchdog) is a failure of that run and makes the command exit 1
//! at the end. Everything set up is undone by the guards of `kswap.rs` and `cgroup.rs`,
//! and after a SIGKILL by the next run (`ledger.rs`).

use crate::cgroup::{Hierarchy, Memcg, OomStats, SwapPolicy};
use crate::harness::{
    check_interrupted, child_done, describe_status, fmt_size, median, need_root, spawn_in, Side,
    Watchdog,
};
use crate::kswap::{self, KernelSwap, Kind};
use crate::RunArgs;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// How one run ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok,
    /// The kernel side was OOM-killed in its cgroup: a result, not a failure.
    OomKilled,
    /// Why the run failed.
    Failed(String),
}

/// One run of one side.
#[derive(Debug, Clone)]
struct RunOut {
    run: u32,
    side: Side,
    wall_s: f64,
    exit_code: Option<i32>,
    signal: Option<i32>,
    outcome: Outcome,
    oom: OomStats,
    memcg_peak: Option<u64>,
    /// The uswap side's budget in this run (the kernel side: the budget asked for).
    budget: u64,
    /// The kernel side's zram memory or zswap pool at its peak: memory a v1 memory
    /// cgroup does not charge, which the next uswap run's budget gets too.
    pool_peak: Option<u64>,
    vmstat: BTreeMap<String, u64>,
    log: Option<PathBuf>,
}

impl RunOut {
    fn status_name(&self) -> &'static str {
        match self.outcome {
            Outcome::Ok => "ok",
            Outcome::OomKilled => "oom_killed",
            Outcome::Failed(_) => "failed",
        }
    }

    fn json(&self) -> Value {
        json!({
            "run": self.run,
            "side": self.side.name(),
            "status": self.status_name(),
            "error": match &self.outcome {
                Outcome::Failed(e) => Some(e.clone()),
                _ => None,
            },
            "wall_s": self.wall_s,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "memcg_peak_bytes": self.memcg_peak,
            "budget": self.budget,
            "pool_peak_bytes": self.pool_peak,
            "memcg_limit_hits": self.oom.limit_hits,
            "oom_kill": self.oom.oom_kill,
            "vmstat_delta": self.vmstat,
            "log": self.log.as_ref().map(|p| p.display().to_string()),
        })
    }
}

/// Where PROGRAM's output goes for one run: our stderr, or `DIR/<side>-<run>.log`.
fn output(args: &RunArgs, side: Side, run: u32) -> Result<(Stdio, Stdio, Option<PathBuf>), String> {
    match &args.log_dir {
        None => {
            let dup = || {
                std::io::stderr()
                    .as_fd()
                    .try_clone_to_owned()
                    .map(Stdio::from)
                    .map_err(|e| format!("duplicate stderr: {e}"))
            };
            Ok((dup()?, dup()?, None))
        }
        Some(dir) => {
            let path = dir.join(format!("{}-{run}.log", side.name()));
            let f = std::fs::File::create(&path)
                .map_err(|e| format!("create {}: {e}", path.display()))?;
            let g = f
                .try_clone()
                .map_err(|e| format!("duplicate {}: {e}", path.display()))?;
            Ok((Stdio::from(f), Stdio::from(g), Some(path)))
        }
    }
}

/// The command for one side: PROGRAM itself, or `uswap run SETTINGS -- PROGRAM` with
/// `budget`.
fn side_command(args: &RunArgs, side: Side, budget: u64) -> Result<Command, String> {
    let mut cmd = if side == Side::Uswap && !args.direct {
        let exe = std::env::current_exe().map_err(|e| format!("find our own executable: {e}"))?;
        let mut c = Command::new(exe);
        c.args(crate::run::child_args(args, budget));
        c
    } else {
        let (program, rest) = args.program.split_first().expect("clap requires PROGRAM");
        let mut c = Command::new(program);
        c.args(rest);
        c
    };
    cmd.env("USWAP_AGAINST_SIDE", side.name())
        .env("USWAP_AGAINST_BUDGET", budget.to_string())
        .stdin(Stdio::null());
    Ok(cmd)
}

fn run_side(
    args: &RunArgs,
    h: &Hierarchy,
    side: Side,
    run: u32,
    budget: u64,
    ks: Option<&mut KernelSwap>,
) -> Result<RunOut, String> {
    check_interrupted()?;
    let limit = budget + args.against_allowance;
    let mut ks = ks;
    crate::harness::swap_for_side(side, ks.as_deref_mut())?;
    let swap = match side {
        Side::Kernel => SwapPolicy::Allowed,
        Side::Uswap => SwapPolicy::Forbidden,
    };
    let cg = Memcg::create(h, limit, swap)?;
    let (out, err, log) = output(args, side, run)?;
    let mut cmd = side_command(args, side, budget)?;
    cmd.stdout(out).stderr(err);
    let before = kswap::vmstat();
    let t0 = Instant::now();
    let mut child = spawn_in(&cg, cmd, &format!("{} side's program", side.name()))?;
    let zswap_peak = ks
        .as_deref()
        .filter(|k| k.is_zswap())
        .map(|_| kswap::ZswapPeak::start());
    let dog = Watchdog::start(child.id());
    let status = child.wait();
    child_done();
    let zswap_pool_max = zswap_peak.and_then(kswap::ZswapPeak::stop);
    let timeout_s = dog.limit_s;
    let timed_out = dog.fired();
    let wall_s = t0.elapsed().as_secs_f64();
    let vmstat = kswap::vmstat_delta(&before, &kswap::vmstat());
    let status = status.map_err(|e| format!("wait for the {} side: {e}", side.name()))?;
    let oom = cg.oom_stats();
    let memcg_peak = cg.peak_bytes();
    drop(cg);
    let pool_peak = ks
        .as_deref()
        .and_then(|k| k.zram_mem_used_max())
        .or(zswap_pool_max);
    if let Some(k) = ks {
        k.off()?;
    }
    check_interrupted()?;
    let seen = |what: String| match &log {
        Some(p) => format!("{what} (its output: {})", p.display()),
        None => what,
    };
    let outcome = if timed_out {
        Outcome::Failed(seen(format!(
            "did not finish within {timeout_s} s (USWAP_BENCH_TIMEOUT) and was killed"
        )))
    } else if oom.oom_kill > 0 && side == Side::Kernel {
        Outcome::OomKilled
    } else if oom.oom_kill > 0 {
        Outcome::Failed(seen(format!(
            "OOM-killed in its memory cgroup (limit {}, budget + {} allowance; {})",
            fmt_size(limit),
            fmt_size(args.against_allowance),
            describe_status(status)
        )))
    } else if !status.success() {
        Outcome::Failed(seen(describe_status(status)))
    } else {
        Outcome::Ok
    };
    Ok(RunOut {
        run,
        side,
        wall_s,
        exit_code: status.code(),
        signal: status.signal(),
        outcome,
        oom,
        memcg_peak,
        budget,
        pool_peak,
        vmstat,
        log,
    })
}

/// The command line, for the run's record and the report.
fn command_line() -> String {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `uswap run --against`: the exit status (0, 1 when the uswap side failed or on an error,
/// 2 for bad usage, 127/126 when PROGRAM cannot be run).
pub fn main(args: RunArgs) -> i32 {
    let r = compare(&args);
    // Every guard has run: strike out the record (or keep what is left, said).
    crate::ledger::end();
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("uswap run: error: {e}");
            1
        }
    }
}

fn compare(args: &RunArgs) -> Result<i32, String> {
    need_root()?;
    let (program, _) = args.program.split_first().expect("clap requires PROGRAM");
    let shown = Path::new(program).display().to_string();
    match crate::run::resolve(program) {
        Some(p) if p.is_file() => {}
        _ => {
            eprintln!("uswap run: {shown}: command not found");
            return Ok(127);
        }
    }
    // The uswap side's settings, checked before any kernel swap is set up.
    if !args.direct {
        if let Err(code) = crate::run::check(args) {
            return Ok(code);
        }
    }
    if let Some(dir) = &args.log_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!(
                "uswap run: error: cannot create --log-dir {}: {e}",
                dir.display()
            );
            return Ok(2);
        }
    }
    let kind = Kind::parse(args.against.map_or("kernel", |a| a.name()))?;
    let command = command_line();
    // Before looking at the machine: undo what a killed earlier run left.
    let h = crate::harness::start(&command)?;
    let limit = args.place.budget + args.against_allowance;
    let repeat = args.repeat.max(1);
    let dir = kswap::swap_dir(args.place.swap_file.as_deref());
    let mut ks = KernelSwap::setup(kind, &dir, args.against_swap, false, None)?;
    let kernel_swap = json!({
        "kind": kind.name(),
        "area": ks.area().display().to_string(),
        "size": ks.size(),
        "device": ks.device(),
        "mode": ks.mode(),
        "compressor": ks.compressor(),
        "kernel_page_cluster": ks.page_cluster().map(|p| p.0),
    });
    eprintln!(
        "uswap run --against {}: {} run(s) per side, alternating; budget {} + {} allowance = \
         memcg limit {} (cgroup {} at {})",
        kind.name(),
        repeat,
        fmt_size(args.place.budget),
        fmt_size(args.against_allowance),
        fmt_size(limit),
        h.version.name(),
        h.root.display()
    );
    eprintln!(
        "kernel side: {} {} ({}) on {}, {} mode{}; {}; memcg may swap; PROGRAM run directly",
        match kind {
            Kind::Zram => "zram",
            Kind::File => "swap file",
            Kind::Zswap => "zswap in front of swap file",
        },
        ks.area().display(),
        fmt_size(ks.size()),
        ks.device(),
        ks.mode(),
        ks.compressor()
            .map(|c| format!(", compressor {c}"))
            .unwrap_or_default(),
        ks.page_cluster_note()
    );
    eprintln!(
        "uswap side: kernel swap off, memcg may not swap; PROGRAM run {}",
        if args.direct {
            "directly (--direct: it uses uswap itself)"
        } else {
            "by uswap run (preloaded)"
        }
    );

    // zram's memory and zswap's pool are not charged to the kernel side's (v1) memory
    // cgroup: at equal total memory, the uswap run after it gets them in its budget.
    let equal_memory = matches!(kind, Kind::Zram | Kind::Zswap);
    if equal_memory {
        eprintln!(
            "equal total memory: each uswap run's budget is {} + the {} (peak) of the kernel \
             run before it, and its memcg limit grows with it",
            fmt_size(args.place.budget),
            if kind == Kind::Zram {
                "zram memory"
            } else {
                "zswap pool"
            }
        );
    }
    let mut runs: Vec<RunOut> = Vec::new();
    let mut uswap_budget = args.place.budget;
    for i in 1..=repeat {
        for side in [Side::Kernel, Side::Uswap] {
            eprintln!("[{i}/{repeat}] {} side ...", side.name());
            let budget = match side {
                Side::Kernel => args.place.budget,
                Side::Uswap => uswap_budget,
            };
            let r = run_side(
                args,
                &h,
                side,
                i,
                budget,
                (side == Side::Kernel).then_some(&mut ks),
            )?;
            eprintln!(
                "[{i}/{repeat}] {} side: {}",
                side.name(),
                run_line(&r, budget + args.against_allowance)
            );
            if let (true, Some(p)) = (equal_memory, r.pool_peak) {
                uswap_budget = args.place.budget + p.next_multiple_of(1 << 20);
            }
            runs.push(r);
        }
    }
    ks.teardown()?;
    drop(ks);

    let summary = |s: Side| {
        let of: Vec<&RunOut> = runs.iter().filter(|r| r.side == s).collect();
        let ok: Vec<&RunOut> = of
            .iter()
            .copied()
            .filter(|r| r.outcome == Outcome::Ok)
            .collect();
        let failed = of.iter().filter(|r| r.status_name() == "failed").count();
        let oom = of
            .iter()
            .filter(|r| r.status_name() == "oom_killed")
            .count();
        let wall = median(ok.iter().map(|r| r.wall_s).collect());
        let peak = median(
            ok.iter()
                .filter_map(|r| r.memcg_peak.map(|p| p as f64))
                .collect(),
        );
        (of, ok.len(), failed, oom, wall, peak)
    };
    let (k_runs, k_ok, k_failed, k_oom, k_wall, k_peak) = summary(Side::Kernel);
    let (u_runs, u_ok, u_failed, u_oom, u_wall, u_peak) = summary(Side::Uswap);
    let ratio = match (k_wall, u_wall) {
        (Some(k), Some(u)) if u > 0.0 => Some(k / u),
        _ => None,
    };

    let mut table = vec![format!(
        "{:<8} {:>6} {:>7} {:>11} {:>15} {:>18}",
        "side", "ok", "failed", "oom-killed", "median wall s", "median memcg peak"
    )];
    for (name, ok, failed, oom, wall, peak) in [
        (kind.name(), k_ok, k_failed, k_oom, k_wall, k_peak),
        ("uswap", u_ok, u_failed, u_oom, u_wall, u_peak),
    ] {
        table.push(format!(
            "{name:<8} {ok:>6} {failed:>7} {oom:>11} {:>15} {:>18}",
            wall.map(|w| format!("{w:.3}"))
                .unwrap_or_else(|| "-".into()),
            peak.map(|p| fmt_size(p as u64))
                .unwrap_or_else(|| "-".into())
        ));
    }
    let kernel_label = match kind {
        Kind::File => "kernel swap",
        Kind::Zram => "kernel swap on zram",
        Kind::Zswap => "kernel swap with zswap",
    };
    table.push(match ratio {
        Some(r) => format!(
            "uswap is {r:.2}x the kernel's speed ({kernel_label}; median kernel wall time / \
             median uswap wall time)"
        ),
        None if k_ok == 0 && k_oom > 0 => format!(
            "no ratio: {kernel_label} could not run PROGRAM in this limit (OOM-killed in {k_oom} \
             of {repeat} run(s))"
        ),
        None => "no ratio: a side has no successful run".into(),
    });
    for r in runs.iter() {
        if let Outcome::Failed(e) = &r.outcome {
            table.push(format!(
                "{} side, run {}: FAILED: {e}",
                r.side.name(),
                r.run
            ));
        }
    }

    let side_json = |rs: &[&RunOut],
                     ok: usize,
                     failed: usize,
                     oom: usize,
                     wall: Option<f64>,
                     peak: Option<f64>| {
        json!({
            "runs": rs.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "ok_runs": ok,
            "failed_runs": failed,
            "oom_killed_runs": oom,
            "median_wall_s": wall,
            "median_memcg_peak_bytes": peak.map(|p| p as u64),
        })
    };
    let report = json!({
        "command": command,
        "program": args.program.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
        "against": kind.name(),
        "direct": args.direct,
        "budget": args.place.budget,
        "unit": args.unit.name(),
        "allowance": args.against_allowance,
        "memcg_limit": limit,
        "repeat": repeat,
        "cgroup": h.version.name(),
        "kernel_swap": kernel_swap,
        "kernel": side_json(&k_runs, k_ok, k_failed, k_oom, k_wall, k_peak),
        "uswap": side_json(&u_runs, u_ok, u_failed, u_oom, u_wall, u_peak),
        "ratio": ratio,
        "uswap_failed": u_failed > 0,
    });
    for l in &table {
        if args.json {
            eprintln!("{l}");
        } else {
            println!("{l}");
        }
    }
    if args.json {
        println!("{report}");
    }
    if u_failed > 0 {
        eprintln!(
            "uswap run: error: the uswap side failed in {u_failed} of {repeat} run(s) (see above)"
        );
        return Ok(1);
    }
    Ok(0)
}

/// `12.34 s, exit status 0, memcg peak 80 MiB (limit hit 3 times), OOM kills 0`.
fn run_line(r: &RunOut, limit: u64) -> String {
    let mut s = format!(
        "{:.2} s, {}, budget {}, memcg peak {}, OOM kills {}",
        r.wall_s,
        match (r.exit_code, r.signal) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "?".into(),
        },
        fmt_size(r.budget),
        r.memcg_peak.map(fmt_size).unwrap_or_else(|| "?".into()),
        r.oom.oom_kill
    );
    match &r.outcome {
        Outcome::Ok => {}
        Outcome::OomKilled => s.push_str(&format!(
            "; OOM-killed in its memory cgroup (limit {}): counted, not measured",
            fmt_size(limit)
        )),
        Outcome::Failed(e) => s.push_str(&format!("; FAILED: {e}")),
    }
    if r.side == Side::Kernel {
        let shown: Vec<String> = ["pswpout", "pswpin", "zswpout", "zswpin"]
            .iter()
            .filter_map(|k| {
                let v = *r.vmstat.get(*k).unwrap_or(&0);
                (v > 0 || k.starts_with('p')).then(|| format!("{k} {v}"))
            })
            .collect();
        s.push_str(&format!("; {}", shown.join(" ")));
    }
    s
}
