//! `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall` on uswap memory.
//!
//! The kernel moves no page between a locked and an unlocked mapping (UFFDIO_MOVE
//! answers EINVAL, `validate_move_areas`), and drops no locked page (MADV_DONTNEED
//! answers EINVAL), while the engine brings pages in and out exactly so. Left to the
//! kernel, a locked region filled the budget and more, reclaim copied pages out that
//! it then could not drop, and the program's next write to one was answered by waking
//! it, forever (memtester 1G: a fault thread at 100% CPU, 1.2 GiB resident).
//!
//! So our part of a locked range is locked by the engine (`Region::lock`): faulted in
//! now, never swapped, counted outside the budget (the rest of the program keeps to
//! it), said once on stderr; then it is locked in the kernel too, all its pages
//! present. Whether the program may lock is the kernel's answer, asked first with
//! MLOCK_ONFAULT (nothing is faulted in): RLIMIT_MEMLOCK and CAP_IPC_LOCK apply as
//! without uswap.
//!
//! `mlockall` locks the program's mappings one by one, leaving out the engine's own
//! (frame arenas, whose pages move in and out of regions); MCL_FUTURE is not passed to
//! the kernel (it would lock and populate every later frame arena whole): uswap blocks
//! made afterwards are locked as they are made, other later mappings are not.
//! MLOCK_ONFAULT and MCL_ONFAULT lock our parts whole at once.

use crate::{bypass, enter, sys, table};
use libc::{c_int, c_void, size_t};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use uswap::Region;

const MLOCK_ONFAULT: c_int = 1;

/// mlockall(MCL_FUTURE) is in force: new uswap blocks are locked when made.
static FUTURE: AtomicBool = AtomicBool::new(false);

/// The parts of `[s, e)` that are live memory of our blocks, with their regions, and
/// the gaps that are not ours (parts of our blocks the program unmapped are neither:
/// PROT_NONE holes of the engine).
#[allow(clippy::type_complexity)]
fn split(s: usize, e: usize) -> (Vec<(Arc<Region>, usize, usize)>, Vec<(usize, usize)>) {
    let t = table::lock();
    let mut ours = Vec::new();
    let mut gaps = vec![(s, e)];
    for (&b, en) in t.range(..e) {
        let z = b + en.len;
        if z <= s {
            continue;
        }
        table::subtract(&mut gaps, b, z);
        for &(ls, le) in &en.live {
            let (a, c) = (ls.max(s), le.min(e));
            if a < c {
                ours.push((en.region.clone(), a, c));
            }
        }
    }
    (ours, gaps)
}

fn offset(r: &Region, a: usize) -> usize {
    a - r.as_ptr() as usize
}

/// Lock `[s, e)` (page aligned) with mlock2 `flags`.
fn lock_range(s: usize, e: usize, flags: c_int) -> c_int {
    let (ours, _) = split(s, e);
    if ours.is_empty() {
        return sys::mlock2(s, e - s, flags);
    }
    // The kernel's checks (RLIMIT_MEMLOCK, CAP_IPC_LOCK, unmapped parts), with nothing
    // faulted in: refused, nothing of ours was brought in over the budget.
    if sys::mlock2(s, e - s, MLOCK_ONFAULT) != 0 {
        return -1;
    }
    // The engine brings our parts in unlocked: it cannot move a page into a locked
    // mapping.
    for (_, a, z) in &ours {
        sys::munlock(*a, z - a);
    }
    for (r, a, z) in &ours {
        let _ = r.lock(offset(r, *a), z - a);
    }
    sys::mlock2(s, e - s, flags)
}

fn unlock_range(s: usize, e: usize) -> c_int {
    let rc = sys::munlock(s, e - s);
    for (r, a, z) in split(s, e).0 {
        let _ = r.unlock(offset(&r, a), z - a);
    }
    rc
}

fn page_range(addr: *const c_void, len: size_t) -> (usize, usize) {
    let s = addr as usize & !(table::PAGE - 1);
    (s, table::page_up((addr as usize).saturating_add(len)))
}

/// # Safety
/// The C `mlock` contract.
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    // SAFETY: the same contract.
    unsafe { mlock2(addr, len, 0) }
}

/// # Safety
/// The C `mlock2` contract.
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: c_int) -> c_int {
    let (s, e) = page_range(addr, len);
    if len == 0 || flags & !MLOCK_ONFAULT != 0 || !table::may_overlap(s, e) || bypass() {
        return sys::mlock2(addr as usize, len, flags);
    }
    let _g = enter();
    lock_range(s, e, flags)
}

/// # Safety
/// The C `munlock` contract.
#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    let (s, e) = page_range(addr, len);
    if len == 0 || !table::may_overlap(s, e) || bypass() {
        return sys::munlock(addr as usize, len);
    }
    let _g = enter();
    unlock_range(s, e)
}

/// The program's mappings now, from /proc/self/maps, less the engine's own and the
/// library's heap span (reserved PROT_NONE, ~1.3 TiB: locked, it would count against
/// RLIMIT_MEMLOCK whole; its slabs are regions, locked as blocks).
fn program_mappings() -> Vec<(usize, usize)> {
    let in_span = |p: usize| crate::heap::in_mid(p) || crate::heap::arena_of(p).is_some();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut v: Vec<(usize, usize)> = maps
        .lines()
        .filter(|l| !l.ends_with("[vsyscall]"))
        .filter_map(|l| {
            let (a, z) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(z, 16).ok()?,
            ))
        })
        .filter(|&(a, z)| !in_span(a) && !in_span(z - 1))
        .collect();
    for (a, z) in uswap::engine_mappings() {
        table::subtract(&mut v, a, z);
    }
    v
}

/// # Safety
/// The C `mlockall` contract.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    let known = libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT;
    if bypass() || flags & !known != 0 || flags & (libc::MCL_CURRENT | libc::MCL_FUTURE) == 0 {
        return sys::mlockall(flags);
    }
    let _g = enter();
    let onfault = if flags & libc::MCL_ONFAULT != 0 {
        MLOCK_ONFAULT
    } else {
        0
    };
    if flags & libc::MCL_CURRENT != 0 {
        // Our blocks first, the kernel answering for each whether it may be locked:
        // then the rest of the program's memory.
        let blocks: Vec<(usize, usize)> = table::lock()
            .values()
            .flat_map(|en| en.live.clone())
            .collect();
        for (a, z) in blocks {
            if lock_range(a, z, onfault) != 0 {
                return -1;
            }
        }
        for (a, z) in program_mappings() {
            // A mapping may have gone meanwhile (ENOMEM): locking what is there is
            // what mlockall does.
            if sys::mlock2(a, z - a, onfault) != 0
                && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
            {
                return -1;
            }
        }
    }
    if flags & libc::MCL_FUTURE != 0 {
        // Asked of the kernel for a page of our own, to get its answer (EPERM without
        // CAP_IPC_LOCK and RLIMIT_MEMLOCK) without locking later mappings.
        let probe = table::PAGE;
        let p = sys::mmap(
            std::ptr::null_mut(),
            probe,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p != libc::MAP_FAILED {
            let rc = sys::mlock2(p as usize, probe, MLOCK_ONFAULT);
            let err = std::io::Error::last_os_error().raw_os_error();
            sys::munmap(p, probe);
            if rc != 0 {
                sys::set_errno(err.unwrap_or(libc::EPERM));
                return -1;
            }
        }
        FUTURE.store(true, Relaxed);
    }
    0
}

/// # Safety
/// The C `munlockall` contract.
#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    if bypass() {
        return sys::munlockall();
    }
    let _g = enter();
    FUTURE.store(false, Relaxed);
    let rc = sys::munlockall();
    let blocks: Vec<(Arc<Region>, usize, usize)> = table::lock()
        .iter()
        .map(|(&b, en)| (en.region.clone(), b, b + en.len))
        .collect();
    for (r, a, z) in blocks {
        let _ = r.unlock(offset(&r, a), z - a);
    }
    rc
}

/// A new block `[base, base + len)` of ours: locked at once under mlockall(MCL_FUTURE),
/// as the kernel populates and locks a new mapping then. Call with the guard set.
pub fn on_new_block(base: usize, len: usize) {
    if FUTURE.load(Relaxed) && len > 0 {
        lock_range(base, base + table::page_up(len), 0);
    }
}
