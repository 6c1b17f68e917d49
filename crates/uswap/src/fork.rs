//! fork(2): the child gets its own copy-on-write view of every region, swapped-out
//! pages included, and an engine of its own.
//!
//! Both processes keep referring to the slots the parent's pages had at the fork,
//! as the kernel's swap map does with its per-slot counts (seed 001). Here the
//! count lives in each process's own memory, so the parent holds one reference per
//! slot on the child's behalf (taken in `prepare`, with every engine thread out of
//! the engine) for as long as the child may read them, and never reuses them
//! meanwhile. It learns that the child and everything it forked are gone from a
//! pipe: the child holds the write end (close-on-exec, inherited by its own
//! children), and the parent's reclaim thread polls the read end, which reports
//! hang-up when the last holder exits, is killed or execs. The child reads those
//! slots from the parent's swap file, writes new pages to a file of its own (made
//! when it first needs one), and closes its descriptor of the parent's file once
//! none of its pages is there any more (`tier/file.rs`). So every process holds one
//! file of its own plus what it still reads, disk use falls as processes go, and a
//! killed child leaves nothing behind.
//!
//! The hooks run for every pool of the process; the engine registers them with
//! `pthread_atfork` when the first pool starts, and they may also be called by hand
//! (each fork is handled once however often they are called).

use crate::budget::Gauge;
use crate::engine::{live_engines, Engine};
use crate::pagemap::PageState;
use crate::slots::Slot;
use crate::swap_cache::CacheState;
use crate::sys::mem::{raw_eventfd, replace_fd, SignalsHeld};
use crate::sys::uffd::{Uffd, Wake, REGISTER_MISSING, REGISTER_WP};
use crate::threads::{ThreadCtx, Threads};
use crate::{PAGE_SIZE, UNIT_PAGES};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

/// A fork between its prepare and parent/child hooks.
struct Prepared {
    read_end: OwnedFd,
    write_end: OwnedFd,
    /// Slots the parent holds a reference to on the child's behalf.
    slots: Vec<Slot>,
    /// The child's token on the remote tier.
    token: Option<u64>,
}

/// A child (and its descendants) that may still read this process's slots.
struct Child {
    id: u64,
    pipe: OwnedFd,
    slots: Vec<Slot>,
    armed: bool,
    token: Option<u64>,
}

/// Fork state of one engine.
pub(crate) struct ForkState {
    /// A fork is being prepared: threads and API calls wait at `enter`.
    pending: AtomicBool,
    /// Threads and API calls inside the engine now.
    active: AtomicUsize,
    prepared: Mutex<Option<Prepared>>,
    children: Mutex<Vec<Child>>,
    next_child: AtomicU64,
}

/// Proof of being inside the engine: no fork may start until it drops.
pub(crate) struct Active<'a>(&'a ForkState);

/// A program thread inside the engine: it leaves the engine, then takes its signals.
pub(crate) struct FromProgram<'a> {
    _active: Active<'a>,
    _signals: SignalsHeld,
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, SeqCst);
    }
}

impl ForkState {
    pub(crate) fn new() -> ForkState {
        ForkState {
            pending: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            prepared: Mutex::new(None),
            children: Mutex::new(Vec::new()),
            next_child: AtomicU64::new(1),
        }
    }

    /// Enter the engine: waits while a fork is being prepared.
    pub(crate) fn enter(&self) -> Active<'_> {
        loop {
            while self.pending.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            self.active.fetch_add(1, SeqCst);
            if !self.pending.load(SeqCst) {
                return Active(self);
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }

    /// Enter the engine from a program thread (an API call: a region made, discarded,
    /// dropped, locked, its counters read): as `enter`, with the thread's asynchronous
    /// signals held off until it leaves (`SignalsHeld`).
    pub(crate) fn enter_from_program(&self) -> FromProgram<'_> {
        let signals = SignalsHeld::new();
        FromProgram {
            _active: self.enter(),
            _signals: signals,
        }
    }

    /// Whether a fork is being prepared.
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(SeqCst)
    }
}

/// Serializes forks of the whole process (two threads forking at once).
static FORKING: AtomicBool = AtomicBool::new(false);

/// Call right before fork() (pthread_atfork "prepare"): quiesces every pool's
/// threads so that no engine lock is held across the fork, and takes the child's
/// references. The engine registers this itself; calling it by hand is harmless.
pub fn prepare_fork() {
    if FORKING.swap(true, SeqCst) {
        return; // this fork is already prepared (hooks registered twice)
    }
    // SIGBUS handlers first: they take the engine list and regions' locks before they
    // enter an engine, and wait for the fault threads that `prepare` stops.
    crate::fault::in_thread::hold_for_fork();
    for e in live_engines() {
        prepare(&e);
    }
}

/// Call in the parent right after fork().
pub fn after_fork_parent() {
    if !FORKING.load(SeqCst) {
        return;
    }
    for e in live_engines() {
        parent(&e);
    }
    crate::fault::in_thread::release_after_fork(false);
    FORKING.store(false, SeqCst);
}

/// Call in the child right after fork(): gives the child's regions their own
/// engine (new userfaultfd, threads, rings; a swap file of its own for new writes).
pub fn after_fork_child() {
    if !FORKING.load(SeqCst) {
        return;
    }
    // The child's engine threads inherit this mask (`Threads::spawn`).
    let _signals = SignalsHeld::new();
    for e in live_engines() {
        child(&e);
    }
    crate::fault::in_thread::release_after_fork(true);
    FORKING.store(false, SeqCst);
}

extern "C" fn atfork_prepare() {
    prepare_fork();
}
extern "C" fn atfork_parent() {
    after_fork_parent();
}
extern "C" fn atfork_child() {
    after_fork_child();
}

/// Register the fork hooks once per process.
pub(crate) fn register_hooks() {
    // The heap's hooks first: its lock is taken after these quiesce the engine, and
    // released before the child's engine starts its threads.
    crate::sys::heap::register_fork_hooks();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers three `extern "C"` functions without arguments, which
        // live as long as the program.
        unsafe {
            libc::pthread_atfork(
                Some(atfork_prepare),
                Some(atfork_parent),
                Some(atfork_child),
            );
        }
    });
}

/// Every slot a page map refers to (swapped pages, and clean resident pages whose
/// copy is still valid): what a child shares with its parent.
fn referenced_slots(e: &Engine) -> Vec<Slot> {
    let mut v = Vec::new();
    for r in e.regions.all() {
        for unit in r.units.iter() {
            let u = unit.lock();
            for i in 0..UNIT_PAGES {
                match u.get(i) {
                    PageState::Swapped(s) | PageState::Resident { slot: Some(s), .. } => v.push(s),
                    _ => {}
                }
            }
        }
    }
    v
}

fn prepare(e: &Arc<Engine>) {
    let f = &e.fork;
    f.pending.store(true, SeqCst);
    while f.active.load(SeqCst) > 0 {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    // Spares shared copy-on-write with the child would not move: none cross a fork.
    crate::spare::drop(e, usize::MAX);
    // Warm 2 MiB frames would be copied into the child for nothing (its frames are
    // emptied): none cross a fork either.
    crate::frames::drop_warm_units(e);
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors into a live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        say!(
            "uswap: fork: no pipe ({}); the parent will keep the slots it shares with \
             this child until it exits",
            std::io::Error::last_os_error()
        );
    }
    let slots = referenced_slots(e);
    for &s in &slots {
        e.tiers.dup_for_child(e, s);
    }
    let token = e.tiers.remote.as_ref().and_then(|r| r.prepare_fork());
    if fds[0] > 0 {
        // SAFETY: two fresh descriptors owned by nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        *f.prepared.lock().unwrap_or_else(|p| p.into_inner()) = Some(Prepared {
            read_end,
            write_end,
            slots,
            token,
        });
    }
}

fn parent(e: &Arc<Engine>) {
    let f = &e.fork;
    if let Some(r) = &e.tiers.remote {
        r.after_fork_parent();
    }
    if let Some(p) = f.prepared.lock().unwrap_or_else(|p| p.into_inner()).take() {
        // Only the child keeps the write end.
        drop(p.write_end);
        let id = f.next_child.fetch_add(1, Relaxed);
        f.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Child {
                id,
                pipe: p.read_end,
                slots: p.slots,
                armed: false,
                token: p.token,
            });
    }
    f.pending.store(false, SeqCst);
    e.threads.wake_kswapd();
}

/// Reclaim thread: poll the pipes of children not polled yet (their hang-up ends
/// the parent's references for them).
pub(crate) fn arm_child_polls(e: &Engine, ctx: &mut ThreadCtx) {
    let mut g = e.fork.children.lock().unwrap_or_else(|p| p.into_inner());
    for c in g.iter_mut().filter(|c| !c.armed) {
        c.armed = true;
        ctx.ring
            .poll(c.pipe.as_raw_fd(), crate::ring::TOKEN_POLL_BASE - c.id);
    }
}

/// Children that may still read this process's slots (their pipes not hung up): each
/// one's remote token and the slots held for it.
pub(crate) fn live_children(e: &Engine) -> Vec<(u64, Vec<Slot>)> {
    let g = e.fork.children.lock().unwrap_or_else(|p| p.into_inner());
    g.iter()
        .filter(|c| !crate::sys::mem::hung_up(c.pipe.as_raw_fd()))
        .filter_map(|c| Some((c.token?, c.slots.clone())))
        .collect()
}

/// The pipe of child `id` reported: the child and its descendants are gone, and
/// with them every reference held on their behalf.
pub(crate) fn child_poll_done(e: &Engine, id: u64) {
    let c = {
        let mut g = e.fork.children.lock().unwrap_or_else(|p| p.into_inner());
        let Some(i) = g.iter().position(|c| c.id == id) else {
            return;
        };
        g.swap_remove(i)
    };
    for s in c.slots {
        e.tiers.put_child_ref(e, s);
    }
    if let (Some(r), Some(token)) = (&e.tiers.remote, c.token) {
        r.child_gone(token);
    }
}

/// In a forked child: page `p` of unit `u`, whose write was in flight in the parent
/// (which may not finish it), comes back into its region from `src` (its bytes; `None`
/// if they are not good), dirty and without a slot; or is poisoned (SIGBUS when
/// touched). Its slot was released. Returns whether it came back.
pub(crate) fn take_back_page(
    r: &crate::pagemap::RegionInner,
    u: &mut crate::pagemap::UnitPages,
    p: u64,
    src: Option<*const u8>,
) -> bool {
    let i = p as usize % UNIT_PAGES;
    let dst = r.page_addr(p);
    let back = src.is_some_and(|src| r.uffd.copy(dst, src, PAGE_SIZE, false, Wake::Yes).is_ok());
    if back {
        let resident = PageState::Resident {
            dirty: true,
            slot: None,
        };
        u.set(i, resident);
        u.resident += 1;
    } else {
        u.set(i, PageState::Poisoned);
        r.counters.poisoned.fetch_add(1, Relaxed);
        let _ = r.uffd.poison(dst, PAGE_SIZE);
    }
    back
}

fn child(e: &Arc<Engine>) {
    let f = &e.fork;
    // The parent's pipes are not ours (the write end of this fork is: keep it).
    if let Some(p) = f.prepared.lock().unwrap_or_else(|p| p.into_inner()).take() {
        drop(p.read_end);
        std::mem::forget(p.write_end);
    }
    f.children.lock().unwrap_or_else(|p| p.into_inner()).clear();
    e.live.forget_after_fork();
    // This process's own descriptors, at the same numbers.
    match Uffd::open() {
        Ok(u) => replace_fd(u.into_raw(), e.uffd.raw()),
        Err(err) => {
            say!(
                "uswap: after fork: no userfaultfd in the child ({err}); its regions are \
                 plain memory now"
            );
            f.pending.store(false, SeqCst);
            return;
        }
    }
    if let Some(old) = e.uffd_in_thread.get() {
        match Uffd::open_sigbus() {
            Ok(u) => replace_fd(u.into_raw(), old.raw()),
            Err(err) => say!("uswap: after fork: no in-thread userfaultfd ({err})"),
        }
    }
    for fd in e.threads.event_fds() {
        match raw_eventfd() {
            Ok(new) => replace_fd(new, fd),
            Err(err) => say!("uswap: after fork: eventfd: {err}"),
        }
    }
    e.zapper.reopen();
    if let Err(err) = e.frames.register(&e.uffd) {
        say!("uswap: after fork: cannot register the swap cache's frames: {err}");
    }
    // The remote tier first: the slots released below must not reach the parent's
    // connections (their threads do not exist here) nor delete its values.
    if let Some(r) = &e.tiers.remote {
        r.fork_child_begin();
    }
    // Regions: registered again, each with its own kind of descriptor (the fault
    // threads' or the in-thread one, both new here); the parent's I/O does not land
    // here, so every cache copy goes (a page whose write was in flight comes back from
    // its frame).
    let mut resident_back = 0i64;
    for r in e.regions.all() {
        if let Err(err) = r
            .uffd
            .register(r.base, r.len, REGISTER_MISSING | REGISTER_WP)
        {
            say!("uswap: after fork: cannot register region {}: {err}", r.id);
            continue;
        }
        for (ui, unit) in r.units.iter().enumerate() {
            let mut u = unit.lock();
            u.unit_reads = 0;
            u.prefetched = false;
            let first = (ui * UNIT_PAGES) as u64;
            resident_back += crate::tier::packed::fork_child_unit(e, &r, &mut u, first);
            let mut clean: Vec<(usize, usize)> = Vec::new();
            for i in 0..UNIT_PAGES {
                let p = first + i as u64;
                match u.get(i) {
                    // fork dropped the write-protect bits: put them back on clean pages.
                    PageState::Resident { dirty: false, .. } => match clean.last_mut() {
                        Some(last) if last.0 + last.1 == r.page_addr(p) => last.1 += PAGE_SIZE,
                        _ => clean.push((r.page_addr(p), PAGE_SIZE)),
                    },
                    PageState::Swapped(s) => match e.cache.remove(s) {
                        // The parent's write may not finish: this copy comes back
                        // (decrypted first: a frame under write holds ciphertext).
                        Some(en) if en.state == CacheState::Writing => {
                            e.slots.clear_cache(s);
                            let plain = crate::tier::seal::open_frame(e, s, en.frame);
                            e.tiers.release(e, s);
                            if !plain {
                                say!(
                                    "uswap: after fork: page {p} of region {} does not \
                                     decrypt: poisoned",
                                    r.id
                                );
                            }
                            let src = plain.then_some(en.frame as *const u8);
                            resident_back += i64::from(take_back_page(&r, &mut u, p, src));
                        }
                        Some(_) => {
                            e.slots.clear_cache(s);
                        }
                        None => {}
                    },
                    _ => {}
                }
            }
            for (a, l) in clean {
                if r.uffd.write_protect(a, l, true, Wake::Yes).is_err() {
                    // Unprotected, a write would go unseen and eviction would trust
                    // the slot: the pages are dirty from here on.
                    let at = (a - r.page_addr(first)) / PAGE_SIZE;
                    for i in at..at + l / PAGE_SIZE {
                        if let PageState::Resident { dirty: false, slot } = u.get(i) {
                            let slot = slot.and_then(|s| crate::fault::stale_slot_of(e, &r, s));
                            u.set(i, PageState::Resident { dirty: true, slot });
                        }
                    }
                }
            }
            if u.resident > 0 {
                unit.on_lru.store(false, Relaxed);
                crate::reclaim::lru_add(e, &r, first, &u);
            }
        }
    }
    // Orphans of the parent's I/O. (The slot allocator alone, here and above: what the
    // tiers keep is the parent's until the remote tier is let go of below.)
    for (s, _) in e.cache.drain() {
        e.slots.clear_cache(s);
    }
    e.frames.reset_after_fork(&e.zapper);
    e.lists.clear_inactive();
    let cached = e.budget.pages_in(Gauge::Cached);
    e.budget.uncharge(Gauge::Cached, cached);
    e.budget.charge(Gauge::Resident, resident_back);
    e.budget.reset_faults();
    // The parent's file is read-only here; new pages go to a file of our own.
    let mut refs: std::collections::BTreeMap<Slot, u64> = Default::default();
    for s in referenced_slots(e) {
        *refs.entry(s).or_default() += 1;
    }
    let refs: Vec<(Slot, u64)> = refs.into_iter().collect();
    let limit = {
        let mut file = e.tiers.file_mut();
        file.fork_child(&refs);
        file.base()
    };
    e.slots.freeze_below(limit);
    // Our own file gets our own key: parent and child count write generations on
    // from the same value and may use the same slot numbers (`tier/seal.rs`).
    if let Some(s) = &e.tiers.seal {
        if !s.fork_child(limit) {
            say!(
                "uswap: after fork: cannot make an encryption key for the child's swap \
                 file; its pages stay in RAM, over budget"
            );
        }
    }
    if let Some(r) = &e.tiers.remote {
        r.fork_child_connect();
    }
    e.tiers.inflight_reset();
    e.tiers.packed.reset_after_fork();
    e.threads.forget_after_fork();
    f.active.store(0, SeqCst);
    f.pending.store(false, SeqCst);
    if let Err(err) = Threads::spawn(e) {
        say!("uswap: after fork: cannot start threads: {err}");
    }
}
