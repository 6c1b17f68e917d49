//! Watching and steering a running program from another process: `uswap stat`,
//! `uswap top`, `uswap run --metrics` (parsed by the Prometheus client library's own
//! parser) and `uswap set`, against tests/progs/live.c under `uswap run`, which fills
//! and checks its memory on command so the counters can be read between steps.
//!
//! Each test publishes into a directory of its own (`USWAP_LIVE_DIR`), so that other
//! programs under uswap on the machine do not show up in what it asserts.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A fresh records directory (mode 0700, as `uswap` wants it), removed at the end.
struct LiveDir(PathBuf);

impl LiveDir {
    fn new(name: &str) -> LiveDir {
        use std::os::unix::fs::PermissionsExt;
        let d = tmpdir().join(format!("live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("live dir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        LiveDir(d)
    }

    /// Record files in it now (the pools' and anything else but temporaries).
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read live dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for LiveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `uswap run ... -- live MIB`, driven through its stdin; killed (its whole process
/// group) when dropped, so a failing test leaves nothing running.
struct Prog {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Receiver<String>,
    pid: u32,
}

impl Prog {
    fn start(dir: &LiveDir, budget: &str, extra: &[&str], mib: u64) -> Prog {
        let mut cmd = Command::new(uswap_exe());
        cmd.args(["run", "--budget", budget])
            .args(extra)
            .arg("--")
            .arg(cprog("live"))
            .arg(mib.to_string());
        let mut p = Prog::spawn(dir, cmd);
        p.expect("ready", 60);
        p
    }

    /// `cmd` (a `uswap run`) in a process group of its own, publishing into `dir`,
    /// its stdio piped.
    fn spawn(dir: &LiveDir, mut cmd: Command) -> Prog {
        use std::os::unix::process::CommandExt;
        let mut child = cmd
            .env("USWAP_PRELOAD", preload())
            .env("USWAP_LIVE_DIR", &dir.0)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn uswap run");
        Prog {
            pid: child.id(),
            stdin: child.stdin.take().expect("stdin"),
            lines: reader(child.stdout.take().expect("stdout")),
            stderr: reader(child.stderr.take().expect("stderr")),
            child,
        }
    }

    /// The next line of its stdout within `secs`.
    fn line(&mut self, secs: u64) -> String {
        match self.lines.recv_timeout(Duration::from_secs(secs)) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => panic!("no answer from the program in {secs} s"),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "the program ended; its stderr: {}",
                self.stderr.try_iter().collect::<Vec<_>>().join("\n")
            ),
        }
    }

    fn expect(&mut self, want: &str, secs: u64) {
        let got = self.line(secs);
        assert_eq!(got, want, "the program answered {got:?}, not {want:?}");
    }

    /// Send a command and check its answer.
    fn ask(&mut self, cmd: &str, want: &str) {
        writeln!(self.stdin, "{cmd}").expect("write to the program");
        self.expect(want, 120);
    }

    /// `quit`, and its exit status within a deadline.
    fn quit(mut self) -> std::process::ExitStatus {
        writeln!(self.stdin, "quit").expect("write to the program");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "the program did not exit in 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pid)])
                .status();
            let _ = self.child.wait();
        }
    }
}

fn reader(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// `uswap ARGS` with the test's records directory, under a deadline.
fn uswap(dir: &LiveDir, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(uswap_exe());
    cmd.env("USWAP_LIVE_DIR", &dir.0).args(args);
    run_with_deadline(cmd, 60)
}

/// The program's name as the kernel keeps it (`comm`: 15 bytes at most).
fn comm() -> String {
    let name = cprog("live")
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    name.chars().take(15).collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `uswap stat --json PID`: the first pool's record.
fn stat(dir: &LiveDir, pid: u32) -> Value {
    let out = uswap(dir, &["stat", "--json", &pid.to_string()]);
    assert!(
        out.status.success(),
        "uswap stat {pid} failed: {}",
        text(&out.stderr)
    );
    let first = text(&out.stdout)
        .lines()
        .next()
        .expect("a pool")
        .to_string();
    serde_json::from_str(&first).expect("stat JSON")
}

fn field(v: &Value, name: &str) -> u64 {
    v["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {v}"))
}

/// What the engine holds in RAM (all of it counts against the budget but spare THPs).
fn held(v: &Value) -> u64 {
    field(v, "resident_bytes") + field(v, "cached_bytes") + field(v, "metadata_bytes")
}

/// Poll `uswap stat` until `ok` holds (every 100 ms, at most `secs`).
fn stat_until(dir: &LiveDir, pid: u32, secs: u64, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = stat(dir, pid);
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "not within {secs} s; last record: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The counters change as the program swaps, read from another process; the
/// record goes when the program exits.
#[test]
fn stat_follows_a_running_program_until_it_exits() {
    let dir = LiveDir::new("stat");
    let mut p = Prog::start(&dir, "64M", &[], 256);
    let pid = p.pid;
    p.ask("fill 1", "filled");
    // 256 MiB written under a 64 MiB budget: most of it went out (the record is
    // rewritten every 250 ms, so the one read first may be from before the end).
    let filled = stat_until(&dir, pid, 10, |v| field(v, "slots_used") * 4096 > 128 * MIB);
    assert_eq!(filled["pid"], pid);
    assert_eq!(filled["run"], pid, "the program is its run's first process");
    assert_eq!(field(&filled, "budget_bytes"), 64 * MIB);
    assert!(field(&filled, "pswpout") > 0, "swapped: {filled}");
    assert!(field(&filled, "resident_bytes") <= 64 * MIB, "{filled}");
    p.ask("check 1", "ok");
    // Reading it all back: pages come in, and the record shows it within its period.
    let checked = stat_until(&dir, pid, 5, |v| {
        field(v, "pswpin") > field(&filled, "pswpin") + 16_384
    });
    assert!(field(&checked, "majflt") > field(&filled, "majflt"));
    // Watching: two showings, the second with rates per second.
    let out = uswap(
        &dir,
        &["stat", "--json", "-w", "300ms", "-n", "2", &pid.to_string()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shows: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(shows.len(), 2, "{shows:?}");
    assert!(
        shows[1]["rates_per_s"]["pswpout"].is_number(),
        "{}",
        shows[1]
    );
    // The text form names the fields as --stats does.
    let out = uswap(&dir, &["stat", &pid.to_string()]);
    let t = text(&out.stdout);
    assert!(t.contains(&format!("pid {pid} ({}) pool 0", comm())), "{t}");
    assert!(t.contains("pswpout") && t.contains("budget_bytes"), "{t}");

    assert!(p.quit().success());
    assert_eq!(
        dir.files(),
        Vec::<String>::new(),
        "the record outlived its process"
    );
    let out = uswap(&dir, &["stat", &pid.to_string()]);
    assert_eq!(out.status.code(), Some(1), "stat of an exited process");
    assert!(
        text(&out.stderr).contains("has no live uswap pool"),
        "{}",
        text(&out.stderr)
    );
}

/// After kill -9 the record stays on disk (nobody removed it), but no reader shows
/// it, and the first one removes it; so does the next pool that starts.
#[test]
fn kill_9_leaves_nothing_listed_behind() {
    let dir = LiveDir::new("kill");
    let mut p = Prog::start(&dir, "64M", &[], 128);
    let pid = p.pid;
    p.ask("fill 2", "filled");
    let top = uswap(&dir, &["top", "-n", "1"]);
    assert!(top.status.success(), "{}", text(&top.stderr));
    let t = text(&top.stdout);
    let row = t
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("pid {pid} not in top:\n{t}"));
    assert!(row.contains(&comm()), "{row}");
    assert!(t.contains("1 processes, 1 pools"), "{t}");

    kill_9(&mut p);
    assert_eq!(dir.files(), vec![format!("{pid}.0")], "left as it was");
    // The next pool to start removes it, with nobody reading.
    let mut q = Prog::start(&dir, "64M", &[], 16);
    q.ask("fill 2", "filled");
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.files() != vec![format!("{}.0", q.pid)] {
        assert!(
            Instant::now() < deadline,
            "a new pool left the stale record: {:?}",
            dir.files()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Killed too, its record is removed by the first reader.
    let qpid = q.pid;
    kill_9(&mut q);
    assert_eq!(dir.files(), vec![format!("{qpid}.0")], "left as it was");
    let top = uswap(&dir, &["top", "-n", "1"]);
    assert!(top.status.success(), "{}", text(&top.stderr));
    let t = text(&top.stdout);
    assert!(t.contains("0 processes, 0 pools"), "{t}");
    assert!(!t.contains(&format!(" {qpid} ")), "{t}");
    assert_eq!(
        dir.files(),
        Vec::<String>::new(),
        "the stale record was not removed"
    );
}

/// `uswap stat --json` of every pool in the directory.
fn stat_all(dir: &LiveDir) -> Vec<Value> {
    let out = uswap(dir, &["stat", "--json"]);
    assert!(out.status.success(), "uswap stat: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("stat JSON"))
        .collect()
}

/// A forked child publishes a record of its own in its parent's run; a process that
/// execs (alive, but no pool any more) is no longer listed.
#[test]
fn a_forked_child_is_grouped_and_an_exec_drops_the_record() {
    const SCRIPT: &str = r#"
import os, sys, time
b = bytearray(96 << 20)
for i in range(0, len(b), 4096): b[i] = 1
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
print("forked", child, flush=True)
sys.stdin.readline()
os.execvp("sleep", ["sleep", "120"])
"#;
    let dir = LiveDir::new("fork");
    let mut cmd = Command::new(uswap_exe());
    cmd.args(["run", "--budget", "32M", "--", "python3", "-c", SCRIPT]);
    // Dropped, it kills the group (the parent and its child), also when an assert fails.
    let mut p = Prog::spawn(&dir, cmd);
    let said = p.line(60);
    let kid: u32 = said
        .strip_prefix("forked ")
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let pools = loop {
        let v = stat_all(&dir);
        if v.len() == 2 {
            break v;
        }
        assert!(Instant::now() < deadline, "not two pools in 10 s: {v:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let of = |pid: u32| {
        pools
            .iter()
            .find(|v| v["pid"] == pid)
            .unwrap_or_else(|| panic!("no record of {pid}: {pools:?}"))
    };
    assert_eq!(of(p.pid)["run"], p.pid);
    assert_eq!(of(kid)["run"], p.pid, "the child is in its parent's run");
    assert_eq!(of(kid)["ppid"], p.pid);
    // The child's copy of the parent's pages counts as its own.
    assert!(field(of(kid), "slots_used") + field(of(kid), "resident_bytes") / 4096 > 0);

    writeln!(p.stdin, "exec").expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = stat_all(&dir);
        if v.len() == 1 {
            assert_eq!(v[0]["pid"], kid, "{v:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the exec'd record is still listed: {v:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.pid)).expect("alive");
    assert_eq!(comm.trim(), "sleep", "the parent runs on, exec'd");
    assert_eq!(
        dir.files(),
        vec![format!("{kid}.0")],
        "the stale record was removed"
    );
}

/// kill -9 the program and wait for its end.
fn kill_9(p: &mut Prog) {
    let st = Command::new("kill")
        .args(["-KILL", &p.pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "kill -9 did not end it");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The Python interpreter with prometheus_client (scripts/test.sh installs it into
/// target/py-venv).
fn python_with_prometheus() -> PathBuf {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import prometheus_client"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} with prometheus_client is needed (scripts/test.sh installs it: \
         target/py-venv/bin/python -m pip install prometheus_client)",
        py.display()
    );
    py
}

/// Parse an exposition with `prometheus_client.parser.text_string_to_metric_families`:
/// (family name, type, sample name, labels, value) of every sample.
fn parse_with_prometheus_client(body: &str) -> Vec<Value> {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    assert fam.documentation, fam.name
    for s in fam.samples:
        out.append({"family": fam.name, "type": fam.type, "name": s.name,
                    "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;
    let mut child = Command::new(python_with_prometheus())
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "the Prometheus parser refused the scrape: {}\n{body}",
        text(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("parser output")
}

/// GET http://ADDR/metrics: the body.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics server");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// `uswap run --metrics`: the scrape parses with the Prometheus client library's
/// parser, every counter named and typed, and once the program's work is done its
/// counters equal what `--stats` prints at exit; the server leaves with the program.
#[test]
fn metrics_scrape_parses_and_matches_stats_at_exit() {
    let dir = LiveDir::new("metrics");
    let stats = tmpdir().join(format!("live-metrics-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let stats_arg = format!("--stats={}", stats.display());
    let mut p = Prog::start(&dir, "64M", &["--metrics", "127.0.0.1:0", &stats_arg], 192);
    let said = p
        .stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("the metrics address on stderr");
    let addr = said
        .strip_prefix("uswap run: metrics at http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected stderr line: {said}"))
        .to_string();
    p.ask("fill 3", "filled");
    p.ask("check 3", "ok");
    // The work is done; the next records (every 250 ms) carry its last counts.
    std::thread::sleep(Duration::from_millis(1500));
    let body = scrape(&addr);
    let samples = parse_with_prometheus_client(&body);
    let pid = p.pid.to_string();
    let value = |name: &str| -> f64 {
        samples
            .iter()
            .find(|s| s["name"] == name && s["labels"]["pid"] == pid.as_str())
            .unwrap_or_else(|| panic!("no sample {name} for pid {pid} in:\n{body}"))["value"]
            .as_f64()
            .expect("a number")
    };
    let any = samples
        .iter()
        .find(|s| s["labels"]["pid"] == pid.as_str())
        .expect("a sample of the program");
    assert_eq!(any["labels"]["program"], comm().as_str());
    assert_eq!(any["labels"]["run"], pid.as_str());
    assert!(value("uswap_swap_out_pages_total") > 0.0);
    assert_eq!(value("uswap_budget_bytes"), (64 * MIB) as f64);
    let fam = samples
        .iter()
        .find(|s| s["name"] == "uswap_swap_out_pages_total")
        .expect("swap-out");
    assert_eq!(fam["type"], "counter");
    assert_eq!(fam["family"], "uswap_swap_out_pages");

    assert!(p.quit().success());
    let at_exit: Value = std::fs::read_to_string(&stats)
        .expect("--stats file")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("stats JSON"))
        .find(|v| v["uswap_stats"]["pid"].as_u64() == Some(pid.parse().unwrap()))
        .expect("the program's --stats line");
    let counters = &at_exit["uswap_stats"]["counters"];
    // Every counter of the one list both come from: scraped equals --stats at exit.
    let mut compared = 0;
    for f in uswap::Counters::FIELDS {
        if f.kind != uswap::stats::Kind::Counter {
            continue;
        }
        assert_eq!(
            Some(value(f.metric)),
            counters[f.name].as_f64(),
            "{} ({}): scraped vs --stats at exit",
            f.metric,
            f.name
        );
        compared += 1;
    }
    assert!(compared >= 30, "only {compared} counters compared");
    let _ = std::fs::remove_file(&stats);
    // The server goes once the run is over.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the metrics server outlived the run"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `uswap set` shrinks a running program's budget (it evicts down to it) and grows
/// it again (it holds more), its bytes exact throughout.
#[test]
fn set_shrinks_and_grows_a_running_budget() {
    let dir = LiveDir::new("set");
    let mut p = Prog::start(&dir, "160M", &[], 256);
    let pid = p.pid.to_string();
    p.ask("fill 4", "filled");
    p.ask("check 4", "ok");
    let before = stat_until(&dir, p.pid, 5, |v| held(v) > 96 * MIB);

    let out = uswap(&dir, &["set", &pid, "--budget", "48M"]);
    assert!(out.status.success(), "set 48M: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("budget 160.0 MiB -> 48.0 MiB"),
        "{}",
        text(&out.stdout)
    );
    // Evicted down to it without a fault asking: what it holds fits the new budget.
    let shrunk = stat_until(&dir, p.pid, 5, |v| held(v) <= 48 * MIB);
    assert_eq!(field(&shrunk, "budget_bytes"), 48 * MIB);
    assert_eq!(field(&shrunk, "budget_limit_bytes"), 48 * MIB);
    assert!(field(&shrunk, "evicted") > field(&before, "evicted"));
    p.ask("check 4", "ok");
    let after_check = stat(&dir, p.pid);
    assert!(held(&after_check) <= 48 * MIB, "{after_check}");

    let out = uswap(&dir, &["set", &pid, "--budget", "160M"]);
    assert!(out.status.success(), "set 160M: {}", text(&out.stderr));
    p.ask("check 4", "ok");
    p.ask("fill 5", "filled");
    p.ask("check 5", "ok");
    let grown = stat(&dir, p.pid);
    assert_eq!(field(&grown, "budget_bytes"), 160 * MIB);
    assert!(
        held(&grown) > 96 * MIB,
        "grown back, it holds more than the small budget: {grown}"
    );

    // Past the budget it started with, or below the minimum: refused, unchanged.
    for bad in ["1G", "4M"] {
        let out = uswap(&dir, &["set", &pid, "--budget", bad]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "set {bad}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("may go from 8.0 MiB to 160.0 MiB"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(field(&stat(&dir, p.pid), "budget_bytes"), 160 * MIB);
    assert!(p.quit().success());
}

/// Bad input: clear errors and exit statuses, never a hang.
#[test]
fn bad_input_is_refused() {
    let dir = LiveDir::new("bad");
    // No such process.
    let out = uswap(&dir, &["set", "999999999", "--budget", "64M"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("has no live uswap pool"),
        "{}",
        text(&out.stderr)
    );
    let out = uswap(&dir, &["stat", "999999999"]);
    assert_eq!(out.status.code(), Some(1));
    // A directory others may write to is not trusted.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = uswap(&dir, &["top", "-n", "1"]);
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("open to other users"),
            "{}",
            text(&out.stderr)
        );
    }
    // --metrics on an address that cannot be bound fails before the program starts.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut cmd = Command::new(uswap_exe());
    cmd.env("USWAP_PRELOAD", preload())
        .env("USWAP_LIVE_DIR", &dir.0)
        .args(["run", "--metrics", &addr, "--", "true"]);
    let out = run_with_deadline(cmd, 60);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot listen on"),
        "{}",
        text(&out.stderr)
    );
    let out = uswap(&dir, &["export"]);
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("uswap_pools 0"),
        "{}",
        text(&out.stdout)
    );
}
