//! Completions handed back to a client's thread: a queue plus an eventfd to wake it.

use std::fs::File;
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::sync::{Condvar, Mutex};

use crate::RemoteError;

/// The end of one request: `Ok(None)` for a write, `Ok(Some(payload))` for a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The caller's token given with the request.
    pub token: u64,
    /// What came of it.
    pub result: Result<Option<Vec<u8>>, RemoteError>,
}

/// A client's completion queue; written by the store's runtime, drained by the client.
pub(crate) struct CompletionQueue {
    /// guarded: the completions not yet drained
    items: Mutex<Vec<Completion>>,
    /// signalled on every push (for the blocking helpers)
    pushed: Condvar,
    /// the caller's eventfd (our own dup of it), written on every push
    eventfd: Option<File>,
}

impl CompletionQueue {
    /// A queue that wakes `eventfd` (duplicated: the caller may close its own copy).
    pub(crate) fn new(eventfd: Option<BorrowedFd<'_>>) -> std::io::Result<CompletionQueue> {
        let eventfd = match eventfd {
            Some(fd) => Some(File::from(fd.try_clone_to_owned()?)),
            None => None,
        };
        Ok(CompletionQueue {
            items: Mutex::new(Vec::new()),
            pushed: Condvar::new(),
            eventfd,
        })
    }

    pub(crate) fn push(&self, completion: Completion) {
        self.items
            .lock()
            .expect("completion queue")
            .push(completion);
        self.pushed.notify_all();
        if let Some(fd) = &self.eventfd {
            // an eventfd adds the 8-byte counter; EAGAIN (counter near its maximum, nonblocking
            // fd) still leaves it readable, so the reader wakes either way
            let _ = (&*fd).write(&1u64.to_ne_bytes());
        }
    }

    /// Moves every completion into `out`; returns how many.
    pub(crate) fn drain_into(&self, out: &mut Vec<Completion>) -> usize {
        let mut items = self.items.lock().expect("completion queue");
        let n = items.len();
        out.append(&mut items);
        n
    }

    /// Waits until a completion is queued or `deadline` passes; takes them all.
    pub(crate) fn wait_into(
        &self,
        out: &mut Vec<Completion>,
        deadline: std::time::Instant,
    ) -> usize {
        let mut items = self.items.lock().expect("completion queue");
        loop {
            if !items.is_empty() {
                let n = items.len();
                out.append(&mut items);
                return n;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return 0;
            }
            items = self
                .pushed
                .wait_timeout(items, deadline - now)
                .expect("completion queue")
                .0;
        }
    }
}
