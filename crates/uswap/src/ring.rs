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

thread_local! {
    /// A faulting thread's own ring for its reads (in-thread faults), and the process
    /// that made it: a ring inherited over fork is its parent's (the same queues,
    /// mapped shared), never used by the child, whose reads could take the parent's
    /// completions.
    static OWN_READS: std::cell::RefCell<Option<(IoUring, u32)>> =
        const { std::cell::RefCell::new(None) };
}

/// Read 4 KiB at byte `off` of `fd` into the page at `buf`, on the calling thread's own
/// small ring, and wait for it: poll the completion queue (shared memory) for up to
/// `poll`, giving the CPU to any other runnable thread between looks, then sleep. A
/// thread that faults in its own page has nothing else to do meanwhile, and on this VM
/// its sleep and wake-up cost more than polling: the read's completion reaches a thread
/// that never left its CPU. The read's result (bytes, or -errno); `None` when `poll` is
/// zero or no ring can be had here (a fault while this thread's ring is in use), for
/// the caller's synchronous `pread`.
pub(crate) fn read_own(fd: RawFd, buf: usize, off: u64, poll: std::time::Duration) -> Option<i32> {
    if poll.is_zero() {
        return None;
    }
    OWN_READS
        .try_with(|r| {
            let mut r = r.try_borrow_mut().ok()?;
            let pid = std::process::id();
            if r.as_ref().is_none_or(|(_, p)| *p != pid) {
                // (dropping the parent's unmaps and closes this process's copies only)
                *r = None;
                *r = Some((IoUring::new(2).ok()?, pid));
            }
            let (ring, _) = r.as_mut()?;
            let sqe = opcode::Read::new(types::Fd(fd), buf as *mut u8, PAGE_SIZE as u32)
                .offset(off)
                .build();
            // SAFETY: `buf` is a page the caller owns until this function returns, and
            // it returns only with the read's completion.
            unsafe { ring.submission().push(&sqe).ok()? };
            let t = std::time::Instant::now();
            loop {
                match ring.submit() {
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Some(-e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
            loop {
                if let Some(c) = ring.completion().next() {
                    return Some(c.result());
                }
                if t.elapsed() < poll {
                    std::thread::yield_now();
                    continue;
                }
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    // the read is in flight: its buffer must not be given back before
                    // its completion, so keep waiting
                    Err(_) => std::thread::sleep(std::time::Duration::from_micros(50)),
                }
            }
        })
        .ok()
        .flatten()
}

/// [`read_own`] into a caller's page-aligned 4 KiB buffer: `uswap bench fault-latency`'s
/// baseline, the device's read as a polling fault waits for it.
#[doc(hidden)]
pub fn read_own_page(
    fd: RawFd,
    page: &mut [u8],
    off: u64,
    poll: std::time::Duration,
) -> Option<i32> {
    assert!(page.len() == PAGE_SIZE && (page.as_ptr() as usize).is_multiple_of(PAGE_SIZE));
    read_own(fd, page.as_mut_ptr() as usize, off, poll)
}
