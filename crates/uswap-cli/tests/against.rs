//! The `uswap bench --against` harness and `--cgroup-limit`, run for real: both sides run and
//! verify their data, the kernel side really swaps, and no swap area, cgroup or swap file is
//! left behind, also after an injected failure and after SIGTERM.
//!
//! Needs root and no swap on at the start; otherwise each test says why and passes.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One comparison at a time: each turns kernel swap on and off.
static SERIAL: Mutex<()> = Mutex::new(());

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uswap")
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (needs root to create cgroups and enable swap)".into());
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    if swaps.lines().skip(1).any(|l| !l.trim().is_empty()) {
        return Some(format!("kernel swap is already on:\n{swaps}"));
    }
    None
}

macro_rules! need_root_no_swap {
    () => {
        if let Some(why) = skip_reason() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// Everything that could be left behind: swap areas, our cgroups, kernel swap files.
#[derive(Debug, PartialEq, Eq)]
struct Leftovers {
    swaps: Vec<String>,
    cgroups: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

fn list(dir: &str, pred: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| pred(&e.file_name().to_string_lossy()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn leftovers() -> Leftovers {
    let swaps = std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let mut cgroups = Vec::new();
    for root in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        cgroups.extend(list(root, |n| n.starts_with("uswap-bench-")));
    }
    let mut files = Vec::new();
    let tmp = std::env::temp_dir();
    for dir in [tmp.to_str().unwrap_or("/tmp"), "/var/tmp"] {
        files.extend(list(dir, |n| {
            n.starts_with("uswap-bench-") && n.ends_with(".kswap")
        }));
    }
    files.dedup();
    Leftovers {
        swaps,
        cgroups,
        files,
    }
}

fn zram_in_use() -> bool {
    std::fs::read_to_string("/sys/block/zram0/initstate")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).env("USWAP_BENCH_TIMEOUT", "240");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run uswap")
}

/// `uswap bench WORKLOAD --against AGAINST --size SIZE --budget BUDGET --json EXTRA...`.
fn against_args(
    workload: &str,
    against: &str,
    size: &str,
    budget: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = [
        "bench",
        workload,
        "--against",
        against,
        "--size",
        size,
        "--budget",
        budget,
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Run one comparison (see `against_args`) to the end.
fn run_against(
    workload: &str,
    against: &str,
    size: &str,
    budget: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let args = against_args(workload, against, size, budget, extra);
    run(&args.iter().map(String::as_str).collect::<Vec<_>>(), env)
}

fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "last stdout line is not JSON ({e}): {last:?}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The command succeeded: its JSON report and its stderr.
fn ok_json(out: &Output) -> (Value, String) {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed:\n{err}");
    (last_json(out), err)
}

fn check_both_sides(j: &Value) {
    for side in ["kernel", "uswap"] {
        let runs = j[side]["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("no {side} runs: {j}"));
        assert!(!runs.is_empty(), "no {side} runs");
        for r in runs {
            assert_eq!(
                r["bench"]["verify"], "ok",
                "{side} side did not verify: {r}"
            );
        }
    }
    for r in j["kernel"]["runs"].as_array().unwrap() {
        let out = r["vmstat_delta"]["pswpout"].as_u64().unwrap_or(0);
        assert!(
            out > 0,
            "the kernel side did not swap out (pswpout {out}): {r}"
        );
    }
    assert!(
        j["ratios"].as_object().is_some_and(|m| !m.is_empty()),
        "no ratios: {j}"
    );
}

#[test]
fn swap_w_seq_against_kernel_runs_both_sides_and_cleans_up() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let out = run_against("swap-w-seq", "kernel", "256M", "64M", &[], &[]);
    let (j, _) = ok_json(&out);
    check_both_sides(&j);
    assert_eq!(j["against"], "kernel");
    assert!(["rotational", "ssd"].contains(&j["kernel_swap"]["mode"].as_str().unwrap_or("")));
    assert!(
        j["ratios"]["throughput_MBps"].as_f64().is_some(),
        "no throughput ratio: {j}"
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn pmbench_against_kernel_with_plot() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let plot = std::env::temp_dir().join(format!("uswap-against-test-{}.png", std::process::id()));
    let out = run_against(
        "pmbench",
        "kernel",
        "256M",
        "64M",
        &["--duration", "2s", "--plot", plot.to_str().unwrap()],
        &[],
    );
    let (j, _) = ok_json(&out);
    check_both_sides(&j);
    for side in ["kernel", "uswap"] {
        let a = j[side]["median"]["accesses_per_s"].as_f64().unwrap_or(0.0);
        assert!(a > 0.0, "{side}: no accesses/s: {j}");
    }
    let png = std::fs::read(&plot).expect("plot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a PNG"
    );
    let _ = std::fs::remove_file(&plot);
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn zram_against_cleans_up_zram() {
    need_root_no_swap!();
    if zram_in_use() || !std::path::Path::new("/sys/block/zram0").exists() {
        eprintln!("skipped: /dev/zram0 missing or in use");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let alg = std::fs::read_to_string("/sys/block/zram0/comp_algorithm").unwrap();
    let out = run_against(
        "swap-w-seq",
        "zram",
        "128M",
        "32M",
        &[],
        &[("USWAP_BENCH_SIDES", "kernel")],
    );
    let (j, _) = ok_json(&out);
    let r = &j["kernel"]["runs"][0];
    assert_eq!(r["bench"]["verify"], "ok");
    assert!(
        r["vmstat_delta"]["pswpout"].as_u64().unwrap_or(0) > 0,
        "zram did not swap: {r}"
    );
    assert!(!zram_in_use(), "zram0 left initialised");
    assert_eq!(
        std::fs::read_to_string("/sys/block/zram0/comp_algorithm").unwrap(),
        alg
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn injected_uswap_failure_fails_clearly_and_cleans_up() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let out = run_against(
        "swap-w-seq",
        "kernel",
        "64M",
        "32M",
        &[],
        &[("USWAP_BENCH_FAIL_SIDE", "uswap")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an injected failure must fail the command:\n{err}"
    );
    assert!(
        err.contains("the uswap side failed"),
        "unclear message:\n{err}"
    );
    assert_eq!(
        leftovers(),
        before,
        "something was left behind after the failure"
    );
}

/// `combined` maps two regions: the kernel's swap must hold both (it was sized for one,
/// and the kernel side was OOM-killed with a full swap).
#[test]
fn combined_against_kernel_sizes_swap_for_both_regions() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let out = run_against(
        "combined",
        "kernel",
        "512M",
        "32M",
        &["--duration", "1s"],
        &[],
    );
    let (j, err) = ok_json(&out);
    assert_eq!(j["kernel"]["oom_killed_runs"], 0, "{err}");
    check_both_sides(&j);
    assert_eq!(leftovers(), before, "something was left behind");
}

/// A kernel side OOM-killed in its memcg is reported as a result: counted, left out of
/// the medians, the uswap side still measured, nothing left behind.
#[test]
fn kernel_oom_kill_is_counted_not_fatal() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let plot = std::env::temp_dir()
        .join(format!("uswap-against-oom-{}.png", std::process::id()))
        .display()
        .to_string();
    let out = run_against(
        "swap-w-seq",
        "kernel",
        "256M",
        "32M",
        &["--repeat", "2", "--plot", &plot],
        &[("USWAP_BENCH_FAIL_SIDE", "kernel-oom")],
    );
    let (j, err) = ok_json(&out);
    assert!(
        err.contains("OOM-killed in its memory cgroup") && err.contains("in 2 of 2 run(s)"),
        "no clear OOM line:\n{err}"
    );
    assert_eq!(j["kernel"]["oom_killed_runs"], 2, "{j}");
    assert_eq!(j["uswap"]["oom_killed_runs"], 0, "{j}");
    let runs = j["kernel"]["runs"].as_array().expect("kernel runs");
    assert_eq!(runs.len(), 2, "{j}");
    assert!(runs.iter().all(|r| r["oom_killed"] == true), "{j}");
    for r in j["uswap"]["runs"].as_array().expect("uswap runs") {
        assert_eq!(r["bench"]["verify"], "ok", "{r}");
    }
    assert!(
        j["uswap"]["median"]["throughput_MBps"].as_f64().is_some(),
        "{j}"
    );
    assert!(
        std::fs::metadata(&plot).is_ok_and(|m| m.len() > 0),
        "no plot"
    );
    let _ = std::fs::remove_file(&plot);
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn sigterm_mid_run_cleans_up() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    let mut child = Command::new(bin())
        .args(against_args(
            "pmbench",
            "kernel",
            "256M",
            "64M",
            &["--duration", "30s"],
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uswap");
    // Wait until the kernel side is running (its swap is on and its cgroup exists).
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains("kernel side ...") {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !leftovers().swaps.is_empty(),
        "kernel swap not on mid-run:\n{seen}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    let st = child.wait().unwrap();
    assert!(!st.success(), "an interrupted run must fail:\n{seen}{rest}");
    assert!(
        rest.contains("interrupted"),
        "no clear message:\n{seen}{rest}"
    );
    assert_eq!(
        leftovers(),
        before,
        "something was left behind after SIGTERM"
    );
}

#[test]
fn cgroup_limit_reports_oom_and_passes_output_through() {
    need_root_no_swap!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = leftovers();
    // Plain memory well inside the limit: fine, and the JSON comes through unchanged.
    let ok = run(
        &[
            "bench",
            "swap-w-seq",
            "--memory",
            "plain",
            "--size",
            "32M",
            "--cgroup-limit",
            "256M",
            "--json",
        ],
        &[],
    );
    assert!(
        ok.status.success(),
        "failed:\n{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let j = last_json(&ok);
    assert_eq!(j["verify"], "ok", "{j}");
    assert_eq!(j["memory"], "plain", "{j}");
    // Plain memory four times the limit with no swap: the OOM killer must strike, and say so.
    let oom = run(
        &[
            "bench",
            "swap-w-seq",
            "--memory",
            "plain",
            "--size",
            "256M",
            "--cgroup-limit",
            "64M",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&oom.stderr);
    assert!(!oom.status.success(), "must fail:\n{err}");
    assert!(err.contains("OOM-killed"), "no clear OOM message:\n{err}");
    assert_eq!(leftovers(), before, "something was left behind");
}
