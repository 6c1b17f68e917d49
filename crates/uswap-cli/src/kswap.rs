//! Kernel swap for the comparison: a swap file, zram, or zswap in front of a swap file;
//! the block device's `queue/rotational` knob; /proc/vmstat deltas.
//!
//! [`KernelSwap`] is a guard: everything it turned on or changed is turned off and restored
//! when it is dropped (swapoff, swap file removed, zram reset to its old algorithm, zswap
//! parameters and `rotational` restored).

use crate::ledger::{self, Change};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Which kernel swap the uswap side is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A swap file on the same filesystem as uswap's swap file.
    File,
    /// /dev/zram0 with lz4.
    Zram,
    /// zswap (lz4) in front of a swap file.
    Zswap,
}

impl Kind {
    /// Parse `kernel`, `zram` or `zswap`.
    pub fn parse(s: &str) -> Result<Kind, String> {
        match s.to_ascii_lowercase().as_str() {
            "kernel" | "file" | "swapfile" => Ok(Kind::File),
            "zram" => Ok(Kind::Zram),
            "zswap" => Ok(Kind::Zswap),
            _ => Err(format!("--against {s}: expected kernel, zram or zswap")),
        }
    }

    /// `kernel`, `zram` or `zswap`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "kernel",
            Kind::Zram => "zram",
            Kind::Zswap => "zswap",
        }
    }
}

/// The /proc/vmstat counters recorded around each child.
pub const VMSTAT_KEYS: &[&str] = &[
    "pswpin",
    "pswpout",
    "swap_ra",
    "swap_ra_hit",
    "thp_swpout",
    "thp_swpout_fallback",
    "pgmajfault",
    "zswpin",
    "zswpout",
    "zswpwb",
];

/// Read the counters of [`VMSTAT_KEYS`] from /proc/vmstat.
pub fn vmstat() -> BTreeMap<String, u64> {
    let text = fs::read_to_string("/proc/vmstat").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            VMSTAT_KEYS
                .contains(&k)
                .then(|| Some((k.to_string(), v.trim().parse().ok()?)))?
        })
        .collect()
}

/// `after - before`, key by key.
pub fn vmstat_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .collect()
}

/// Whether `area` is an active swap area (/proc/swaps writes spaces as `\040`).
pub fn swap_is_on(area: &Path) -> bool {
    let want = area.to_string_lossy().replace(' ', "\\040");
    active_swaps().contains(&want)
}

/// Active swap areas (the lines of /proc/swaps after the header).
pub fn active_swaps() -> Vec<String> {
    fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

/// Write `value` to a sysfs knob.
pub fn write_knob(path: &Path, value: &str) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    f.write_all(value.as_bytes())
        .map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

/// zswap's pool now, in bytes (/proc/meminfo `Zswap:`): memory a v1 memcg does not
/// charge (the bench's cgroup showed 2 MiB of kmem beside a 263 MiB pool).
pub fn zswap_pool_bytes() -> Option<u64> {
    let m = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("Zswap:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The largest zswap pool seen while it runs (zswap keeps no peak of its own):
/// /proc/meminfo every 10 ms.
pub struct ZswapPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Option<u64>>,
}

impl ZswapPeak {
    pub fn start() -> ZswapPeak {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        // The pool is system-wide: what it held before the run is not the run's.
        let base = zswap_pool_bytes();
        let thread = std::thread::spawn(move || {
            let mut peak = None;
            loop {
                if let Some(now) = zswap_pool_bytes() {
                    peak = Some(peak.unwrap_or(0).max(now));
                }
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return peak.map(|p: u64| p.saturating_sub(base.unwrap_or(0)));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        });
        ZswapPeak { stop, thread }
    }

    /// Stop sampling; the peak in bytes over what the pool held at the start (None:
    /// this kernel's /proc/meminfo has no `Zswap:` line).
    pub fn stop(self) -> Option<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}

fn read_knob(path: &Path) -> Result<String, String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("read {}: {e}", path.display()))
}

/// The selected entry of a sysfs list such as `lzo [lz4] zstd`.
fn bracketed(s: &str) -> Option<String> {
    let a = s.find('[')?;
    let b = s[a..].find(']')? + a;
    Some(s[a + 1..b].to_string())
}

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("bad path {}", p.display()))
}

fn swapon(p: &Path) -> io::Result<()> {
    let c = cpath(p).map_err(io::Error::other)?;
    // SAFETY: swapon(2) with a NUL-terminated path that lives across the call.
    let r = unsafe { libc::swapon(c.as_ptr(), 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// swapoff(2).
pub fn swapoff(p: &Path) -> io::Result<()> {
    let c = cpath(p).map_err(io::Error::other)?;
    // SAFETY: swapoff(2) with a NUL-terminated path that lives across the call.
    let r = unsafe { libc::swapoff(c.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mkswap(p: &Path) -> Result<(), String> {
    let out = Command::new("mkswap")
        .arg(p)
        .output()
        .map_err(|e| format!("run mkswap (util-linux): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mkswap {}: {}{}",
            p.display(),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

fn is_tmpfs(dir: &Path) -> bool {
    let Ok(c) = cpath(dir) else { return false };
    // SAFETY: statfs is plain old data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) with a valid path and a pointer to a live struct.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == TMPFS_MAGIC
}

/// The directory for the kernel's swap file, next to uswap's: `--swap-file` itself when it
/// is a directory, else its parent directory (not for a block device), else $TMPDIR (uswap's
/// default), else /var/tmp. A tmpfs cannot hold a swap file, so such a directory is skipped.
pub fn swap_dir(swap_file: Option<&Path>) -> PathBuf {
    let usable = |d: &Path| d.is_dir() && !is_tmpfs(d);
    if let Some(f) = swap_file {
        if usable(f) {
            return f.to_path_buf();
        }
        let is_blk = fs::metadata(f)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if !is_blk {
            if let Some(dir) = f.parent() {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                if usable(dir) {
                    return dir.to_path_buf();
                }
            }
        }
    }
    let tmp = std::env::temp_dir();
    if usable(&tmp) {
        return tmp;
    }
    PathBuf::from("/var/tmp")
}

/// The block device's sysfs directory (`/sys/block/<dev>`, the whole disk for a partition)
/// under the filesystem holding `path`, or the device itself for a block device node.
pub fn block_dev_of(path: &Path) -> Option<PathBuf> {
    let md = fs::metadata(path).ok()?;
    let dev = if md.file_type().is_block_device() {
        md.rdev()
    } else {
        md.dev()
    };
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")).ok()?;
    if sys.join("partition").exists() {
        return sys.parent().map(Path::to_path_buf);
    }
    Some(sys)
}

/// The kernel's swap for one comparison; restores everything on drop.
#[derive(Debug)]
pub struct KernelSwap {
    /// The swap area: the file, or /dev/zram0.
    area: PathBuf,
    size: u64,
    file_created: bool,
    on: bool,
    zram_sys: Option<PathBuf>,
    zram_old_alg: Option<String>,
    /// Knobs set for the comparison (zswap's, `vm.page-cluster`) and their old values,
    /// restored in reverse order at teardown.
    saved_knobs: Vec<(PathBuf, String)>,
    /// `vm.page-cluster` as set for the kernel side, and its old value.
    page_cluster: Option<(u32, String)>,
    rotational: Option<PathBuf>,
    rotational_old: Option<String>,
    /// Set `rotational` to 0 around each swapon (restored after swapoff).
    ssd: bool,
    zswap_compressor: Option<String>,
    zram_alg: Option<String>,
}

/// Swap readahead's knob: the kernel reads 2^N pages around a swapped-in page.
const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// `vm.page-cluster` for the kernel side unless `--kernel-page-cluster` says: 0 (no swap
/// readahead) for zram and zswap, as zram setups ship it (Fedora's zram-generator,
/// Android, ChromeOS): a page read ahead from compressed memory costs a decompression and
/// room in the memory cgroup and saves no seek. At the default 3, pmbench 4k over 1 GiB
/// in a 320 MiB memcg with zswap was OOM-killed in 8 runs of 8 (2026-11-27: 268 MB of its
/// 320 MiB held by the swap cache); at 0 it ran. A swap file alone keeps the machine's.
fn default_page_cluster(kind: Kind) -> Option<u32> {
    match kind {
        Kind::Zram | Kind::Zswap => Some(0),
        Kind::File => None,
    }
}

impl KernelSwap {
    /// Prepare (but do not turn on) the kernel's swap area of `size` bytes.
    /// `dir` is where a swap file goes; `ssd` asks for `queue/rotational=0` while it is on;
    /// `page_cluster` sets `vm.page-cluster` (swap readahead: 2^N pages) until teardown,
    /// by default 0 for zram and zswap ([`default_page_cluster`]).
    pub fn setup(
        kind: Kind,
        dir: &Path,
        size: u64,
        ssd: bool,
        page_cluster: Option<u32>,
    ) -> Result<KernelSwap, String> {
        let mut ks = KernelSwap {
            area: PathBuf::new(),
            size,
            file_created: false,
            on: false,
            zram_sys: None,
            zram_old_alg: None,
            saved_knobs: Vec::new(),
            page_cluster: None,
            rotational: None,
            rotational_old: None,
            ssd,
            zswap_compressor: None,
            zram_alg: None,
        };
        match kind {
            Kind::File => ks.make_file(dir)?,
            Kind::Zswap => {
                ks.make_file(dir)?;
                ks.enable_zswap()?;
            }
            Kind::Zram => ks.make_zram()?,
        }
        if let Some(n) = page_cluster.or(default_page_cluster(kind)) {
            let old = ks.set_knob(Path::new(PAGE_CLUSTER), &n.to_string())?;
            ks.page_cluster = Some((n, old));
        }
        let blk = block_dev_of(&ks.area)
            .ok_or_else(|| format!("cannot find the block device under {}", ks.area.display()))?;
        ks.rotational = Some(blk.join("queue/rotational"));
        Ok(ks)
    }

    fn make_file(&mut self, dir: &Path) -> Result<(), String> {
        if is_tmpfs(dir) {
            return Err(format!(
                "{} is a tmpfs: a swap file cannot live there",
                dir.display()
            ));
        }
        let path = dir.join(format!("uswap-bench-{}.kswap", std::process::id()));
        ledger::note(Change::SwapFile { path: path.clone() })?;
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("create swap file {}: {e}", path.display()))?;
        self.area = path.clone();
        self.file_created = true;
        // SAFETY: fallocate(2) on an fd we own; no memory is passed.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, self.size as libc::off_t) };
        if r != 0 {
            write_zeros(&f, self.size)
                .map_err(|e| format!("fill swap file {}: {e}", path.display()))?;
        }
        f.sync_all()
            .map_err(|e| format!("sync {}: {e}", path.display()))?;
        drop(f);
        mkswap(&path)
    }

    fn make_zram(&mut self) -> Result<(), String> {
        let sys = PathBuf::from("/sys/block/zram0");
        if !sys.exists() {
            let _ = Command::new("modprobe").arg("zram").status();
        }
        if !sys.exists() {
            return Err("no /dev/zram0 (modprobe zram failed?)".to_string());
        }
        let init = read_knob(&sys.join("initstate"))?;
        if init != "0" {
            return Err("/dev/zram0 is already in use (initstate 1): refusing to reset it".into());
        }
        let algs = read_knob(&sys.join("comp_algorithm"))?;
        self.zram_old_alg = bracketed(&algs);
        self.zram_sys = Some(sys);
        self.area = PathBuf::from("/dev/zram0");
        if algs
            .split_whitespace()
            .any(|a| a.trim_matches(['[', ']']) == "lz4")
        {
            self.zram_alg = Some("lz4".into());
        } else {
            self.zram_alg = self.zram_old_alg.clone();
        }
        self.init_zram()
    }

    /// Reset zram0, set its algorithm and size, mkswap it.
    fn init_zram(&mut self) -> Result<(), String> {
        let Some(sys) = self.zram_sys.clone() else {
            return Ok(());
        };
        ledger::note(self.zram_change(&sys))?;
        write_knob(&sys.join("reset"), "1")?;
        if let Some(alg) = &self.zram_alg {
            write_knob(&sys.join("comp_algorithm"), alg)?;
        }
        write_knob(&sys.join("disksize"), &self.size.to_string())?;
        mkswap(&self.area)
    }

    fn zram_change(&self, sys: &Path) -> Change {
        Change::Zram {
            sys: sys.to_path_buf(),
            old_alg: self.zram_old_alg.clone(),
        }
    }

    fn enable_zswap(&mut self) -> Result<(), String> {
        let dir = Path::new("/sys/module/zswap/parameters");
        if !dir.exists() {
            return Err("this kernel has no zswap (/sys/module/zswap missing)".into());
        }
        if let Err(e) = self.set_knob(&dir.join("compressor"), "lz4") {
            eprintln!("uswap: zswap: cannot choose lz4 ({e}); keeping the configured compressor");
        }
        self.zswap_compressor = read_knob(&dir.join("compressor")).ok();
        self.set_knob(&dir.join("enabled"), "Y").map(drop)
    }

    /// Write a knob, its old value noted first (in the ledger, for a run killed before
    /// its teardown, and here, for the teardown); returns the old value.
    fn set_knob(&mut self, path: &Path, value: &str) -> Result<String, String> {
        let old = read_knob(path)?;
        let change = Change::Knob {
            path: path.to_path_buf(),
            old: old.clone(),
        };
        ledger::note(change.clone())?;
        if let Err(e) = write_knob(path, value) {
            // Nothing changed: nothing to put back (a record left would make every
            // later run fail to restore a knob it cannot write).
            ledger::undone(&change);
            return Err(e);
        }
        self.saved_knobs.push((path.to_path_buf(), old.clone()));
        Ok(old)
    }

    /// `vm.page-cluster` as set for the kernel side, and the machine's value before.
    pub fn page_cluster(&self) -> Option<(u32, &str)> {
        self.page_cluster
            .as_ref()
            .map(|(n, old)| (*n, old.as_str()))
    }

    /// How the kernel side's swap readahead was set, for a header line.
    pub fn page_cluster_note(&self) -> String {
        match self.page_cluster() {
            Some((n, old)) => format!("vm.page-cluster {n} (was {old}; restored after)"),
            None => format!(
                "vm.page-cluster {} (as the machine has it)",
                read_knob(Path::new(PAGE_CLUSTER)).unwrap_or_else(|_| "?".into())
            ),
        }
    }

    /// Turn the swap area on (and set `rotational` to 0 first with `--kernel-ssd`).
    pub fn on(&mut self) -> Result<(), String> {
        if self.on {
            return Ok(());
        }
        if self.ssd {
            if let Some(rot) = &self.rotational {
                if self.rotational_old.is_none() {
                    let old = read_knob(rot)?;
                    ledger::note(Change::Knob {
                        path: rot.clone(),
                        old: old.clone(),
                    })?;
                    self.rotational_old = Some(old);
                }
                write_knob(rot, "0")?;
            }
        }
        if self.zram_sys.is_some() {
            // A fresh zram for every run, so that its memory figures are this run's.
            self.init_zram()?;
        }
        ledger::note(Change::SwapOn {
            area: self.area.clone(),
        })?;
        swapon(&self.area).map_err(|e| format!("swapon {}: {e}", self.area.display()))?;
        self.on = true;
        Ok(())
    }

    /// Turn the swap area off (and restore `rotational`).
    pub fn off(&mut self) -> Result<(), String> {
        if self.on {
            swapoff(&self.area).map_err(|e| format!("swapoff {}: {e}", self.area.display()))?;
            self.on = false;
            ledger::undone(&Change::SwapOn {
                area: self.area.clone(),
            });
        }
        if let (Some(rot), Some(old)) = (&self.rotational, self.rotational_old.take()) {
            write_knob(rot, &old)?;
            ledger::undone(&Change::Knob {
                path: rot.clone(),
                old,
            });
        }
        Ok(())
    }

    /// The swap area's path.
    pub fn area(&self) -> &Path {
        &self.area
    }

    /// Size of the swap area in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `queue/rotational` of the device under the swap area as the kernel sees it at
    /// swapon: "rotational" (HDD paths) or "ssd".
    pub fn mode(&self) -> &'static str {
        if self.ssd {
            return "ssd";
        }
        match self.rotational.as_deref().map(read_knob) {
            Some(Ok(v)) if v == "1" => "rotational",
            Some(Ok(_)) => "ssd",
            _ => "unknown",
        }
    }

    /// The block device name under the swap area (e.g. `vda`, `zram0`).
    pub fn device(&self) -> String {
        self.rotational
            .as_deref()
            .and_then(|p| p.parent()?.parent()?.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "?".into())
    }

    /// The compressor in use (zram or zswap), if any.
    pub fn compressor(&self) -> Option<&str> {
        self.zram_alg
            .as_deref()
            .or(self.zswap_compressor.as_deref())
    }

    /// zram's `mem_used_max` in bytes (field 5 of mm_stat: compressed memory, which a v1
    /// memcg does not charge).
    pub fn zram_mem_used_max(&self) -> Option<u64> {
        let sys = self.zram_sys.as_ref()?;
        read_knob(&sys.join("mm_stat"))
            .ok()?
            .split_whitespace()
            .nth(4)?
            .parse()
            .ok()
    }

    /// Whether this is zswap in front of a swap file.
    pub fn is_zswap(&self) -> bool {
        self.zswap_compressor.is_some()
    }

    /// Undo everything; collects every error rather than stopping at the first.
    pub fn teardown(&mut self) -> Result<(), String> {
        let mut errs = Vec::new();
        if let Err(e) = self.off() {
            // A swapoff can fail while pages are still coming back; try once more.
            std::thread::sleep(std::time::Duration::from_millis(200));
            if let Err(e2) = self.off() {
                errs.push(format!("{e}; retry: {e2}"));
            }
        }
        if let Some(sys) = self.zram_sys.take() {
            let change = self.zram_change(&sys);
            let n = errs.len();
            if let Err(e) = write_knob(&sys.join("reset"), "1") {
                errs.push(e);
            }
            if let Some(alg) = self.zram_old_alg.take() {
                if let Err(e) = write_knob(&sys.join("comp_algorithm"), &alg) {
                    errs.push(e);
                }
            }
            if errs.len() == n {
                ledger::undone(&change);
            }
        }
        for (p, v) in self.saved_knobs.drain(..).rev() {
            match write_knob(&p, &v) {
                Ok(()) => ledger::undone(&Change::Knob { path: p, old: v }),
                Err(e) => errs.push(e),
            }
        }
        if self.file_created && !self.on {
            match fs::remove_file(&self.area) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    errs.push(format!("remove {}: {e}", self.area.display()))
                }
                _ => {
                    self.file_created = false;
                    ledger::undone(&Change::SwapFile {
                        path: self.area.clone(),
                    });
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("uswap: cleanup: {e}");
        }
    }
}

fn write_zeros(f: &fs::File, size: u64) -> io::Result<()> {
    let buf = vec![0u8; 1 << 20];
    let mut w = f;
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}
