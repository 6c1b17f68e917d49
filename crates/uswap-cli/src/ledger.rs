//! What a `--against` or `--cgroup-limit` run has changed on the machine, so that a run
//! killed with SIGKILL (when no guard runs) is cleaned up by the next one.
//!
//! Each run keeps `/run/uswap/bench-<pid>.json`: its pid and start time, the boot, its
//! command, and the changes it has made, each written down *before* it is made and
//! struck out once undone; the file goes when nothing is left. A run that starts reads
//! the others' files under a lock: a live one with kernel swap (`--against`) makes it
//! refuse, naming the pid; a dead one's changes are undone, newest first, and said.
//! After a reboot (another boot id) only files on disk outlive it: only those are
//! removed.

use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where the records live (a tmpfs on most systems: gone at reboot, like the changes).
pub const DIR: &str = "/run/uswap";

/// One change to the machine, with what undoes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// A kernel swap file was created: remove it.
    SwapFile { path: PathBuf },
    /// A swap area was turned on: swapoff.
    SwapOn { area: PathBuf },
    /// A zram device was initialised: reset it, give it back its algorithm.
    Zram {
        sys: PathBuf,
        old_alg: Option<String>,
    },
    /// A sysfs or cgroup knob was written: write back its old value.
    Knob { path: PathBuf, old: String },
    /// A memory cgroup was created: kill what is in it, remove it.
    Cgroup { path: PathBuf },
    /// `+memory` was written to a `cgroup.subtree_control`: write `-memory`.
    Subtree { path: PathBuf },
}

impl Change {
    fn describe(&self) -> String {
        match self {
            Change::SwapFile { path } => format!("removed {}", path.display()),
            Change::SwapOn { area } => format!("swapoff {}", area.display()),
            Change::Zram { sys, .. } => format!("reset {}", sys.display()),
            Change::Knob { path, old } => format!("{} back to {old}", path.display()),
            Change::Cgroup { path } => format!("removed cgroup {}", path.display()),
            Change::Subtree { path } => format!("-memory in {}", path.display()),
        }
    }

    /// Undo it. `same_boot`: the machine has not restarted since (else only a file on
    /// disk is left to remove).
    fn undo(&self, same_boot: bool) -> Result<(), String> {
        match self {
            Change::SwapFile { path } => match fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("remove {}: {e}", path.display()))
                }
                _ => Ok(()),
            },
            _ if !same_boot => Ok(()),
            Change::SwapOn { area } => {
                if crate::kswap::swap_is_on(area) {
                    crate::kswap::swapoff(area)
                        .map_err(|e| format!("swapoff {}: {e}", area.display()))?;
                }
                Ok(())
            }
            Change::Zram { sys, old_alg } => {
                crate::kswap::write_knob(&sys.join("reset"), "1")?;
                match old_alg {
                    Some(a) => crate::kswap::write_knob(&sys.join("comp_algorithm"), a),
                    None => Ok(()),
                }
            }
            Change::Knob { path, old } => crate::kswap::write_knob(path, old),
            Change::Cgroup { path } => crate::cgroup::remove_dir(path),
            Change::Subtree { path } => {
                // Still wanted by other cgroups when this fails: left on, as by the guard.
                let _ = crate::kswap::write_knob(path, "-memory");
                Ok(())
            }
        }
    }
}

/// One run's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    pid: i32,
    /// /proc/PID/stat field 22: tells a reused pid from the run's.
    start_time: u64,
    boot_id: String,
    command: String,
    /// An `--against` run (kernel swap on); else `--cgroup-limit`.
    against: bool,
    changes: Vec<Change>,
}

/// This process's record and its file; None until [`begin`].
static OURS: Mutex<Option<(PathBuf, Record)>> = Mutex::new(None);

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; fields after the command (which may hold spaces) start at 3.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

fn alive(r: &Record) -> bool {
    r.boot_id == boot_id() && start_time(r.pid) == Some(r.start_time)
}

fn save(path: &Path, r: &Record) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))
}

/// The lock every run holds while it reads the records and writes its own.
fn lock() -> Result<fs::File, String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(DIR)
        .map_err(|e| format!("create {DIR}: {e}"))?;
    let p = Path::new(DIR).join("lock");
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&p)
        .map_err(|e| format!("open {}: {e}", p.display()))?;
    // SAFETY: flock(2) on an fd we own; released when the file is closed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "lock {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(f)
}

/// Start this run's record: first clean up after dead runs (said on stderr), and refuse
/// while another run with kernel swap is alive, or, for an `--against` run, while any
/// other run is.
pub fn begin(command: &str, against: bool) -> Result<(), String> {
    let _lock = lock()?;
    let me = std::process::id() as i32;
    let mut entries: Vec<PathBuf> = Vec::new();
    for e in fs::read_dir(DIR).map_err(|e| format!("read {DIR}: {e}"))? {
        let path = match e {
            Ok(e) => e.path(),
            Err(_) => continue,
        };
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(pid) = name
            .strip_prefix("bench-")
            .and_then(|n| n.strip_suffix(".tmp"))
        {
            // A record half written by a run killed in save(): gone with its writer.
            if pid.parse().ok().and_then(start_time).is_none() {
                let _ = fs::remove_file(&path);
            }
        } else if name.starts_with("bench-") && name.ends_with(".json") {
            entries.push(path);
        }
    }
    entries.sort();
    for path in entries {
        let Some(r) = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<Record>(&t).ok())
        else {
            eprintln!(
                "uswap: ignoring {} (not a record of this version)",
                path.display()
            );
            continue;
        };
        if r.pid == me {
            continue;
        }
        if alive(&r) {
            if r.against || against {
                return Err(format!(
                    "another comparison or memory-cgroup run is going on (pid {}: `{}`): it has \
                     set up kernel swap or memory cgroups; wait for it to finish, or stop it \
                     (kill {}) and run again",
                    r.pid, r.command, r.pid
                ));
            }
            continue;
        }
        clean_up(&path, r)?;
    }
    let rec = Record {
        pid: me,
        start_time: start_time(me).unwrap_or(0),
        boot_id: boot_id(),
        command: command.to_string(),
        against,
        changes: Vec::new(),
    };
    let path = Path::new(DIR).join(format!("bench-{me}.json"));
    save(&path, &rec)?;
    *OURS.lock().unwrap_or_else(|p| p.into_inner()) = Some((path, rec));
    Ok(())
}

/// Undo a dead run's changes, newest first; its file goes when all are undone.
fn clean_up(path: &Path, mut r: Record) -> Result<(), String> {
    let same_boot = r.boot_id == boot_id();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let mut failed = Vec::new();
    for c in std::mem::take(&mut r.changes).into_iter().rev() {
        match c.undo(same_boot) {
            Ok(()) => done.push(c.describe()),
            Err(e) => {
                errors.push(e);
                failed.push(c);
            }
        }
    }
    failed.reverse();
    r.changes = failed;
    let what = if done.is_empty() {
        "nothing was left".to_string()
    } else {
        done.join(", ")
    };
    if errors.is_empty() {
        let _ = fs::remove_file(path);
        eprintln!(
            "uswap: cleaned up after an earlier run that did not finish (pid {}: `{}`): {what}",
            r.pid, r.command
        );
        return Ok(());
    }
    let _ = save(path, &r);
    Err(format!(
        "an earlier run (pid {}: `{}`) that did not finish left changes that cannot be undone \
         ({}); undone: {what}. See {}",
        r.pid,
        r.command,
        errors.join("; "),
        path.display()
    ))
}

/// Write `change` down before making it. Without a record (not an `--against` or
/// `--cgroup-limit` run) there is nothing to write.
pub fn note(change: Change) -> Result<(), String> {
    let mut ours = OURS.lock().unwrap_or_else(|p| p.into_inner());
    let Some((path, rec)) = ours.as_mut() else {
        return Ok(());
    };
    if !rec.changes.contains(&change) {
        rec.changes.push(change);
        save(path, rec)?;
    }
    Ok(())
}

/// Strike out `change` once undone.
pub fn undone(change: &Change) {
    let mut ours = OURS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((path, rec)) = ours.as_mut() {
        let before = rec.changes.len();
        rec.changes.retain(|c| c != change);
        if rec.changes.len() != before {
            if let Err(e) = save(path, rec) {
                eprintln!("uswap: {e}");
            }
        }
    }
}

/// The run is over: remove the record, or keep it (and say so) when something could
/// not be undone, for the next run to retry.
pub fn end() {
    let mut ours = OURS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((path, rec)) = ours.take() {
        if rec.changes.is_empty() {
            let _ = fs::remove_file(&path);
        } else {
            let left: Vec<String> = rec.changes.iter().map(Change::describe).collect();
            eprintln!(
                "uswap: not undone yet: {}; kept in {} for the next run to retry",
                left.join(", "),
                path.display()
            );
        }
    }
}
