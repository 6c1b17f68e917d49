//! A thin, typed wrapper over userfaultfd(2).
#![allow(dead_code)]
//!
//! Why not the `userfaultfd` crate: it has no UFFDIO_MOVE, UFFDIO_POISON, COPY's
//! write-protect mode or the newer feature bits, which are the operations the engine
//! is built on (DESIGN.md). The raw constants and structs stay in this file.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFDIO: u64 = 0xAA;
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_MOVE: u64 = iowr(0x05, std::mem::size_of::<UffdioMove>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
const UFFDIO_POISON: u64 = iowr(0x08, std::mem::size_of::<UffdioPoison>());
const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8; // _IO(0xAA, 0x00)

const UFFD_API: u64 = 0xAA;
/// Write-protect faults are reported (anonymous memory: Linux 5.7+).
pub(crate) const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_SIGBUS: u64 = 1 << 7;
pub(crate) const FEATURE_THREAD_ID: u64 = 1 << 8;
pub(crate) const FEATURE_POISON: u64 = 1 << 14;
pub(crate) const FEATURE_MOVE: u64 = 1 << 16;

/// Register mode bits.
pub const REGISTER_MISSING: u64 = 1;
/// Register for write-protect faults.
pub const REGISTER_WP: u64 = 2;

const COPY_MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;
const MOVE_MODE_DONTWAKE: u64 = 1;
const WP_MODE_WP: u64 = 1;
const WP_MODE_DONTWAKE: u64 = 2;

const EVENT_PAGEFAULT: u8 = 0x12;
const PAGEFAULT_FLAG_WRITE: u64 = 1;
const PAGEFAULT_FLAG_WP: u64 = 2;

/// Size of one `struct uffd_msg`.
pub const MSG_SIZE: usize = 32;

/// A page fault reported by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Faulting address (page aligned by the caller).
    pub addr: usize,
    /// The access was a write.
    pub write: bool,
    /// It is a write-protect fault (page present, protected), not a missing one.
    pub wp: bool,
    /// Faulting thread id.
    pub tid: u32,
}

/// Decode one message; `None` for events the engine does not ask for.
pub fn decode(msg: &[u8; MSG_SIZE]) -> Option<Fault> {
    if msg[0] != EVENT_PAGEFAULT {
        return None;
    }
    let flags = u64::from_ne_bytes(msg[8..16].try_into().ok()?);
    let addr = u64::from_ne_bytes(msg[16..24].try_into().ok()?);
    let tid = u32::from_ne_bytes(msg[24..28].try_into().ok()?);
    Some(Fault {
        addr: addr as usize,
        write: flags & PAGEFAULT_FLAG_WRITE != 0,
        wp: flags & PAGEFAULT_FLAG_WP != 0,
        tid,
    })
}

/// Whether a mapping ioctl needs the faulting thread woken afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Wake waiters on the range (the usual case).
    Yes,
    /// Leave them asleep; the caller wakes later (several steps to one mapping).
    No,
}

/// An open userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a live, properly sized #[repr(C)] struct matching `req`'s
    // declared size; the kernel reads/writes only within it.
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Open a userfaultfd (syscall first, then /dev/userfaultfd), non-blocking, and
    /// negotiate the features the engine needs: MOVE, POISON, THREAD_ID; write-protect
    /// faults come with the base API.
    pub fn open() -> Result<Uffd> {
        Self::open_with(0)
    }

    /// Like [`Uffd::open`], but faults raise SIGBUS in the faulting thread instead of
    /// waiting for a handler thread (UFFD_FEATURE_SIGBUS); faults taken inside system
    /// calls fail with EFAULT.
    pub fn open_sigbus() -> Result<Uffd> {
        Self::open_with(FEATURE_SIGBUS)
    }

    fn open_with(extra: u64) -> Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: plain syscall with integer flags.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        let raw = if r >= 0 {
            r as RawFd
        } else {
            let first = io::Error::last_os_error();
            match Self::open_dev(flags) {
                Ok(fd) => fd,
                Err(_) => return Err(Error::UffdNotPermitted { source: first }),
            }
        };
        // SAFETY: `raw` is a freshly opened fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let uffd = Uffd { fd };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_MOVE | FEATURE_POISON | FEATURE_THREAD_ID | extra,
            ioctls: 0,
        };
        if ioctl(uffd.raw(), UFFDIO_API, &mut api).is_err() {
            // Find which feature is missing, for a precise message.
            for (bit, name) in [
                (FEATURE_MOVE, "UFFD_FEATURE_MOVE"),
                (FEATURE_POISON, "UFFD_FEATURE_POISON"),
                (FEATURE_SIGBUS, "UFFD_FEATURE_SIGBUS"),
            ] {
                let probe = Uffd::open_plain()?;
                let mut a = UffdioApi {
                    api: UFFD_API,
                    features: bit,
                    ioctls: 0,
                };
                if ioctl(probe.raw(), UFFDIO_API, &mut a).is_err() {
                    return Err(Error::UffdFeatureMissing { feature: name });
                }
            }
            return Err(Error::sys("UFFDIO_API"));
        }
        Ok(uffd)
    }

    fn open_plain() -> Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: plain syscall with integer flags.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        let raw = if r >= 0 {
            r as RawFd
        } else {
            Self::open_dev(flags).map_err(|e| Error::UffdNotPermitted { source: e })?
        };
        // SAFETY: fresh fd owned by nobody else.
        Ok(Uffd {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    fn open_dev(flags: i32) -> io::Result<RawFd> {
        use std::os::unix::fs::OpenOptionsExt;
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/userfaultfd")?;
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags as an integer argument.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    /// The raw fd (for polling).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Give up ownership of the descriptor (the caller closes it).
    pub fn into_raw(self) -> RawFd {
        use std::os::fd::IntoRawFd;
        self.fd.into_raw_fd()
    }

    /// Register `[start, start+len)` with the given mode bits.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        ioctl(self.raw(), UFFDIO_REGISTER, &mut r)
    }

    /// Unregister a range (wakes any thread still waiting in it).
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_UNREGISTER, &mut r)
    }

    /// Wake threads waiting on a range.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_WAKE, &mut r)
    }

    /// Copy `len` bytes from `src` into the missing range at `dst`; `wp` maps it
    /// write-protected (clean). Pages already mapped (EEXIST) are skipped, not
    /// overwritten: they hold what a racing mapping put there.
    pub fn copy(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        wp: bool,
        wake: Wake,
    ) -> io::Result<()> {
        self.copy_counted(dst, src, len, wp, wake)
            .map_err(|(_, e)| e)
    }

    /// [`Uffd::copy`] that says how far it got when it fails: `Err((bytes mapped
    /// before the failure, error))`.
    pub fn copy_counted(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        wp: bool,
        wake: Wake,
    ) -> std::result::Result<(), (usize, io::Error)> {
        let mut mode = if wp { COPY_MODE_WP } else { 0 };
        if wake == Wake::No {
            mode |= COPY_MODE_DONTWAKE;
        }
        let mut done = 0usize;
        // Page by page once a range spanning several mappings was refused.
        let mut single = false;
        while done < len {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                src: src.wrapping_add(done) as u64,
                len: if single {
                    crate::PAGE_SIZE as u64
                } else {
                    (len - done) as u64
                },
                mode,
                copy: 0,
            };
            match ioctl(self.raw(), UFFDIO_COPY, &mut c) {
                Ok(()) if single => done += crate::PAGE_SIZE,
                Ok(()) => return Ok(()),
                Err(e) => {
                    let progress = c.copy.max(0) as usize;
                    match e.raw_os_error() {
                        // The range is not one mapping: the program changed the
                        // protection of part of it (mprotect splits the mapping; `uswap
                        // run` leaves uncommitted and unmapped parts PROT_NONE). Each
                        // page lies in one mapping: go on page by page.
                        Some(libc::ENOENT) if !single && len - done > crate::PAGE_SIZE => {
                            done += progress;
                            single = true;
                        }
                        Some(libc::EAGAIN) => {
                            if progress == 0 {
                                std::thread::yield_now();
                            }
                            done += progress;
                        }
                        Some(libc::EEXIST) => {
                            // Mapped already (a racing mapping put it there): skip it.
                            done += progress + crate::PAGE_SIZE;
                            if wake == Wake::Yes {
                                let _ = self.wake(dst + done - crate::PAGE_SIZE, crate::PAGE_SIZE);
                            }
                        }
                        _ => return Err((done + progress, e)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Move pages from `src` to `dst` without copying (both private anonymous, `dst`
    /// registered). Holes in `src` are skipped. Returns the bytes handled before an
    /// error, and the error: the page at `src + done` is the one that refused (not
    /// exclusive after fork, pinned, or `dst` not empty).
    ///
    /// The caller guarantees that every `dst` page is empty at the call and that
    /// nobody else fills one meanwhile (its unit's lock, or a frame it owns): a `dst`
    /// page that holds something afterwards was moved there by this call. That is
    /// what makes the kernel's undercount below safe to repair.
    pub fn move_pages_partial(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: Wake,
    ) -> (usize, Option<io::Error>) {
        // Holes in `src` are skipped here, not by the kernel (ALLOW_SRC_HOLES): after
        // the internal EAGAIN of [`landed_uncounted`], a hole would count as moved
        // without advancing and the kernel would loop until a fatal signal; refused
        // (ENOENT), it stops.
        let mode = if wake == Wake::No {
            MOVE_MODE_DONTWAKE
        } else {
            0
        };
        let mut done = 0usize;
        while done < len {
            let mut m = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode,
                moved: 0,
            };
            match ioctl(self.raw(), UFFDIO_MOVE, &mut m) {
                Ok(()) => return (len, None),
                Err(e) => {
                    done += m.moved.max(0) as usize;
                    if e.raw_os_error() == Some(libc::EAGAIN) {
                        if m.moved <= 0 {
                            std::thread::yield_now();
                        }
                        continue;
                    }
                    let skip = match e.raw_os_error() {
                        Some(libc::EEXIST) => landed_uncounted(dst + done, src + done, len - done),
                        Some(libc::ENOENT) if is_hole(src + done) => 1,
                        _ => 0,
                    };
                    if skip == 0 {
                        return (done, Some(e));
                    }
                    // The kernel wakes only what it counted.
                    if wake == Wake::Yes {
                        let _ = self.wake(dst + done, skip * crate::PAGE_SIZE);
                    }
                    done += skip * crate::PAGE_SIZE;
                }
            }
        }
        (done, None)
    }

    /// Move pages from `src` to `dst` without copying; all or an error (the caller
    /// must not assume nothing moved on error: see [`Uffd::move_pages_partial`]).
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, wake: Wake) -> io::Result<usize> {
        match self.move_pages_partial(dst, src, len, wake) {
            (n, None) => Ok(n),
            (_, Some(e)) => Err(e),
        }
    }

    /// Set (`protect`) or clear write protection on a present range. Clearing wakes
    /// the waiters unless told not to; setting never wakes (and the kernel refuses
    /// WP together with DONTWAKE, so `wake` is ignored then).
    pub fn write_protect(
        &self,
        start: usize,
        len: usize,
        protect: bool,
        wake: Wake,
    ) -> io::Result<()> {
        let mode = if protect {
            WP_MODE_WP
        } else if wake == Wake::No {
            WP_MODE_DONTWAKE
        } else {
            0
        };
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
        };
        ioctl(self.raw(), UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Map a poison marker: any access to the range raises SIGBUS (lost data).
    pub fn poison(&self, start: usize, len: usize) -> io::Result<()> {
        let mut p = UffdioPoison {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: 0,
            updated: 0,
        };
        match ioctl(self.raw(), UFFDIO_POISON, &mut p) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self.wake(start, len),
            r => r,
        }
    }

    /// Read pending fault messages into `buf` (non-blocking); returns how many.
    pub fn read_msgs(&self, buf: &mut [[u8; MSG_SIZE]]) -> io::Result<usize> {
        // SAFETY: `buf` is a writable byte buffer of exactly the given length.
        let r = unsafe {
            libc::read(
                self.raw(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(buf),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize / MSG_SIZE)
    }
}

/// Pages UFFDIO_MOVE moved without counting them, in this process (see
/// [`landed_uncounted`]).
static MOVES_UNCOUNTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Pages UFFDIO_MOVE moved in this process but did not count (kernel 6.17+), that the
/// engine found and counted itself.
pub(crate) fn moves_uncounted() -> u64 {
    MOVES_UNCOUNTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// UFFDIO_MOVE answered EEXIST at `dst`: how many pages from there it moved after all.
///
/// Kernels from 6.17 (batched moves) keep an internal -EAGAIN (a page under migration,
/// a folio lock taken by compaction) across the retry that then moves a batch: that
/// batch is not counted, the loop tries it again, finds its own page at the
/// destination and fails with EEXIST. The caller would then believe the pages still at
/// `src` and find them gone. Measured here (6.18,
/// `scripts/probes/uffd-move-undercount.sh`): 3 and 7 of 20,000 moves of 512 pages in
/// two runs while the kernel compacted, each leaving 12-492 moved pages uncounted.
///
/// Under [`Uffd::move_pages_partial`]'s contract a destination page that holds
/// something, whose source is empty, is one this call moved; they are a run from
/// `dst` (a batch ends where a page table ends, every 2 MiB).
fn landed_uncounted(dst: usize, src: usize, len: usize) -> usize {
    use crate::sys::mem::PAGE_MAP;
    const PAGE_TABLE_SPAN: usize = 2 << 20;
    let in_table = |a: usize| (PAGE_TABLE_SPAN - a % PAGE_TABLE_SPAN) / crate::PAGE_SIZE;
    let n = (len / crate::PAGE_SIZE)
        .min(in_table(dst))
        .min(in_table(src));
    let (Some(d), Some(s)) = (PAGE_MAP.pages(dst, n), PAGE_MAP.pages(src, n)) else {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            say!(
                "uswap: cannot read /proc/self/pagemap: a UFFDIO_MOVE that this kernel \
                 undercounts (6.17+, under compaction) will poison the pages it moved"
            )
        });
        return 0;
    };
    let landed = d
        .iter()
        .zip(&s)
        .take_while(|(d, s)| !d.empty() && s.empty())
        .count();
    if landed > 0 {
        MOVES_UNCOUNTED.fetch_add(landed as u64, std::sync::atomic::Ordering::Relaxed);
    }
    landed
}

/// Whether `addr` is a page of a mapping with nothing in its page-table entry (a hole:
/// nothing to move), not an unmapped address (mincore fails there with ENOMEM).
fn is_hole(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte, for the one page asked about, into `v`.
    let mapped = unsafe { libc::mincore(addr as *mut libc::c_void, crate::PAGE_SIZE, &mut v) } == 0;
    mapped && crate::sys::mem::PAGE_MAP.empty(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mem::{map_aligned, unmap};
    use crate::PAGE_SIZE;

    fn word(addr: usize) -> u64 {
        // SAFETY: a present page of a mapping this test owns.
        unsafe { std::ptr::read_volatile(addr as *const u64) }
    }

    /// What the kernel's undercount leaves (every destination full, every source
    /// empty), made on purpose: moving a range a second time. The move counts it all
    /// as moved, across two page-table boundaries, and the bytes are where they went.
    /// A source that is a hole is skipped, as ALLOW_SRC_HOLES would.
    #[test]
    fn a_move_the_kernel_did_not_count_is_counted() {
        let uffd = Uffd::open().expect("userfaultfd (root or /dev/userfaultfd access)");
        let len = 6 << 20;
        let src = map_aligned(len, false).unwrap();
        let dst = map_aligned(len, false).unwrap();
        let holes_dst = map_aligned(len, false).unwrap();
        uffd.register(dst, len, REGISTER_MISSING).unwrap();
        uffd.register(holes_dst, len, REGISTER_MISSING).unwrap();
        // From 3 pages before a 2 MiB boundary, past the next one.
        let (off, n) = ((2 << 20) - 3 * PAGE_SIZE, 600);
        for k in 0..n {
            // SAFETY: a page of `src`, mapped above and written only here.
            unsafe {
                std::ptr::write_volatile((src + off + k * PAGE_SIZE) as *mut u64, k as u64 + 1)
            };
        }
        let moved = |d: usize| uffd.move_pages_partial(d + off, src + off, n * PAGE_SIZE, Wake::No);
        let (done, err) = moved(dst);
        assert_eq!((done, err.is_none()), (n * PAGE_SIZE, true), "{err:?}");
        let before = moves_uncounted();
        let (done, err) = moved(dst);
        assert_eq!((done, err.is_none()), (n * PAGE_SIZE, true), "{err:?}");
        assert!(moves_uncounted() - before >= n as u64);
        // Present before read: a missing page of a registered range would wait forever.
        let there = crate::sys::mem::PAGE_MAP.pages(dst + off, n).unwrap();
        assert!(
            there.iter().all(|p| p.present),
            "pages not at the destination"
        );
        for k in 0..n {
            assert_eq!(word(dst + off + k * PAGE_SIZE), k as u64 + 1, "page {k}");
        }
        // The source is all holes now: nothing moves, nothing fails.
        let (done, err) = moved(holes_dst);
        assert_eq!((done, err.is_none()), (n * PAGE_SIZE, true), "{err:?}");
        let pages = crate::sys::mem::PAGE_MAP.pages(holes_dst + off, n).unwrap();
        assert!(pages.iter().all(|p| p.empty()));
        for a in [src, dst, holes_dst] {
            unmap(a, len);
        }
    }
}

/// `userfaultfd(2)` flag: the fd reports only faults taken in user mode; allowed to
/// unprivileged processes whatever vm.unprivileged_userfaultfd says (Linux 5.11+).
const UFFD_USER_MODE_ONLY: i32 = 1;

/// What userfaultfd allows this process, each way of getting one tried (for
/// `uswap doctor`, through `host.rs`).
#[derive(Debug)]
pub struct Probe {
    /// The system call, for faults in user and kernel mode (what the engine needs).
    pub syscall: io::Result<()>,
    /// The system call with UFFD_USER_MODE_ONLY.
    pub user_mode_only: io::Result<()>,
    /// /dev/userfaultfd (USERFAULTFD_IOC_NEW), for faults in both modes.
    pub device: io::Result<()>,
    /// The features UFFDIO_API reports on the first fd that could be had.
    pub features: Option<u64>,
}

/// Try every way to get a userfaultfd, and ask the kernel for its features.
pub fn probe() -> Probe {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let raw_syscall = |flags: i32| -> io::Result<OwnedFd> {
        // SAFETY: plain syscall with integer flags.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a freshly opened fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    };
    let full = raw_syscall(flags);
    let user = raw_syscall(flags | UFFD_USER_MODE_ONLY);
    let dev = Uffd::open_dev(flags).map(|fd| {
        // SAFETY: a freshly opened fd that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    });
    let features = [&full, &dev, &user]
        .into_iter()
        .find_map(|r| r.as_ref().ok())
        .and_then(|fd| {
            // features 0 asks for none; the kernel answers with all it has.
            let mut api = UffdioApi {
                api: UFFD_API,
                features: 0,
                ioctls: 0,
            };
            ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api).ok()?;
            Some(api.features)
        });
    Probe {
        syscall: full.map(drop),
        user_mode_only: user.map(drop),
        device: dev.map(drop),
        features,
    }
}
