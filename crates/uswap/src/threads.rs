//! The pool's threads and what each one owns.
//!
//! - Fault threads (`PoolBuilder::fault_threads`, default 1, `fault::run`): each
//!   sleeps in its own io_uring waiting for "userfaultfd readable" and for its own
//!   I/O completions, so one sleep covers both and a fault needs no hop to another
//!   thread; it reclaims directly when a fault would cross the budget.
//! - One reclaim thread (the kernel's kswapd, `reclaim::run`): woken above the high
//!   watermark, it evicts down to the low one, with its own ring for the writes; it
//!   also makes spare zeroed THPs and notices forked children that are gone.
//!
//! A panic in an engine thread leaves the engine in an unknown state, and a program
//! waiting on a fault would then wait forever: the process is aborted instead, with
//! the panic's message (a defined, loud failure rather than a hang).

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ring::Ring;
use crate::slots::SlotCursor;
use crate::sys::mem::{eventfd, signal_eventfd};
use crate::sys::uffd::{Fault, MSG_SIZE};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Per-thread state: its ring, its slot cursor, its fault message buffer.
pub(crate) struct ThreadCtx {
    pub(crate) ring: Ring,
    pub(crate) cursor: SlotCursor,
    pub(crate) msgs: Vec<[u8; MSG_SIZE]>,
    /// A poll on the userfaultfd is armed in the ring.
    pub(crate) uffd_armed: bool,
    /// Faults put back because a fork is pending and they need room that only
    /// other threads' I/O can make (see `reclaim::make_room`); served after the fork.
    pub(crate) deferred: Vec<Fault>,
    /// The eventfd that wakes this thread.
    pub(crate) event_fd: RawFd,
    /// This thread's requests to the remote tier, if the pool has one.
    pub(crate) remote: Option<crate::tier::remote::RemoteCtx>,
    /// Requests that failed before they could start (completed with the others).
    pub(crate) failed: Vec<(crate::tier::Op, i32)>,
}

/// A thread's io_uring: 512 entries, or 64 where the locked-memory limit has no room
/// for 512 (a low RLIMIT_MEMLOCK, 64 KiB in many containers and systemd units: the
/// kernel charges the rings to it); an error that says which limit to raise.
pub(crate) fn new_ring() -> Result<Ring> {
    match Ring::new(512) {
        Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
            Ring::new(64).map_err(|source| match source.raw_os_error() {
                Some(libc::ENOMEM) => Error::Sys {
                    op: "io_uring_setup (out of locked memory: raise RLIMIT_MEMLOCK, e.g. \
                         `ulimit -l 1024`, `prlimit --memlock=1048576`, LimitMEMLOCK=1M in a \
                         systemd unit or `--ulimit memlock=1048576` for docker; uswap needs \
                         about 64 KiB per engine thread)",
                    source,
                },
                _ => Error::Sys {
                    op: "io_uring_setup",
                    source,
                },
            })
        }
        r => r.map_err(|source| Error::Sys {
            op: "io_uring_setup",
            source,
        }),
    }
}

impl ThreadCtx {
    pub(crate) fn new(e: &Engine, event_fd: RawFd) -> Result<ThreadCtx> {
        Ok(ThreadCtx {
            ring: new_ring()?,
            cursor: e.slots.cursor(),
            msgs: vec![[0u8; MSG_SIZE]; 64],
            uffd_armed: false,
            deferred: Vec::new(),
            event_fd,
            remote: match &e.tiers.remote {
                Some(r) => {
                    let event = eventfd()?;
                    r.client(&event)
                        .map(|c| crate::tier::remote::RemoteCtx::new(c, event))
                }
                None => None,
            },
            failed: Vec::new(),
        })
    }

    /// Back-tier requests of this thread in flight (its ring's and the remote tier's).
    pub(crate) fn io_pending(&self) -> bool {
        self.ring.inflight > 0
            || self.remote.as_ref().is_some_and(|r| r.pending() > 0)
            || !self.failed.is_empty()
    }

    /// Reads in flight that a fault likely waits for: the ring's, and the remote tier's
    /// on the thread's own connections (their polls complete in the ring too).
    pub(crate) fn reads_waited_on(&self) -> bool {
        self.ring.reads_inflight > 0 || self.remote.as_ref().is_some_and(|r| r.direct_owed())
    }

    /// Sleep in the ring until a completion, or until the remote tier's next deadline.
    pub(crate) fn sleep(&mut self) {
        match self.remote.as_ref().and_then(|r| r.deadline()) {
            Some(t) => {
                let left = t.saturating_duration_since(std::time::Instant::now());
                self.ring
                    .wait_for(left.max(std::time::Duration::from_millis(1)));
            }
            None => self.ring.wait(),
        }
    }

    /// Arm the polls that wake this thread: its eventfd and the remote tier's.
    pub(crate) fn arm_polls(&mut self) {
        self.ring.poll(self.event_fd, crate::ring::TOKEN_EVENT);
        if let Some(r) = &self.remote {
            self.ring.poll(
                std::os::fd::AsRawFd::as_raw_fd(&r.event),
                crate::ring::TOKEN_REMOTE,
            );
        }
    }
}

/// The threads' handles, wake-ups and life.
pub(crate) struct Threads {
    /// eventfd that wakes the reclaim thread.
    kswapd_event: OwnedFd,
    kswapd_asleep: AtomicBool,
    /// Passes of the reclaim thread begun, and the last one that could not reach its
    /// target (nothing more can leave now: pages pinned, writes refused, the
    /// compressed pool full; 0: none).
    kswapd_passes: AtomicU64,
    kswapd_stalled_pass: AtomicU64,
    /// Faults waiting for the reclaim thread to make room (in-thread faults).
    room_waiters: AtomicUsize,
    /// eventfds of the fault threads (shutdown).
    fault_events: Vec<OwnedFd>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Pool and Region handles alive; the threads stop when it reaches 0.
    users: AtomicUsize,
    shutdown: AtomicBool,
}

impl Threads {
    pub(crate) fn new(fault_threads: usize) -> Result<Threads> {
        Ok(Threads {
            kswapd_event: eventfd()?,
            kswapd_asleep: AtomicBool::new(false),
            kswapd_passes: AtomicU64::new(0),
            kswapd_stalled_pass: AtomicU64::new(0),
            room_waiters: AtomicUsize::new(0),
            fault_events: (0..fault_threads)
                .map(|_| eventfd())
                .collect::<Result<_>>()?,
            handles: Mutex::new(Vec::new()),
            users: AtomicUsize::new(1),
            shutdown: AtomicBool::new(false),
        })
    }

    /// Start the fault threads and the reclaim thread.
    pub(crate) fn spawn(e: &Arc<Engine>) -> Result<()> {
        let mut hs = Vec::new();
        for i in 0..e.threads.fault_events.len() {
            let ctx = ThreadCtx::new(e, e.threads.fault_events[i].as_raw_fd())?;
            let eng = e.clone();
            hs.push(spawn_named(format!("uswap-fault-{i}"), move || {
                crate::fault::run(&eng, ctx)
            })?);
        }
        let ctx = ThreadCtx::new(e, e.threads.kswapd_event.as_raw_fd())?;
        let eng = e.clone();
        hs.push(spawn_named("uswap-reclaim".into(), move || {
            crate::reclaim::run(&eng, ctx)
        })?);
        *e.threads.handles.lock().unwrap_or_else(|p| p.into_inner()) = hs;
        Ok(())
    }

    /// Wake the reclaim thread if it sleeps.
    pub(crate) fn wake_kswapd(&self) {
        if self.kswapd_asleep.swap(false, AcqRel) {
            signal_eventfd(self.kswapd_event.as_raw_fd());
        }
    }

    /// The reclaim thread is about to sleep (a waker after this signals it).
    pub(crate) fn kswapd_sleeps(&self, asleep: bool) {
        self.kswapd_asleep.store(asleep, Release);
    }

    /// A pass of the reclaim thread begins; its number.
    pub(crate) fn kswapd_pass_begins(&self) -> u64 {
        self.kswapd_passes.fetch_add(1, AcqRel) + 1
    }

    /// Pass `pass` of the reclaim thread ended; `stalled`: it gave up.
    pub(crate) fn kswapd_pass_ends(&self, pass: u64, stalled: bool) {
        if stalled {
            self.kswapd_stalled_pass.fetch_max(pass, AcqRel);
        }
    }

    /// A fault waits for the reclaim thread to make room, as long as the guard lives.
    pub(crate) fn room_waiter(&self) -> RoomWaiter<'_> {
        self.room_waiters.fetch_add(1, AcqRel);
        RoomWaiter(&self.room_waiters)
    }

    /// Whether a fault waits for the reclaim thread to make room.
    pub(crate) fn room_awaited(&self) -> bool {
        self.room_waiters.load(Acquire) > 0
    }

    /// Passes of the reclaim thread begun so far (see `kswapd_stalled_since`).
    pub(crate) fn kswapd_passes(&self) -> u64 {
        self.kswapd_passes.load(Acquire)
    }

    /// Whether a pass of the reclaim thread begun after `passes` (a reading of
    /// `kswapd_passes`) gave up: waiting for it is futile now. A pass under way at the
    /// reading, or one that gave up long before (the pressure may differ now), does not
    /// count.
    pub(crate) fn kswapd_stalled_since(&self, passes: u64) -> bool {
        self.kswapd_stalled_pass.load(Acquire) > passes
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Acquire)
    }

    /// One more Pool/Region handle.
    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, AcqRel);
    }

    /// One handle fewer; the last one stops the threads and waits for them.
    pub(crate) fn drop_user(&self) -> bool {
        let last = self.users.fetch_sub(1, AcqRel) == 1;
        if last {
            self.shutdown.store(true, Release);
            signal_eventfd(self.kswapd_event.as_raw_fd());
            for e in &self.fault_events {
                signal_eventfd(e.as_raw_fd());
            }
            let hs = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|p| p.into_inner()));
            for h in hs {
                let _ = h.join();
            }
        }
        last
    }

    /// Engine threads that ended while the pool lives (a panic aborts the process, so
    /// none should), described.
    pub(crate) fn dead(&self) -> Vec<String> {
        if self.is_shutdown() {
            return Vec::new();
        }
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|t| t.is_finished())
            .map(|t| {
                format!(
                    "engine thread {} ended while the pool lives",
                    t.thread().name().unwrap_or("?")
                )
            })
            .collect()
    }

    /// The wake-up descriptors (replaced in a forked child: the parent's are shared).
    pub(crate) fn event_fds(&self) -> Vec<RawFd> {
        std::iter::once(self.kswapd_event.as_raw_fd())
            .chain(self.fault_events.iter().map(|e| e.as_raw_fd()))
            .collect()
    }

    /// In a forked child: the parent's threads do not exist here; their handles must
    /// not be joined.
    pub(crate) fn forget_after_fork(&self) {
        std::mem::forget(std::mem::take(
            &mut *self.handles.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        self.kswapd_asleep.store(false, Release);
    }
}

/// See `Threads::room_waiter`.
pub(crate) struct RoomWaiter<'a>(&'a AtomicUsize);

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

pub(crate) fn spawn_named(
    name: String,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>> {
    let what = name.clone();
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            // A program's handler run on an engine thread that it then makes fault on
            // memory under uswap would wait for that very thread: the program's signals
            // go to its own threads (the mask is inherited too, from `Engine::start`).
            crate::sys::mem::SignalsHeld::new().for_good();
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                say!(
                    "uswap: internal error in thread {what}: {msg}; the engine cannot go on \
                     safely, aborting (please report this)"
                );
                std::process::abort();
            }
        })
        .map_err(|source| Error::Sys {
            op: "spawn thread",
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    const CHILD: &str = "USWAP_TEST_SAY_CHILD";

    /// An engine thread that says something on a stderr nobody reads any more (`prog
    /// 2>&1 | head`, once `head` has gone) goes on. With `eprintln!` the write's EPIPE
    /// was a panic; the thread's panic handler's own `eprintln!` panicked again, the
    /// thread died without the abort, and the program's next fault waited forever.
    #[test]
    fn engine_threads_go_on_when_stderr_is_a_closed_pipe() {
        if std::env::var_os(CHILD).is_some() {
            // The child: stderr is a pipe whose reader is gone.
            let t = super::spawn_named("uswap-test-say".into(), || {
                for i in 0..3 {
                    say!("uswap: a message nobody reads ({i})");
                }
            })
            .expect("spawn");
            let ok = t.join().is_ok();
            // Told on stdout, which the parent reads.
            println!("said-through={ok}");
            return;
        }
        let mut fds = [0; 2];
        // SAFETY: pipe fills two fds, which become owned here.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both fds are fresh from pipe2 and owned by nothing else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read_end);
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "threads::tests::engine_threads_go_on_when_stderr_is_a_closed_pipe",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(write_end))
            .spawn()
            .expect("run the test binary as the child");
        // Watchdog: the old failure was a hang.
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("the child hung: an engine thread stopped on a closed stderr");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out)
            .expect("read the child's stdout");
        assert!(
            out.contains("said-through=true"),
            "the engine thread did not get through its messages (status {status}): {out}"
        );
    }
}
