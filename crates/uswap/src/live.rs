//! Live counters: every pool publishes its [`Counters`] to a small file that other
//! processes of the same user read while it runs (`uswap stat`, `uswap top`,
//! `uswap export`), and takes budget changes from one (`uswap set`).
//!
//! Where: one directory per user, `/dev/shm/uswap-<uid>` (mode 0700; refused if it is
//! anyone else's or open to others), or `$USWAP_LIVE_DIR` (read when the pool starts;
//! empty or `off`: nothing published). One file per pool, `<pid>.<n>` (mode 0600; `n`
//! counts the process's pools from 0), written by the pool's reclaim thread every
//! [`PERIOD`] with `pwrite`s under a sequence number (odd while a write is under way, as
//! a seqlock), so a reader never stops the program and never takes a torn record.
//!
//! Liveness is the file's lock, not its pid: the pool holds an exclusive `flock` on the
//! file for its life, through a close-on-exec descriptor. Exit, a kill -9 or an exec
//! lets it go, so a reader that gets a shared lock knows the file is stale and removes
//! it (a recycled pid cannot make a stale file look live). A forked child closes its
//! copy of the parent's descriptor (never unlocking it: the lock is the parent's) and
//! publishes a file of its own; each file records the `uswap run` it belongs to
//! (`USWAP_ROOT_PID`, else the pid that started the pool) and the parent pid, so the
//! processes of one program are grouped.
//!
//! A budget change is a file `<pid>.<n>.budget` holding the bytes, renamed into place
//! (never seen half written); the reclaim thread reads it at its next period, applies
//! it (`Pool::set_budget`) and removes it, and the next record shows the budget.

use crate::engine::Engine;
use crate::stats::Counters;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a pool's record is written and a budget change looked for.
pub const PERIOD: Duration = Duration::from_millis(250);

const MAGIC: &[u8; 8] = b"USWAPLV\0";
const VERSION: u32 = 1;
/// Bytes before the values (layout in [`Record::encode`]).
const HEADER: usize = 80;
const SEQ_AT: u64 = 24;
const PROGRAM_LEN: usize = 16;

/// Pools this process started: each one's number in its file's name.
static NEXT_INDEX: AtomicU32 = AtomicU32::new(0);

/// The directory the live files of this user go to: `$USWAP_LIVE_DIR`, or
/// `/dev/shm/uswap-<uid>`. `None`: `USWAP_LIVE_DIR` is empty or `off`.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("USWAP_LIVE_DIR") {
        Some(d) if d.is_empty() || d == "off" => None,
        Some(d) => Some(PathBuf::from(d)),
        None => Some(PathBuf::from(format!(
            "/dev/shm/uswap-{}",
            crate::sys::mem::euid()
        ))),
    }
}

/// Make `dir` (mode 0700) if it is missing, and check that it is this user's alone:
/// a directory others can write to, or someone else's, could show a reader records a
/// stranger wrote, or take budget changes from one.
pub fn check_dir(dir: &Path, create: bool) -> Result<(), String> {
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let me = crate::sys::mem::euid();
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me})",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is open to other users (mode {:o}; want 700)",
            dir.display(),
            m.mode() & 0o777
        ));
    }
    Ok(())
}

/// A pool's publishing: where, as whom, and the open file.
pub(crate) struct Live {
    dir: Option<PathBuf>,
    root_pid: u32,
    index: u32,
    started_ms: u64,
    file: Mutex<Option<LiveFile>>,
    next: Mutex<Instant>,
    /// Set at close: nothing more is published.
    closed: AtomicBool,
    said: AtomicBool,
}

struct LiveFile {
    file: File,
    path: PathBuf,
    pid: u32,
    seq: u64,
}

impl Live {
    /// Read where to publish and the run this process belongs to (at the pool's start,
    /// on the program's thread: the environment is not read from engine threads).
    pub(crate) fn new(on: bool) -> Live {
        let root_pid = std::env::var("USWAP_ROOT_PID")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(std::process::id);
        Live {
            dir: if on { dir() } else { None },
            root_pid,
            index: NEXT_INDEX.fetch_add(1, Relaxed),
            started_ms: unix_ms(),
            file: Mutex::new(None),
            next: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            said: AtomicBool::new(false),
        }
    }

    fn say_once(&self, what: &str) {
        if !self.said.swap(true, Relaxed) {
            say!("uswap: live counters not published: {what}");
        }
    }

    /// In a forked child: the parent's file is not ours. Its descriptor closes (the
    /// lock stays the parent's); the child publishes its own.
    pub(crate) fn forget_after_fork(&self) {
        drop(self.file.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// The pool closes (or the process exits): the file goes, nothing more is written.
    /// Call inside the engine (`ForkState::enter`), as `tick` does.
    pub(crate) fn close(&self) {
        self.closed.store(true, Relaxed);
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = f {
            if f.pid == std::process::id() {
                let _ = std::fs::remove_file(&f.path);
                let _ = std::fs::remove_file(request_path(&f.path));
            }
        }
    }
}

/// From the reclaim thread's loop: every [`PERIOD`], apply a budget change asked for
/// and write the pool's record. Returns how long until the next one is due.
pub(crate) fn tick(e: &Engine) -> Duration {
    let live = &e.live;
    if live.dir.is_none() || live.closed.load(Relaxed) {
        return Duration::MAX;
    }
    // Inside the engine: a fork waits until the record and its locks are let go (a
    // child must not inherit them held: its fork hook takes `file`).
    let _a = e.fork.enter();
    {
        let mut next = live.next.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now < *next {
            return *next - now;
        }
        *next = now + PERIOD;
    }
    let mut g = live.file.lock().unwrap_or_else(|p| p.into_inner());
    if live.closed.load(Relaxed) {
        return Duration::MAX;
    }
    if g.is_none() {
        match create(live) {
            Ok(f) => *g = Some(f),
            Err(what) => {
                live.say_once(&what);
                // Not again for a while (a full or foreign directory stays so).
                *live.next.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + PERIOD * 40;
                return PERIOD * 40;
            }
        }
    }
    let Some(f) = g.as_mut() else {
        return PERIOD;
    };
    apply_request(e, &f.path);
    let c = e.with_gauges(e.regions.counters());
    if let Err(err) = f.write(live, &c) {
        live.say_once(&format!("writing {}: {err}", f.path.display()));
    }
    PERIOD
}

fn create(live: &Live) -> Result<LiveFile, String> {
    let dir = live.dir.as_deref().expect("publishing");
    check_dir(dir, true)?;
    // Records of processes that ended without closing their pools (`_exit`, a
    // signal, an exec) go now, so they do not pile up where nobody reads them.
    sweep_stale(dir);
    let pid = std::process::id();
    let name = format!("{pid}.{}", live.index);
    let tmp = dir.join(format!(".{name}.new"));
    let path = dir.join(&name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    // Locked before it has its name: a reader never sees it unlocked while we live.
    file.try_lock()
        .map_err(|e| format!("cannot lock {}: {e}", tmp.display()))?;
    let mut f = LiveFile {
        file,
        path: path.clone(),
        pid,
        seq: 0,
    };
    let made = f
        .write(live, &Counters::default())
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("cannot publish {}: {e}", path.display()));
    }
    Ok(f)
}

impl LiveFile {
    /// One record, under the sequence number: odd while the body is written.
    fn write(&mut self, live: &Live, c: &Counters) -> std::io::Result<()> {
        let rec = Record {
            pid: self.pid,
            ppid: std::os::unix::process::parent_id(),
            root_pid: live.root_pid,
            index: live.index,
            started_ms: live.started_ms,
            updated_ms: unix_ms(),
            program: program_name(),
            counters: *c,
        };
        let bytes = rec.encode(self.seq + 1);
        self.seq += 1;
        self.file.write_all_at(&self.seq.to_le_bytes(), SEQ_AT)?;
        self.file
            .write_all_at(&bytes[SEQ_AT as usize + 8..], SEQ_AT + 8)?;
        self.file.write_all_at(&bytes[..SEQ_AT as usize], 0)?;
        self.seq += 1;
        self.file.write_all_at(&self.seq.to_le_bytes(), SEQ_AT)
    }
}

/// A budget change asked for through the file next to the record: applied, the file
/// removed (a bad one too, said once).
fn apply_request(e: &Engine, record: &Path) {
    let req = request_path(record);
    let Ok(text) = std::fs::read_to_string(&req) else {
        return;
    };
    let _ = std::fs::remove_file(&req);
    let applied = text
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("not a byte count: {:?}", text.trim()))
        .and_then(|bytes| e.set_budget(bytes).map_err(|err| err.to_string()));
    if let Err(what) = applied {
        say!("uswap: budget change refused: {what}");
    }
}

fn request_path(record: &Path) -> PathBuf {
    let mut p = record.as_os_str().to_owned();
    p.push(".budget");
    PathBuf::from(p)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn program_name() -> [u8; PROGRAM_LEN] {
    let mut out = [0u8; PROGRAM_LEN];
    if let Ok(s) = std::fs::read("/proc/self/comm") {
        let s = s.strip_suffix(b"\n").unwrap_or(&s);
        let n = s.len().min(PROGRAM_LEN);
        out[..n].copy_from_slice(&s[..n]);
    }
    out
}

/// FNV-1a over the fields' names: a reader built with another list of counters
/// refuses the record instead of misreading it.
fn fields_hash() -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for f in Counters::FIELDS {
        for b in f.name.bytes().chain([b',']) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

struct Record {
    pid: u32,
    ppid: u32,
    root_pid: u32,
    index: u32,
    started_ms: u64,
    updated_ms: u64,
    program: [u8; PROGRAM_LEN],
    counters: Counters,
}

impl Record {
    /// Little-endian: magic (8), version u32, fields u32, fields' hash u64, sequence
    /// u64 (24), pid, ppid, root pid, pool index (u32 each), started and updated (ms
    /// since the epoch, u64 each), program (16 bytes, NUL-padded), then the values in
    /// [`Counters::FIELDS`] order (80).
    fn encode(&self, seq: u64) -> Vec<u8> {
        let values = self.counters.values();
        let mut b = Vec::with_capacity(HEADER + 8 * values.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(values.len() as u32).to_le_bytes());
        b.extend_from_slice(&fields_hash().to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        for v in [self.pid, self.ppid, self.root_pid, self.index] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.started_ms.to_le_bytes());
        b.extend_from_slice(&self.updated_ms.to_le_bytes());
        b.extend_from_slice(&self.program);
        debug_assert_eq!(b.len(), HEADER);
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Result<Record, String> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if b.len() < HEADER || &b[..8] != MAGIC {
            return Err("not a uswap live file".into());
        }
        let n = u32_at(12) as usize;
        if u32_at(8) != VERSION || n != Counters::FIELDS.len() || u64_at(16) != fields_hash() {
            return Err("written by another version of uswap".into());
        }
        if b.len() < HEADER + 8 * n {
            return Err("short record".into());
        }
        let values: Vec<u64> = (0..n).map(|i| u64_at(HEADER + 8 * i)).collect();
        Ok(Record {
            pid: u32_at(32),
            ppid: u32_at(36),
            root_pid: u32_at(40),
            index: u32_at(44),
            started_ms: u64_at(48),
            updated_ms: u64_at(56),
            program: b[64..80].try_into().expect("16 bytes"),
            counters: Counters::from_values(&values),
        })
    }
}

/// A live pool as a reader sees it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The record's file.
    pub path: PathBuf,
    /// The process.
    pub pid: u32,
    /// Its parent when the record was written.
    pub ppid: u32,
    /// The `uswap run` (its program's first pid) the process belongs to; its own pid
    /// (or the pid that started the pool, before a fork) outside `uswap run`.
    pub root_pid: u32,
    /// The pool's number in its process (0 for the first).
    pub index: u32,
    /// The process's name (`/proc/PID/comm`).
    pub program: String,
    /// When the pool started, ms since the epoch.
    pub started_ms: u64,
    /// When the record was written, ms since the epoch.
    pub updated_ms: u64,
    /// The pool's counters and gauges then.
    pub counters: Counters,
}

/// What [`list`] found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Live pools, by pid and pool number.
    pub pools: Vec<Snapshot>,
    /// Stale files removed (their process exited, was killed or exec'd).
    pub removed: usize,
    /// Files that could not be read, and why.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Whether `name` is a record's (`<pid>.<n>`).
fn is_record(name: &str) -> bool {
    name.split_once('.')
        .is_some_and(|(pid, n)| pid.parse::<u32>().is_ok() && n.parse::<u32>().is_ok())
}

/// Whether `path` is a stale record, removed now: no process holds its lock.
fn remove_if_stale(path: &Path, file: &File) -> bool {
    if file.try_lock_shared().is_err() {
        return false;
    }
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(request_path(path));
    true
}

/// Remove the stale records in `dir` (without reading the live ones).
fn sweep_stale(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for ent in rd.flatten() {
        if ent.file_name().to_str().is_some_and(is_record) {
            if let Ok(f) = File::open(ent.path()) {
                remove_if_stale(&ent.path(), &f);
            }
        }
    }
}

/// The live pools whose files are in `dir`; stale files (no process holds their lock)
/// are removed on the way.
pub fn list(dir: &Path) -> std::io::Result<Listing> {
    let mut out = Listing::default();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        if !name.to_str().is_some_and(is_record) {
            continue;
        }
        let path = ent.path();
        match read(&path) {
            Ok(Some(s)) => out.pools.push(s),
            Ok(None) => out.removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => out.unreadable.push((path, e.to_string())),
        }
    }
    out.pools.sort_by_key(|s| (s.pid, s.index));
    Ok(out)
}

/// One file: its pool's snapshot, or `None` when it was stale (and is removed now).
pub fn read(path: &Path) -> std::io::Result<Option<Snapshot>> {
    let file = File::open(path)?;
    if remove_if_stale(path, &file) {
        // Nobody held it: the process is gone (or exec'd).
        return Ok(None);
    }
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    for _ in 0..1000 {
        let len = file.metadata()?.len() as usize;
        let mut buf = vec![0u8; len.max(HEADER)];
        let n = file.read_at(&mut buf, 0)?;
        buf.truncate(n);
        if n < HEADER {
            return Err(invalid(format!("{n} bytes: short record")));
        }
        let seq = u64::from_le_bytes(buf[24..32].try_into().expect("8 bytes"));
        let mut again = [0u8; 8];
        file.read_exact_at(&mut again, SEQ_AT)?;
        if seq % 2 == 1 || u64::from_le_bytes(again) != seq {
            std::thread::yield_now();
            continue;
        }
        let r = Record::decode(&buf).map_err(invalid)?;
        let end = r
            .program
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(PROGRAM_LEN);
        return Ok(Some(Snapshot {
            path: path.to_path_buf(),
            pid: r.pid,
            ppid: r.ppid,
            root_pid: r.root_pid,
            index: r.index,
            program: String::from_utf8_lossy(&r.program[..end]).into_owned(),
            started_ms: r.started_ms,
            updated_ms: r.updated_ms,
            counters: r.counters,
        }));
    }
    Err(invalid("the record kept changing while read".into()))
}

/// Ask the pool of `s` for a budget of `bytes`: it applies it within [`PERIOD`] (its
/// next record shows `budget_bytes`), or says on its stderr why not.
pub fn request_budget(s: &Snapshot, bytes: u64) -> std::io::Result<()> {
    let req = request_path(&s.path);
    let mut tmp = req.as_os_str().to_owned();
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(format!("{bytes}\n").as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, &req).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let mut c = Counters::default();
        let n = c.values().len() as u64;
        c = Counters::from_values(&(10..10 + n).collect::<Vec<_>>());
        let r = Record {
            pid: 7,
            ppid: 3,
            root_pid: 5,
            index: 2,
            started_ms: 11,
            updated_ms: 12,
            program: *b"prog\0\0\0\0\0\0\0\0\0\0\0\0",
            counters: c,
        };
        let b = r.encode(4);
        let d = Record::decode(&b).unwrap();
        assert_eq!((d.pid, d.ppid, d.root_pid, d.index), (7, 3, 5, 2));
        assert_eq!((d.started_ms, d.updated_ms), (11, 12));
        assert_eq!(d.counters, c);
        let mut other = b.clone();
        other[16] ^= 1;
        assert!(Record::decode(&other).is_err(), "another list of fields");
    }
}
