//! Test support: a fault-injecting mount in a fresh directory, optionally under a loop
//! device, undone on [`FaultMount::close`], on drop and on panic; a watchdog that aborts
//! a hung mount; the leftovers of a killed test process swept at the next start; and
//! [`run_with_deadline`] for the programs a test runs on it.
//!
//! ```no_run
//! use uswap_faultfs::harness::{FaultMount, Options};
//! let fm = FaultMount::start(Options { disk_size: 64 << 20, loop_device: true, ..Options::default() })
//!     .unwrap_or_else(|e| panic!("{e}"));
//! fm.control("drop-write 1M 64k").unwrap();
//! // ... use fm.disk() (a file), fm.loop_device() (/dev/loopN) or fm.mountpoint() (a dir)
//! for e in fm.events() { println!("{:?} {:?}", e.kind, e.affected); }
//! fm.close().unwrap(); // or just drop it
//! ```

use crate::fs::{State, CONTROL_NAME, DISK_NAME};
use crate::loopdev::{self, LoopDevice};
use crate::mount::{self, Mounted};
use crate::rules::{Counters, Event, Rule};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Prefix of the directories made here: `<base>/uswap-faultfs.<pid>.<n>`.
const DIR_PREFIX: &str = "uswap-faultfs.";
/// How long cleanup waits for a loop device to go and for the server to stop.
const CLEANUP_WAIT: Duration = Duration::from_secs(10);

/// What to set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Length of the served `disk` file (sparse: reads as zeros at first).
    pub disk_size: u64,
    /// Attach a loop device over the mount's `disk`.
    pub loop_device: bool,
    /// Logical block size of the loop device.
    pub loop_block_size: u32,
    /// After this long, abort the FUSE connection (blocked I/O then fails instead of
    /// hanging the test) and say so; `None`: never.
    pub watchdog: Option<Duration>,
    /// Where the directory is made: `$USWAP_FAULTFS_DIR`, else /var/tmp (on a disk).
    pub base_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            disk_size: 64 << 20,
            loop_device: false,
            loop_block_size: 4096,
            watchdog: Some(Duration::from_secs(300)),
            base_dir: None,
        }
    }
}

/// A mounted fault-injecting filesystem (and maybe a loop device over its `disk`).
///
/// Layout: `dir()/mnt` is the mount point (holding `disk`, `control` and files created
/// there), `dir()/disk` the real file served as `disk`, `dir()/files` where created
/// files' data lives (unlinked at once, so nothing stays).
#[derive(Debug)]
pub struct FaultMount {
    dir: PathBuf,
    mountpoint: PathBuf,
    backing: PathBuf,
    /// `None` only while being set up.
    state: Option<Arc<State>>,
    mounted: Option<Mounted>,
    loop_dev: Option<LoopDevice>,
    watchdog: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// Can this process mount FUSE (and attach loop devices)? `Err` says why not and what to
/// do; tests turn it into a failure, never a skip.
pub fn check_available(need_loop: bool) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(format!(
            "uswap-faultfs needs root to mount FUSE and attach loop devices (running as uid \
             {uid}): run the tests as root, as scripts/test.sh does"
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(format!(
            "uswap-faultfs cannot open /dev/fuse ({e}): this kernel or container has no FUSE \
             (modprobe fuse; in a container, pass --device /dev/fuse)"
        ));
    }
    if need_loop {
        if let Err(e) = std::fs::metadata("/dev/loop-control") {
            return Err(format!(
                "uswap-faultfs cannot use loop devices: /dev/loop-control: {e} (modprobe loop; in \
                 a container, pass the loop devices)"
            ));
        }
    }
    Ok(())
}

fn default_base() -> PathBuf {
    std::env::var_os("USWAP_FAULTFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Remove what dead processes left in `base`: loop devices over their mounts, the
/// mounts (aborted), the directories. Returns the directories cleaned.
pub fn sweep_stale(base: &Path) -> Vec<PathBuf> {
    let mut cleaned = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return cleaned;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        let dir = e.path();
        remove_setup(&dir);
        cleaned.push(dir);
    }
    cleaned
}

/// Take down whatever of a setup in `dir` is left: loop devices, the mount, the files.
fn remove_setup(dir: &Path) {
    loopdev::detach_under(dir);
    let mnt = dir.join("mnt");
    if mount::is_mounted(&mnt) {
        mount::force_unmount(&mnt);
    }
    // Never recurse into a live mount.
    if !mount::is_mounted(&mnt) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl FaultMount {
    /// Mount a fresh instance with a `disk` of `disk_size` bytes. Panics with a clear
    /// message if it cannot (no root, no FUSE): a test that needs it fails.
    pub fn new(disk_size: u64) -> FaultMount {
        FaultMount::start(Options {
            disk_size,
            ..Options::default()
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`FaultMount::new`] with a loop device over `disk`.
    pub fn with_loop(disk_size: u64) -> FaultMount {
        FaultMount::start(Options {
            disk_size,
            loop_device: true,
            ..Options::default()
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Set up as `opts` say.
    pub fn start(opts: Options) -> Result<FaultMount, String> {
        check_available(opts.loop_device)?;
        let base = opts.base_dir.clone().unwrap_or_else(default_base);
        for d in sweep_stale(&base) {
            eprintln!(
                "uswap-faultfs: removed the leftovers of a dead process: {}",
                d.display()
            );
        }
        let dir = loop {
            let d = base.join(format!(
                "{DIR_PREFIX}{}.{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&d) {
                Ok(()) => break d,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("uswap-faultfs: mkdir {}: {e}", d.display())),
            }
        };
        let mut fm = FaultMount {
            mountpoint: dir.join("mnt"),
            backing: dir.join("disk"),
            dir,
            state: None,
            mounted: None,
            loop_dev: None,
            watchdog: None,
        };
        // From here on, `fm`'s drop undoes whatever was done.
        fm.set_up(&opts)?;
        Ok(fm)
    }

    fn set_up(&mut self, opts: &Options) -> Result<(), String> {
        let ctx = |what: &str, p: &Path, e: std::io::Error| {
            format!("uswap-faultfs: {what} {}: {e}", p.display())
        };
        let files = self.dir.join("files");
        for d in [&self.mountpoint, &files] {
            std::fs::create_dir(d).map_err(|e| ctx("mkdir", d, e))?;
        }
        let f = std::fs::File::create_new(&self.backing)
            .map_err(|e| ctx("create", &self.backing, e))?;
        f.set_len(opts.disk_size)
            .map_err(|e| ctx("size", &self.backing, e))?;
        drop(f);
        let state = State::new(&self.backing, &files).map_err(|e| ctx("open", &self.backing, e))?;
        self.state = Some(state.clone());
        self.mounted =
            Some(mount::mount(state, &self.mountpoint).map_err(|e| format!("uswap-faultfs: {e}"))?);
        if let Some(limit) = opts.watchdog {
            self.watchdog = Some(start_watchdog(self.mountpoint.clone(), limit));
        }
        if opts.loop_device {
            self.loop_dev = Some(
                LoopDevice::attach(&self.disk(), opts.loop_block_size)
                    .map_err(|e| format!("uswap-faultfs: loop device: {e}"))?,
            );
        }
        Ok(())
    }

    fn state(&self) -> &State {
        self.state.as_deref().expect("set up in start")
    }

    /// The directory holding everything (removed at the end).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The mount point: usable as a swap directory (files can be created in it).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The served file in the mount (`<mountpoint>/disk`).
    pub fn disk(&self) -> PathBuf {
        self.mountpoint.join(DISK_NAME)
    }

    /// The control file (`<mountpoint>/control`): write commands, read the status.
    pub fn control_file(&self) -> PathBuf {
        self.mountpoint.join(CONTROL_NAME)
    }

    /// The real file behind `disk` (reads and writes here bypass the faults).
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// `/dev/loopN` over `disk`, if one was asked for.
    pub fn loop_device(&self) -> Option<&Path> {
        self.loop_dev.as_ref().map(|l| l.path())
    }

    /// Run control commands (the same language and effect as writing them to the
    /// control file); all or nothing.
    pub fn control(&self, commands: &str) -> Result<(), String> {
        self.state().control(commands)
    }

    /// The status text (what reading the control file gives).
    pub fn status(&self) -> String {
        self.state().status()
    }

    /// The injected faults so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.state().with_faults(|f| f.events().to_vec())
    }

    /// The rules now.
    pub fn rules(&self) -> Vec<Rule> {
        self.state().with_faults(|f| f.rules().to_vec())
    }

    /// What reached the filesystem and what was injected.
    pub fn counters(&self) -> Counters {
        self.state().with_faults(|f| f.counters().clone())
    }

    /// Abort the FUSE connection now: every pending and later request on the mount fails
    /// (ENOTCONN). For a test that finds the mount hung.
    pub fn abort(&self) {
        mount::abort(&self.mountpoint);
    }

    /// Undo everything (watchdog, loop device, mount, directory) and say what went wrong.
    pub fn close(mut self) -> Result<(), String> {
        self.tear_down()
    }

    fn tear_down(&mut self) -> Result<(), String> {
        let mut problems = Vec::new();
        if let Some((stop, thread)) = self.watchdog.take() {
            drop(stop);
            let _ = thread.join();
        }
        if let Some(l) = self.loop_dev.take() {
            if let Err(e) = l.detach(CLEANUP_WAIT) {
                problems.push(e);
            }
        }
        if let Some(m) = self.mounted.take() {
            if let Err(e) = m.unmount(CLEANUP_WAIT) {
                problems.push(e);
            }
        }
        if self.dir.as_os_str().is_empty() {
            return Ok(());
        }
        if mount::is_mounted(&self.mountpoint) {
            problems.push(format!(
                "{} still mounted: left in place",
                self.dir.display()
            ));
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            problems.push(format!("remove {}: {e}", self.dir.display()));
        }
        self.dir = PathBuf::new();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("uswap-faultfs cleanup: {}", problems.join("; ")))
        }
    }
}

impl Drop for FaultMount {
    fn drop(&mut self) {
        if let Err(e) = self.tear_down() {
            eprintln!("{e}");
        }
    }
}

fn start_watchdog(mountpoint: PathBuf, limit: Duration) -> (mpsc::Sender<()>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let t = std::thread::Builder::new()
        .name("faultfs-watchdog".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "uswap-faultfs watchdog: {} still mounted after {limit:?}: aborting its FUSE \
                     connection (blocked I/O on it now fails)",
                    mountpoint.display()
                );
                mount::abort(&mountpoint);
            }
        })
        .expect("spawn the watchdog thread");
    (tx, t)
}

/// How a program run by [`run_with_deadline`] ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// `None` if it was killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl RunOutcome {
    /// The signal that ended it, if any.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }

    /// Its exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// Everything, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status {:?} (signal {:?}) timed_out {} after {:.1?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.signal(),
            self.timed_out,
            self.elapsed,
            self.stdout,
            self.stderr
        )
    }
}

/// Run `cmd` (in its own process group, killed if this thread dies) and wait at most
/// `deadline`; then kill the group with SIGKILL and say so. Output is captured.
pub fn run_with_deadline(cmd: &mut Command, deadline: Duration) -> RunOutcome {
    let started = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes one syscall. If this
    // thread dies (the test process is killed), the program gets SIGKILL instead of
    // spinning on a dead mount.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped")));
    let err = reader(Box::new(child.stderr.take().expect("piped")));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() >= deadline => {
                timed_out = true;
                // SAFETY: kill(2) of the child's process group (it leads its own group).
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("wait for {cmd:?}: {e}"),
        }
    };
    RunOutcome {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
        elapsed: started.elapsed(),
    }
}
