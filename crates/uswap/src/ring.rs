//! One thread's io_uring: the thread's one place to sleep. It waits there for its
//! file-tier reads and writes and for the polls that wake it (userfaultfd readable,
//! its eventfd, other tiers' completion eventfds), so one sleep covers them all.
//! Completions are handled by the thread that submitted, so the common fault path
//! never hands work to another thread.

use crate::tier::Op;
use crate::tier::OpKind;
use crate::PAGE_SIZE;
use io_uring::{opcode, types, IoUring};
use std::os::fd::RawFd;

/// `user_data` of the userfaultfd poll.
pub const TOKEN_UFFD: u64 = u64::MAX;
/// `user_data` of the thread's eventfd poll.
pub const TOKEN_EVENT: u64 = u64::MAX - 1;
/// `user_data` of a timeout that ends a bounded wait.
pub const TOKEN_TIMEOUT: u64 = u64::MAX - 2;
/// `user_data` of the poll of the remote tier's completion eventfd.
pub const TOKEN_REMOTE: u64 = u64::MAX - 3;
/// `user_data` of polls on other descriptors (fork children's pipes, other tiers'
/// completion eventfds): `TOKEN_POLL_BASE + n`, counting down.
pub const TOKEN_POLL_BASE: u64 = u64::MAX - 16;
/// `user_data` of polls on the remote tier's direct-read sockets:
/// `TOKEN_DIRECT_BASE - token` for the reader's tokens (below 2^32), far from the
/// ranges above and from request indices.
pub const TOKEN_DIRECT_BASE: u64 = TOKEN_POLL_BASE - (1 << 40);
/// Whether `user_data` is a direct-read poll's.
pub fn is_direct_token(ud: u64) -> bool {
    ud <= TOKEN_DIRECT_BASE && ud > TOKEN_DIRECT_BASE - (1 << 32)
}

/// Frames that follow each other become one iovec.
pub(crate) fn coalesce_iov(frames: &[usize]) -> Vec<libc::iovec> {
    let mut iov: Vec<libc::iovec> = Vec::new();
    for &a in frames {
        if let Some(last) = iov.last_mut() {
            if last.iov_base as usize + last.iov_len == a {
                last.iov_len += PAGE_SIZE;
                continue;
            }
        }
        iov.push(libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: PAGE_SIZE,
        });
    }
    iov
}

/// Writes a ring keeps at the device at once, and their bytes: enough for the
/// device's full sequential bandwidth (fio: 2 MiB writes reach it at queue depth 4
/// here), few enough that completions come one by one. The rest wait in the ring's
/// queue: a deep queue of 2 MiB writes completed in bursts of ~100 ms (Little's law
/// on a device that serves them in parallel), and the program, waiting for room
/// that only a completion frees, stopped for each burst while the device idled
/// between them. Reads never wait here: a fault waits for them. Measured on
/// swap-w-seq 2 GiB / 256 MiB, --unit 2m, alternating runs: 8 MiB 1,309-1,510 MB/s,
/// no limit 1,299-1,363 (pass 2 slower: its reads queue behind writes), 4 MiB
/// 1,119-1,460 (too shallow for the device).
const WRITES_AT_DEVICE: usize = 32;
const WRITE_BYTES_AT_DEVICE: usize = 8 << 20;

/// A thread's ring and the requests it has in flight.
pub struct Ring {
    ring: IoUring,
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Requests in flight (at the device or queued behind the write limit).
    pub inflight: usize,
    /// Reads in flight (a fault may be waiting for one).
    pub reads_inflight: usize,
    /// Writes waiting for the device: (slot index in `ops`, fd, offset).
    queued_writes: std::collections::VecDeque<(usize, RawFd, u64)>,
    /// Writes at the device now, and their bytes.
    device_writes: usize,
    device_write_bytes: usize,
}

impl Ring {
    /// A ring of `entries`.
    pub fn new(entries: u32) -> std::io::Result<Ring> {
        Ok(Ring {
            ring: IoUring::new(entries)?,
            ops: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            reads_inflight: 0,
            queued_writes: std::collections::VecDeque::new(),
            device_writes: 0,
            device_write_bytes: 0,
        })
    }

    /// Entries of its submission queue.
    pub fn entries(&self) -> u32 {
        self.ring.params().sq_entries()
    }

    fn push(&mut self, sqe: &io_uring::squeue::Entry) {
        loop {
            // SAFETY: every buffer an SQE points to (frames, iovec arrays held in
            // `self.ops`) stays valid until its completion is reaped.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return;
            }
            // Queue full: hand what we have to the kernel and retry.
            let _ = self.ring.submit();
        }
    }

    /// Queue a read or write of `op` at `(fd, byte offset)` (submitted at the next
    /// `submit`/`wait`). The op's frames stay untouched until its completion.
    pub fn queue(&mut self, op: Op, (fd, off): (RawFd, u64)) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        let kind = op.kind;
        self.ops[idx] = Some(op);
        self.inflight += 1;
        if kind == OpKind::Read {
            self.reads_inflight += 1;
        }
        // Writes keep their order: none passes one already queued.
        if (kind == OpKind::Write && !self.queued_writes.is_empty()) || !self.write_fits(kind, idx)
        {
            self.queued_writes.push_back((idx, fd, off));
            return;
        }
        self.start(idx, fd, off);
    }

    /// Whether a request may go to the device now (reads always may).
    fn write_fits(&self, kind: OpKind, idx: usize) -> bool {
        kind == OpKind::Read
            || self.device_writes == 0
            || (self.device_writes < WRITES_AT_DEVICE
                && self.device_write_bytes + self.op_bytes(idx) <= WRITE_BYTES_AT_DEVICE)
    }

    fn op_bytes(&self, idx: usize) -> usize {
        self.ops[idx].as_ref().map_or(0, Op::bytes)
    }

    /// Hand request `idx` to the device.
    fn start(&mut self, idx: usize, fd: RawFd, off: u64) {
        let Some(op) = self.ops[idx].as_ref() else {
            return;
        };
        let iov = op.iov();
        let (ptr, n) = (iov.as_ptr(), iov.len() as u32);
        let sqe = match op.kind {
            OpKind::Read => opcode::Readv::new(types::Fd(fd), ptr, n)
                .offset(off)
                .build(),
            OpKind::Write => {
                self.device_writes += 1;
                self.device_write_bytes += op.bytes();
                opcode::Writev::new(types::Fd(fd), ptr, n)
                    .offset(off)
                    .build()
            }
        }
        .user_data(idx as u64);
        self.push(&sqe);
    }

    /// Ask for a one-shot POLLIN notification on `fd`, reported with `token`.
    pub fn poll(&mut self, fd: RawFd, token: u64) {
        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(token);
        self.push(&sqe);
    }

    /// Submit queued requests without waiting.
    pub fn submit(&mut self) {
        let _ = self.ring.submit();
    }

    /// Submit and sleep until at least one completion or `timeout`.
    pub fn wait_for(&mut self, timeout: std::time::Duration) {
        let ts = types::Timespec::new()
            .sec(timeout.as_secs())
            .nsec(timeout.subsec_nanos());
        let args = types::SubmitArgs::new().timespec(&ts);
        loop {
            match self.ring.submitter().submit_with_args(1, &args) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                _ => return,
            }
        }
    }

    /// Submit and sleep until at least one completion.
    pub fn wait(&mut self) {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return,
                Err(_) => return,
            }
        }
    }

    /// Reap completions: `(user_data, result)` pairs appended to `out`.
    pub fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        for cqe in self.ring.completion() {
            out.push((cqe.user_data(), cqe.result()));
        }
    }

    /// Take back the request of a completion.
    pub fn take(&mut self, user_data: u64) -> Option<Op> {
        let i = user_data as usize;
        let op = self.ops.get_mut(i)?.take()?;
        self.free.push(i);
        self.inflight -= 1;
        if op.kind == OpKind::Read {
            self.reads_inflight -= 1;
        }
        if op.kind == OpKind::Write {
            self.device_writes -= 1;
            self.device_write_bytes -= op.bytes();
            // The next queued writes take its place (submitted with the next
            // `submit`/`wait` of this thread).
            while let Some(&(idx, fd, off)) = self.queued_writes.front() {
                if !self.write_fits(OpKind::Write, idx) {
                    break;
                }
                self.queued_writes.pop_front();
                self.start(idx, fd, off);
            }
        }
        Some(op)
    }
}

/// A faulting thread's own ring for its reads (in-thread faults).
struct OwnRing {
    /// `None`: none could be made in this process (no io_uring here): pread.
    ring: Option<IoUring>,
    /// The process that made it: a ring inherited over fork is the parent's (the same
    /// queues, mapped shared), never used by the child, whose reads could take the
    /// parent's completions.
    pid: u32,
    /// `user_data` of the last read: a completion of another (none is expected: each
    /// read is waited for) is passed over, never taken for this read's.
    seq: u64,
}

thread_local! {
    static OWN_READS: std::cell::RefCell<Option<OwnRing>> = const { std::cell::RefCell::new(None) };
}

/// Read 4 KiB at byte `off` of `fd` into `page` (page-aligned, 4 KiB) on the calling
/// thread's own small ring, and wait for it: look at the completion queue for up to
/// `poll`, giving the CPU to any other runnable thread between looks (the yield also
/// enters the kernel, where the completion's task work is run), then sleep. A thread
/// that faults in its own page has nothing else to do meanwhile, and on this VM a sleep
/// and its wake-up cost more than looking: a polled 4 KiB read took ~10 µs less than a
/// pread (`uswap bench fault-latency`). The read's result (bytes, or -errno); `None`
/// when `poll` is zero or this thread has no ring to use now (none can be made, a fault
/// while the ring is in use, the ring refused the request; it is then dropped, with the
/// request unsubmitted), for the caller's synchronous `pread`.
pub fn read_own(fd: RawFd, page: &mut [u8], off: u64, poll: std::time::Duration) -> Option<i32> {
    assert!(page.len() == PAGE_SIZE && (page.as_ptr() as usize).is_multiple_of(PAGE_SIZE));
    if poll.is_zero() {
        return None;
    }
    OWN_READS
        .try_with(|cell| {
            let mut cell = cell.try_borrow_mut().ok()?;
            let pid = std::process::id();
            if cell.as_ref().is_none_or(|o| o.pid != pid) {
                // (dropping the parent's unmaps and closes this process's copies only)
                *cell = None;
                *cell = Some(OwnRing {
                    ring: IoUring::new(2).ok(),
                    pid,
                    seq: 0,
                });
            }
            let own = cell.as_mut()?;
            own.seq += 1;
            let seq = own.seq;
            let ring = own.ring.as_mut()?;
            let sqe = opcode::Read::new(types::Fd(fd), page.as_mut_ptr(), PAGE_SIZE as u32)
                .offset(off)
                .build()
                .user_data(seq);
            // SAFETY: `page` is borrowed until this function returns, and it returns
            // only once the read completed, or with the request never submitted (the
            // ring dropped with it).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                own.ring = None;
                return None;
            }
            loop {
                match ring.submit() {
                    Ok(1) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    _ => {
                        own.ring = None;
                        return None;
                    }
                }
            }
            let t = std::time::Instant::now();
            loop {
                if let Some(c) = ring.completion().find(|c| c.user_data() == seq) {
                    return Some(c.result());
                }
                if t.elapsed() < poll {
                    std::thread::yield_now();
                    continue;
                }
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    // the read is in flight: its page is not given back before its
                    // completion, so keep waiting
                    Err(_) => std::thread::sleep(std::time::Duration::from_micros(50)),
                }
            }
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A page-aligned 4 KiB buffer.
    struct Page(*mut u8);
    impl Page {
        fn new() -> Page {
            let l = std::alloc::Layout::from_size_align(PAGE_SIZE, PAGE_SIZE).unwrap();
            // SAFETY: a non-zero layout, freed in Drop with the same layout.
            Page(unsafe { std::alloc::alloc_zeroed(l) })
        }
        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: PAGE_SIZE bytes owned by self.
            unsafe { std::slice::from_raw_parts_mut(self.0, PAGE_SIZE) }
        }
    }
    impl Drop for Page {
        fn drop(&mut self) {
            let l = std::alloc::Layout::from_size_align(PAGE_SIZE, PAGE_SIZE).unwrap();
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.0, l) };
        }
    }

    #[test]
    fn own_reads_return_their_own_bytes_and_errors() {
        // A read whose completion never came would wait forever: fail loudly instead.
        let (done, watch) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if watch.recv_timeout(std::time::Duration::from_secs(60))
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                eprintln!("own_reads test: a read did not complete in 60 s");
                std::process::abort();
            }
        });
        let path = std::env::temp_dir().join(format!("uswap-ring-test-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        for p in 0..16u8 {
            f.write_all(&[p; PAGE_SIZE]).unwrap();
        }
        let mut page = Page::new();
        let poll = std::time::Duration::from_micros(250);
        // In any order, each read brings its own page; a failed one (a closed
        // descriptor) returns its error, and the next read its own bytes again.
        for (k, p) in [3u8, 0, 15, 7, 7, 1].into_iter().enumerate() {
            if k == 3 {
                assert_eq!(read_own(-1, page.bytes(), 0, poll), Some(-libc::EBADF));
            }
            let n = read_own(
                f.as_raw_fd(),
                page.bytes(),
                p as u64 * PAGE_SIZE as u64,
                poll,
            );
            assert_eq!(n, Some(PAGE_SIZE as i32), "page {p}");
            assert!(page.bytes().iter().all(|&b| b == p), "page {p}");
        }
        // Past the end: 0 bytes, not another page's.
        assert_eq!(
            read_own(f.as_raw_fd(), page.bytes(), 16 * PAGE_SIZE as u64, poll),
            Some(0)
        );
        // Polling off: the caller's pread.
        assert_eq!(
            read_own(f.as_raw_fd(), page.bytes(), 0, std::time::Duration::ZERO),
            None
        );
        drop(done);
    }
}
