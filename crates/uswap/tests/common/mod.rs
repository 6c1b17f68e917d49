//! Support shared by the engine tests (each `tests/*.rs` has `mod common;`).
//!
//! - [`with_deadline`]: every engine test runs its body under a deadline. A test that
//!   hangs (a fault never woken, a lock never released) FAILS: the watchdog prints
//!   what it knows (the test, its phase and seed, each pool's counters and invariant
//!   check, the stack of every thread of the process: gdb's backtraces when gdb is
//!   installed, the kernel stacks from /proc/self/task/*/stack always) and aborts the
//!   process. A forked child gets its own deadline with [`child_deadline`].
//! - Pools made through [`Test::pool`] are checked at the end of the body with
//!   `Pool::check_invariants` (no double frees, no invalid slot operations, no engine
//!   thread dead, nothing leaked once their regions are dropped): a test that passes
//!   its own asserts still fails on an engine that went wrong inside.
//!
//! `USWAP_TEST_DEADLINE_SCALE=K` multiplies every deadline (slow machines); debug
//! builds multiply by 4 on their own.

#![allow(dead_code)] // each test binary uses its own part

use std::io::Write;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use uswap::{Pool, PoolBuilder, Region, RegionOptions, UnitPolicy};

/// The tests run the engine as uswap's C library, Python module and command do: its
/// allocations apart from the program's (a handler that faults while its thread is in
/// `malloc` must not wait for an engine thread that waits for `malloc`).
#[global_allocator]
static HEAP: uswap::EngineHeap = uswap::EngineHeap;

/// A region of `size` bytes in `unit` units (a test's region must exist: unwrapped).
pub fn region_of(p: &Pool, size: u64, unit: UnitPolicy) -> Region {
    p.region_with(
        size,
        RegionOptions {
            unit: Some(unit),
            ..Default::default()
        },
    )
    .unwrap()
}

/// splitmix64: a cheap, well-mixed pattern generator.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Run test `name` of this test binary again, in a child process with `env`=1 set
/// (its body, seeing it, does what must end the process), and assert that the child
/// died of signal `sig`. Returns the child's stderr.
pub fn child_dies_of(name: &str, env: &str, sig: i32) -> String {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--nocapture"])
        .env(env, "1")
        .output()
        .expect("run the test binary again");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.signal(),
        Some(sig),
        "child: {:?} {} {err}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

/// Words per 4 KiB page.
pub const WORDS_PER_PAGE: usize = 512;

/// Check that units were read or decoded into frames that evictions gave back (warm
/// 2 MiB frames, `frames.rs`), unless a developer turned them off to compare.
pub fn assert_frames_recycled(c: &uswap::Counters) {
    if std::env::var("USWAP_WARM_UNITS").as_deref() == Ok("0") {
        eprintln!("USWAP_WARM_UNITS=0: warm 2 MiB frames are off, not checked");
        return;
    }
    assert!(
        c.thp_swpin_recycled > 0,
        "no unit read into a recycled 2 MiB frame: {c:?}"
    );
}

/// Data for the compressed tiers: what word `i` holds for `seed`. Pages of small
/// integers (compress ~4:1 and more), every fifth page random (refused by the pool, or
/// stored raw inside a unit), every seventh zeros.
pub fn compressible_word(seed: u64, i: usize) -> u64 {
    match (i / WORDS_PER_PAGE) % 35 {
        p if p % 5 == 4 => mix(seed ^ i as u64),
        p if p % 7 == 6 => 0,
        _ => (seed.wrapping_mul(31) + (i % 97) as u64) & 0xffff,
    }
}

/// Fill `words` with `compressible_word(seed, _)`.
pub fn fill_compressible(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(compressible_word(seed, i), Relaxed);
    }
}

/// Check every word of `words` against `compressible_word(seed, _)`.
pub fn check_compressible(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        let v = w.load(Relaxed);
        assert_eq!(
            v,
            compressible_word(seed, i),
            "word {i} (page {})",
            i / WORDS_PER_PAGE
        );
    }
}

/// What the watchdog knows about one running test.
struct Watch {
    name: String,
    started: Instant,
    phase: Mutex<String>,
    seed: Mutex<Option<u64>>,
    pools: Mutex<Vec<Arc<Pool>>>,
}

/// Every test of this process under a deadline now (a hang aborts them all: the
/// report names each).
static RUNNING: Mutex<Vec<Arc<Watch>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running test's handle: name its phase and seed for the report, make pools
/// that are checked at the end.
pub struct Test {
    watch: Arc<Watch>,
}

/// A pool made by [`Test::pool`]: used as a `Pool`; the test keeps it until its
/// invariants are checked at the end.
pub struct TestPool(Arc<Pool>);

impl Deref for TestPool {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.0
    }
}

impl Test {
    /// Say what the test is doing now (printed if it hangs).
    pub fn phase(&self, what: impl Into<String>) {
        *lock(&self.watch.phase) = what.into();
    }

    /// Record (and print) the seed this run uses.
    pub fn seed(&self, seed: u64) {
        *lock(&self.watch.seed) = Some(seed);
        say(&format!("{}: seed {seed}", self.watch.name));
    }

    /// Build a pool whose counters the watchdog reports and whose invariants are
    /// checked when the body returns.
    pub fn pool(&self, b: PoolBuilder) -> TestPool {
        let p = Arc::new(
            b.build()
                .expect("pool (needs root or /dev/userfaultfd access)"),
        );
        lock(&self.watch.pools).push(p.clone());
        TestPool(p)
    }

    /// Done with a pool before the end of the test: check its invariants and drop it
    /// (its threads stop and its swap files close once its regions are gone too).
    pub fn finish_pool(&self, p: TestPool, what: &str) {
        check_pool(&p, what);
        lock(&self.watch.pools).retain(|q| !Arc::ptr_eq(q, &p.0));
        drop(p);
    }

    /// Check every pool of this test now (e.g. between rounds that drop all regions).
    pub fn check_pools(&self) {
        for p in lock(&self.watch.pools).iter() {
            check_pool(p, &self.watch.name);
        }
    }

    /// Seconds this test has run.
    pub fn elapsed(&self) -> Duration {
        self.watch.started.elapsed()
    }
}

/// The engine's own invariants, asserted.
pub fn check_pool(p: &Pool, what: &str) {
    if let Err(e) = p.check_invariants() {
        panic!("{what}: engine invariants broken: {e}; {:?}", p.counters());
    }
}

fn scale() -> u64 {
    let env = std::env::var("USWAP_TEST_DEADLINE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1u64)
        .max(1);
    env * if cfg!(debug_assertions) { 4 } else { 1 }
}

/// Run `body` with a deadline of `secs` seconds: on a hang, report and abort the
/// process (the test fails, CI does not hang). After the body, the invariants of
/// every pool made by `Test::pool` are checked (still under the deadline), then the
/// pools are dropped.
pub fn with_deadline<R>(secs: u64, body: impl FnOnce(&Test) -> R) -> R {
    let name = std::thread::current().name().unwrap_or("main").to_string();
    let watch = Arc::new(Watch {
        name: name.clone(),
        started: Instant::now(),
        phase: Mutex::new("start".into()),
        seed: Mutex::new(None),
        pools: Mutex::new(Vec::new()),
    });
    lock(&RUNNING).push(watch.clone());
    let limit = Duration::from_secs(secs * scale());
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let dog = {
        let (done, watch) = (done.clone(), watch.clone());
        std::thread::Builder::new()
            .name(format!("watchdog {name}"))
            .spawn(move || {
                let (m, cv) = &*done;
                let mut g = lock(m);
                while !*g {
                    let left = limit.saturating_sub(watch.started.elapsed());
                    if left.is_zero() {
                        drop(g);
                        hung(&watch, limit);
                    }
                    g = cv
                        .wait_timeout(g, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            })
            .expect("spawn the watchdog")
    };
    let t = Test {
        watch: watch.clone(),
    };
    // A panic in the body still stops the watchdog (the test fails by the panic).
    struct Stop(Arc<(Mutex<bool>, Condvar)>, Arc<Watch>);
    impl Drop for Stop {
        fn drop(&mut self) {
            *lock(&self.0 .0) = true;
            self.0 .1.notify_all();
            lock(&RUNNING).retain(|w| !Arc::ptr_eq(w, &self.1));
        }
    }
    let stop = Stop(done, watch.clone());
    let r = body(&t);
    t.phase("end: checking the engine's invariants, dropping the pools");
    let pools = std::mem::take(&mut *lock(&watch.pools));
    for p in &pools {
        check_pool(p, &name);
    }
    drop(pools);
    drop(stop);
    let _ = dog.join();
    r
}

/// A SIGBUS that kills the test process (a page uswap poisoned, or a fault nothing
/// served) is reported with its address on stderr first: the harness's captured output
/// dies with the process. Installed before `main` (Rust's runtime then leaves SIGBUS
/// alone, and a pool's in-thread handler passes the faults it does not serve on to
/// this one).
#[used]
#[link_section = ".init_array"]
static REPORT_SIGBUS: extern "C" fn() = report_sigbus;

extern "C" fn report_sigbus() {
    extern "C" fn on_sigbus(_: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
        // Only async-signal-safe work: digits into a stack buffer, one write(2).
        let mut b = [0u8; 96];
        let mut n = 0;
        for &c in b"test process: SIGBUS at 0x" {
            b[n] = c;
            n += 1;
        }
        for k in (0..16).rev() {
            b[n] = b"0123456789abcdef"[(addr >> (4 * k)) & 15];
            n += 1;
        }
        for &c in b" si_code " {
            b[n] = c;
            n += 1;
        }
        b[n] = b'0' + (code.clamp(0, 9) as u8);
        b[n + 1] = b'\n';
        // SAFETY: write(2) from a live buffer; then the default action, so that the
        // access runs again and ends the process as it would have.
        unsafe {
            libc::write(2, b.as_ptr().cast(), n + 2);
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
        }
    }
    // SAFETY: installs an SA_SIGINFO handler from a zeroed struct, before main.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let handler: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) = on_sigbus;
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// In a forked child: die by SIGALRM after `secs` seconds (the parent sees a killed
/// child and fails), since the watchdog thread does not exist in the child.
pub fn child_deadline(secs: u64) {
    // SAFETY: alarm(2) with an integer; the default action of SIGALRM ends the process.
    unsafe { libc::alarm((secs * scale()) as u32) };
}

/// Write a line to stderr directly: not captured by the test harness (a report must
/// show even when the process aborts) and without Rust's stderr lock (a hung thread
/// may hold it). Safe in a forked child.
pub fn say(s: &str) {
    let mut b = Vec::with_capacity(s.len() + 1);
    b.extend_from_slice(s.as_bytes());
    b.push(b'\n');
    let mut off = 0;
    while off < b.len() {
        // SAFETY: writes from a live buffer to fd 2.
        let n = unsafe { libc::write(2, b[off..].as_ptr().cast(), b.len() - off) };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}

static REPORTING: AtomicU64 = AtomicU64::new(0);

/// The deadline passed: say everything known, then abort.
fn hung(watch: &Watch, limit: Duration) -> ! {
    if REPORTING.fetch_add(1, Relaxed) > 0 {
        // Another watchdog is reporting; it aborts the process.
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    say(&format!(
        "\n==== WATCHDOG: test `{}` still running after {:?}: a hang; aborting ====",
        watch.name, limit
    ));
    for w in lock(&RUNNING).iter() {
        say(&format!(
            "test `{}`: phase: {}; seed: {}; running {:.1} s",
            w.name,
            lock(&w.phase),
            lock(&w.seed).map_or("none".into(), |s| s.to_string()),
            w.started.elapsed().as_secs_f64()
        ));
        for (i, p) in lock(&w.pools).iter().enumerate() {
            say(&format!("  pool {i}: {}", pool_report(p.clone())));
        }
    }
    dump_stacks();
    say("==== WATCHDOG: aborting ====");
    std::process::abort();
}

/// Counters and invariants of a pool, asked on another thread: a hung engine may
/// not answer (then that is said).
fn pool_report(p: Arc<Pool>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(format!(
            "{:?}; invariants: {:?}",
            p.counters(),
            p.check_invariants()
        ));
    });
    rx.recv_timeout(Duration::from_secs(3))
        .unwrap_or_else(|_| "no answer in 3 s (the engine is stuck)".into())
}

/// The stacks of every thread: kernel stacks and wait channels from /proc (as root),
/// then gdb's backtraces of all threads when gdb is installed.
fn dump_stacks() {
    let pid = std::process::id();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let p = t.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
            let state = read("stat");
            let state = state
                .rsplit(") ")
                .next()
                .unwrap_or("")
                .split(' ')
                .next()
                .unwrap_or("?");
            say(&format!(
                "-- thread {} `{}` state {} wchan {}\n{}",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                state,
                read("wchan"),
                read("stack").trim_end()
            ));
        }
    }
    let gdb = std::process::Command::new("gdb")
        .args(["-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
        .stdin(std::process::Stdio::null())
        .stdout(stderr_fd())
        .stderr(stderr_fd())
        .spawn();
    match gdb {
        Ok(mut child) => {
            let t = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if t.elapsed() > Duration::from_secs(90) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        say("(gdb did not finish in 90 s)");
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        Err(e) => say(&format!("(no gdb: {e}; kernel stacks above only)")),
    }
}

fn stderr_fd() -> std::process::Stdio {
    use std::os::fd::AsFd;
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => std::process::Stdio::from(fd),
        Err(_) => std::process::Stdio::inherit(),
    }
}

/// Open swap files of process `pid` in directory `dir`: (device, inode, allocated bytes)
/// of each distinct file whose descriptor points there (the engine's swap files are
/// unlinked at once, so they show as `DIR/NAME (deleted)`).
pub fn open_swap_files(pid: u32, dir: &std::path::Path) -> Vec<(u64, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    let dir = dir.to_string_lossy().into_owned();
    for fd in fds.flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if !(target.starts_with(&dir) && target.ends_with("(deleted)")) {
            continue;
        }
        if let Ok(m) = std::fs::metadata(fd.path()) {
            let key = (m.dev(), m.ino(), m.blocks() * 512);
            if !out
                .iter()
                .any(|k: &(u64, u64, u64)| (k.0, k.1) == (key.0, key.1))
            {
                out.push(key);
            }
        }
    }
    out
}

/// Flush stdout/stderr before a fork, so that the child does not print them again.
pub fn flush() {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
}

// ---- a local Redis Cluster (scripts/redis-cluster.sh) -----------------------------

#[path = "../support/cluster.rs"]
mod cluster;
#[allow(unused_imports)] // each test binary uses its own part
pub use cluster::Cluster;
