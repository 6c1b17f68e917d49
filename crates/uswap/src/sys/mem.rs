//! Mappings, advice and page-table queries on this process's own memory.

use crate::error::{Error, Result};
use crate::{PAGE_SIZE, UNIT_SIZE};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

/// Map `len` bytes of anonymous private memory aligned to 2 MiB (no reserve), with
/// THP advice (`huge`: MADV_HUGEPAGE, else MADV_NOHUGEPAGE).
pub(crate) fn map_aligned(len: usize, huge: bool) -> Result<usize> {
    let total = len + UNIT_SIZE;
    // SAFETY: anonymous mapping request; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::sys("mmap"));
    }
    let start = p as usize;
    let aligned = (start + UNIT_SIZE - 1) & !(UNIT_SIZE - 1);
    // SAFETY: trims the unaligned head and the tail of the mapping made just above.
    unsafe {
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        let tail = start + total - (aligned + len);
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    let adv = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on the mapping made above.
    unsafe { libc::madvise(aligned as *mut libc::c_void, len, adv) };
    note_mapped(aligned, len);
    Ok(aligned)
}

/// The address ranges of the engine's own mappings (regions, frame arenas, spares):
/// start → end.
static MAPPED: Mutex<std::collections::BTreeMap<usize, usize>> =
    Mutex::new(std::collections::BTreeMap::new());

fn note_mapped(addr: usize, len: usize) {
    note_unmapped(addr, len);
    MAPPED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(addr, addr + len);
}

fn note_unmapped(addr: usize, len: usize) {
    let end = addr + len;
    let mut m = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    let hit: Vec<(usize, usize)> = m
        .range(..end)
        .filter(|&(_, &z)| z > addr)
        .map(|(&a, &z)| (a, z))
        .collect();
    for (a, z) in hit {
        m.remove(&a);
        if a < addr {
            m.insert(a, addr);
        }
        if z > end {
            m.insert(end, z);
        }
    }
}

/// The engine's own mappings now, as `(start, end)`: what a program's mlockall must
/// leave to the engine (a frame arena locked whole would be populated whole, and the
/// kernel moves no page between a locked and an unlocked mapping).
pub(crate) fn own_mappings() -> Vec<(usize, usize)> {
    let m = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    m.iter().map(|(&a, &z)| (a, z)).collect()
}

/// An anonymous private mapping of `len` bytes at `addr` (MAP_FIXED: it replaces what
/// the caller had there), with THP advice as in [`map_aligned`]. `addr` must be 2 MiB
/// aligned.
pub(crate) fn map_fixed(addr: usize, len: usize, prot: libc::c_int, huge: bool) -> Result<usize> {
    if !addr.is_multiple_of(UNIT_SIZE) {
        return Err(Error::InvalidRegionSize {
            size: len as u64,
            reason: format!("region address {addr:#x} is not 2 MiB aligned"),
        });
    }
    // SAFETY: MAP_FIXED over a range the caller of `Pool::region_at` owns and gave us.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::sys("mmap"));
    }
    let adv = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on the mapping made above.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, adv) };
    if prot == libc::PROT_NONE {
        note_unmapped(addr, len);
    } else {
        note_mapped(addr, len);
    }
    Ok(p as usize)
}

/// Copy `len` bytes of this process's memory at `src` into `dst` whatever the
/// protection of `src` (the program may have made it PROT_NONE: `uswap run` leaves
/// holes and uncommitted parts of reservations so): a pread of /proc/self/mem.
///
/// # Safety
/// `dst` must be `len` bytes of a live, present, writable mapping of the engine's that
/// nobody else writes meanwhile.
pub(crate) unsafe fn read_own_memory(src: usize, dst: usize, len: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open("/proc/self/mem") else {
        return false;
    };
    // SAFETY: the caller's contract; the slice lives only for this call.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
    matches!(f.read_at(buf, src as u64), Ok(n) if n == len)
}

/// Unmap a range this engine mapped and no longer hands out.
pub(crate) fn unmap(addr: usize, len: usize) {
    // SAFETY: the caller owns the range and nothing refers to it any more.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    note_unmapped(addr, len);
}

/// MADV_DONTNEED on `[addr, addr + len)` now; false where the kernel refused (a
/// range the program locked: the kernel drops no locked page).
pub(crate) fn zap_now(addr: usize, len: usize) -> bool {
    // SAFETY: drops pages of a range the caller owns and has copied what it needs.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0 }
}

/// Unlock `[addr, addr + len)` in the kernel (munlock), so that the engine can drop
/// pages of a range the program locked: the kernel drops no locked page.
pub(crate) fn munlock(addr: usize, len: usize) {
    // SAFETY: changes no data; only the lock of a range of the engine's mappings.
    unsafe { libc::munlock(addr as *const libc::c_void, len) };
}

/// Populate `len` bytes at `addr` for writing (zeroed pages, a THP where allowed).
pub(crate) fn populate_write(addr: usize, len: usize) -> bool {
    // SAFETY: populates a range of a mapping the engine owns; no data is changed
    // (missing pages become zero pages of our own, present ones are untouched).
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
}

/// Frees pages of this process's mappings with MADV_DONTNEED: one `process_madvise`
/// for up to 1024 ranges (512 scattered pages: 0.3-0.7 ms against 2.5-5.8 ms with
/// one madvise each), one madvise each where the kernel refuses it.
pub(crate) struct Zapper {
    /// Read-locked across each call: the reclaim thread's batch of a thousand ranges
    /// (TLB flushes across the vCPUs) must not hold a faulting thread's one range
    /// back; only `reopen` after a fork writes it.
    pidfd: RwLock<Option<OwnedFd>>,
    batched: AtomicBool,
}

impl Zapper {
    pub(crate) fn new() -> Zapper {
        let z = Zapper {
            pidfd: RwLock::new(None),
            batched: AtomicBool::new(true),
        };
        z.reopen();
        z
    }

    /// Open a pidfd on this process (again after a fork: the old one names the parent).
    pub(crate) fn reopen(&self) {
        // SAFETY: pidfd_open on our own pid.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        let fd = (fd >= 0).then(|| {
            // SAFETY: a fresh fd owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
        });
        *self.pidfd.write().unwrap_or_else(|p| p.into_inner()) = fd;
    }

    /// MADV_DONTNEED on every `(addr, len)`.
    pub(crate) fn zap(&self, ranges: &[(usize, usize)]) {
        for chunk in ranges.chunks(1024) {
            if self.batched.load(Relaxed) && self.zap_batched(chunk) {
                continue;
            }
            for &(a, l) in chunk {
                // SAFETY: drops pages of a mapping the engine owns.
                unsafe { libc::madvise(a as *mut libc::c_void, l, libc::MADV_DONTNEED) };
            }
        }
    }

    fn zap_batched(&self, chunk: &[(usize, usize)]) -> bool {
        let g = self.pidfd.read().unwrap_or_else(|p| p.into_inner());
        let Some(pidfd) = g.as_ref() else {
            return false;
        };
        let iov: Vec<libc::iovec> = chunk
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: l,
            })
            .collect();
        // SAFETY: process_madvise on our own pidfd with ranges of our own mappings.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                libc::MADV_DONTNEED,
                0,
            )
        };
        if r < 0 {
            self.batched.store(false, Relaxed);
        }
        // It returns the bytes it advised and may stop short (a range it could not
        // advise): then the caller advises each range itself, or a frame believed
        // empty would still hold a page.
        let total: usize = chunk.iter().map(|&(_, l)| l).sum();
        r >= 0 && r as usize == total
    }
}

/// What /proc/self/pagemap says of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageInfo {
    /// Mapped (present in RAM).
    pub present: bool,
    /// Not present, but its page-table entry holds something (bit 62: a migration
    /// entry while the kernel moves the page, a kernel swap entry, a marker): its bytes
    /// are not gone. A page under migration is not present for a moment, and
    /// UFFDIO_MOVE answers EAGAIN there.
    pub swapped: bool,
    /// Mapped by this process only (bit 56): not shared copy-on-write with a forked
    /// process. A present page that refuses UFFDIO_MOVE while exclusive is pinned
    /// (the program's own O_DIRECT I/O), not shared.
    pub exclusive: bool,
}

impl PageInfo {
    /// One 8-byte page-map entry.
    fn decode(e: &[u8]) -> PageInfo {
        let v = u64::from_le_bytes(e.try_into().expect("an 8-byte entry"));
        PageInfo {
            present: v >> 63 == 1,
            swapped: (v >> 62) & 1 == 1,
            exclusive: (v >> 56) & 1 == 1,
        }
    }

    /// Nothing in the page-table entry: neither mapped nor any kind of entry.
    pub(crate) fn empty(self) -> bool {
        !self.present && !self.swapped
    }
}

/// Reads /proc/self/pagemap of the process that opened it (reopened after a fork:
/// an open pagemap file keeps describing the process that opened it).
pub(crate) struct PageMapReader {
    file: Mutex<Option<(u32, std::fs::File)>>,
}

/// This process's page map (one per process: /proc/self/pagemap describes the process
/// that reads it, and the reader reopens it after a fork).
pub(crate) static PAGE_MAP: PageMapReader = PageMapReader::new();

impl PageMapReader {
    const fn new() -> PageMapReader {
        PageMapReader {
            file: Mutex::new(None),
        }
    }

    /// The page at `addr`; None if the kernel would not say.
    /// Allocates nothing: it runs in the in-thread fault handler.
    pub(crate) fn page(&self, addr: usize) -> Option<PageInfo> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Some(PageInfo::decode(&b))
    }

    /// The `n` pages from `addr` (one read); None if the kernel would not say.
    pub(crate) fn pages(&self, addr: usize, n: usize) -> Option<Vec<PageInfo>> {
        let mut b = vec![0u8; n * 8];
        self.read(addr, &mut b)?;
        Some(b.chunks_exact(8).map(PageInfo::decode).collect())
    }

    /// The entries of `buf.len() / 8` pages from `addr`.
    fn read(&self, addr: usize, buf: &mut [u8]) -> Option<()> {
        use std::os::unix::fs::FileExt;
        let pid = std::process::id();
        let mut g = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(|(p, _)| *p != pid) {
            *g = Some((pid, std::fs::File::open("/proc/self/pagemap").ok()?));
        }
        let (_, f) = g.as_ref()?;
        f.read_exact_at(buf, (addr / PAGE_SIZE) as u64 * 8).ok()
    }

    /// Whether the page at `addr` is present; None if the kernel would not say.
    pub(crate) fn present(&self, addr: usize) -> Option<bool> {
        self.page(addr).map(|p| p.present)
    }

    /// Whether the page table has nothing at `addr` (not present, no entry of any
    /// kind): what a page resident by the page map looks like when its bytes are gone.
    /// False if the kernel would not say.
    pub(crate) fn empty(&self, addr: usize) -> bool {
        self.page(addr).is_some_and(|p| p.empty())
    }
}

/// A non-blocking eventfd.
pub(crate) fn eventfd() -> Result<OwnedFd> {
    let fd = raw_eventfd().map_err(|source| Error::Sys {
        op: "eventfd",
        source,
    })?;
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A non-blocking eventfd as a raw fd (the caller owns it).
pub(crate) fn raw_eventfd() -> std::io::Result<RawFd> {
    // SAFETY: eventfd(2) with integer flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// Add one to an eventfd's count (wakes its pollers).
pub(crate) fn signal_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Consume an eventfd's count (non-blocking).
pub(crate) fn drain_eventfd(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Sleeps until eventfd `fd` has a count (or a signal or error ends the wait), then
/// consumes it.
pub(crate) fn wait_eventfd(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one live pollfd, without a time limit.
    unsafe { libc::poll(&mut p, 1, -1) };
    drain_eventfd(fd);
}

/// Sleeps while `word` holds `expected`, for at most `timeout` (or until a wake-up, a
/// signal). Async-signal-safe: one system call, nothing allocated or locked.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned u32 (an AtomicU32's storage) with a live
    // relative timespec; the kernel only reads them.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every thread in `futex_wait` on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32; the kernel does not touch its value.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// Whether nobody holds the other end of pipe `fd` any more (poll reports hang-up).
pub(crate) fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: poll(2) on one live pollfd, without waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Put a fresh descriptor at the number `old` (so that everything holding `old`
/// sees the new one) and close the fresh number.
pub(crate) fn replace_fd(fresh: RawFd, old: RawFd) {
    // SAFETY: dup2 onto a descriptor number the engine owns; `fresh` is closed after.
    unsafe {
        libc::dup2(fresh, old);
        libc::close(fresh);
    }
}

/// Take disk blocks for `len` bytes at `off` of file `fd` (fallocate, size kept).
pub(crate) fn allocate(fd: RawFd, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate(2) on a descriptor the caller holds open, with a byte range.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, off as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Give the disk blocks of `len` bytes at `off` of file `fd` back to its filesystem (the
/// range reads as zeros after; the file keeps its size). False where the filesystem
/// cannot.
pub(crate) fn punch_hole(fd: RawFd, off: u64, len: u64) -> bool {
    // SAFETY: fallocate(2) on a descriptor the caller holds open, with a byte range.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    r == 0
}

/// Bytes free for an unprivileged file on the filesystem of `fd` (fstatfs f_bavail).
pub(crate) fn fs_free_bytes(fd: RawFd) -> Option<u64> {
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs(2) on a descriptor the caller holds open, into a live struct.
    let r = unsafe { libc::fstatfs(fd, &mut st) };
    (r == 0).then(|| st.f_bavail * st.f_bsize as u64)
}

/// MemTotal of this machine, in bytes.
pub(crate) fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// This process's effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// This thread's kernel id.
pub(crate) fn gettid() -> u64 {
    thread_local!(static TID: u64 = {
        // SAFETY: gettid(2) has no arguments and cannot fail.
        unsafe { libc::gettid() as u64 }
    });
    TID.with(|t| *t)
}

/// Lower this thread's scheduling priority (nice value).
pub(crate) fn set_thread_nice(nice: i32) {
    // SAFETY: setpriority on this thread's own id; no memory is touched.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
}

/// Every asynchronous signal: all but those the kernel raises for a fault or trap of
/// the thread itself (blocked, those end the process instead of being raised).
pub(crate) fn async_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, filled by sigfillset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigfillset and sigdelset write into a live sigset_t.
    unsafe {
        libc::sigfillset(&mut set);
        for sig in [
            libc::SIGBUS,
            libc::SIGSEGV,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut set, sig);
        }
    }
    set
}

/// The program's asynchronous signals held off on this thread until dropped (then the
/// mask before). A program's handler that runs inside the engine on top of work that
/// holds its locks, and touches memory under uswap, would wait for those locks, or for
/// a thread that waits for them: inside the engine, a program thread is in a system
/// call as far as its signals go.
pub(crate) struct SignalsHeld(libc::sigset_t);

impl SignalsHeld {
    pub(crate) fn new() -> SignalsHeld {
        let set = async_signals();
        // SAFETY: sigset_t is plain data; pthread_sigmask writes the old mask into it.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: blocks signals of this thread with live sets.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        super::heap::note_held(true);
        SignalsHeld(old)
    }

    /// Keep them held for the rest of this thread's life (the engine's own threads:
    /// a program's handler never runs on one).
    pub(crate) fn for_good(self) {
        std::mem::forget(self);
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        super::heap::note_held(false);
        // SAFETY: restores this thread's mask from a live set.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}
