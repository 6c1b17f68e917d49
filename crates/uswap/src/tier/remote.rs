//! The remote tier: other machines' RAM on a Redis Cluster (or Valkey), through
//! `uswap-remote` (a pool-private key prefix, values checksummed and carrying their
//! id, writes acknowledged by the primary and its replicas before they count, reads
//! retried across failover for a bounded time).
//!
//! It is a back tier like the file: evicted pages go out in batches (one request
//! per run of slots, every page its own value, so that a 4 KiB fault reads 4 KiB),
//! and a fault reads its page. Requests never block an engine thread: each thread
//! has a client whose completions wake it through an eventfd polled in its io_uring,
//! and they come back through the same completion path as file I/O. A page whose
//! value is gone (all copies lost, or the cluster unavailable past the retry bound)
//! fails its read, is tried again, and is then poisoned: SIGBUS on that page only.
//!
//! A forked child cannot use the parent's connections (their threads do not exist
//! there): in the child the tier refuses requests, so pages the child evicts stay in
//! RAM (over budget, said) and pages it inherited on the remote tier raise SIGBUS
//! when touched. Said on stderr in the child, and in docs/design.md.

use crate::error::{Error, Result};
use crate::slots::Slot;
use crate::tier::{Op, OpKind};
use crate::PAGE_SIZE;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use uswap_remote::{Completion, RemoteClient, RemoteConfig, RemoteStore};

/// The pool's connection to the cluster.
pub(crate) struct Remote {
    store: Mutex<Option<RemoteStore>>,
    /// Requests fail at once (a forked child's copy of the tier).
    dead: AtomicBool,
}

/// Connect to the cluster named by `nodes` (`redis://HOST:PORT[,HOST:PORT...]`).
pub(crate) fn connect(nodes: &str) -> Result<Remote> {
    let cfg = RemoteConfig::from_list(nodes).map_err(remote_err)?;
    let store = RemoteStore::connect(cfg).map_err(remote_err)?;
    Ok(Remote {
        store: Mutex::new(Some(store)),
        dead: AtomicBool::new(false),
    })
}

fn remote_err(e: uswap_remote::RemoteError) -> Error {
    Error::Remote {
        what: e.to_string(),
    }
}

impl Remote {
    fn store(&self) -> std::sync::MutexGuard<'_, Option<RemoteStore>> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client for one engine thread, woken through `event`.
    pub(crate) fn client(&self, event: &OwnedFd) -> Option<RemoteClient> {
        if self.dead.load(Relaxed) {
            return None;
        }
        self.store().as_ref()?.client(Some(event.as_fd())).ok()
    }

    /// Slots freed: their values go (in the background).
    pub(crate) fn release(&self, slots: &[Slot]) {
        if self.dead.load(Relaxed) {
            return;
        }
        if let Some(s) = self.store().as_ref() {
            s.delete_batch(slots);
        }
    }

    /// The store's counters.
    pub(crate) fn counters(&self) -> Option<uswap_remote::RemoteCounters> {
        self.store().as_ref().map(|s| s.counters())
    }

    /// In a forked child: the parent's connections are not ours. The store is
    /// forgotten (dropping it would wait on threads that do not exist here).
    pub(crate) fn fork_child(&self) {
        self.dead.store(true, Relaxed);
        if let Some(s) = self.store().take() {
            std::mem::forget(s);
        }
        eprintln!(
            "uswap: after fork: the remote tier is not shared with a child: pages the child \
             evicts stay in RAM, and pages it inherited on the remote tier raise SIGBUS when \
             touched"
        );
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(s) = self.store().take() {
            // Deletes every key of the pool.
            let _ = s.close();
        }
    }
}

/// A thread's requests to the remote tier in flight.
pub(crate) struct RemoteCtx {
    pub(crate) client: RemoteClient,
    /// Wakes the thread on completions (polled in its ring).
    pub(crate) event: OwnedFd,
    ops: HashMap<u64, Pending>,
    /// A read's page token → its request's token and the page's index.
    pages: HashMap<u64, (u64, usize)>,
    next: u64,
    done: Vec<Completion>,
}

/// One request: writes complete with one completion, reads with one per page.
struct Pending {
    op: Op,
    left: usize,
    failed: bool,
}

impl RemoteCtx {
    pub(crate) fn new(client: RemoteClient, event: OwnedFd) -> RemoteCtx {
        RemoteCtx {
            client,
            event,
            ops: HashMap::new(),
            pages: HashMap::new(),
            next: 1,
            done: Vec::new(),
        }
    }

    /// Requests in flight.
    pub(crate) fn pending(&self) -> usize {
        self.ops.len()
    }

    /// Start `op`: a write sends every page as its own value in one batch; a read asks
    /// for every page (tokens `base + k`, `base` even per op).
    pub(crate) fn submit(&mut self, frames: &crate::frames::Frames, op: Op) {
        let token = self.next;
        self.next += op.pages.len() as u64 + 1;
        let n = op.pages.len();
        match op.kind {
            OpKind::Write => {
                let items = (0..n)
                    .map(|k| (op.slot + k as u64, frames.page(op.frames[k]).to_vec()))
                    .collect();
                self.client.put_batch(token, items);
                self.ops.insert(
                    token,
                    Pending {
                        op,
                        left: 1,
                        failed: false,
                    },
                );
            }
            OpKind::Read => {
                let reqs = (0..n)
                    .map(|k| {
                        self.pages.insert(token + 1 + k as u64, (token, k));
                        (token + 1 + k as u64, op.slot + k as u64)
                    })
                    .collect();
                self.client.get_batch(reqs);
                self.ops.insert(
                    token,
                    Pending {
                        op,
                        left: n,
                        failed: false,
                    },
                );
            }
        }
    }

    /// Completions in: finished requests with their results. A write that did not
    /// count fails (-EIO: written elsewhere, or kept); a read completes whole, and a
    /// page that did not come back keeps its frame's zeros, fails its checksum, and is
    /// read again, then poisoned (the other pages of the request are good).
    pub(crate) fn drain(&mut self, frames: &crate::frames::Frames, out: &mut Vec<(Op, i32)>) {
        crate::sys::mem::drain_eventfd(std::os::fd::AsRawFd::as_raw_fd(&self.event));
        self.done.clear();
        self.client.poll_completions(&mut self.done);
        for c in self.done.drain(..) {
            let (base, k) = match self.pages.remove(&c.token) {
                Some((b, k)) => (b, Some(k)),
                None => (c.token, None),
            };
            let Some(p) = self.ops.get_mut(&base) else {
                continue;
            };
            match (&c.result, k) {
                (Ok(Some(bytes)), Some(k)) if bytes.len() == PAGE_SIZE => {
                    frames.page_mut(p.op.frames[k]).copy_from_slice(bytes);
                }
                (Ok(_), None) => {}
                _ => p.failed = true,
            }
            p.left -= 1;
            if p.left == 0 {
                let p = self.ops.remove(&base).expect("just seen");
                let res = if p.failed && p.op.kind == OpKind::Write {
                    -libc::EIO
                } else {
                    p.op.bytes() as i32
                };
                out.push((p.op, res));
            }
        }
    }
}
