//! Watching and steering running programs: `uswap stat`, `uswap top`, `uswap export`,
//! `uswap set`, and `uswap run --metrics`. All read the records every pool publishes
//! (`uswap::live`): one reader, one list of counters (`uswap::Counters::FIELDS`), so
//! what they show is what `--stats` prints at exit, under the same names.

use clap::Args;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uswap::live::Snapshot;
use uswap::stats::Kind;
use uswap::Counters;

pub const STAT_HELP: &str = "\
Examples:
  uswap stat 4242              the counters of process 4242's pools, once
  uswap stat -w 1 4242         every second, with rates of the counters (per second)
  uswap stat --json 4242       one JSON object per pool (the names of --stats)

Fields that are 0 are left out unless --all. Every process under uswap publishes its
records in $USWAP_LIVE_DIR or /dev/shm/uswap-<uid> (written every 250 ms); only the same
user (or root) can read them. Exit status: 0, 1 when a PID has no live uswap pool.";

pub const TOP_HELP: &str = "\
Every uswap pool of this user on the machine, one line each, grouped by the `uswap run`
they belong to (RUN: its pid), refreshed every --delay. Rates are per second over the
last interval (IN/OUT: swap-in/out bytes; FLT: major faults). Records of processes that
are gone (exited, killed, exec'd) are removed as they are found.

Examples:
  uswap top                    refresh every second until interrupted
  uswap top -n 1               print once and exit";

pub const EXPORT_HELP: &str = "\
Serves every uswap pool of this user in the Prometheus text format (node_exporter style):
one sample per pool and metric, labels program, pid, pool and run. Counters end in
_total; units are in the names (_bytes, _pages). See docs/run.md for the list.

Examples:
  uswap export --listen 127.0.0.1:9477     serve /metrics
  uswap export                             print the exposition once to stdout";

pub const SET_HELP: &str = "\
Changes the budget of a running process's uswap pools, applied within 250 ms: growing
lets it hold more at once; shrinking makes it evict down to the new budget (its data is
kept; nothing is killed). The budget may go from 8 MiB up to the budget the process
started with.

Examples:
  uswap set 4242 --budget 128M
  uswap set 4242 --budget 1G --pool 1     only its second pool (Python: uswap.Pool)";

/// `uswap stat` options.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Processes to show (every process of this user under uswap if none).
    #[arg(value_name = "PID")]
    pub pids: Vec<u32>,
    /// Show them again every INTERVAL (e.g. 1, 500ms, 2s), with rates, until they are
    /// gone or interrupted.
    #[arg(short = 'w', long = "watch", value_name = "INTERVAL",
          value_parser = crate::bench::parse_duration)]
    pub watch: Option<Duration>,
    /// With --watch: stop after N showings.
    #[arg(short = 'n', long, value_name = "N", requires = "watch")]
    pub iterations: Option<u64>,
    /// One JSON object per pool and showing.
    #[arg(long)]
    pub json: bool,
    /// Show fields that are 0 too.
    #[arg(long)]
    pub all: bool,
}

/// `uswap top` options.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Refresh every INTERVAL [default: 1s].
    #[arg(short = 'd', long, value_name = "INTERVAL", default_value = "1s",
          hide_default_value = true, value_parser = crate::bench::parse_duration)]
    pub delay: Duration,
    /// Stop after N refreshes.
    #[arg(short = 'n', long, value_name = "N")]
    pub iterations: Option<u64>,
}

/// `uswap export` options.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Serve GET /metrics on ADDR (HOST:PORT); without it, print once to stdout.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Only the processes of the `uswap run` whose program has pid PID.
    #[arg(long, value_name = "PID")]
    pub run: Option<u32>,
    /// `uswap run --metrics`: serve the socket on stdin, and exit once the run (--run)
    /// is gone.
    #[arg(long, hide = true, requires = "run", conflicts_with = "listen")]
    pub listener_on_stdin: bool,
    /// With --listener-on-stdin: start the server detached and return.
    #[arg(long, hide = true, requires = "listener_on_stdin")]
    pub detach: bool,
}

/// `uswap set` options.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The process.
    #[arg(value_name = "PID")]
    pub pid: u32,
    /// The new budget (e.g. 512M, 2G).
    #[arg(long, value_name = "SIZE", value_parser = crate::bench::parse_size_arg)]
    pub budget: u64,
    /// Only the process's pool number N (0: its first) [default: every pool].
    #[arg(long, value_name = "N")]
    pub pool: Option<u32>,
}

/// The records' directory, checked: this user's alone.
fn live_dir() -> Result<PathBuf, String> {
    let dir =
        uswap::live::dir().ok_or("USWAP_LIVE_DIR is off: no process publishes its counters")?;
    if !dir.exists() {
        return Ok(dir);
    }
    uswap::live::check_dir(&dir, false)?;
    Ok(dir)
}

/// The live pools now (none if the directory does not exist yet).
fn pools() -> Result<Vec<Snapshot>, String> {
    let dir = live_dir()?;
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let l = uswap::live::list(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (p, why) in &l.unreadable {
        eprintln!("uswap: {}: {why}", p.display());
    }
    Ok(l.pools)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type Key = (u32, u32);

fn key(s: &Snapshot) -> Key {
    (s.pid, s.index)
}

/// Per-second rates of the counters between two records of one pool.
fn rates(now: &Snapshot, before: &Snapshot) -> Vec<Option<f64>> {
    let dt = now.updated_ms.saturating_sub(before.updated_ms) as f64 / 1000.0;
    let (a, b) = (now.counters.values(), before.counters.values());
    Counters::FIELDS
        .iter()
        .zip(a.iter().zip(&b))
        .map(|(f, (x, y))| {
            (f.kind == Kind::Counter && dt > 0.0).then(|| x.saturating_sub(*y) as f64 / dt)
        })
        .collect()
}

pub fn stat(args: StatArgs) -> i32 {
    let mut before: HashMap<Key, Snapshot> = HashMap::new();
    let mut shown = 0u64;
    loop {
        let all = match pools() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("uswap stat: error: {e}");
                return 1;
            }
        };
        let mine: Vec<&Snapshot> = all
            .iter()
            .filter(|s| args.pids.is_empty() || args.pids.contains(&s.pid))
            .collect();
        let missing: Vec<u32> = args
            .pids
            .iter()
            .copied()
            .filter(|p| !mine.iter().any(|s| s.pid == *p))
            .collect();
        if shown == 0 && !missing.is_empty() {
            for p in &missing {
                eprintln!(
                    "uswap stat: process {p} has no live uswap pool (not under uswap, \
                     exited, or another user's; records are read from {})",
                    live_dir().map_or_else(|e| e, |d| d.display().to_string())
                );
            }
            return 1;
        }
        if shown > 0 {
            for p in &missing {
                if before.keys().any(|k| k.0 == *p) {
                    eprintln!("uswap stat: process {p} is gone");
                }
            }
            before.retain(|k, _| !missing.contains(&k.0));
            if mine.is_empty() {
                return 0;
            }
        }
        let now = now_ms();
        for s in &mine {
            let r = before.get(&key(s)).map(|b| rates(s, b));
            if args.json {
                println!("{}", stat_json(s, r.as_deref()));
            } else {
                print!("{}", stat_text(s, r.as_deref(), args.all, now));
            }
        }
        let _ = std::io::stdout().flush();
        before = mine.iter().map(|s| (key(s), (*s).clone())).collect();
        shown += 1;
        let Some(every) = args.watch else { return 0 };
        if args.iterations.is_some_and(|n| shown >= n) {
            return 0;
        }
        std::thread::sleep(every);
    }
}

fn stat_json(s: &Snapshot, rates: Option<&[Option<f64>]>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "pid": s.pid,
        "ppid": s.ppid,
        "run": s.root_pid,
        "pool": s.index,
        "program": s.program,
        "started_ms": s.started_ms,
        "updated_ms": s.updated_ms,
        "counters": s.counters,
    });
    if let Some(r) = rates {
        let m: serde_json::Map<String, serde_json::Value> = Counters::FIELDS
            .iter()
            .zip(r)
            .filter_map(|(f, r)| r.map(|r| (f.name.to_string(), serde_json::json!(r))))
            .collect();
        v["rates_per_s"] = m.into();
    }
    v
}

fn stat_text(s: &Snapshot, rates: Option<&[Option<f64>]>, all: bool, now: u64) -> String {
    let secs = |ms: u64| now.saturating_sub(ms) as f64 / 1000.0;
    let mut out = format!(
        "pid {} ({}) pool {}, run {}, parent {}: started {:.1} s ago, record {:.1} s old\n",
        s.pid,
        s.program,
        s.index,
        s.root_pid,
        s.ppid,
        secs(s.started_ms),
        secs(s.updated_ms)
    );
    let values = s.counters.values();
    for (i, f) in Counters::FIELDS.iter().enumerate() {
        let v = values[i];
        let always = matches!(
            f.name,
            "budget_bytes" | "budget_limit_bytes" | "resident_bytes" | "cached_bytes"
        );
        if v == 0 && !all && !always {
            continue;
        }
        let mut line = format!("  {:<36} {v:>16}", f.name);
        if f.name.ends_with("_bytes") {
            line.push_str(&format!("  {}", uswap::format_size(v)));
        }
        if let Some(Some(r)) = rates.map(|r| r[i]) {
            line.push_str(&format!("  {r:.1}/s"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A size in a column: 4 significant characters and a unit.
fn short(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v >= 100.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

pub fn top(args: TopArgs) -> i32 {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut before: HashMap<Key, Snapshot> = HashMap::new();
    let mut shown = 0u64;
    loop {
        let mut all = match pools() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("uswap top: error: {e}");
                return 1;
            }
        };
        all.sort_by_key(|s| (s.root_pid, s.pid != s.root_pid, s.pid, s.index));
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        } else if shown > 0 {
            out.push('\n');
        }
        let procs = {
            let mut p: Vec<u32> = all.iter().map(|s| s.pid).collect();
            p.dedup();
            p.len()
        };
        out.push_str(&format!(
            "uswap top: {procs} processes, {} pools, every {:.1} s\n",
            all.len(),
            args.delay.as_secs_f64()
        ));
        out.push_str(&format!(
            "{:>7} {:>7} {:>7} {:<15} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>5}\n",
            "RUN", "PID", "PPID", "PROGRAM", "BUDGET", "LIMIT", "RESID", "CACHED", "SWAPPED",
            "ZPOOL", "IN/s", "OUT/s", "FLT/s", "ERR"
        ));
        for s in &all {
            let c = &s.counters;
            let rate = |f: fn(&Counters) -> u64| {
                before.get(&key(s)).map_or("-".to_string(), |b| {
                    let dt = s.updated_ms.saturating_sub(b.updated_ms) as f64 / 1000.0;
                    if dt <= 0.0 {
                        return "-".to_string();
                    }
                    short(f(c).saturating_sub(f(&b.counters)) as f64 / dt)
                })
            };
            let name = if s.index > 0 {
                format!("{}#{}", s.program, s.index)
            } else {
                s.program.clone()
            };
            out.push_str(&format!(
                "{:>7} {:>7} {:>7} {:<15} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>5}\n",
                s.root_pid,
                s.pid,
                s.ppid,
                name,
                short(c.budget_bytes as f64),
                short(c.budget_limit_bytes as f64),
                short(c.resident_bytes as f64),
                short(c.cached_bytes as f64),
                short(c.slots_used as f64 * 4096.0),
                short(c.zswap_pool_bytes as f64),
                rate(|c| c.pswpin * 4096),
                rate(|c| c.pswpout * 4096),
                rate(|c| c.majflt).trim_end_matches('B'),
                c.io_errors + c.poisoned,
            ));
        }
        print!("{out}");
        let _ = std::io::stdout().flush();
        before = all.into_iter().map(|s| (key(&s), s)).collect();
        shown += 1;
        if args.iterations.is_some_and(|n| shown >= n) {
            return 0;
        }
        std::thread::sleep(args.delay);
    }
}

/// A label value in the exposition format.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition (format 0.0.4) of `pools`: every field of
/// `Counters::FIELDS` as a family with its HELP and TYPE, one sample per pool.
pub fn exposition(pools: &[Snapshot]) -> String {
    let now = now_ms();
    let labels: Vec<String> = pools
        .iter()
        .map(|s| {
            format!(
                "{{program=\"{}\",pid=\"{}\",pool=\"{}\",run=\"{}\"}}",
                label(&s.program),
                s.pid,
                s.index,
                s.root_pid
            )
        })
        .collect();
    let values: Vec<Vec<u64>> = pools.iter().map(|s| s.counters.values()).collect();
    let mut out = String::new();
    let mut family =
        |name: &str, kind: &str, help: &str, samples: &mut dyn Iterator<Item = String>| {
            out.push_str(&format!(
                "# HELP {name} {}\n# TYPE {name} {kind}\n",
                help.trim().replace('\\', "\\\\").replace('\n', "\\n")
            ));
            for s in samples {
                out.push_str(&s);
            }
        };
    family(
        "uswap_pools",
        "gauge",
        "uswap pools whose live records were read (one per process and pool).",
        &mut std::iter::once(format!("uswap_pools {}\n", pools.len())),
    );
    for (i, f) in Counters::FIELDS.iter().enumerate() {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        family(
            f.metric,
            kind,
            f.help,
            &mut labels
                .iter()
                .zip(&values)
                .map(|(l, v)| format!("{}{l} {}\n", f.metric, v[i])),
        );
    }
    family(
        "uswap_zswap_compression_ratio",
        "gauge",
        "Bytes the compressed tier stores over the bytes it holds (0 when empty).",
        &mut labels.iter().zip(pools).map(|(l, s)| {
            format!(
                "uswap_zswap_compression_ratio{l} {}\n",
                s.counters.zswap_ratio()
            )
        }),
    );
    family(
        "uswap_record_age_seconds",
        "gauge",
        "How old the pool's record was when read (written every 0.25 s; more: the process is stopped or busy).",
        &mut labels.iter().zip(pools).map(|(l, s)| {
            format!(
                "uswap_record_age_seconds{l} {}\n",
                now.saturating_sub(s.updated_ms) as f64 / 1000.0
            )
        }),
    );
    out
}

/// The pools of run `run` (all with `None`).
fn pools_of(run: Option<u32>) -> Result<Vec<Snapshot>, String> {
    Ok(pools()?
        .into_iter()
        .filter(|s| run.is_none_or(|r| s.root_pid == r))
        .collect())
}

/// Answer one HTTP request on `stream`: GET /metrics, or 404.
fn serve_one(mut stream: TcpStream, run: Option<u32>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 << 10 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&req);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_string(),
        )
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        match pools_of(run) {
            Ok(p) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                exposition(&p),
            ),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
        }
    } else {
        (
            "404 Not Found",
            "text/plain",
            "uswap metrics are at /metrics\n".to_string(),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = stream.write_all(body.as_bytes());
    }
}

/// Whether process `pid` is running (not gone, not a zombie).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

pub fn export(args: ExportArgs) -> i32 {
    if args.detach {
        // Started by `uswap run` before it execs: start the server as a process of its
        // own (not a child of the program, whose wait() must not see it) and return.
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("uswap export: error: cannot find own executable: {e}");
                return 1;
            }
        };
        use std::os::unix::process::CommandExt;
        let spawned = std::process::Command::new(exe)
            .args(["export", "--listener-on-stdin", "--run"])
            .arg(args.run.expect("clap requires --run").to_string())
            .env_remove("LD_PRELOAD")
            .stdout(std::process::Stdio::null())
            // Out of the terminal's process group: ^C goes to the program, and the
            // server leaves once the program is gone.
            .process_group(0)
            .spawn();
        return match spawned {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("uswap export: error: cannot start the metrics server: {e}");
                1
            }
        };
    }
    let listener = if args.listener_on_stdin {
        use std::os::fd::AsFd;
        match std::io::stdin().as_fd().try_clone_to_owned() {
            Ok(fd) => TcpListener::from(fd),
            Err(e) => {
                eprintln!("uswap export: error: no listening socket on stdin: {e}");
                return 1;
            }
        }
    } else if let Some(addr) = args.listen {
        match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("uswap export: error: cannot listen on {addr}: {e}");
                return 2;
            }
        }
    } else {
        return match pools_of(args.run) {
            Ok(p) => {
                print!("{}", exposition(&p));
                0
            }
            Err(e) => {
                eprintln!("uswap export: error: {e}");
                1
            }
        };
    };
    if let Err(e) = live_dir() {
        eprintln!("uswap export: error: {e}");
        return 1;
    }
    // Nonblocking, to notice the run's end between requests (`uswap run --metrics`).
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("uswap export: error: {e}");
        return 1;
    }
    let mut last_check = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                serve_one(s, args.run);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("uswap export: error: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if args.listener_on_stdin && last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            let run = args.run.expect("clap requires --run");
            // The run is over when its program is gone and no process of it publishes.
            if !running(run) && pools_of(Some(run)).is_ok_and(|p| p.is_empty()) {
                return 0;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `uswap run --metrics ADDR`: bind ADDR now (a bad address fails the run before the
/// program starts) and leave a server for the run's processes behind, detached.
pub fn start_run_exporter(addr: SocketAddr) -> Result<(), String> {
    live_dir()?;
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr} (--metrics): {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    if addr.port() == 0 {
        eprintln!("uswap run: metrics at http://{bound}/metrics");
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let fd = std::os::fd::OwnedFd::from(listener);
    let status = std::process::Command::new(exe)
        .args(["export", "--listener-on-stdin", "--detach", "--run"])
        .arg(std::process::id().to_string())
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::from(fd))
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot start the metrics server: {e}"))?;
    if !status.success() {
        return Err("the metrics server did not start".into());
    }
    Ok(())
}

pub fn set(args: SetArgs) -> i32 {
    let all = match pools() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("uswap set: error: {e}");
            return 1;
        }
    };
    let targets: Vec<&Snapshot> = all
        .iter()
        .filter(|s| s.pid == args.pid && args.pool.is_none_or(|n| s.index == n))
        .collect();
    if targets.is_empty() {
        match args.pool {
            Some(n) => eprintln!(
                "uswap set: error: process {} has no live uswap pool {n}",
                args.pid
            ),
            None => eprintln!(
                "uswap set: error: process {} has no live uswap pool (not under uswap, \
                 exited, or another user's)",
                args.pid
            ),
        }
        return 1;
    }
    const MIN: u64 = 8 << 20;
    for s in &targets {
        let max = s.counters.budget_max_bytes;
        if args.budget < MIN || args.budget > max {
            eprintln!(
                "uswap set: error: budget {}: process {} pool {} may go from {} to {} \
                 (the budget it started with; start it with a bigger --budget to grow \
                 past that)",
                uswap::format_size(args.budget),
                s.pid,
                s.index,
                uswap::format_size(MIN),
                uswap::format_size(max)
            );
            return 2;
        }
    }
    for s in &targets {
        if let Err(e) = uswap::live::request_budget(s, args.budget) {
            eprintln!("uswap set: error: {}: {e}", s.path.display());
            return 1;
        }
    }
    // Applied at the pool's next record (every 250 ms): wait to see it.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut pending: Vec<Key> = targets.iter().map(|s| key(s)).collect();
    let old: HashMap<Key, u64> = targets
        .iter()
        .map(|s| (key(s), s.counters.budget_bytes))
        .collect();
    while !pending.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let Ok(now) = pools() else { continue };
        pending.retain(|k| {
            let Some(s) = now.iter().find(|s| key(s) == *k) else {
                eprintln!("uswap set: process {} pool {} is gone", k.0, k.1);
                return false;
            };
            if s.counters.budget_bytes != args.budget {
                return true;
            }
            println!(
                "pid {} ({}) pool {}: budget {} -> {}",
                s.pid,
                s.program,
                s.index,
                uswap::format_size(old[k]),
                uswap::format_size(args.budget)
            );
            false
        });
    }
    if !pending.is_empty() {
        for k in &pending {
            eprintln!(
                "uswap set: error: process {} pool {} did not take the budget within 3 s \
                 (stopped? its stderr says why if it refused)",
                k.0, k.1
            );
        }
        return 1;
    }
    0
}
