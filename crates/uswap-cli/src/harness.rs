//! What the comparisons (`uswap bench --against`, `--cgroup-limit`, `uswap run --against`)
//! share: root check, signal handling that unwinds through the guards, children started
//! inside a memory cgroup, a watchdog, and small formatting helpers.

use crate::cgroup::{self, Memcg};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicU32 = AtomicU32::new(0);
/// The child running now (0: none), for the signal handler.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// One side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Kernel,
    Uswap,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Kernel => "kernel",
            Side::Uswap => "uswap",
        }
    }
    /// `uswap bench --memory` of this side.
    pub fn memory(self) -> &'static str {
        match self {
            Side::Kernel => "plain",
            Side::Uswap => "uswap",
        }
    }
}

/// Bytes for humans: `64 MiB`, `1.5 GiB`.
pub fn fmt_size(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", units[i])
    } else {
        format!("{v:.1} {}", units[i])
    }
}

pub fn need_root() -> Result<(), String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root to create cgroups and enable swap (run it with sudo)".into());
    }
    Ok(())
}

/// SIGINT/SIGTERM/SIGHUP: remember it, pass it on to the running child (SIGKILL on the
/// second one), and let the main thread unwind through the guards.
pub fn install_signals() -> Result<(), String> {
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            ctrlc::set_handler(|| {
                INTERRUPTED.store(true, Ordering::SeqCst);
                let n = SIGNALS.fetch_add(1, Ordering::SeqCst);
                let pid = CHILD.load(Ordering::SeqCst);
                if pid > 0 {
                    let sig = if n == 0 { libc::SIGTERM } else { libc::SIGKILL };
                    // SAFETY: kill(2) on our own child's pid; touches no memory.
                    unsafe { libc::kill(pid, sig) };
                }
                eprintln!("uswap: interrupted, cleaning up");
            })
            .map_err(|e| format!("install the signal handler: {e}"))
        })
        .clone()
}

/// Start a comparison with kernel swap: undo what a killed earlier run left (the ledger),
/// refuse when kernel swap is already on by somebody else (the kernel side must use only
/// the swap the comparison sets up, the uswap side none), take the signals, find the
/// memory cgroups.
pub fn start(command: &str) -> Result<cgroup::Hierarchy, String> {
    crate::ledger::begin(command, true)?;
    let on = crate::kswap::active_swaps();
    if !on.is_empty() {
        return Err(format!(
            "kernel swap is already on ({}), and not by an earlier uswap run: swapoff it first, \
             so that the kernel side uses only the swap this comparison sets up and the uswap \
             side runs with none",
            on.join(", ")
        ));
    }
    install_signals()?;
    cgroup::detect()
}

/// Kernel swap as a side needs it: on for the kernel side (its `ks`), and checked off
/// for the uswap side.
pub fn swap_for_side(side: Side, ks: Option<&mut crate::kswap::KernelSwap>) -> Result<(), String> {
    if let Some(k) = ks {
        k.on()?;
    }
    if side == Side::Uswap {
        let on = crate::kswap::active_swaps();
        if !on.is_empty() {
            return Err(format!(
                "kernel swap is on ({}) for the uswap side",
                on.join(", ")
            ));
        }
    }
    Ok(())
}

pub fn check_interrupted() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err("interrupted; everything set up was undone".into());
    }
    Ok(())
}

pub fn describe_status(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(9)) => "killed by SIGKILL".into(),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

/// Start `cmd` as a child inside `cg` (it enters the cgroup between fork and exec, so
/// everything it allocates is charged); it dies with us (PR_SET_PDEATHSIG) and gets our
/// SIGTERM when we are interrupted. `what` names it in errors. Call [`child_done`] once it
/// has been waited for.
pub fn spawn_in(cg: &Memcg, mut cmd: Command, what: &str) -> Result<Child, String> {
    let procs = cg.procs_fd()?;
    let fd = cgroup::raw(&procs);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook only calls prctl(2), getppid(2), _exit(2), getpid(2) and write(2)
    // on an inherited fd, all async-signal-safe, with no allocation (see
    // cgroup::enter_from_child).
    unsafe {
        cmd.pre_exec(move || {
            // Die with us: a SIGKILLed harness must not leave a child running in its
            // cgroup (the next run removes the cgroup, see ledger.rs).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            cgroup::enter_from_child(fd)
        });
    }
    let child = cmd.spawn().map_err(|e| format!("start the {what}: {e}"))?;
    drop(procs);
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    Ok(child)
}

/// The child started by [`spawn_in`] has been waited for: signals no longer go to it.
pub fn child_done() {
    CHILD.store(0, Ordering::SeqCst);
}

/// Kills a child that runs past `USWAP_BENCH_TIMEOUT` seconds (default 1800): a hung side
/// must end the comparison with an error, not hang it.
pub struct Watchdog {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<bool>>,
    pub limit_s: u64,
}

impl Watchdog {
    pub fn start(pid: u32) -> Watchdog {
        let limit_s = std::env::var("USWAP_BENCH_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1800u64);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            match rx.recv_timeout(std::time::Duration::from_secs(limit_s)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // SAFETY: kill(2) on our own child, not yet reaped (the main thread is
                    // still waiting for it); touches no memory.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    true
                }
                _ => false,
            }
        });
        Watchdog {
            stop: Some(tx),
            thread: Some(thread),
            limit_s,
        }
    }

    /// Stop watching; whether the child was killed for running too long.
    pub fn fired(mut self) -> bool {
        self.stop.take();
        self.thread
            .take()
            .map(|t| t.join().unwrap_or(false))
            .unwrap_or(false)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// "; last output:\n<the last lines>", or nothing when there was no output.
pub fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    if v.is_empty() {
        return String::new();
    }
    format!(
        "; last output:\n{}",
        v[v.len().saturating_sub(lines)..].join("\n")
    )
}

/// The median of the finite values, if any.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}
