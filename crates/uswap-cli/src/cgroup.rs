//! Fresh memory cgroups for benchmark children, cgroup v1 or v2.
//!
//! A [`Memcg`] is created with a limit and a swap policy, a child is placed in it before it
//! allocates (see [`Memcg::procs_fd`]), and dropping it kills whatever is left inside and
//! removes the directory. Names are `uswap-bench-<pid>-<n>`.

use crate::ledger::{self, Change};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Prefix of every cgroup this program creates.
pub const PREFIX: &str = "uswap-bench-";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Which cgroup interface the memory controller is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The v1 `memory` controller hierarchy.
    V1,
    /// The unified (v2) hierarchy with `memory` in its controllers.
    V2,
}

impl Version {
    /// "v1" or "v2".
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// Where new memory cgroups go.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// v1 or v2.
    pub version: Version,
    /// The directory new cgroups are created in.
    pub root: PathBuf,
}

/// Whether the kernel may swap the cgroup's anonymous memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapPolicy {
    /// Swap allowed without a limit (v1: swappiness 60, memsw unlimited; v2: swap.max=max).
    Allowed,
    /// No swap (v1: swappiness 0; v2: swap.max=0).
    Forbidden,
}

fn mounts() -> Vec<(String, String, String)> {
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let _dev = f.next()?;
            let dir = f.next()?.replace("\\040", " ");
            let ty = f.next()?.to_string();
            let opts = f.next()?.to_string();
            Some((dir, ty, opts))
        })
        .collect()
}

fn v2_has_memory(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|w| w == "memory"))
        .unwrap_or(false)
}

/// Find the memory controller: the v1 `memory` hierarchy when mounted, else a v2 mount
/// (`/sys/fs/cgroup/unified` or `/sys/fs/cgroup`) whose `cgroup.controllers` lists memory.
/// `USWAP_CGROUP_VERSION=v1|v2` forces one of them.
pub fn detect() -> Result<Hierarchy, String> {
    let want = std::env::var("USWAP_CGROUP_VERSION").ok();
    let ms = mounts();
    if want.as_deref() != Some("v2") {
        if let Some((dir, _, _)) = ms
            .iter()
            .find(|(_, ty, opts)| ty == "cgroup" && opts.split(',').any(|o| o == "memory"))
        {
            return Ok(Hierarchy {
                version: Version::V1,
                root: PathBuf::from(dir),
            });
        }
    }
    if want.as_deref() != Some("v1") {
        let mut cands: Vec<PathBuf> = ms
            .iter()
            .filter(|(_, ty, _)| ty == "cgroup2")
            .map(|(dir, _, _)| PathBuf::from(dir))
            .collect();
        cands.sort_by_key(|p| {
            (
                p != Path::new("/sys/fs/cgroup/unified"),
                p != Path::new("/sys/fs/cgroup"),
            )
        });
        if let Some(dir) = cands.into_iter().find(|d| v2_has_memory(d)) {
            return Ok(Hierarchy {
                version: Version::V2,
                root: dir,
            });
        }
    }
    Err(match want.as_deref() {
        Some(v) => format!("no cgroup {v} memory controller is mounted (USWAP_CGROUP_VERSION={v})"),
        None => "no memory cgroup controller found: neither a cgroup v1 `memory` mount nor a \
                 cgroup v2 mount whose cgroup.controllers lists memory"
            .to_string(),
    })
}

fn write_knob(path: &Path, value: &str) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    f.write_all(value.as_bytes())
        .map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

/// OOM and limit counters of a memory cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomStats {
    /// Processes the OOM killer killed in this cgroup (v1 oom_control oom_kill, v2 events oom_kill).
    pub oom_kill: u64,
    /// v1: under_oom now; v2: the `oom` event count.
    pub oom: u64,
    /// v1 memory.failcnt (times the limit was hit); v2 events `max`.
    pub limit_hits: u64,
}

/// A memory cgroup created by this program, removed on drop.
#[derive(Debug)]
pub struct Memcg {
    path: PathBuf,
    version: Version,
    limit: u64,
    /// v2 only: whether `+memory` was added to the parent's subtree_control by us.
    enabled_subtree: Option<PathBuf>,
}

impl Memcg {
    /// Create `uswap-bench-<pid>-<n>` under `h.root`, limited to `limit` bytes.
    pub fn create(h: &Hierarchy, limit: u64, swap: SwapPolicy) -> Result<Memcg, String> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}", std::process::id());
        let path = h.root.join(&name);
        let mut enabled_subtree = None;
        if h.version == Version::V2 {
            let sub = h.root.join("cgroup.subtree_control");
            let cur = fs::read_to_string(&sub).unwrap_or_default();
            if !cur.split_whitespace().any(|w| w == "memory") {
                ledger::note(Change::Subtree { path: sub.clone() })?;
                write_knob(&sub, "+memory")
                    .map_err(|e| format!("enable the memory controller for children: {e}"))?;
                enabled_subtree = Some(sub);
            }
        }
        ledger::note(Change::Cgroup { path: path.clone() })?;
        fs::create_dir(&path).map_err(|e| format!("create cgroup {}: {e}", path.display()))?;
        let cg = Memcg {
            path,
            version: h.version,
            limit,
            enabled_subtree,
        };
        cg.configure(swap)?;
        Ok(cg)
    }

    fn configure(&self, swap: SwapPolicy) -> Result<(), String> {
        let p = |f: &str| self.path.join(f);
        match self.version {
            Version::V1 => {
                write_knob(&p("memory.limit_in_bytes"), &self.limit.to_string())?;
                if p("memory.memsw.limit_in_bytes").exists() {
                    write_knob(&p("memory.memsw.limit_in_bytes"), "-1")?;
                }
                let swappiness = match swap {
                    SwapPolicy::Allowed => "60",
                    SwapPolicy::Forbidden => "0",
                };
                write_knob(&p("memory.swappiness"), swappiness)?;
                // Keep the OOM killer on: a child over its budget must die, not hang.
                let _ = write_knob(&p("memory.oom_control"), "0");
            }
            Version::V2 => {
                write_knob(&p("memory.max"), &self.limit.to_string())?;
                if p("memory.swap.max").exists() {
                    let v = match swap {
                        SwapPolicy::Allowed => "max",
                        SwapPolicy::Forbidden => "0",
                    };
                    write_knob(&p("memory.swap.max"), v)?;
                } else if swap == SwapPolicy::Allowed {
                    return Err(
                        "this cgroup v2 has no memory.swap.max (swap accounting off)".to_string(),
                    );
                }
            }
        }
        Ok(())
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs` opened for writing (close-on-exec). A forked child writes its own pid
    /// into it with [`enter_from_child`] before it execs, so it is charged from the start.
    pub fn procs_fd(&self) -> Result<File, String> {
        let p = self.path.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| format!("open {}: {e}", p.display()))
    }

    /// OOM counters now.
    pub fn oom_stats(&self) -> OomStats {
        let read = |f: &str| fs::read_to_string(self.path.join(f)).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .find_map(|l| {
                    let mut w = l.split_whitespace();
                    (w.next() == Some(key))
                        .then(|| w.next()?.parse::<u64>().ok())
                        .flatten()
                })
                .unwrap_or(0)
        };
        match self.version {
            Version::V1 => {
                let oc = read("memory.oom_control");
                OomStats {
                    oom_kill: field(&oc, "oom_kill"),
                    oom: field(&oc, "under_oom"),
                    limit_hits: read("memory.failcnt").trim().parse().unwrap_or(0),
                }
            }
            Version::V2 => {
                let ev = read("memory.events");
                OomStats {
                    oom_kill: field(&ev, "oom_kill"),
                    oom: field(&ev, "oom"),
                    limit_hits: field(&ev, "max"),
                }
            }
        }
    }

    /// Highest memory usage seen (v1 max_usage_in_bytes, v2 memory.peak), if available.
    pub fn peak_bytes(&self) -> Option<u64> {
        let f = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        fs::read_to_string(self.path.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kill everything left in the cgroup and remove it. Safe to call twice.
    pub fn remove(&mut self) -> Result<(), String> {
        remove_dir(&self.path)?;
        ledger::undone(&Change::Cgroup {
            path: self.path.clone(),
        });
        self.restore_subtree()
    }

    fn restore_subtree(&mut self) -> Result<(), String> {
        if let Some(sub) = self.enabled_subtree.take() {
            // Only possible once no sibling of ours uses it; other cgroups may, so a failure
            // here means the controller is still wanted and is left on.
            let _ = write_knob(&sub, "-memory");
            ledger::undone(&Change::Subtree { path: sub });
        }
        Ok(())
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("uswap: cleanup: {e}");
        }
    }
}

/// Kill everything in the cgroup at `path` and remove it (gone already: fine).
pub fn remove_dir(path: &Path) -> Result<(), String> {
    let mut last = None;
    for attempt in 0..200 {
        let pids = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        for pid in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) on a pid read from our own cgroup; no memory is touched.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(if attempt < 20 { 10 } else { 50 }));
    }
    Err(format!(
        "could not remove cgroup {}: {}",
        path.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    ))
}

/// Called in a forked child between fork and exec: write the child's pid into `fd`
/// (a `cgroup.procs` opened by [`Memcg::procs_fd`]). Async-signal-safe: no allocation.
pub fn enter_from_child(fd: RawFd) -> io::Result<()> {
    // SAFETY: getpid(2) has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    let mut v = pid as u32;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let digits = &buf[i..];
    // SAFETY: write(2) from a live stack buffer of `digits.len()` bytes to an fd the parent
    // opened and the child inherited; async-signal-safe.
    let n = unsafe { libc::write(fd, digits.as_ptr().cast(), digits.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The raw fd of an open `cgroup.procs`, for [`enter_from_child`].
pub fn raw(f: &File) -> RawFd {
    f.as_raw_fd()
}
