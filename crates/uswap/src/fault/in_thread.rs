//! In-thread faults, for regions that ask for them (`RegionOptions::in_thread`).
//!
//! A region registered with the pool's second userfaultfd (UFFD_FEATURE_SIGBUS) does
//! not queue its faults for a fault thread: the kernel raises SIGBUS in the faulting
//! thread, whose handler (here) serves the fault itself and returns, and the access
//! runs again. A major fault then costs the read and a few microseconds, with no
//! thread woken on either side (a wake-up across vCPUs costs ~20 µs each way on this
//! VM, twice per fault in the handler-thread design). Reads of the back tier go into a
//! frame and are waited for here: an O_DIRECT read on the thread's own small ring (on
//! the remote tier: a request on the thread's own connection to the primary), whose
//! end the thread polls for, yielding its CPU to any runnable thread between looks,
//! before it sleeps (`PoolBuilder::own_read_poll_us`; 0: a plain pread): on this VM
//! a 4 KiB read waited for asleep takes ~10 µs longer than one polled for (`uswap
//! bench fault-latency` measures both). The page is mapped with UFFDIO_COPY: dirty and
//! writable for a write access (x86-64's signal frame says which), else write-protected
//! (the page is clean until written; a write then traps once more and unprotects it).
//! Swap-cache hits, readahead results and writes in flight are served as usual; a
//! page whose read is in flight on a fault thread is waited for.
//!
//! Costs of the mode, said in the docs: a system call that touches a page of such a
//! region that is not mapped fails with EFAULT (the kernel cannot deliver SIGBUS
//! there), so hand such memory to `read(2)` and friends only once it is resident; the
//! handler allocates, so the region must not hold the data of the allocator itself;
//! a program that installs its own SIGBUS handler afterwards must chain to the one it
//! replaced (as JVMs do). Other SIGBUS (a poisoned page: its bytes were lost, a real
//! bus error) go to the handler that was there before, or kill the process as usual.

use crate::budget::Gauge;
use crate::engine::{Engine, ENGINES};
use crate::error::{Error, Result};
use crate::pagemap::{PageState, RegionInner};
use crate::swap_cache::Lookup;
use crate::sys::uffd::{Uffd, Wake};
use crate::tier::Location;
use crate::{PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

/// The pool's in-thread userfaultfd, made (and the SIGBUS handler installed) on first
/// use.
pub(crate) fn uffd(e: &Engine) -> Result<Arc<Uffd>> {
    if let Some(u) = e.uffd_in_thread.get() {
        return Ok(u.clone());
    }
    install_handler()?;
    let u = Arc::new(Uffd::open_sigbus()?);
    Ok(e.uffd_in_thread.get_or_init(|| u).clone())
}

/// The SIGBUS disposition before ours, to chain to.
static PREVIOUS: Mutex<Option<libc::sigaction>> = Mutex::new(None);

/// Threads inside the handler's engine work now (from before the engine list is looked
/// at until the fault is served).
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
/// A fork is being prepared: handlers wait before they take any lock.
static FORK_HELD: AtomicBool = AtomicBool::new(false);

/// Proof of being inside the handler's engine work: a fork waits until it drops.
struct HandlerGate;

impl HandlerGate {
    fn enter() -> HandlerGate {
        loop {
            while FORK_HELD.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            IN_HANDLER.fetch_add(1, SeqCst);
            if !FORK_HELD.load(SeqCst) {
                return HandlerGate;
            }
            IN_HANDLER.fetch_sub(1, SeqCst);
        }
    }
}

impl Drop for HandlerGate {
    fn drop(&mut self) {
        IN_HANDLER.fetch_sub(1, SeqCst);
    }
}

/// Before fork: hold new SIGBUS handlers off and wait for those inside to leave, so that
/// no lock they take (the engine list, a region table, a unit, a cache shard, a frame
/// lock) is copied held into the child. Handlers that wait (for room, for another
/// thread's I/O) leave while a fork is held; their accesses fault again after it.
pub(crate) fn hold_for_fork() {
    FORK_HELD.store(true, SeqCst);
    while IN_HANDLER.load(SeqCst) > 0 {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// After fork, in the parent and the child. The child has no other thread, so none is
/// inside a handler (one may have been counted between the wait above and the fork).
pub(crate) fn release_after_fork(child: bool) {
    if child {
        IN_HANDLER.store(0, SeqCst);
    }
    FORK_HELD.store(false, SeqCst);
}

fn fork_held() -> bool {
    FORK_HELD.load(SeqCst)
}

fn install_handler() -> Result<()> {
    let mut prev = PREVIOUS.lock().unwrap_or_else(|p| p.into_inner());
    if prev.is_some() {
        return Ok(());
    }
    // SAFETY: sigaction is plain data; zeroed is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
    // Every asynchronous signal is held off while the handler runs: a program's own
    // handler (a timer's, a profiler's) would otherwise run on top of a fault that holds
    // its unit's lock, and one that touches the same unit would wait for itself.
    // Synchronous signals stay open (SIGBUS too: SA_NODEFER keeps it open for a fault
    // of the handler itself, which goes on to the previous handler).
    sa.sa_mask = crate::sys::mem::async_signals();
    // SAFETY: same as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installs a handler for SIGBUS with live structs; `old` gets the previous.
    if unsafe { libc::sigaction(libc::SIGBUS, &sa, &mut old) } != 0 {
        return Err(Error::sys("sigaction(SIGBUS)"));
    }
    *prev = Some(old);
    Ok(())
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // The interrupted code may be between a system call and its read of errno: the
    // system calls made here (a remote read's EAGAIN, EINPROGRESS...) must not show.
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // A userfaultfd fault raises BUS_ADRERR; a poisoned page BUS_MCEERR_AR (or also
    // BUS_ADRERR without CONFIG_MEMORY_FAILURE: `serve` tells them apart by state).
    if code == libc::BUS_ADRERR && serve(addr, is_write(uctx)) {
        set_errno(errno);
        return;
    }
    set_errno(errno);
    let prev = {
        let _gate = HandlerGate::enter();
        *PREVIOUS.lock().unwrap_or_else(|p| p.into_inner())
    };
    // Outside the gate: the previous handler may never return (a JVM's longjmps).
    chain(prev, sig, info, uctx);
}

/// Whether the faulting access was a write. On x86-64 the signal frame carries the page
/// fault's error code (bit 1: a write); a write fault on a swapped page then maps it
/// dirty and writable at once, as a fault thread does, instead of clean and then
/// trapping a second time to unprotect it. Elsewhere: false (that second trap).
fn is_write(uctx: *mut libc::c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if uctx.is_null() {
            return false;
        }
        // SAFETY: an SA_SIGINFO handler's third argument is the interrupted context.
        let uc = unsafe { &*(uctx as *const libc::ucontext_t) };
        uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = uctx;
        false
    }
}

fn set_errno(value: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    unsafe { *libc::__errno_location() = value };
}

/// Pass a SIGBUS that is not ours to the disposition before ours.
fn chain(
    prev: Option<libc::sigaction>,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    let Some(prev) = prev else { return };
    if prev.sa_sigaction == libc::SIG_DFL || prev.sa_sigaction == libc::SIG_IGN {
        // Default action: restore it; the access runs again and the kernel's SIGBUS
        // ends the process as it would have without us.
        // SAFETY: restores the previous disposition (plain data).
        unsafe { libc::sigaction(libc::SIGBUS, &prev, std::ptr::null_mut()) };
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as an SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev.sa_sigaction) };
        f(sig, info, uctx);
    } else {
        // SAFETY: the previous handler was installed as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
        f(sig);
    }
}

/// Serve a fault at `addr` if it is in an in-thread region of some pool. True: the
/// access may run again.
fn serve(addr: usize, write: bool) -> bool {
    // The interrupted code may be inside `malloc` (a program's handler that faulted):
    // what this fault allocates (a swap-cache shard's table resized) comes from the
    // engine's heap.
    let _inside = crate::sys::heap::Inside::enter();
    let _gate = HandlerGate::enter();
    let engines = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
    let found = engines.iter().find_map(|w| {
        let e = w.upgrade()?;
        let r = e.regions.by_addr(addr)?;
        r.in_thread.then_some((e, r))
    });
    drop(engines);
    let Some((e, r)) = found else {
        return false;
    };
    let page = ((addr - r.base) / PAGE_SIZE) as u64;
    fault(&e, &r, page, write)
}

/// The fault of one page (`write`: by a write access), served here. Returns when the
/// access may run again: true, or false when the page's bytes are lost (the program's
/// SIGBUS).
fn fault(e: &Engine, r: &Arc<RegionInner>, page: u64, write: bool) -> bool {
    let active = e.fork.enter();
    // Room for the page and its read's frame. No direct reclaim here (it needs a
    // thread's ring): wait for the reclaim thread while it makes progress, and go
    // over the budget once a pass of it begun since gives up (as a fault thread does
    // after two passes of its own) or after 10 s, rather than hang: waiting out the
    // 10 s at every fault made a program whose pool was full stop for good.
    let t = std::time::Instant::now();
    let passes = e.threads.kswapd_passes();
    let mut force = false;
    crate::memcg::follow(e);
    if !e.budget.try_reserve(2, false) {
        // Counted while it waits: the reclaim thread then takes what it spares ahead of
        // need (`reclaim::needed`).
        let _waiting = e.threads.room_waiter();
        while !e.budget.try_reserve(2, force) {
            if e.fork.pending() || fork_held() {
                // A fork waits for this thread to leave the engine, and the reclaim
                // thread, which makes the room, waits for the fork: leave (nothing is
                // reserved yet); the access faults again after the fork.
                return true;
            }
            e.threads.wake_kswapd();
            std::thread::sleep(std::time::Duration::from_micros(50));
            force = e.threads.kswapd_stalled_since(passes)
                || t.elapsed() > std::time::Duration::from_secs(10);
            if force {
                e.diag.over_budget();
            }
        }
    }
    let room = e.budget.room(2);
    crate::reclaim::wake_if_high(e);
    let unit = r.unit_of(page);
    let mut u = unit.lock();
    if r.is_dead() {
        return true;
    }
    unit.referenced.store(true, Relaxed);
    let i = page as usize % UNIT_PAGES;
    let addr = r.page_addr(page);
    let present = || crate::sys::mem::PAGE_MAP.present(addr) == Some(true);

    match u.get(i) {
        PageState::Untouched => {
            // First touch: writable zeros (a read of zeros costs a write at eviction,
            // a write would cost a second trap).
            let zero = [0u8; PAGE_SIZE];
            if r.uffd
                .copy(addr, zero.as_ptr(), PAGE_SIZE, false, Wake::No)
                .is_ok()
            {
                u.set(
                    i,
                    PageState::Resident {
                        dirty: true,
                        slot: None,
                    },
                );
                u.resident += 1;
                e.budget.charge(Gauge::Resident, 1);
                r.counters.minflt.fetch_add(1, Relaxed);
            }
        }
        PageState::Resident { dirty: false, slot } if present() => {
            // A write to a clean page: it becomes dirty, its slot stale.
            if slot.is_some() {
                r.write_trend.written_after_read();
            }
            let slot = slot.and_then(|s| super::stale_slot_of(e, r, s));
            u.set(i, PageState::Resident { dirty: true, slot });
            r.counters.wpflt.fetch_add(1, Relaxed);
            let _ = r.uffd.write_protect(addr, PAGE_SIZE, false, Wake::No);
        }
        PageState::Resident { .. } => {
            if crate::sys::mem::PAGE_MAP.empty(addr) {
                super::heal_missing_resident(e, r, &mut u, page);
            }
        }
        PageState::Poisoned => {
            // Its bytes are lost: the program's SIGBUS, not ours to serve (on a
            // kernel without CONFIG_MEMORY_FAILURE a poison marker raises the same
            // BUS_ADRERR as a userfault).
            let _ = r.uffd.poison(addr, PAGE_SIZE);
            return false;
        }
        PageState::Swapped(slot) => match e.cache.fault_lookup(slot, write) {
            Lookup::Hit(en) => {
                r.counters.minflt.fetch_add(1, Relaxed);
                r.counters.swapcache_hit.fetch_add(1, Relaxed);
                if en.readahead {
                    r.counters.swap_ra_hit.fetch_add(1, Relaxed);
                }
                super::map_from_frames(e, r, &mut u, page, &[(slot, en.frame)], write);
            }
            Lookup::InFlight => {
                // A fault thread's read or a write is in flight: its completion maps
                // the page (a waiter was recorded). Wait for it outside the lock, and
                // outside the engine: a fork being prepared waits for every thread in
                // it, and the thread whose completion ends this wait would wait for
                // the fork. The wait polls locks, so it stays inside the handler's gate
                // and ends when a fork is held (the access faults again after it).
                drop(u);
                drop(room);
                drop(active);
                // While the I/O is still in flight: completions map under the unit's
                // lock, so under it a page still swapped whose copy is clean or gone (a
                // completion could not map it, then reclaim may have dropped the copy)
                // is this fault's to map, on its next try.
                let in_flight = || {
                    let u = r.unit_of(page).lock();
                    matches!(u.get(i), PageState::Swapped(s) if s == slot)
                        && e.cache
                            .get(slot)
                            .is_some_and(|en| en.state != crate::swap_cache::CacheState::Clean)
                };
                while in_flight() && !r.is_dead() && !fork_held() {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                return true;
            }
            Lookup::Miss => match e.tiers.meta.location(slot) {
                Location::Back => read_in(e, r, &mut u, page, slot, write),
                Location::Compressed => {
                    crate::tier::compressed::fault(e, r, &mut u, page, slot, write)
                }
                Location::Packed => crate::tier::packed::fault(e, r, &mut u, page, slot, write),
                Location::None => {
                    e.diag.internal(&format!(
                        "page {page} of region {} is swapped to slot {slot}, which holds nothing",
                        r.id
                    ));
                    super::poison_page(e, r, &mut u, page, slot);
                }
            },
        },
    }
    crate::reclaim::lru_add_in_place(e, r, page, &u);
    true
}

/// Read page `page` (swapped to `slot` on the back tier) into a frame on this thread
/// (an O_DIRECT read polled for, `ring::read_own`, else a pread; the remote tier's
/// own request), check it (with encryption: decrypt it), map it: clean, or dirty for a
/// write (`write`). Under the unit's lock.
fn read_in(
    e: &Engine,
    r: &RegionInner,
    u: &mut crate::pagemap::UnitPages,
    page: u64,
    slot: crate::slots::Slot,
    write: bool,
) {
    let Some(frame) = e.frames.alloc_to_fill(crate::frames::Site::InThread) else {
        // No frame free now: the access runs again once reclaim trimmed the cache.
        e.threads.wake_kswapd();
        return;
    };
    e.budget.charge(Gauge::Cached, 1);
    r.counters.majflt.fetch_add(1, Relaxed);
    let mut good = false;
    let poll = std::time::Duration::from_micros(e.cfg.own_read_poll_us as u64);
    for attempt in 0..3 {
        let n = match &e.tiers.remote {
            // the back tier is the cluster: this thread's own connection, waited on here
            Some(remote) => match remote.read_blocking(slot, e.frames.page_mut(frame), poll) {
                true => PAGE_SIZE as isize,
                false => -1,
            },
            None => {
                let (fd, off) = e.tiers.file().locate(slot);
                match crate::ring::read_own(fd, e.frames.page_mut(frame), off, poll) {
                    Some(n) => n as isize,
                    // SAFETY: reads 4 KiB into a frame this thread owns (an O_DIRECT-
                    // aligned page of the arena, which only takes ordinary kernel faults).
                    None => unsafe {
                        libc::pread(fd, frame as *mut libc::c_void, PAGE_SIZE, off as i64)
                    },
                }
            }
        };
        let seq = e.diag.read_seq.fetch_add(1, Relaxed) + 1;
        let inj = e.cfg.inject;
        let failed = inj.fail_read_every > 0
            && seq.is_multiple_of(inj.fail_read_every)
            && (attempt == 0 || !inj.transient);
        if n == PAGE_SIZE as isize && !failed {
            if e.tiers.verify_page(&e.frames, slot, frame) {
                good = true;
                break;
            }
            r.counters.swap_csum_fail.fetch_add(1, Relaxed);
        }
        r.counters.io_errors.fetch_add(1, Relaxed);
    }
    if !good {
        e.frames.free(&e.zapper, &[frame]);
        e.budget.uncharge(Gauge::Cached, 1);
        super::poison_page(e, r, u, page, slot);
        return;
    }
    r.counters.pswpin.fetch_add(1, Relaxed);
    // Clean (mapped write-protected, the slot stays valid) unless written. As a copy
    // from the cache, it holds the slot's cache reference for `map_from_frames`.
    e.slots.set_cache(slot);
    super::map_from_frames(e, r, u, page, &[(slot, frame)], write);
}
