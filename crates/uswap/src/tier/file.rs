//! The file tier: a swap file or block device opened with O_DIRECT, written and
//! read through each thread's io_uring (`ring.rs`).
//!
//! Placement rules, so that swapped data never outlives the process, never sits
//! readable by others, and never sits in RAM:
//! - no path: an `O_TMPFILE` (unnamed, mode 0600) in the first of `$TMPDIR`,
//!   `/var/tmp`, `/tmp` that is on a disk (the others are skipped, and the place says
//!   so);
//! - a directory: an `O_TMPFILE` in it;
//! - a path that does not exist: an `O_TMPFILE` in its directory; the name itself is
//!   never created, so processes given the same path (or a parent and its forked
//!   children) never collide. Where the filesystem has no `O_TMPFILE`, a unique name
//!   next to it, created 0600 and unlinked at once;
//! - a block device: used as is (its size is the capacity).
//!
//! A place that keeps its data in RAM is refused: tmpfs (which has O_DIRECT since
//! Linux 6.6), ramfs, a RAM disk (brd), a loop device over a file in one of them
//! (statfs's f_type, then the block device in sysfs). zram is accepted, as a swap
//! device should be, and [`SwapFile::place`] says so. O_DIRECT keeps the page cache
//! from holding swapped data outside the budget; a filesystem that refuses it is
//! refused with a hint.
//!
//! After a fork the parent keeps writing its file; the child gets a file of its own
//! (made when it first needs one) and only reads the parent's, for the pages both
//! had at the fork. The parent never reuses those slots while the child lives (see
//! `fork.rs`); the child closes its descriptor of the parent's file when none of its
//! pages is there any more, so a file lives exactly as long as a process needs it.

use crate::error::{Error, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Growth steps of a regular swap file (fallocate): a quarter of its size, within
/// these bounds. Small at first, so that a program that evicts little takes little
/// disk (the file once grew in 64 MiB steps, and was made as large as every region at
/// once: 8.4 GB for 32 regions of 256 MiB with one byte touched in each).
const GROW_STEP_MIN: u64 = 4 << 20;
const GROW_STEP_MAX: u64 = 64 << 20;

/// A file of an ancestor process, inherited at a fork: read-only here.
#[derive(Debug)]
struct Inherited {
    /// Slots `[first, end)` live in `file` at offset `(slot - first) * 4096`.
    first: u64,
    end: u64,
    /// None once no page of this process is there any more (closed).
    file: Mutex<Option<File>>,
    /// Pages of this process whose bytes are there.
    refs: AtomicU64,
}

/// An open swap file or device.
#[derive(Debug)]
pub struct SwapFile {
    /// The file new slots are written to; slot `s` is at `(s - base) * 4096`. Unset in
    /// a forked child until it first needs one.
    file: OnceLock<File>,
    /// First slot of `file` (0 until a fork).
    base: u64,
    /// Files inherited at forks, oldest first.
    inherited: Vec<Inherited>,
    /// Where the user asked for swap (to open a new file after a fork).
    origin: Option<PathBuf>,
    /// What the user sees in messages.
    desc: PathBuf,
    /// Where the swap is, for people: "an unnamed file in /var/tmp (on vda)".
    place: String,
    /// The zram device under the swap (compressed RAM), if any.
    zram: Option<String>,
    /// Bytes usable now (a multiple of 2 MiB).
    capacity: AtomicU64,
    /// `Some(n)`: the user fixed the size (or it is a device); never grow past it.
    fixed: Option<u64>,
    /// A growable file's own size never passes this (`MaxSwap`, in bytes).
    max_bytes: u64,
    /// ... nor takes its filesystem's free space below this (what the cap left free
    /// when the pool started; a forked child keeps its parent's, so that a process
    /// tree shares one cap).
    floor: u64,
    /// Most disk space the file took, sampled after each growth.
    peak_disk: AtomicU64,
    /// Serializes growth.
    grow_lock: Mutex<()>,
    is_block: bool,
    rotational: Option<bool>,
    /// Only names slots (the pages go to another tier): grown sparse, never written.
    sparse: std::sync::atomic::AtomicBool,
    /// Clusters given back to the filesystem (first slot → slots), taken again before
    /// their next write (`fill_holes`).
    holes: Mutex<std::collections::BTreeMap<u64, u64>>,
    has_holes: std::sync::atomic::AtomicBool,
}

fn swap_err(path: &Path, source: std::io::Error, hint: &str) -> Error {
    Error::SwapFile {
        path: path.to_path_buf(),
        source,
        hint: hint.to_string(),
    }
}

fn odirect_hint(e: &std::io::Error) -> &'static str {
    if e.raw_os_error() == Some(libc::EINVAL) {
        " (the filesystem does not support O_DIRECT: choose a directory on a disk with --swap-file)"
    } else if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EPERM) {
        " (no permission: choose a writable directory with --swap-file)"
    } else if e.raw_os_error() == Some(libc::ENOENT) {
        " (the directory does not exist)"
    } else {
        ""
    }
}

impl SwapFile {
    /// Open the backend. `size`: fixed capacity in bytes, or `None` to grow on demand
    /// up to the default cap ([`MaxSwap::DEFAULT`](crate::MaxSwap::DEFAULT)).
    pub fn open(path: Option<&Path>, size: Option<u64>) -> Result<SwapFile> {
        Self::open_capped(path, size, crate::MaxSwap::DEFAULT, None)
    }

    /// [`open`](Self::open), growing at most to `max` and never taking the free space of
    /// its filesystem below `keep_free` (default: what `max` leaves free now); a fixed
    /// size or a device ignores both.
    pub fn open_capped(
        path: Option<&Path>,
        size: Option<u64>,
        max: crate::MaxSwap,
        keep_free: Option<u64>,
    ) -> Result<SwapFile> {
        let unit = crate::UNIT_SIZE as u64;
        if let Some(s) = size.filter(|&s| s < unit) {
            return Err(Error::SwapSizeTooSmall {
                size: s,
                minimum: unit,
            });
        }
        let Placed {
            file,
            desc,
            place,
            zram,
        } = match path {
            None => place_default()?,
            Some(p) => place_given(p)?,
        };
        let meta = file.metadata().map_err(|e| swap_err(&desc, e, ""))?;
        let is_block = meta.file_type().is_block_device();
        let rotational = detect_rotational(&file, is_block);
        let fixed = if is_block {
            let dev_size = block_size(file.as_raw_fd()).map_err(|e| swap_err(&desc, e, ""))?;
            let cap = size.map_or(dev_size, |s| s.min(dev_size));
            Some(cap)
        } else {
            size
        };
        let free = fs_free(&file).unwrap_or(u64::MAX);
        let max_bytes = max.bytes_of(free);
        let sf = SwapFile {
            file: OnceLock::from(file),
            base: 0,
            inherited: Vec::new(),
            origin: path.map(Path::to_path_buf),
            desc,
            place,
            zram,
            capacity: AtomicU64::new(0),
            fixed: fixed.map(|f| f & !(crate::UNIT_SIZE as u64 - 1)),
            max_bytes,
            floor: keep_free.unwrap_or(free.saturating_sub(max_bytes)),
            peak_disk: AtomicU64::new(0),
            grow_lock: Mutex::new(()),
            is_block,
            rotational,
            sparse: std::sync::atomic::AtomicBool::new(false),
            holes: Mutex::new(std::collections::BTreeMap::new()),
            has_holes: std::sync::atomic::AtomicBool::new(false),
        };
        if let Some(cap) = sf.fixed {
            if cap == 0 {
                // Only a device can get here (a size below a unit is refused above).
                return Err(swap_err(
                    &sf.desc,
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                    " (the device holds less than 2 MiB, one swap unit)",
                ));
            }
            if is_block {
                sf.capacity.store(cap, Ordering::Release);
            } else {
                sf.ensure(cap)?;
            }
        }
        Ok(sf)
    }

    /// The raw fd of the file new slots go to (-1 while there is none).
    pub fn raw(&self) -> RawFd {
        self.file.get().map_or(-1, |f| f.as_raw_fd())
    }

    /// Where slot `slot` lives: fd and byte offset (fd -1: nowhere, the I/O fails).
    pub fn locate(&self, slot: u64) -> (RawFd, u64) {
        if slot >= self.base {
            return (self.raw(), (slot - self.base) * 4096);
        }
        for f in self.inherited.iter().rev() {
            if slot >= f.first && slot < f.end {
                let g = f.file.lock().unwrap_or_else(|p| p.into_inner());
                return (
                    g.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    (slot - f.first) * 4096,
                );
            }
        }
        (-1, 0)
    }

    /// First slot of the writable file: slots below it are an ancestor's, read-only.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Whether slot `slot + 1` lives in the same file as `slot`, right after it, so
    /// that one request may cover both. Not where an inherited file ends: the next
    /// slot is in the next file (a request located by its first slot would read the
    /// rest past that file's end, or from bytes of another process).
    pub fn continues(&self, slot: u64) -> bool {
        let next = slot + 1;
        next != self.base
            && !self
                .inherited
                .iter()
                .any(|f| next == f.first || next == f.end)
    }

    /// In the child after fork: the file in use becomes the parent's, read-only here,
    /// with `refs` pages of this process in it; new slots start past it, in a file
    /// of the child's own made on first need (same placement; a block device is
    /// replaced by an unnamed file in `$TMPDIR`).
    pub fn fork_child(&mut self, refs_below_base: &[(u64, u64)]) {
        let end = self.capacity() / 4096;
        if let Some(f) = self.file.take() {
            self.inherited.push(Inherited {
                first: self.base,
                end,
                file: Mutex::new(Some(f)),
                refs: AtomicU64::new(0),
            });
        }
        for inh in &mut self.inherited {
            let refs: u64 = refs_below_base
                .iter()
                .filter(|(s, _)| *s >= inh.first && *s < inh.end)
                .map(|(_, n)| n)
                .sum();
            inh.refs.store(refs, Ordering::Relaxed);
            if refs == 0 {
                *inh.file.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        self.base = end;
        // Holes of the parent's file are the parent's to fill.
        self.holes
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.has_holes.get_mut() = false;
        if self.is_block {
            self.origin = None;
        }
        if self.is_block || self.fixed.is_some() {
            // The child's own file grows, up to what the parent's could hold.
            self.max_bytes = self.max_bytes();
            self.floor = 0;
        }
        self.is_block = false;
        self.fixed = None;
    }

    /// A page of this process no longer needs `slot` of an inherited file; the file
    /// is closed with its last such page. False if `slot` is not inherited.
    pub fn release_inherited(&self, slot: u64) -> bool {
        if slot >= self.base {
            return false;
        }
        for f in self.inherited.iter() {
            if slot >= f.first && slot < f.end {
                let before = f
                    .refs
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1));
                if before == Ok(1) {
                    *f.file.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                return true;
            }
        }
        true
    }

    /// Files open now (the writable one and inherited ones still needed).
    pub fn open_files(&self) -> usize {
        self.file.get().is_some() as usize
            + self
                .inherited
                .iter()
                .filter(|f| f.file.lock().unwrap_or_else(|p| p.into_inner()).is_some())
                .count()
    }

    /// From now on the file only names slots (their pages go to another tier): it
    /// grows sparse and takes no disk space.
    pub fn set_sparse(&self) {
        self.sparse.store(true, Ordering::Relaxed);
    }

    /// Whether the file only names slots (no disk space).
    pub fn is_sparse(&self) -> bool {
        self.sparse.load(Ordering::Relaxed)
    }

    /// Where it lives, for messages.
    pub fn desc(&self) -> &Path {
        &self.desc
    }

    /// Where the swap is, for people: "an unnamed file in /var/tmp (on vda)", with the
    /// default places skipped and why.
    pub fn place(&self) -> &str {
        &self.place
    }

    /// The zram device under the swap, if any: swapped pages then still take RAM,
    /// compressed.
    pub fn zram(&self) -> Option<&str> {
        self.zram.as_deref()
    }

    /// Bytes usable now.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    /// The fixed size, if any.
    pub fn fixed_size(&self) -> Option<u64> {
        self.fixed
    }

    /// `Some(true)` on a rotational device, `Some(false)` on SSD, `None` unknown.
    pub fn rotational(&self) -> Option<bool> {
        self.rotational
    }

    /// The cap on the writable file's own size, in bytes (a fixed size, a device's
    /// size, or what `MaxSwap` allowed at start).
    pub fn max_bytes(&self) -> u64 {
        self.fixed.unwrap_or(self.max_bytes)
    }

    /// Free space of the filesystem the writable file is on, when it is a file.
    pub fn fs_free_bytes(&self) -> Option<u64> {
        self.file.get().filter(|_| !self.is_block).and_then(fs_free)
    }

    /// Disk space the writable file takes now (its allocated blocks).
    pub fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        match self.file.get() {
            Some(f) if !self.is_block => f.metadata().map_or(0, |m| m.blocks() * 512),
            _ => 0,
        }
    }

    /// Bytes of slot space in the writable file, and of it in use by `used` slots:
    /// whether enough of it is free and still takes disk space to be worth giving back
    /// (more than half the file, and at least 16 MiB; checked with an fstat only then).
    pub fn worth_giving_back(&self, used_slots: u64) -> bool {
        if self.is_block || self.sparse.load(Ordering::Relaxed) || self.file.get().is_none() {
            return false;
        }
        let own = self.capacity().saturating_sub(self.base * 4096);
        let free = own.saturating_sub(used_slots * 4096);
        free > (own / 2).max(16 << 20) && self.disk_bytes() > used_slots * 4096 + (16 << 20)
    }

    /// The disk blocks of `n` slots from `first` go back to the filesystem: they hold
    /// nothing any process reads (the slot allocator says so, under the cluster's lock).
    /// Slots of an inherited file are never touched.
    pub fn give_back(&self, first: u64, n: u64) {
        if first < self.base || self.is_block || self.sparse.load(Ordering::Relaxed) {
            return;
        }
        if let Some(f) = self.file.get() {
            if crate::sys::mem::punch_hole(f.as_raw_fd(), (first - self.base) * 4096, n * 4096) {
                let mut h = self.holes.lock().unwrap_or_else(|p| p.into_inner());
                h.insert(first, n);
                self.has_holes.store(true, Ordering::Release);
            }
        }
    }

    /// Before a write to `n` slots from `slot`: the blocks of any hole given back there
    /// are taken again, within the same room as growth (the cap and the free space the
    /// filesystem keeps: another process may have grown into what was given back).
    /// False: the room is not there (the write fails as on a full device).
    pub fn fill_holes(&self, slot: u64, n: u64) -> bool {
        if !self.has_holes.load(Ordering::Acquire) {
            return true;
        }
        let mut h = self.holes.lock().unwrap_or_else(|p| p.into_inner());
        let end = slot + n;
        let found: Vec<(u64, u64)> = h
            .range(..end)
            .filter(|&(&first, &len)| first + len > slot)
            .map(|(&f, &l)| (f, l))
            .collect();
        for (first, len) in found {
            let Some(f) = self.file.get() else {
                return false;
            };
            let bytes = len * 4096;
            let room = self
                .free_bytes()
                .is_none_or(|free| free >= self.floor.saturating_add(bytes));
            if !room
                || crate::sys::mem::allocate(f.as_raw_fd(), (first - self.base) * 4096, bytes)
                    .is_err()
            {
                return false;
            }
            h.remove(&first);
        }
        if h.is_empty() {
            self.has_holes.store(false, Ordering::Release);
        }
        true
    }

    /// Free space the file never takes its filesystem below.
    pub fn keep_free(&self) -> u64 {
        self.floor
    }

    /// Most disk space the file took at once (sampled after each growth).
    pub fn peak_disk_bytes(&self) -> u64 {
        self.peak_disk.load(Ordering::Relaxed)
    }

    /// The next growth step: a quarter of the file, 4 to 64 MiB.
    pub fn next_step(&self) -> u64 {
        let own = self.capacity().saturating_sub(self.base * 4096);
        (own / 4).clamp(GROW_STEP_MIN, GROW_STEP_MAX) & !(crate::UNIT_SIZE as u64 - 1)
    }

    /// Bytes the writable file may still grow by from capacity `cap`: under its cap
    /// and, on a filesystem, without taking the free space below the floor.
    fn room(&self, cap: u64) -> u64 {
        let own = cap.saturating_sub(self.base * 4096);
        let sparse = self.sparse.load(Ordering::Relaxed);
        if sparse && self.fixed.is_none() {
            // Names only, no disk: no cap.
            return u64::MAX - cap;
        }
        let by_cap = self.max_bytes().saturating_sub(own);
        if self.is_block || sparse {
            return by_cap;
        }
        let by_floor = self
            .free_bytes()
            .map_or(u64::MAX, |f| f.saturating_sub(self.floor));
        by_cap.min(by_floor) & !(crate::UNIT_SIZE as u64 - 1)
    }

    /// Grow by `step` (a multiple of 2 MiB), or by what the cap and the disk allow,
    /// at least one 2 MiB unit. Returns the new capacity.
    pub fn grow(&self, step: u64) -> Result<u64> {
        let unit = crate::UNIT_SIZE as u64;
        let cap = self.capacity();
        let room = self.room(cap);
        match self.ensure(cap + step.min(room).max(unit)) {
            Err(e)
                if step > unit
                    && matches!(&e, Error::SwapFile { source, .. }
                    if source.raw_os_error() == Some(libc::ENOSPC)) =>
            {
                self.ensure(cap + unit)
            }
            r => r,
        }
    }

    /// Make at least `bytes` usable (rounded up to a 2 MiB unit): extend and
    /// preallocate a regular file (so that O_DIRECT writes do not allocate blocks one
    /// by one and a full disk shows here, not as a write error later). A growth past
    /// the cap or the disk's room fails, taking nothing, and the error says what was
    /// asked, what the cap allows and what was free. Returns the new capacity.
    pub fn ensure(&self, bytes: u64) -> Result<u64> {
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let cap = self.capacity();
        if bytes <= cap {
            return Ok(cap);
        }
        if self.is_block {
            return Ok(cap);
        }
        if self.file.get().is_none() {
            // A forked child's own file, made on first need where the parent's was.
            let placed = match self.origin.as_deref() {
                None => place_default()?,
                Some(p) => place_given(p)?,
            };
            let _ = self.file.set(placed.file);
        }
        let unit = crate::UNIT_SIZE as u64;
        let want = bytes.div_ceil(unit).saturating_mul(unit);
        let free = || {
            self.free_bytes()
                .map_or_else(|| "an unknown amount".into(), crate::format_size)
        };
        if want - cap > self.room(cap) {
            let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
            let own = want - self.base * 4096;
            let limit = if own > self.max_bytes() {
                format!(
                    "past its cap of {} (--max-swap)",
                    crate::format_size(self.max_bytes())
                )
            } else {
                format!(
                    "more than its filesystem can give while keeping {} free",
                    crate::format_size(self.floor)
                )
            };
            let hint = format!(
                " (the swap file needs {} more to hold {}, {limit}; the filesystem has {} \
                 free)",
                crate::format_size(want - cap),
                crate::format_size(own),
                free()
            );
            return Err(swap_err(&self.desc, e, &hint));
        }
        match self.grow_to(cap, want) {
            Ok(()) => {
                self.capacity.store(want, Ordering::Release);
                self.peak_disk
                    .fetch_max(self.disk_bytes(), Ordering::Relaxed);
                Ok(want)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                let hint = format!(
                    " (the swap file needs {} more to hold {}; its filesystem has {} free)",
                    crate::format_size(want - cap),
                    crate::format_size(want - self.base * 4096),
                    free()
                );
                Err(swap_err(&self.desc, e, &hint))
            }
            Err(e) => Err(swap_err(&self.desc, e, "")),
        }
    }

    /// Extend the writable file from capacity `cap` to `want` (slot-space bytes),
    /// preallocated where the filesystem can; on failure the file is as it was.
    fn grow_to(&self, cap: u64, want: u64) -> std::io::Result<()> {
        let Some(file) = self.file.get() else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        let off = self.base * 4096;
        if self.sparse.load(Ordering::Relaxed) {
            return file.set_len(want - off);
        }
        // SAFETY: fallocate on an fd we own, with a byte range.
        let r = unsafe { libc::fallocate(self.raw(), 0, (cap - off) as i64, (want - cap) as i64) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // No preallocation on this filesystem: a sparse extension still works.
            return file.set_len(want - off);
        }
        // Give back what a partial fallocate may have taken.
        let _ = file.set_len(cap - off);
        Err(e)
    }

    /// Bytes free on the filesystem of the writable file.
    fn free_bytes(&self) -> Option<u64> {
        self.file.get().and_then(fs_free)
    }
}

/// Bytes free (for an unprivileged file) on the filesystem of `file`.
fn fs_free(file: &File) -> Option<u64> {
    crate::sys::mem::fs_free_bytes(file.as_raw_fd())
}

/// A swap file or device just opened, and where it is.
struct Placed {
    file: File,
    desc: PathBuf,
    place: String,
    zram: Option<String>,
}

/// What keeps the data of a swap place, as far as RAM goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Medium {
    /// A disk (the block device's name, when there is one).
    Disk(Option<String>),
    /// zram: compressed RAM, a legitimate swap device; said, not refused.
    Zram(String),
    /// RAM: swapping there frees nothing. What it is, for messages.
    Ram(String),
}

impl Medium {
    /// " (on vda)", " (on zram0: compressed RAM)", or nothing.
    fn suffix(&self) -> String {
        match self {
            Medium::Disk(Some(d)) => format!(" (on {d})"),
            Medium::Disk(None) => String::new(),
            Medium::Zram(z) => format!(" (on {z}: compressed RAM)"),
            Medium::Ram(w) => format!(" (on {w}: RAM)"),
        }
    }

    fn zram(&self) -> Option<String> {
        match self {
            Medium::Zram(z) => Some(z.clone()),
            _ => None,
        }
    }
}

const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;

/// What holds the filesystem of `path`: tmpfs and ramfs are RAM; otherwise the block
/// device under it (RAM disks, zram and loop devices looked through).
fn medium_of_path(path: &Path) -> std::io::Result<Medium> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) with a NUL-terminated path and a pointer to a live struct.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // f_type's width differs between architectures; the magics are 32-bit.
    match st.f_type as u32 {
        TMPFS_MAGIC => return Ok(Medium::Ram("tmpfs".into())),
        RAMFS_MAGIC => return Ok(Medium::Ram("ramfs".into())),
        _ => {}
    }
    use std::os::unix::fs::MetadataExt;
    Ok(medium_of_dev(std::fs::metadata(path)?.dev(), 0))
}

/// What block device `dev` is: zram, a RAM disk (brd: ram0...), a loop device (what
/// holds its backing file), or another disk. A device sysfs does not know (btrfs,
/// overlayfs, NFS) counts as a disk.
fn medium_of_dev(dev: u64, depth: u32) -> Medium {
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")) else {
        return Medium::Disk(None);
    };
    let disk = if sys.join("partition").exists() {
        sys.parent().map(Path::to_path_buf).unwrap_or(sys)
    } else {
        sys
    };
    let name = disk
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let digits_after = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if digits_after("zram") {
        return Medium::Zram(name);
    }
    if digits_after("ram") {
        return Medium::Ram(format!("the RAM disk {name}"));
    }
    if digits_after("loop") && depth < 4 {
        let backing = std::fs::read_to_string(disk.join("loop/backing_file")).unwrap_or_default();
        let backing = backing.trim().trim_end_matches(" (deleted)");
        if !backing.is_empty() {
            match medium_of_path(Path::new(backing)) {
                Ok(Medium::Ram(w)) => {
                    return Medium::Ram(format!("{name}, a loop device over a file on {w}"))
                }
                Ok(Medium::Zram(z)) => return Medium::Zram(format!("{name} over {z}")),
                _ => {}
            }
        }
    }
    Medium::Disk(Some(name))
}

fn ram_err(path: &Path, what: String) -> Error {
    Error::SwapInRam {
        path: path.to_path_buf(),
        what,
    }
}

/// The default place: an unnamed file in the first of $TMPDIR, /var/tmp, /tmp that is
/// on a disk; the place says which were skipped and why.
fn place_default() -> Result<Placed> {
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    if let Some(t) = std::env::var_os("TMPDIR").filter(|t| !t.is_empty()) {
        let t = PathBuf::from(t);
        dirs.push((format!("$TMPDIR ({})", t.display()), t));
    }
    for d in ["/var/tmp", "/tmp"] {
        dirs.push((d.to_string(), PathBuf::from(d)));
    }
    let mut skipped: Vec<String> = Vec::new();
    for (label, dir) in dirs {
        let medium = match medium_of_path(&dir) {
            Ok(Medium::Ram(what)) => {
                skipped.push(format!("{label}: on {what}, RAM"));
                continue;
            }
            Ok(m) => m,
            Err(e) => {
                skipped.push(format!("{label}: {e}"));
                continue;
            }
        };
        match open_tmpfile(&dir) {
            Ok(file) => {
                let why: String = skipped.iter().map(|s| format!("; skipped {s}")).collect();
                return Ok(Placed {
                    file,
                    place: format!(
                        "an unnamed file in {}{}{why}",
                        dir.display(),
                        medium.suffix()
                    ),
                    zram: medium.zram(),
                    desc: dir,
                });
            }
            Err(e) => skipped.push(format!("{label}: {e}{}", odirect_hint(&e))),
        }
    }
    Err(Error::NoSwapPlace {
        tried: skipped.join("; "),
    })
}

/// An unnamed file in `dir` (the place `p` the user gave, a directory or the new path
/// `new` in it), unless `dir` is in RAM.
fn place_in_dir(p: &Path, dir: &Path, new: Option<&Path>) -> Result<Placed> {
    let medium = medium_of_path(dir).map_err(|e| swap_err(p, e, ""))?;
    if let Medium::Ram(what) = medium {
        return Err(ram_err(p, what));
    }
    let file = match new {
        Some(new) => open_in_dir(dir, new),
        None => open_tmpfile(dir),
    }
    .map_err(|e| {
        let h = odirect_hint(&e);
        swap_err(p, e, h)
    })?;
    Ok(Placed {
        file,
        desc: p.to_path_buf(),
        place: format!("an unnamed file in {}{}", dir.display(), medium.suffix()),
        zram: medium.zram(),
    })
}

/// The place the user gave: a directory, a block device or a new path.
fn place_given(p: &Path) -> Result<Placed> {
    let meta = match std::fs::metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return place_new(p, e);
        }
        m => m,
    };
    match meta {
        Ok(m) if m.is_dir() => place_in_dir(p, p, None),
        Ok(m) if m.file_type().is_block_device() => {
            use std::os::unix::fs::MetadataExt;
            let medium = medium_of_dev(m.rdev(), 0);
            if let Medium::Ram(what) = medium {
                return Err(ram_err(p, what));
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC | libc::O_EXCL)
                .open(p)
                .map_err(|e| swap_err(p, e, " (is the device in use or mounted?)"))?;
            let place = match &medium {
                Medium::Zram(z) => format!("the block device {} ({z}: compressed RAM)", p.display()),
                _ => format!("the block device {}", p.display()),
            };
            Ok(Placed {
                file,
                desc: p.to_path_buf(),
                place,
                zram: medium.zram(),
            })
        }
        Ok(m) if m.is_file() => Err(swap_err(
            p,
            std::io::Error::from_raw_os_error(libc::EEXIST),
            " (uswap will not overwrite an existing file: give a new path, a directory or a block device)",
        )),
        Ok(_) => Err(swap_err(
            p,
            std::io::Error::from_raw_os_error(libc::EINVAL),
            " (not a directory, a block device or a new path)",
        )),
        Err(e) => Err(swap_err(p, e, "")),
    }
}

/// A path that does not exist (`missing`: the error that said so): a new file in its
/// directory, unless it names a missing directory or is a dangling symlink.
fn place_new(p: &Path, missing: std::io::Error) -> Result<Placed> {
    if let Ok(target) = std::fs::read_link(p) {
        let hint = format!(
            " (a symlink to {}, which does not exist: give a new path, a directory or a \
             block device)",
            target.display()
        );
        return Err(swap_err(p, missing, &hint));
    }
    if p.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(swap_err(p, missing, " (no such directory)"));
    }
    let dir = parent_dir(p);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => place_in_dir(p, dir, Some(p)),
        Ok(_) => Err(swap_err(
            p,
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
            &format!(" ({} is not a directory)", dir.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(swap_err(
            p,
            e,
            &format!(" (the directory {} does not exist)", dir.display()),
        )),
        Err(e) => Err(swap_err(p, e, "")),
    }
}

/// The directory a new path goes in (`.` for a bare name).
fn parent_dir(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// A new swap file for the new path `p` in `dir`: unnamed if the filesystem can, else
/// under a unique name next to `p`, unlinked at once.
fn open_in_dir(dir: &Path, p: &Path) -> std::io::Result<File> {
    match open_tmpfile(dir) {
        // EOPNOTSUPP: this filesystem has no O_TMPFILE (EISDIR: nor the kernel).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            open_unique(dir, p)
        }
        r => r,
    }
}

/// Create `.<name>.uswap-<pid>-<n>` in `dir` (0600, exclusive) and unlink it at once.
fn open_unique(dir: &Path, p: &Path) -> std::io::Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.uswap-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => {
                // The name goes now; the space goes when the pool closes.
                std::fs::remove_file(&tmp)?;
                return Ok(f);
            }
            // Left by a process that died between create and unlink: next number.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

fn open_tmpfile(dir: &Path) -> std::io::Result<File> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open(2) with a valid NUL-terminated path; O_TMPFILE creates an unnamed
    // file (mode 0600) that vanishes when the last fd closes.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_DIRECT | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn block_size(fd: RawFd) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    const BLKGETSIZE64: u64 = 0x80081272;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let r = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(size)
    }
}

fn detect_rotational(file: &File, is_block: bool) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    let dev = if is_block { m.rdev() } else { m.dev() };
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let base = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for p in [
        base.join("queue/rotational"),
        base.join("../queue/rotational"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return Some(s.trim() == "1");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfile_is_unnamed_and_grows() {
        let f = SwapFile::open(None, None).unwrap();
        assert_eq!(f.capacity(), 0);
        assert!(f.ensure(3 << 20).unwrap() >= 3 << 20);
        // No name in any directory: the kernel shows the descriptor as deleted.
        // (Scanning $TMPDIR instead would race with the other tests' files.)
        let link = std::fs::read_link(format!("/proc/self/fd/{}", f.raw())).unwrap();
        assert!(
            link.to_string_lossy().ends_with(" (deleted)"),
            "swap file has a name: {link:?}"
        );
    }

    /// After forks, slots run on from each inherited file into the next one and into
    /// the process's own: no request may cover a slot on both sides of such a border.
    #[test]
    fn requests_never_run_past_an_inherited_file() {
        let mut f = SwapFile::open(None, None).unwrap();
        let end1 = f.ensure(3 << 20).unwrap() / 4096;
        assert!(
            f.continues(0) && f.continues(end1 - 1),
            "one file, no border"
        );
        f.fork_child(&[(0, 1)]);
        assert_eq!(f.base(), end1);
        assert!(f.continues(end1 - 2));
        assert!(
            !f.continues(end1 - 1),
            "parent's last slot, then the child's first"
        );
        let end2 = f.ensure((end1 * 4096) + (3 << 20)).unwrap() / 4096;
        assert!(f.continues(end1) && f.continues(end2 - 2));
        f.fork_child(&[(0, 1), (end1, 1)]);
        assert!(!f.continues(end1 - 1), "first inherited file ends");
        assert!(!f.continues(end2 - 1), "second inherited file ends");
        assert!(f.continues(end2), "the grandchild's own file");
    }

    #[test]
    fn new_path_is_unlinked_at_once() {
        // /var/tmp: on a disk (/tmp may be a tmpfs, which is refused).
        let p = Path::new("/var/tmp").join(format!("uswap-test-{}", std::process::id()));
        let f = SwapFile::open(Some(&p), Some(4 << 20)).unwrap();
        assert!(!p.exists(), "swap file name must be gone while in use");
        assert_eq!(f.capacity(), 4 << 20);
    }

    #[test]
    fn bad_paths_are_clear_errors() {
        let e = SwapFile::open(Some(Path::new("/nonexistent-dir/x/swap")), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/x/swap"), "{e}");
        assert!(
            e.to_string().contains("/nonexistent-dir/x does not exist"),
            "{e}"
        );
        let e = SwapFile::open(None, Some(0)).unwrap_err();
        assert!(matches!(e, Error::SwapSizeTooSmall { size: 0, .. }), "{e}");
        let existing = std::env::temp_dir().join(format!("uswap-existing-{}", std::process::id()));
        std::fs::write(&existing, b"keep me").unwrap();
        let e = SwapFile::open(Some(&existing), None).unwrap_err();
        assert!(e.to_string().contains("will not overwrite"), "{e}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
        std::fs::remove_file(existing).unwrap();
    }
}
