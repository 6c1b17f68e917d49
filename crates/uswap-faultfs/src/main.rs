//! `uswap-faultfs`: mount a fault-injecting filesystem from a shell, print where it is,
//! serve it until SIGINT, SIGTERM or SIGHUP, then undo everything.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use uswap_faultfs::harness::{FaultMount, Options};
use uswap_faultfs::rules::parse_size;

const USAGE: &str = "\
usage: uswap-faultfs [--size SIZE] [--loop] [--dir BASE] [--watchdog SECONDS]

Mounts a fault-injecting FUSE filesystem in a new directory under BASE ($USWAP_FAULTFS_DIR,
else /var/tmp), serving a sparse file of SIZE bytes (default 1G) as `disk`; with --loop,
also attaches a loop device over it. Prints `mountpoint`, `disk`, `control`, `backing`
(and `loop`) lines, then `ready`, and serves until SIGINT, SIGTERM or SIGHUP; then
detaches, unmounts and removes everything. With --watchdog, it aborts the FUSE connection
after that many seconds. Needs root.

Faults are set by writing commands to the control file, e.g.
  echo 'fail-write all' > MOUNTPOINT/control
  echo 'drop-write 64M 2M; flip-read 0 4k count=1' > MOUNTPOINT/control
and `cat MOUNTPOINT/control` shows the rules, counters and every injected fault.
Commands: fail-read|fail-write RANGE [errno=E] [count=N], drop-write RANGE [count=N],
tear-write RANGE [keep=K] [count=N], flip-read|flip-write RANGE [xor=X] [count=N],
corrupt RANGE [xor=X], clear, clear-log, reset; RANGE is `START LEN` or `all`.
";

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        disk_size: 1 << 30,
        watchdog: None,
        ..Options::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--size" => opts.disk_size = parse_size(&value("--size")?)?,
            "--loop" => opts.loop_device = true,
            "--dir" => opts.base_dir = Some(PathBuf::from(value("--dir")?)),
            "--watchdog" => {
                let s = value("--watchdog")?;
                let secs: u64 = s.parse().map_err(|_| format!("bad --watchdog {s:?}"))?;
                opts.watchdog = Some(Duration::from_secs(secs));
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if opts.disk_size == 0 {
        return Err("--size must be more than 0".into());
    }
    Ok(opts)
}

/// Block the stop signals in every thread (call before any thread starts), so that
/// `sigwait` below receives them.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local set, and pthread_sigmask on it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("uswap-faultfs: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let set = stop_signals();
    let fm = match FaultMount::start(opts) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    println!("mountpoint {}", fm.mountpoint().display());
    println!("disk {}", fm.disk().display());
    println!("control {}", fm.control_file().display());
    println!("backing {}", fm.backing().display());
    if let Some(l) = fm.loop_device() {
        println!("loop {}", l.display());
    }
    println!("ready");
    let mut sig = 0;
    // SAFETY: sigwait on a set blocked in every thread; writes the signal number.
    unsafe { libc::sigwait(&set, &mut sig) };
    eprintln!("uswap-faultfs: signal {sig}: cleaning up");
    match fm.close() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
