//! The `uswap bench --against` harness and `--cgroup-limit`, run for real: both sides run and
//! verify their data, the kernel side really swaps, and no swap area, cgroup, swap file,
//! zram or zswap setting is left behind: after an injected failure, after SIGTERM, and
//! after SIGKILL (the next run recognises the killed run's leftovers and undoes them).
//!
//! `uswap run --against` likewise, with a C program (tests/progs/against_fill.c) that
//! writes and reads back 4x the budget under both kinds of swap.
//!
//! Needs root, and no kernel swap on at the start: a test that cannot run here fails and
//! says why. Each holds the machine-wide lock (tests/support) and, when it fails, puts
//! back whatever was left ([`Machine`]'s drop).

mod common;
use common::support;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One comparison at a time in this process (the machine lock is a no-op when the whole
/// suite runs under it): each turns kernel swap on and off.
static SERIAL: Mutex<()> = Mutex::new(());

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uswap")
}

const ZSWAP: &str = "/sys/module/zswap/parameters";
const ZRAM0: &str = "/sys/block/zram0";
const STATE_DIR: &str = "/run/uswap";
const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

fn knob(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Everything that could be left behind: swap areas, our cgroups, kernel swap files,
/// run records, zswap's settings, zram0's state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leftovers {
    swaps: Vec<String>,
    cgroups: Vec<PathBuf>,
    files: Vec<PathBuf>,
    records: Vec<PathBuf>,
    zswap: (String, String),
    zram0: (String, String),
    page_cluster: String,
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
        records: list(STATE_DIR, |n| n.starts_with("bench-")),
        zswap: (
            knob(&format!("{ZSWAP}/enabled")),
            knob(&format!("{ZSWAP}/compressor")),
        ),
        zram0: (
            knob(&format!("{ZRAM0}/initstate")),
            knob(&format!("{ZRAM0}/comp_algorithm")),
        ),
        page_cluster: knob(PAGE_CLUSTER),
    }
}

fn zram_in_use() -> bool {
    knob(&format!("{ZRAM0}/initstate")) == "1"
}

/// The machine for one test: root, the locks, no kernel swap on, and what it looked like
/// at the start. Dropped (also when the test fails), it kills the runs the test started
/// and puts back whatever they left.
struct Machine {
    before: Leftovers,
    children: Vec<Child>,
    _serial: MutexGuard<'static, ()>,
    _lock: support::MachineLock,
}

fn machine() -> Machine {
    support::need_root("uswap bench --against and --cgroup-limit (cgroups, swapon)");
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lock = support::machine_lock();
    let before = leftovers();
    assert!(
        before.swaps.is_empty(),
        "kernel swap is already on, so this test cannot check what the comparison sets up \
         and undoes; swapoff it first:\n{:?}",
        before.swaps
    );
    assert!(
        before.cgroups.is_empty() && before.files.is_empty() && before.records.is_empty(),
        "leftovers of an earlier run before the test: {before:?}"
    );
    Machine {
        before,
        children: Vec::new(),
        _serial: serial,
        _lock: lock,
    }
}

impl Machine {
    fn before(&self) -> Leftovers {
        self.before.clone()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let now = leftovers();
        if now == self.before {
            return;
        }
        eprintln!("putting back what was left: {now:?}");
        for c in &now.cgroups {
            for _ in 0..100 {
                let procs = std::fs::read_to_string(c.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: kill(2) on a pid in a cgroup this test's run created.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                if std::fs::remove_dir(c).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for line in &now.swaps {
            let area = line.split_whitespace().next().unwrap_or("");
            let _ = Command::new("swapoff").arg(area).status();
        }
        let _ = std::fs::write(format!("{ZSWAP}/enabled"), &self.before.zswap.0);
        let _ = std::fs::write(format!("{ZSWAP}/compressor"), &self.before.zswap.1);
        let _ = std::fs::write(PAGE_CLUSTER, &self.before.page_cluster);
        if self.before.zram0.0 == "0" && zram_in_use() {
            let _ = std::fs::write(format!("{ZRAM0}/reset"), "1");
        }
        for f in now.files.iter().chain(&now.records) {
            let _ = std::fs::remove_file(f);
        }
    }
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
        // Pages zswap keeps count as zswpout, not pswpout.
        let v = &r["vmstat_delta"];
        let out = v["pswpout"].as_u64().unwrap_or(0) + v["zswpout"].as_u64().unwrap_or(0);
        assert!(
            out > 0,
            "the kernel side did not swap out (pswpout + zswpout {out}): {r}"
        );
    }
    assert!(
        j["ratios"].as_object().is_some_and(|m| !m.is_empty()),
        "no ratios: {j}"
    );
}

#[test]
fn swap_w_seq_against_kernel_runs_both_sides_and_cleans_up() {
    let m = machine();
    let before = m.before();
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
    let m = machine();
    let before = m.before();
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
    let m = machine();
    if !Path::new(ZRAM0).exists() {
        let _ = Command::new("modprobe").arg("zram").status();
    }
    assert!(
        Path::new(ZRAM0).exists() && !zram_in_use(),
        "this test needs /dev/zram0, not in use (modprobe zram)"
    );
    let before = m.before();
    let alg = std::fs::read_to_string("/sys/block/zram0/comp_algorithm").unwrap();
    let out = run_against(
        "swap-w-seq",
        "zram",
        "128M",
        "32M",
        &["--tier", "compressed+file"],
        &[],
    );
    let (j, _) = ok_json(&out);
    check_both_sides(&j);
    let r = &j["kernel"]["runs"][0];
    assert_eq!(r["bench"]["verify"], "ok");
    assert!(
        r["vmstat_delta"]["pswpout"].as_u64().unwrap_or(0) > 0,
        "zram did not swap: {r}"
    );
    // Equal total memory: uswap's budget is the kernel's plus zram's memory.
    let zram = r["zram_mem_used_max_bytes"]
        .as_u64()
        .expect("zram's memory");
    assert!(zram > 0, "{r}");
    let u = &j["uswap"]["runs"][0]["bench"];
    assert_eq!(
        u["budget"].as_u64(),
        Some((32 << 20) + zram.next_multiple_of(1 << 20)),
        "uswap's budget at equal total memory: {u}"
    );
    assert_eq!(j["equal_memory"], true);
    assert!(!zram_in_use(), "zram0 left initialised");
    assert_eq!(
        std::fs::read_to_string("/sys/block/zram0/comp_algorithm").unwrap(),
        alg
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

/// Sets a knob for the rest of a test, and puts the old value back when dropped.
struct KnobSet(&'static str, String);

impl KnobSet {
    fn new(path: &'static str, value: &str) -> KnobSet {
        let old = knob(path);
        std::fs::write(path, value).unwrap_or_else(|e| panic!("write {value} to {path}: {e}"));
        KnobSet(path, old)
    }
}

impl Drop for KnobSet {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, &self.1);
    }
}

#[test]
fn zswap_against_runs_at_equal_memory() {
    let _m = machine();
    // A value the comparison changes (to 0 by default) and must put back.
    let _pc = KnobSet::new(PAGE_CLUSTER, "2");
    let before = leftovers();
    let out = run_against(
        "swap-w-seq",
        "zswap",
        "128M",
        "32M",
        &["--tier", "compressed+file"],
        &[],
    );
    let (j, _) = ok_json(&out);
    check_both_sides(&j);
    assert_eq!(
        j["kernel_swap"]["kernel_page_cluster"].as_u64(),
        Some(0),
        "zswap's side runs without swap readahead by default: {}",
        j["kernel_swap"]
    );
    let r = &j["kernel"]["runs"][0];
    let pool = r["zswap_pool_max_bytes"].as_u64().expect("zswap's pool");
    assert!(pool > 0, "zswap stored nothing: {r}");
    // zswap's pool is not charged to the kernel side's v1 memcg: uswap gets it too.
    let u = &j["uswap"]["runs"][0]["bench"];
    assert_eq!(
        u["budget"].as_u64(),
        Some((32 << 20) + pool.next_multiple_of(1 << 20)),
        "uswap's budget at equal total memory: {u}"
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn injected_uswap_failure_fails_clearly_and_cleans_up() {
    let m = machine();
    let before = m.before();
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
    let m = machine();
    let before = m.before();
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
    let m = machine();
    let before = m.before();
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
    let m = machine();
    let before = m.before();
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
    let m = machine();
    let before = m.before();
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

/// A budget bigger than the memory cgroup's room gives way to the cgroup (the engine
/// follows its usage), and `--fill-memcg` takes the room the cgroup leaves: no run is
/// OOM-killed, every byte verifies, and the engine's limit sits under the cgroup's.
/// Without the following, `--budget 1G` in a 160 MiB cgroup with no swap is killed.
#[test]
fn the_budget_gives_way_to_its_memory_cgroup() {
    let m = machine();
    let before = m.before();
    // pmbench, 4 KiB units, 2 s; then the budget (and --fill-memcg).
    let pm = |tail: &[&'static str]| {
        let mut a = vec!["pmbench", "--unit", "4k", "--duration", "2s"];
        a.extend_from_slice(tail);
        a
    };
    let cases = [
        pm(&["--budget", "1G"]),
        vec!["swap-w-seq", "--unit", "2m", "--budget", "1G"],
        pm(&["--budget", "64M", "--fill-memcg"]),
    ];
    for case in &cases {
        let mut args = vec!["bench"];
        args.extend_from_slice(case);
        args.extend_from_slice(&["--size", "512M", "--cgroup-limit", "160M", "--json"]);
        let out = run(&args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case:?} failed:\n{err}");
        let j = last_json(&out);
        assert_eq!(j["verify"], "ok", "{case:?}: {j}");
        let limit = j["counters"]["budget_limit_bytes"].as_u64().unwrap();
        let peak = j["counters"]["peak_used_bytes"].as_u64().unwrap();
        // Under the cgroup by the program's own memory and the margin.
        assert!(
            limit <= (160 - 8) << 20,
            "{case:?}: engine limit {limit}: {j}"
        );
        if case.contains(&"--fill-memcg") {
            // It took more than the 64 MiB asked: the cgroup's room.
            assert_eq!(j["budget"].as_u64(), Some(160 << 20), "{j}");
            // (The limit read at the end is no measure: the run's last moments move it.)
            assert!(
                peak > 96 << 20,
                "{case:?}: peak {peak}: it did not fill the room: {j}"
            );
        } else {
            assert!(peak <= 160 << 20, "{case:?}: peak {peak}: {j}");
        }
    }
    // Alone, --fill-memcg needs a limited cgroup.
    if let Some(l) = uswap::memcg::limit() {
        eprintln!(
            "NOT CHECKED: --fill-memcg outside a limited cgroup (this test runs in one, \
             limit {l} bytes)"
        );
    } else {
        let alone = run(&["bench", "pmbench", "--size", "64M", "--fill-memcg"], &[]);
        let err = String::from_utf8_lossy(&alone.stderr);
        assert_eq!(alone.status.code(), Some(2), "{err}");
        assert!(err.contains("no limit"), "{err}");
    }
    assert_eq!(leftovers(), before, "something was left behind");
}

/// Start `uswap ARGS` with stderr read line by line; return once a line contains `ready`
/// and `then()` holds (polled), with the child and what it printed.
fn start_until<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(
    m: &mut Machine,
    args: &[S],
    env: &[(&str, &str)],
    ready: &str,
    then: impl Fn() -> bool,
) -> (u32, String) {
    let mut c = Command::new(bin());
    c.args(args)
        .env("USWAP_BENCH_TIMEOUT", "240")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("start uswap");
    let err = child.stderr.take().unwrap();
    let pid = child.id();
    m.children.push(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = false;
    while Instant::now() < deadline {
        while let Ok(l) = rx.try_recv() {
            found |= l.contains(ready);
            seen.push_str(&l);
            seen.push('\n');
        }
        if found && then() {
            return (pid, seen);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{args:?}: not ready ({ready:?}) within 120 s:\n{seen}");
}

/// SIGKILL the run `pid` (a child of this test); wait until it is gone and nothing is
/// left running in its cgroups (its children die with it: PR_SET_PDEATHSIG).
fn sigkill(m: &mut Machine, pid: u32) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if let Some(c) = m.children.iter_mut().find(|c| c.id() == pid) {
        let _ = c.wait();
    }
    let t0 = Instant::now();
    loop {
        let busy: Vec<PathBuf> = leftovers()
            .cgroups
            .into_iter()
            .filter(|c| {
                !std::fs::read_to_string(c.join("cgroup.procs"))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
            })
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the killed run's bench child still runs in {busy:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL mid-comparison (kernel side running: swap on, zswap or zram set up, a memcg)
/// leaves all that behind (no guard runs); the next comparison recognises it as its own
/// (the killed run's record in /run/uswap), undoes it, says so, and runs. At the end the
/// machine is as before: no swap, no cgroup, zswap and zram as they were, no files.
fn sigkill_then_next_run_cleans_up(against: &str) {
    let mut m = machine();
    let before = m.before();
    let (pid, seen) = start_until(
        &mut m,
        &against_args("pmbench", against, "128M", "64M", &["--duration", "120s"]),
        &[("USWAP_BENCH_SIDES", "kernel")],
        "kernel side ...",
        || {
            let l = leftovers();
            !l.swaps.is_empty() && !l.cgroups.is_empty()
        },
    );
    sigkill(&mut m, pid);
    let left = leftovers();
    assert!(
        !left.swaps.is_empty() && !left.cgroups.is_empty(),
        "nothing left to clean after SIGKILL?\n{seen}{left:?}"
    );
    let record = Path::new(STATE_DIR).join(format!("bench-{pid}.json"));
    assert!(
        left.records.contains(&record),
        "no record {}: {left:?}",
        record.display()
    );
    let out = run_against(
        "swap-w-seq",
        against,
        "64M",
        "32M",
        &[],
        &[("USWAP_BENCH_SIDES", "kernel")],
    );
    let (_, err) = ok_json(&out);
    assert!(
        err.contains(&format!(
            "cleaned up after an earlier run that did not finish (pid {pid}"
        )) && err.contains("swapoff"),
        "the cleanup was not said:\n{err}"
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

#[test]
fn sigkill_of_against_zswap_is_cleaned_up_by_the_next_run() {
    sigkill_then_next_run_cleans_up("zswap");
}

#[test]
fn sigkill_of_against_zram_is_cleaned_up_by_the_next_run() {
    if !Path::new(ZRAM0).exists() {
        let _ = Command::new("modprobe").arg("zram").status();
    }
    sigkill_then_next_run_cleans_up("zram");
}

/// A comparison that is alive is not touched: a second one refuses, naming its pid, and
/// the first finishes undisturbed (here: stopped with SIGTERM, which cleans up).
#[test]
fn a_second_comparison_refuses_while_one_runs() {
    let mut m = machine();
    let before = m.before();
    let (pid, _) = start_until(
        &mut m,
        &against_args("pmbench", "kernel", "128M", "64M", &["--duration", "120s"]),
        &[("USWAP_BENCH_SIDES", "kernel")],
        "kernel side ...",
        || !leftovers().swaps.is_empty(),
    );
    let out = run_against("swap-w-seq", "kernel", "64M", "32M", &[], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("is going on (pid {pid}")),
        "does not name the running one:\n{err}"
    );
    assert!(
        !leftovers().swaps.is_empty(),
        "the running comparison was disturbed"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    for c in &mut m.children {
        let _ = c.wait();
    }
    assert_eq!(leftovers(), before, "something was left behind");
}

/// The same for `--cgroup-limit`: SIGKILL leaves the memcg (its bench child dies with
/// it); the next run removes it. The killed bench's swap file (uswap memory, on a
/// filesystem of its own) is gone with it: no name, no space.
#[test]
fn sigkill_of_cgroup_limit_is_cleaned_up_by_the_next_run() {
    let mut m = machine();
    let before = m.before();
    let fs = support::Mount::ext4(Path::new(env!("CARGO_TARGET_TMPDIR")), "cg-kill", 256);
    let free = fs.free_bytes();
    let dir = fs.path().to_str().unwrap().to_string();
    let (pid, seen) = start_until(
        &mut m,
        &[
            "bench",
            "pmbench",
            "--size",
            "96M",
            "--budget",
            "16M",
            "--duration",
            "120s",
            "--swap-file",
            &dir,
            "--cgroup-limit",
            "128M",
        ],
        &[],
        "running in memcg",
        || support::free_bytes(fs.path()) + (32 << 20) < free,
    );
    sigkill(&mut m, pid);
    assert!(!leftovers().cgroups.is_empty(), "no cgroup left?\n{seen}");
    let out = run(
        &[
            "bench",
            "swap-w-seq",
            "--memory",
            "plain",
            "--size",
            "16M",
            "--cgroup-limit",
            "256M",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("(pid {pid}")) && err.contains("removed cgroup"),
        "the cleanup was not said:\n{err}"
    );
    assert_eq!(leftovers(), before, "something was left behind");
    assert!(fs.entries().is_empty(), "{:?}", fs.entries());
    assert_eq!(
        fs.free_bytes(),
        free,
        "the killed bench's swap space was not freed"
    );
}

/// `uswap run --against KIND --budget 32M --against-swap 512M EXTRA -- PROG` to the end.
fn run_against_prog(against: &str, extra: &[&str], prog: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "run",
        "--against",
        against,
        "--budget",
        "32M",
        "--against-swap",
        "512M",
    ];
    args.extend(extra);
    args.push("--");
    args.extend(prog);
    let lib = common::preload().display().to_string();
    let mut env = env.to_vec();
    env.push(("USWAP_PRELOAD", &lib));
    run(&args, &env)
}

/// The C program that writes and reads back `mib` MiB; its path and the size as text.
fn fill_prog() -> String {
    common::cprog("against_fill").display().to_string()
}

/// The same unmodified program on kernel swap and under uswap (preloaded), 128 MiB in a
/// 96 MiB memcg: both verify their data, the kernel side really swaps (and the uswap side,
/// whose memcg may not swap, could only finish under uswap), the report has wall times,
/// peaks and the ratio of the medians, and nothing is left behind.
#[test]
fn run_against_kernel_times_both_sides_and_cleans_up() {
    let m = machine();
    let before = m.before();
    let prog = fill_prog();
    let out = run_against_prog("kernel", &["--json"], &[&prog, "128"], &[]);
    let (j, err) = ok_json(&out);
    let limit = (32u64 + 64) << 20;
    assert_eq!(j["memcg_limit"], limit, "{j}");
    assert_eq!(j["against"], "kernel", "{j}");
    for side in ["kernel", "uswap"] {
        assert!(
            err.contains(&format!(
                "side={side}\nok: 128 MiB written and read back, 0 wrong words"
            )),
            "{side}: the program did not run or verify there:\n{err}"
        );
        let runs = j[side]["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 1, "{j}");
        let r = &runs[0];
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        assert!(r["wall_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        let peak = r["memcg_peak_bytes"].as_u64().unwrap_or(0);
        assert!(peak > 0 && peak <= limit, "{side}: memcg peak {peak}: {r}");
        assert_eq!(j[side]["median_wall_s"], r["wall_s"], "{j}");
    }
    let pswpout = j["kernel"]["runs"][0]["vmstat_delta"]["pswpout"]
        .as_u64()
        .unwrap_or(0);
    assert!(pswpout > 0, "the kernel side did not swap: {j}");
    let (k, u) = (
        j["kernel"]["median_wall_s"].as_f64().unwrap(),
        j["uswap"]["median_wall_s"].as_f64().unwrap(),
    );
    let ratio = j["ratio"].as_f64().expect("a ratio");
    assert!((ratio - k / u).abs() < 1e-9, "ratio {ratio} != {k}/{u}");
    assert_eq!(j["uswap_failed"], false, "{j}");
    assert!(err.contains("uswap is "), "no ratio line:\n{err}");
    assert_eq!(leftovers(), before, "something was left behind");
}

/// A program that fails on the uswap side: the command fails and says so (exit status of
/// the run, which side); one that fails on the kernel side only: reported, exit 0.
#[test]
fn run_against_a_failing_side_is_reported() {
    let m = machine();
    let before = m.before();
    let prog = fill_prog();
    let out = run_against_prog(
        "kernel",
        &["--json"],
        &[&prog, "64"],
        &[("AGAINST_FILL_FAIL_SIDE", "uswap")],
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "must fail with 1:\n{err}");
    assert!(
        err.contains("the uswap side failed in 1 of 1 run(s)")
            && err.contains("uswap side, run 1: FAILED: exit status 3"),
        "unclear message:\n{err}"
    );
    let j = last_json(&out);
    assert_eq!(j["uswap"]["runs"][0]["status"], "failed", "{j}");
    assert_eq!(j["uswap"]["runs"][0]["exit_code"], 3, "{j}");
    assert_eq!(j["kernel"]["runs"][0]["status"], "ok", "{j}");
    assert_eq!(j["ratio"], Value::Null, "{j}");
    assert_eq!(j["uswap_failed"], true, "{j}");
    assert_eq!(
        leftovers(),
        before,
        "something was left behind after a failure"
    );

    let out = run_against_prog(
        "kernel",
        &["--json"],
        &[&prog, "64"],
        &[("AGAINST_FILL_FAIL_SIDE", "kernel")],
    );
    let (j, err) = ok_json(&out);
    assert!(
        err.contains("kernel side, run 1: FAILED: exit status 3"),
        "kernel failure not reported:\n{err}"
    );
    assert_eq!(j["kernel"]["failed_runs"], 1, "{j}");
    assert_eq!(j["uswap"]["ok_runs"], 1, "{j}");
    assert_eq!(leftovers(), before, "something was left behind");
}

/// `--direct`: PROGRAM runs without the preload on both sides and sees which side it is
/// on and the budget; `--log-dir` gets its output, one file per run.
#[test]
fn run_against_direct_tells_the_program_its_side() {
    let m = machine();
    let before = m.before();
    let logs = support::TempDir::new(&common::tmpdir(), "against-logs");
    let dir = logs.path().join("logs");
    let out = run_against_prog(
        "kernel",
        &["--direct", "--repeat", "2", "--log-dir", dir.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo side=$USWAP_AGAINST_SIDE budget=$USWAP_AGAINST_BUDGET preload=${LD_PRELOAD:-none}",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed:\n{err}");
    assert!(
        !err.contains("side="),
        "output not in the log files:\n{err}"
    );
    for side in ["kernel", "uswap"] {
        for run in 1..=2 {
            let log = dir.join(format!("{side}-{run}.log"));
            let text = std::fs::read_to_string(&log)
                .unwrap_or_else(|e| panic!("{}: {e}\n{err}", log.display()));
            assert_eq!(
                text.trim(),
                format!("side={side} budget={} preload=none", 32u64 << 20),
                "{}",
                log.display()
            );
        }
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("uswap is "),
        "no table on stdout"
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

/// SIGTERM while the kernel side runs: swap off, cgroup gone, a clear message. SIGKILL:
/// the next run undoes what the killed one left and says so.
#[test]
fn run_against_interrupted_or_killed_cleans_up() {
    let mut m = machine();
    let before = m.before();
    let lib = common::preload().display().to_string();
    let args = [
        "run",
        "--against",
        "kernel",
        "--budget",
        "32M",
        "--against-swap",
        "256M",
        "--",
        "sleep",
        "60",
    ];
    let env = [("USWAP_PRELOAD", lib.as_str())];
    let on = || {
        let l = leftovers();
        !l.swaps.is_empty() && !l.cgroups.is_empty()
    };
    let (pid, seen) = start_until(&mut m, &args, &env, "kernel side ...", on);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let child = m.children.iter_mut().find(|c| c.id() == pid).unwrap();
    let st = child.wait().unwrap();
    assert!(!st.success(), "an interrupted run must fail:\n{seen}");
    assert_eq!(
        leftovers(),
        before,
        "something was left behind after SIGTERM"
    );

    let (pid, seen) = start_until(&mut m, &args, &env, "kernel side ...", on);
    sigkill(&mut m, pid);
    assert!(on(), "nothing left to clean after SIGKILL?\n{seen}");
    let prog = fill_prog();
    // (With a smaller allowance: the limit is the budget + that.)
    let out = run_against_prog(
        "kernel",
        &["--json", "--against-allowance", "32M"],
        &[&prog, "16"],
        &[],
    );
    let (j, err) = ok_json(&out);
    assert_eq!(j["memcg_limit"], 64u64 << 20, "{j}");
    assert_eq!(j["allowance"], 32u64 << 20, "{j}");
    assert!(
        err.contains("budget 32 MiB + 32 MiB allowance = memcg limit 64 MiB"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "cleaned up after an earlier run that did not finish (pid {pid}"
        )) && err.contains("swapoff"),
        "the cleanup was not said:\n{err}"
    );
    assert_eq!(leftovers(), before, "something was left behind");
}

/// Without root: a clear error, exit 1, nothing set up.
#[test]
fn run_against_without_root_says_so() {
    let m = machine();
    let before = m.before();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(["run", "--against", "kernel", "--", "true"])
        .output()
        .expect("run setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("needs root"), "unclear message:\n{err}");
    assert_eq!(leftovers(), before, "something was set up");
}
