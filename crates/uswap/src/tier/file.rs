//! The file tier: a swap file or block device opened with O_DIRECT, written and
//! read through each thread's io_uring (`ring.rs`).
//!
//! Placement rules, so that swapped data never outlives the process and never sits
//! readable by others:
//! - no path: an `O_TMPFILE` (unnamed, mode 0600) in `$TMPDIR`, else `/var/tmp`;
//! - a directory: an `O_TMPFILE` in it;
//! - a path that does not exist: created 0600 and unlinked at once (the space is
//!   freed when the pool closes, even after a crash);
//! - a block device: used as is (its size is the capacity).
//!
//! O_DIRECT keeps the page cache from holding swapped data outside the budget; a
//! filesystem that refuses O_DIRECT (tmpfs) is refused with a hint.
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

/// Granularity in which a regular swap file is extended (fallocate).
const GROW_STEP: u64 = 64 << 20;

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
    /// Bytes usable now (a multiple of 2 MiB).
    capacity: AtomicU64,
    /// `Some(n)`: the user fixed the size (or it is a device); never grow past it.
    fixed: Option<u64>,
    /// Serializes growth.
    grow_lock: Mutex<()>,
    is_block: bool,
    rotational: Option<bool>,
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
        " (the filesystem does not support O_DIRECT, e.g. tmpfs: choose a directory on a disk with --swap-file)"
    } else if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EPERM) {
        " (no permission: choose a writable directory with --swap-file)"
    } else if e.raw_os_error() == Some(libc::ENOENT) {
        " (the directory does not exist)"
    } else {
        ""
    }
}

impl SwapFile {
    /// Open the backend. `size`: fixed capacity in bytes, or `None` to grow on demand.
    pub fn open(path: Option<&Path>, size: Option<u64>) -> Result<SwapFile> {
        let (file, desc) = open_place(path)?;
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
        let sf = SwapFile {
            file: OnceLock::from(file),
            base: 0,
            inherited: Vec::new(),
            origin: path.map(Path::to_path_buf),
            desc,
            capacity: AtomicU64::new(0),
            fixed: fixed.map(|f| f & !(crate::UNIT_SIZE as u64 - 1)),
            grow_lock: Mutex::new(()),
            is_block,
            rotational,
        };
        if let Some(cap) = sf.fixed {
            if cap == 0 {
                return Err(swap_err(
                    &sf.desc,
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                    " (swap size below 2 MiB)",
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
}

/// Open the place the user asked for (see the module doc); the file and what to
/// call it in messages.
fn open_place(path: Option<&Path>) -> Result<(File, PathBuf)> {
    {
        let r = match path {
            None => {
                let mut dirs: Vec<PathBuf> = Vec::new();
                if let Some(t) = std::env::var_os("TMPDIR") {
                    dirs.push(PathBuf::from(t));
                }
                dirs.push(PathBuf::from("/var/tmp"));
                dirs.push(PathBuf::from("/tmp"));
                let mut last = None;
                let mut found = None;
                for d in dirs {
                    match open_tmpfile(&d) {
                        Ok(f) => {
                            found = Some((f, d));
                            break;
                        }
                        Err(e) => last = Some((d, e)),
                    }
                }
                match found {
                    Some(x) => x,
                    None => {
                        let (d, e) = last.expect("at least one directory was tried");
                        let hint = odirect_hint(&e);
                        return Err(swap_err(&d, e, hint));
                    }
                }
            }
            Some(p) => match std::fs::metadata(p) {
                Ok(m) if m.is_dir() => (open_tmpfile(p).map_err(|e| {
                            let h = odirect_hint(&e);
                            swap_err(p, e, h)
                        })?, p.to_path_buf()),
                Ok(m) if m.file_type().is_block_device() => {
                    let f = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC | libc::O_EXCL)
                        .open(p)
                        .map_err(|e| swap_err(p, e, " (is the device in use or mounted?)"))?;
                    (f, p.to_path_buf())
                }
                Ok(_) => {
                    return Err(swap_err(
                        p,
                        std::io::Error::from_raw_os_error(libc::EEXIST),
                        " (uswap will not overwrite an existing file: give a new path, a directory or a block device)",
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let f = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                        .open(p)
                        .map_err(|e| {
                            let h = odirect_hint(&e);
                            swap_err(p, e, h)
                        })?;
                    // The name goes now; the space goes when the pool closes.
                    std::fs::remove_file(p).map_err(|e| swap_err(p, e, ""))?;
                    (f, p.to_path_buf())
                }
                Err(e) => return Err(swap_err(p, e, "")),
            },
        };
        Ok(r)
    }
}

impl SwapFile {
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
        if self.is_block {
            self.origin = None;
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

    /// Where it lives, for messages.
    pub fn desc(&self) -> &Path {
        &self.desc
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

    /// Make at least `bytes` usable: extend and preallocate a regular file (so that
    /// O_DIRECT writes do not allocate blocks one by one and a full disk shows here,
    /// not as a write error later). Returns the new capacity.
    pub fn ensure(&self, bytes: u64) -> Result<u64> {
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let cap = self.capacity();
        if bytes <= cap {
            return Ok(cap);
        }
        if self.is_block {
            return Ok(cap);
        }
        let file = match self.file.get() {
            Some(f) => f,
            None => {
                let (f, _) = open_place(self.origin.as_deref())?;
                self.file.get_or_init(|| f)
            }
        };
        let mut want = bytes.div_ceil(GROW_STEP) * GROW_STEP;
        if let Some(f) = self.fixed {
            want = want.min(f).max(bytes.min(f));
        }
        // Offsets in the file start at the first slot of this process's own range.
        let off = self.base * 4096;
        let (have, len) = (cap - off, want - cap);
        // SAFETY: fallocate on an fd we own, with a byte range.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, have as i64, len as i64) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                // No preallocation on this filesystem: a sparse extension still works.
                file.set_len(want - off)
                    .map_err(|e| swap_err(&self.desc, e, ""))?;
            } else {
                // Give back what a partial fallocate may have taken.
                let _ = file.set_len(have);
                let hint = if e.raw_os_error() == Some(libc::ENOSPC) {
                    " (the disk is full)"
                } else {
                    ""
                };
                return Err(swap_err(&self.desc, e, hint));
            }
        }
        self.capacity.store(want, Ordering::Release);
        Ok(want)
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

    #[test]
    fn new_path_is_unlinked_at_once() {
        let p = std::env::temp_dir().join(format!("uswap-test-{}", std::process::id()));
        let f = SwapFile::open(Some(&p), Some(4 << 20)).unwrap();
        assert!(!p.exists(), "swap file name must be gone while in use");
        assert_eq!(f.capacity(), 4 << 20);
    }

    #[test]
    fn bad_paths_are_clear_errors() {
        let e = SwapFile::open(Some(Path::new("/nonexistent-dir/x/swap")), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/x/swap"), "{e}");
        let existing = std::env::temp_dir().join(format!("uswap-existing-{}", std::process::id()));
        std::fs::write(&existing, b"keep me").unwrap();
        let e = SwapFile::open(Some(&existing), None).unwrap_err();
        assert!(e.to_string().contains("will not overwrite"), "{e}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
        std::fs::remove_file(existing).unwrap();
    }
}
