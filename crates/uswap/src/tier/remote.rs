//! The remote tier: other machines' RAM on a Redis Cluster (or Valkey), through
//! `uswap-remote` (a pool-private key prefix, values checksummed and carrying their
//! id, writes acknowledged by the primary and its replicas before they count, reads
//! retried across failover for a bounded time).
//!
//! It is a back tier like the file: evicted pages go out in batches (one request
//! per run of slots, every page its own value, so that a 4 KiB fault reads 4 KiB),
//! and a fault reads its page. A whole 2 MiB unit of a `--unit 2m` region, which is
//! swapped in whole, is one value (see [`Units`]). Requests never block an engine
//! thread: each thread has a client whose completions wake it through an eventfd polled in its io_uring,
//! and they come back through the same completion path as file I/O. A page whose
//! value is gone (all copies lost, or the cluster unavailable past the retry bound)
//! fails its read, is tried again, and is then poisoned: SIGBUS on that page only.
//!
//! A forked child cannot use the parent's connections (their threads do not exist
//! there). It connects a store of its own from what the parent took just before the
//! fork (`uswap_remote::Inheritance`): its evictions go under its own prefix, and it
//! reads the pages it inherited from the keys of the process that wrote them. The
//! parent keeps those values for as long as the child may read them (the references
//! `fork.rs` holds for the child), and at its close leaves the groups a live child
//! holds to the children (`uswap_remote`'s lineage: the last reader deletes them, and
//! keys of killed processes expire).

use crate::error::{Error, Result};
use crate::slots::Slot;
use crate::tier::{Op, OpKind};
use crate::PAGE_SIZE;
use crate::{UnitPolicy, UNIT_PAGES};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uswap_remote::{
    ChildHold, Completion, DirectReads, Inheritance, RemoteClient, RemoteConfig, RemoteStore,
};

/// The pool's connection to the cluster.
pub(crate) struct Remote {
    store: Mutex<Option<RemoteStore>>,
    /// Requests fail at once (in a forked child until its store connects, or for good
    /// when it cannot).
    dead: AtomicBool,
    units: Mutex<Units>,
    /// What the child being forked needs (from the prepare hook to the parent's or the
    /// child's).
    forking: Mutex<Option<Inheritance>>,
    /// Forked children by token: their stores' prefixes (what they did not delete
    /// themselves goes when they and their descendants are gone).
    children: Mutex<HashMap<u64, uswap_remote::layout::Prefix>>,
    /// Reads of faults served in the faulting thread, done on the reader thread.
    handoff: Arc<Handoff>,
    /// The reader thread (none once closed, or in a forked child until it connects).
    reader: Mutex<Option<JoinHandle<()>>>,
    /// The longest a reader's read may take (the store's retries included): a faulting
    /// thread waits no longer.
    read_bound: Duration,
}

/// The store id of a whole-unit value (ids below are single pages' slots).
const UNIT_ID: u64 = 1 << 62;

/// What freeing a slot frees on the cluster.
enum Freed {
    /// The slot's own value.
    Page,
    /// Nothing yet: other slots still use the unit's value.
    None,
    /// The unit value with this first slot: the slot was its last.
    Unit(Slot),
}

/// Units stored as one value: by first slot (512-aligned), which of its slots still use
/// it. A whole unit is one value because it goes out and comes back whole: one field
/// of 2 MiB instead of 512 of 4 KiB is less work for the cluster and for us, per write,
/// per read and per delete (remote-bench on a local 3+3 cluster: 572-684 MB/s of
/// acknowledged 2 MiB values against 427-554 for the same bytes as 4 KiB values). Its
/// slots are freed one at a time (a rewritten page frees its stale slot at once); the
/// value goes with the last. A slot freed from a unit can be handed to another page and
/// then holds a value of its own: membership is per slot, not per range.
#[derive(Default)]
struct Units {
    live: HashMap<Slot, [u64; UNIT_PAGES / 64]>,
}

impl Units {
    /// The unit value holding slot `s`'s page: its first slot.
    fn holder(&self, s: Slot) -> Option<Slot> {
        let head = s - s % UNIT_PAGES as u64;
        let k = (s - head) as usize;
        self.live
            .get(&head)
            .filter(|bits| bits[k / 64] & (1 << (k % 64)) != 0)
            .map(|_| head)
    }

    /// Slot `s` is freed: which value goes.
    fn release(&mut self, s: Slot) -> Freed {
        let Some(head) = self.holder(s) else {
            return Freed::Page;
        };
        let k = (s - head) as usize;
        let bits = self.live.get_mut(&head).expect("holder");
        bits[k / 64] &= !(1 << (k % 64));
        if bits.iter().all(|&b| b == 0) {
            self.live.remove(&head);
            return Freed::Unit(head);
        }
        Freed::None
    }
}

/// Connect to the cluster named by `nodes` (`redis://HOST:PORT[,HOST:PORT...]`).
pub(crate) fn connect(nodes: &str) -> Result<Remote> {
    let mut cfg = RemoteConfig::from_list(nodes).map_err(remote_err)?;
    // a diagnostic switch: reads through the store's runtime only (to compare)
    if std::env::var_os("USWAP_REMOTE_DIRECT_READS").is_some_and(|v| v == "off") {
        cfg.direct_reads = false;
    }
    // a diagnostic switch: every value stored as it is (to compare)
    if std::env::var_os("USWAP_REMOTE_COMPRESS").is_some_and(|v| v == "off") {
        cfg.compress = false;
    }
    // the reader's own bound, and time for its thread to come round to the read
    let read_bound = cfg.retry_for + 2 * cfg.op_timeout + Duration::from_secs(5);
    RemoteStore::on_runtime_thread_start(crate::sys::heap::engine_thread_for_good);
    let store = RemoteStore::connect(cfg).map_err(remote_err)?;
    let handoff = Arc::new(Handoff::new()?);
    let reader = start_reader(&handoff, &store)?;
    Ok(Remote {
        store: Mutex::new(Some(store)),
        dead: AtomicBool::new(false),
        units: Mutex::new(Units::default()),
        forking: Mutex::new(None),
        children: Mutex::new(HashMap::new()),
        handoff,
        reader: Mutex::new(Some(reader)),
        read_bound,
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

    /// A client for one engine thread, woken through `event` (reads also on the
    /// thread's own connections, see [`RemoteCtx`]).
    pub(crate) fn client(&self, event: &OwnedFd) -> Option<RemoteClient> {
        if self.dead.load(Relaxed) {
            return None;
        }
        self.store().as_ref()?.client(Some(event.as_fd())).ok()
    }

    fn units(&self) -> std::sync::MutexGuard<'_, Units> {
        self.units.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slot `s` freed: its value goes (in the background), or, for a slot of a unit
    /// value, the unit's value with its last slot.
    pub(crate) fn release(&self, s: Slot) {
        if self.dead.load(Relaxed) {
            return;
        }
        let id = match self.units().release(s) {
            Freed::Page => s,
            Freed::Unit(head) => UNIT_ID | head,
            Freed::None => return,
        };
        if let Some(store) = self.store().as_ref() {
            store.delete_batch(&[id]);
        }
    }

    /// Reads slot `s`'s page into `page` for a fault served in the faulting thread
    /// (`fault::in_thread`), which may be a program's signal handler that interrupted
    /// anything, malloc included: the read is handed to the reader thread ([`Handoff`])
    /// and waited for without allocating. The reply is polled for up to `poll` before the
    /// thread sleeps (`PoolBuilder::own_read_poll_us`). False: not read (no store, the
    /// value is lost or damaged, or the cluster did not answer in time).
    pub(crate) fn read_blocking(&self, s: Slot, page: &mut [u8], poll: Duration) -> bool {
        if self.dead.load(Relaxed) || page.len() > PAGE_SIZE {
            return false;
        }
        let (id, at) = match self.units().holder(s) {
            Some(head) => (UNIT_ID | head, (s - head) as usize * PAGE_SIZE),
            None => (s, 0),
        };
        self.handoff.read(id, at, page, poll, self.read_bound)
    }

    /// Stops the reader thread (waiting for its read in progress).
    fn stop_reader(&self) {
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(reader) = reader {
            self.handoff.stop.store(true, SeqCst);
            crate::sys::mem::signal_eventfd(self.handoff.event.as_raw_fd());
            let _ = reader.join();
        }
    }

    /// The store's counters.
    pub(crate) fn counters(&self) -> Option<uswap_remote::RemoteCounters> {
        self.store().as_ref().map(|s| s.counters())
    }

    /// The store id of slot `s`'s value: its own, or its unit's.
    fn id_of(&self, s: Slot) -> u64 {
        self.units().holder(s).map_or(s, |head| UNIT_ID | head)
    }

    /// Before a fork (every engine thread out of the engine): what the child will need;
    /// returns the child's token (`None`: no store, the child's tier stays dead).
    pub(crate) fn prepare_fork(&self) -> Option<u64> {
        if self.dead.load(Relaxed) {
            return None;
        }
        let inh = match self.store().as_ref()?.fork_inheritance() {
            Ok(inh) => inh,
            Err(err) => {
                say!("uswap: fork: {err}");
                return None;
            }
        };
        let token = inh.token();
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, inh.child_prefix());
        *self.forking.lock().unwrap_or_else(|p| p.into_inner()) = Some(inh);
        Some(token)
    }

    /// Child `token` and its descendants are gone: what its store left goes.
    pub(crate) fn child_gone(&self, token: u64) {
        let prefix = self
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
        if let (Some(prefix), Some(store)) = (prefix, self.store().as_ref()) {
            store.reap_child(&prefix);
        }
    }

    /// In the parent after a fork.
    pub(crate) fn after_fork_parent(&self) {
        self.forking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// In a forked child, first: the parent's connections are not ours. The store is
    /// forgotten (dropping it would wait on threads that do not exist here), and requests
    /// fail until [`Remote::fork_child_connect`] (slots released meanwhile are the
    /// parent's: nothing of theirs is deleted).
    pub(crate) fn fork_child_begin(&self) {
        self.dead.store(true, Relaxed);
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if let Some(s) = self.store().take() {
            std::mem::forget(s);
        }
        // The reader thread is not in the child (its handle names a thread of the parent),
        // and no read was asked of it when the fork came: SIGBUS handlers had left.
        std::mem::forget(self.reader.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Err(err) = self.handoff.reset() {
            // no reader will start: in-thread faults on this tier fail, none waits
            self.handoff.stop.store(true, SeqCst);
            say!("uswap: after fork: {err}");
        }
    }

    /// In a forked child, before its engine threads start: a store of its own, which
    /// also reads what the child inherited.
    pub(crate) fn fork_child_connect(&self) {
        let Some(inh) = self
            .forking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let connected = RemoteStore::connect_child(inh)
            .map_err(remote_err)
            .and_then(|store| Ok((start_reader(&self.handoff, &store)?, store)));
        match connected {
            Ok((reader, store)) => {
                *self.store() = Some(store);
                *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(reader);
                self.dead.store(false, Relaxed);
            }
            Err(err) => say!(
                "uswap: after fork: the child cannot connect to the remote tier ({err}): pages \
                 it evicts stay in RAM, and pages it inherited there raise SIGBUS when touched"
            ),
        }
    }

    /// The pool ends: its values go, except those of `children` (token, slots) that are
    /// still alive, which are left to them.
    pub(crate) fn close(&self, children: Vec<(u64, Vec<Slot>)>) {
        let holds: Vec<ChildHold> = children
            .into_iter()
            .map(|(token, slots)| ChildHold {
                token,
                ids: slots.into_iter().map(|s| self.id_of(s)).collect(),
            })
            .collect();
        self.stop_reader();
        if let Some(s) = self.store().take() {
            if let Err(err) = s.close_with(&holds) {
                say!("uswap: {err}");
            }
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.close(Vec::new());
    }
}

/// Reads for faults served in the faulting thread, asked of the tier's reader thread.
///
/// Such a fault may come from a program's signal handler that interrupted its thread
/// anywhere: inside malloc, holding an arena lock. A read of the cluster on that thread
/// (connections, request and reply buffers, the store's live set, the runtime as its
/// fallback) allocates, and waited for that lock for good (issue 40). So the faulting
/// thread only claims one of a fixed set of asks with atomics, wakes the reader through
/// an eventfd, and waits on the ask's state word (polled, then a futex): no allocation,
/// no lock of the store, and nothing per thread to set up (any program thread may fault,
/// first in a handler, or while its thread-locals are being destroyed). The reader, an
/// engine thread with the program's signals held, reads with the same direct path the
/// faulting thread used to, and copies the page into the ask's buffer.
struct Handoff {
    asks: Box<[Ask]>,
    /// The reader sleeps on it; a faulting thread signals it after its ask.
    event: OwnedFd,
    /// The reader thread ends (the pool closes).
    stop: AtomicBool,
    /// How long the reader polls its sockets before it sleeps (`own_read_poll_us`).
    poll_us: AtomicU64,
}

/// One read asked of the reader. Its `state` says whose it is:
/// FREE → (faulting thread) CLAIMED → ASKED → (reader) TAKEN → DONE / FAILED →
/// (faulting thread) FREE. A faulting thread that stops waiting turns ASKED or TAKEN into
/// ABANDONED, which the reader turns into FREE.
struct Ask {
    state: AtomicU32,
    /// The store id of the value.
    id: AtomicU64,
    /// Where the page is in the value (a whole unit's holds 512).
    at: AtomicUsize,
    /// The page read (the reader writes it before DONE, the faulting thread reads it
    /// after; never both at once).
    page: Mutex<Box<[u8]>>,
}

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const ASKED: u32 = 2;
const TAKEN: u32 = 3;
const DONE: u32 = 4;
const FAILED: u32 = 5;
const ABANDONED: u32 = 6;

/// Reads asked at once, at most: one per thread in a fault (a fault's thread holds its
/// asynchronous signals, so it never asks twice); more threads wait for a free ask.
const ASKS: usize = 64;

impl Handoff {
    fn new() -> Result<Handoff> {
        Ok(Handoff {
            asks: (0..ASKS)
                .map(|_| Ask {
                    state: AtomicU32::new(FREE),
                    id: AtomicU64::new(0),
                    at: AtomicUsize::new(0),
                    page: Mutex::new(vec![0u8; PAGE_SIZE].into_boxed_slice()),
                })
                .collect(),
            event: crate::sys::mem::eventfd()?,
            stop: AtomicBool::new(false),
            poll_us: AtomicU64::new(0),
        })
    }

    /// In a forked child: no reader yet, every ask free (none was asked at the fork),
    /// and an eventfd of its own. The one inherited is the parent's too: each process's
    /// reader would consume the others' wake-ups and leave their asks waiting.
    fn reset(&self) -> Result<()> {
        for a in self.asks.iter() {
            a.state.store(FREE, SeqCst);
        }
        let fresh = crate::sys::mem::raw_eventfd().map_err(|source| Error::Sys {
            op: "eventfd",
            source,
        })?;
        crate::sys::mem::replace_fd(fresh, self.event.as_raw_fd());
        self.stop.store(false, SeqCst);
        Ok(())
    }

    /// The faulting thread's side: asks for the page at `at` of value `id`, waits for it
    /// (at most `bound`) and copies it into `page`. Allocates nothing and takes no lock
    /// another thread may hold while it waits for this one.
    fn read(&self, id: u64, at: usize, page: &mut [u8], poll: Duration, bound: Duration) -> bool {
        let started = Instant::now();
        let ask = loop {
            if self.stop.load(SeqCst) || started.elapsed() > bound {
                return false;
            }
            let free = self.asks.iter().find(|a| {
                a.state
                    .compare_exchange(FREE, CLAIMED, Acquire, Relaxed)
                    .is_ok()
            });
            match free {
                Some(a) => break a,
                None => {
                    // every ask in use: have the reader free those given up on
                    crate::sys::mem::signal_eventfd(self.event.as_raw_fd());
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        };
        ask.id.store(id, Relaxed);
        ask.at.store(at, Relaxed);
        self.poll_us.store(poll.as_micros() as u64, Relaxed);
        ask.state.store(ASKED, Release);
        crate::sys::mem::signal_eventfd(self.event.as_raw_fd());
        loop {
            let state = ask.state.load(Acquire);
            if state == DONE || state == FAILED {
                let good = state == DONE;
                if good {
                    let bytes = ask.page.lock().unwrap_or_else(|p| p.into_inner());
                    page.copy_from_slice(&bytes[..page.len()]);
                }
                ask.state.store(FREE, Release);
                return good;
            }
            let waited = started.elapsed();
            if waited > bound || self.stop.load(SeqCst) {
                // the reader frees it when (if) it finishes
                if ask
                    .state
                    .compare_exchange(state, ABANDONED, AcqRel, Acquire)
                    .is_ok()
                {
                    return false;
                }
                continue;
            }
            if waited < poll {
                std::thread::yield_now();
            } else {
                crate::sys::mem::futex_wait(&ask.state, state, Duration::from_millis(100));
            }
        }
    }

    /// The reader thread's side: ends an ask it took (`page`: the bytes read, if any).
    fn finish(&self, ask: &Ask, page: Option<&[u8]>) {
        if let Some(bytes) = page {
            ask.page
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .copy_from_slice(bytes);
        }
        let end = if page.is_some() { DONE } else { FAILED };
        if ask
            .state
            .compare_exchange(TAKEN, end, AcqRel, Acquire)
            .is_err()
        {
            // abandoned meanwhile: nobody waits for it
            ask.state.store(FREE, Release);
        }
        crate::sys::mem::futex_wake(&ask.state);
    }
}

/// Starts the reader thread of `handoff` on `store`: it sleeps until asked, takes every
/// read asked, reads them at once on its own connections (`DirectReads`, the store's
/// runtime as their fallback), and ends each.
fn start_reader(handoff: &Arc<Handoff>, store: &RemoteStore) -> Result<JoinHandle<()>> {
    let client = store.client(None).map_err(remote_err)?;
    let h = handoff.clone();
    crate::threads::spawn_named("uswap-remote-reader".into(), move || {
        let mut reader: DirectReads = client.reader();
        let mut taken: Vec<(usize, u64)> = Vec::with_capacity(ASKS);
        let mut ids: Vec<u64> = Vec::with_capacity(ASKS);
        loop {
            crate::sys::mem::wait_eventfd(h.event.as_raw_fd());
            if h.stop.load(SeqCst) {
                return;
            }
            loop {
                taken.clear();
                for (k, a) in h.asks.iter().enumerate() {
                    match a.state.load(Acquire) {
                        ASKED
                            if a.state
                                .compare_exchange(ASKED, TAKEN, AcqRel, Acquire)
                                .is_ok() =>
                        {
                            taken.push((k, a.id.load(Relaxed)));
                        }
                        // asked and given up on before this thread took it
                        ABANDONED => {
                            let _ = a.state.compare_exchange(ABANDONED, FREE, AcqRel, Relaxed);
                        }
                        _ => {}
                    }
                }
                if taken.is_empty() {
                    break;
                }
                ids.clear();
                ids.extend(taken.iter().map(|&(_, id)| id));
                let poll = Duration::from_micros(h.poll_us.load(Relaxed));
                let results = reader.get_all_blocking(&ids, poll);
                for (&(k, id), result) in taken.iter().zip(results) {
                    let a = &h.asks[k];
                    let want = if id & UNIT_ID != 0 {
                        UNIT_PAGES * PAGE_SIZE
                    } else {
                        PAGE_SIZE
                    };
                    let at = a.at.load(Relaxed);
                    let page = match &result {
                        Ok(bytes) if bytes.len() == want && at + PAGE_SIZE <= want => {
                            Some(&bytes[at..at + PAGE_SIZE])
                        }
                        _ => None,
                    };
                    h.finish(a, page);
                }
            }
        }
    })
}

/// A thread's requests to the remote tier in flight.
///
/// Reads go out on the thread's own connections to the primaries (`DirectReads`): the
/// thread polls those sockets in its ring and parses the replies itself, so a fault pays
/// one wake-up (the reply's) instead of two hand-offs through the store's runtime; what
/// that path cannot answer it hands to the runtime, whose completions come back through
/// `event`. Writes always go through the runtime (they wait for replicas and retry).
pub(crate) struct RemoteCtx {
    pub(crate) client: RemoteClient,
    /// Wakes the thread on completions (polled in its ring).
    pub(crate) event: OwnedFd,
    direct: Option<DirectReads>,
    ops: HashMap<u64, Pending>,
    /// A read's value token → its request's token, and the value it asked for.
    pages: HashMap<u64, (u64, Wanted)>,
    next: u64,
    done: Vec<Completion>,
}

/// A value a read asked for: its length (a page's, or a whole unit's), and for each
/// page it fills, (the page's index in the request, the page's index in the value).
struct Wanted {
    len: usize,
    pages: Vec<(usize, usize)>,
}

/// One request: writes complete with one completion, reads with one per value.
struct Pending {
    op: Op,
    left: usize,
    failed: bool,
}

/// Whether a write stores its pages as one unit value: a whole unit (its first slot
/// 512-aligned) of a region whose units are swapped in whole.
fn unit_value(op: &Op) -> bool {
    op.kind == OpKind::Write
        && op.region.policy.unit == UnitPolicy::Huge
        && op.pages.len() == UNIT_PAGES
        && op.slot.is_multiple_of(UNIT_PAGES as u64)
}

impl RemoteCtx {
    pub(crate) fn new(client: RemoteClient, event: OwnedFd) -> RemoteCtx {
        RemoteCtx {
            direct: client.direct(),
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

    /// Start `op`: a write sends every page as its own value in one batch (a whole
    /// unit of a `--unit 2m` region as one value); a read asks for each value holding
    /// its pages (tokens `base + 1 ..`).
    pub(crate) fn submit(&mut self, remote: &Remote, frames: &crate::frames::Frames, op: Op) {
        let token = self.next;
        self.next += op.pages.len() as u64 + 1;
        let n = op.pages.len();
        match op.kind {
            OpKind::Write => {
                let items = if unit_value(&op) {
                    let mut unit = Vec::with_capacity(n * PAGE_SIZE);
                    for &f in &op.frames {
                        unit.extend_from_slice(frames.page(f));
                    }
                    // marked before the write: a slot is read only after its write
                    // completed, and a failed write's slots are released like others
                    remote
                        .units()
                        .live
                        .insert(op.slot, [u64::MAX; UNIT_PAGES / 64]);
                    vec![(UNIT_ID | op.slot, unit)]
                } else {
                    (0..n)
                        .map(|k| (op.slot + k as u64, frames.page(op.frames[k]).to_vec()))
                        .collect()
                };
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
                // one request per value: a page's own, or its unit's (read whole, once
                // per request however its pages interleave with others')
                let mut values: Vec<(u64, Wanted)> = Vec::new();
                let mut unit_at: HashMap<Slot, usize> = HashMap::new();
                {
                    let units = remote.units();
                    for k in 0..n {
                        let s = op.slot + k as u64;
                        let Some(head) = units.holder(s) else {
                            values.push((
                                s,
                                Wanted {
                                    len: PAGE_SIZE,
                                    pages: vec![(k, 0)],
                                },
                            ));
                            continue;
                        };
                        let v = *unit_at.entry(head).or_insert_with(|| {
                            values.push((
                                UNIT_ID | head,
                                Wanted {
                                    len: UNIT_PAGES * PAGE_SIZE,
                                    pages: Vec::new(),
                                },
                            ));
                            values.len() - 1
                        });
                        values[v].1.pages.push((k, (s - head) as usize));
                    }
                }
                let left = values.len();
                let reqs: Vec<(u64, u64)> = values
                    .into_iter()
                    .enumerate()
                    .map(|(v, (id, wanted))| {
                        let t = token + 1 + v as u64;
                        self.pages.insert(t, (token, wanted));
                        (t, id)
                    })
                    .collect();
                match self.direct.as_mut() {
                    Some(d) => {
                        // Whole units through the runtime: a 2 MiB read is bound by its
                        // transfer, not by wake-ups, and its copies then run on the
                        // runtime's threads instead of the fault thread. (swap-w-seq 2m
                        // with every read direct: 420-506 MB/s against 458-510 through
                        // the runtime, 3 alternating runs: no difference past the noise.)
                        let (units, pages): (Vec<_>, Vec<_>) =
                            reqs.into_iter().partition(|&(_, id)| id & UNIT_ID != 0);
                        if !units.is_empty() {
                            self.client.get_batch(units);
                        }
                        if !pages.is_empty() {
                            d.get_batch(pages);
                        }
                    }
                    None => self.client.get_batch(reqs),
                }
                self.ops.insert(
                    token,
                    Pending {
                        op,
                        left,
                        failed: false,
                    },
                );
            }
        }
    }

    /// Arm a poll in `ring` on each of the thread's connections that owes replies.
    pub(crate) fn arm(&mut self, ring: &mut crate::ring::Ring) {
        if let Some(d) = self.direct.as_mut() {
            d.arm(|token, fd| ring.poll(fd, crate::ring::TOKEN_DIRECT_BASE - token));
        }
    }

    /// Replies owed on the thread's own connections.
    pub(crate) fn direct_owed(&self) -> bool {
        self.direct.as_ref().is_some_and(|d| d.owed() > 0)
    }

    /// A poll armed by `arm` fired (`token`: its user_data).
    pub(crate) fn readable(&mut self, token: u64) {
        if let Some(d) = self.direct.as_mut() {
            d.readable(crate::ring::TOKEN_DIRECT_BASE - token);
        }
    }

    /// When the thread must wake even if nothing arrives: a connection silent past its
    /// deadline gives its reads to the store's runtime (`expire`).
    pub(crate) fn deadline(&self) -> Option<std::time::Instant> {
        self.direct.as_ref().and_then(|d| d.deadline())
    }

    /// Connections past their deadline: their reads go to the store's runtime.
    pub(crate) fn expire(&mut self) {
        if let Some(d) = self.direct.as_mut() {
            d.expire();
        }
    }

    /// Completions in: finished requests with their results. A write that did not
    /// count fails (-EIO: written elsewhere, or kept); a read completes whole, and a
    /// page that did not come back is marked lost in it (`Op::lost`): read again, then
    /// poisoned (the other pages of the request are good).
    pub(crate) fn drain(
        &mut self,
        remote: &Remote,
        frames: &crate::frames::Frames,
        out: &mut Vec<(Op, i32)>,
    ) {
        crate::sys::mem::drain_eventfd(std::os::fd::AsRawFd::as_raw_fd(&self.event));
        self.done.clear();
        if let Some(d) = self.direct.as_mut() {
            d.poll_completions(&mut self.done);
        }
        self.client.poll_completions(&mut self.done);
        for c in self.done.drain(..) {
            let (base, wanted) = match self.pages.remove(&c.token) {
                Some((b, wanted)) => (b, Some(wanted)),
                None => (c.token, None),
            };
            let Some(p) = self.ops.get_mut(&base) else {
                continue;
            };
            match (&c.result, wanted) {
                // a page's own value, or its unit's (pages at their offsets)
                (Ok(Some(bytes)), Some(w)) if bytes.len() == w.len => {
                    for (k, at) in w.pages {
                        let src = &bytes[at * PAGE_SIZE..(at + 1) * PAGE_SIZE];
                        frames.page_mut(p.op.frames[k]).copy_from_slice(src);
                    }
                }
                (Ok(_), None) => {}
                (_, wanted) => {
                    p.failed = true;
                    if p.op.kind == OpKind::Read {
                        let n = p.op.pages.len();
                        p.op.lost.resize(n, false);
                        match wanted {
                            Some(w) => w.pages.iter().for_each(|&(k, _)| p.op.lost[k] = true),
                            None => p.op.lost.fill(true),
                        }
                    }
                }
            }
            p.left -= 1;
            if p.left == 0 {
                let p = self.ops.remove(&base).expect("just seen");
                let res = if p.failed && p.op.kind == OpKind::Write {
                    if unit_value(&p.op) {
                        // not stored: a retry marks the slots again, and slots given
                        // up on are never freed (they are bad)
                        remote.units().live.remove(&p.op.slot);
                    }
                    -libc::EIO
                } else {
                    p.op.bytes() as i32
                };
                out.push((p.op, res));
            }
        }
    }
}
