//! `libuswap_preload.so`: loaded with LD_PRELOAD (by `uswap run`), it puts a program's
//! large anonymous memory under uswap without changing the program. See docs/run.md.
//!
//! What is interposed:
//! - the malloc family (`malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//!   `memalign`, `aligned_alloc`, `posix_memalign`, `valloc`, `pvalloc`,
//!   `malloc_usable_size`): blocks of at least the threshold become uswap regions. This
//!   is needed because glibc's malloc maps its big blocks with an internal `__mmap` that
//!   no LD_PRELOAD library can interpose; smaller blocks go to glibc's `__libc_*`;
//! - `mmap`/`mmap64` of anonymous private read-write memory (or private /dev/zero) of at
//!   least the threshold, and `munmap`, `mremap`, `madvise` on what was handed out.
//!
//! Reentrancy: the engine itself allocates and maps memory and runs its own threads.
//! A thread-local guard is set around every call into the engine and every use of the
//! table; with it set, or on an engine thread (`uswap-fault-N`, `uswap-reclaim`),
//! everything goes straight to glibc or the kernel.

mod sys;
mod table;

use libc::{c_int, c_void, off_t, size_t};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use uswap::{Pool, Region, UnitPolicy};

const UNIT: usize = 2 << 20;

/// 0: not configured yet (everything passes through), 1: on, 2: off.
static STATE: AtomicU8 = AtomicU8::new(0);
static THRESHOLD: AtomicUsize = AtomicUsize::new(1 << 20);
static FALLBACKS: AtomicUsize = AtomicUsize::new(0);

struct Config {
    budget: u64,
    swap_file: Option<PathBuf>,
    unit: UnitPolicy,
    threshold: usize,
    stats: Option<String>,
    root_pid: Option<i32>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static POOL: OnceLock<Option<Pool>> = OnceLock::new();

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    static ENGINE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The "inside uswap" guard: while one is alive on a thread, the interposed functions
/// go straight to glibc / the kernel on that thread.
struct Inside(bool);

fn enter() -> Inside {
    Inside(INSIDE.with(|c| c.replace(true)))
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(self.0));
    }
}

/// Whether this call must bypass uswap: guard set, engine thread, or uswap off.
fn bypass() -> bool {
    if STATE.load(Relaxed) != 1 || INSIDE.with(|c| c.get()) {
        return true;
    }
    if ENGINE_THREAD.with(|c| c.get()) {
        return true;
    }
    if sys::thread_name_starts_with(b"uswap-fault-")
        || sys::thread_name_starts_with(b"uswap-reclaim")
    {
        ENGINE_THREAD.with(|c| c.set(true));
        return true;
    }
    false
}

fn threshold() -> usize {
    THRESHOLD.load(Relaxed)
}

fn eprint_line(msg: &str) {
    let mut line = format!("uswap-preload[{}]: {msg}", std::process::id());
    line.push('\n');
    sys::write_all(2, line.as_bytes());
}

fn read_config() -> Result<Config, String> {
    let budget = match std::env::var("USWAP_BUDGET") {
        Ok(s) => uswap::parse_size(&s).map_err(|e| format!("USWAP_BUDGET: {e}"))?,
        Err(_) => return Err("USWAP_BUDGET is not set".into()),
    };
    let unit = match std::env::var("USWAP_UNIT").as_deref() {
        Err(_) | Ok("") | Ok("4k") | Ok("4K") => UnitPolicy::Small,
        Ok("2m") | Ok("2M") => UnitPolicy::Huge,
        Ok("auto") => UnitPolicy::Auto,
        Ok(o) => return Err(format!("USWAP_UNIT={o:?}: use 4k, 2m or auto")),
    };
    let threshold = match std::env::var("USWAP_THRESHOLD") {
        Ok(s) => uswap::parse_size(&s).map_err(|e| format!("USWAP_THRESHOLD: {e}"))? as usize,
        Err(_) => 1 << 20,
    }
    .max(table::PAGE);
    Ok(Config {
        budget,
        swap_file: std::env::var_os("USWAP_SWAP_FILE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        unit,
        threshold,
        stats: std::env::var("USWAP_STATS").ok().filter(|s| !s.is_empty()),
        root_pid: std::env::var("USWAP_ROOT_PID")
            .ok()
            .and_then(|s| s.parse().ok()),
    })
}

extern "C" fn init() {
    let _g = enter();
    let cfg = match read_config() {
        Ok(c) => c,
        Err(e) => {
            eprint_line(&format!("{e}; running without uswap"));
            STATE.store(2, Relaxed);
            return;
        }
    };
    THRESHOLD.store(cfg.threshold, Relaxed);
    let stats = cfg.stats.is_some();
    let _ = CONFIG.set(cfg);
    // SAFETY: registers plain extern "C" handlers that live as long as the process.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        if stats {
            libc::atexit(print_stats);
        }
    }
    STATE.store(1, Relaxed);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The pool, started at the first allocation that needs it. Call with the guard set.
fn pool() -> Option<&'static Pool> {
    POOL.get_or_init(|| {
        let cfg = CONFIG.get()?;
        let mut b = Pool::builder().budget(cfg.budget).unit(cfg.unit);
        if let Some(p) = &cfg.swap_file {
            b = b.swap_file(p);
        }
        match std::panic::catch_unwind(move || b.build()) {
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) => {
                eprint_line(&format!("cannot start uswap ({e}); running without it"));
                STATE.store(2, Relaxed);
                None
            }
            Err(_) => {
                eprint_line("cannot start uswap (internal error); running without it");
                STATE.store(2, Relaxed);
                None
            }
        }
    })
    .as_ref()
}

/// A new region of at least `len` bytes, or None (the caller falls back to glibc or
/// the kernel). Call with the guard set.
fn new_region(len: usize) -> Option<Arc<Region>> {
    let pool = pool()?;
    match std::panic::catch_unwind(|| pool.region(len as u64)) {
        Ok(Ok(r)) => Some(Arc::new(r)),
        Ok(Err(e)) => {
            if FALLBACKS.fetch_add(1, Relaxed) == 0 {
                eprint_line(&format!(
                    "a uswap region of {len} bytes failed ({e}); using ordinary memory for it"
                ));
            }
            None
        }
        Err(_) => {
            FALLBACKS.fetch_add(1, Relaxed);
            None
        }
    }
}

// ---- fork and exit ------------------------------------------------------------------

thread_local! {
    /// The table lock, held by the forking thread from prepare to parent/child.
    static FORK_LOCK: std::cell::RefCell<Option<std::sync::MutexGuard<'static, std::collections::BTreeMap<usize, table::Entry>>>> =
        const { std::cell::RefCell::new(None) };
    static FORK_INSIDE: Cell<bool> = const { Cell::new(false) };
}

extern "C" fn fork_prepare() {
    let prev = INSIDE.with(|c| c.replace(true));
    FORK_INSIDE.with(|c| c.set(prev));
    let g = table::lock();
    FORK_LOCK.with(|l| *l.borrow_mut() = Some(g));
    uswap::prepare_fork();
}

extern "C" fn fork_parent() {
    uswap::after_fork_parent();
    FORK_LOCK.with(|l| l.borrow_mut().take());
    INSIDE.with(|c| c.set(FORK_INSIDE.with(|f| f.get())));
}

extern "C" fn fork_child() {
    uswap::after_fork_child();
    FORK_LOCK.with(|l| l.borrow_mut().take());
    INSIDE.with(|c| c.set(FORK_INSIDE.with(|f| f.get())));
}

fn vm_hwm() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

extern "C" fn print_stats() {
    let _g = enter();
    let Some(cfg) = CONFIG.get() else { return };
    let Some(dest) = &cfg.stats else { return };
    let pool = POOL.get().and_then(|p| p.as_ref());
    let me = std::process::id() as i32;
    // Processes that never used uswap (a shell between `uswap run` and the program,
    // say) stay quiet, except the one `uswap run` started.
    if pool.is_none() && cfg.root_pid != Some(me) {
        return;
    }
    let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let counters = pool.map(|p| p.counters()).unwrap_or_default();
    let v = serde_json::json!({
        "uswap_stats": {
            "pid": me,
            "program": program.trim(),
            "budget": cfg.budget,
            "threshold": cfg.threshold,
            "active": pool.is_some(),
            "swap": pool.map(|p| p.swap_place()),
            "regions_created": table::REGIONS_CREATED.load(Relaxed),
            "malloc_blocks": table::MALLOC_BLOCKS.load(Relaxed),
            "mmap_regions": table::MMAP_REGIONS.load(Relaxed),
            "live_regions": table::LIVE_REGIONS.load(Relaxed),
            "peak_region_bytes": table::PEAK_LIVE_BYTES.load(Relaxed),
            "fallbacks": FALLBACKS.load(Relaxed),
            "peak_used_bytes": counters.peak_used_bytes,
            "vm_hwm_bytes": vm_hwm(),
            "counters": counters,
        }
    });
    let line = format!("{v}\n");
    if dest == "-" {
        sys::write_all(2, line.as_bytes());
    } else if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dest)
    {
        use std::io::Write;
        let mut f = f;
        let _ = f.write_all(line.as_bytes());
    }
}

// ---- malloc family ------------------------------------------------------------------

/// A uswap-backed block of `size` bytes (zero-filled), or null.
fn big_alloc(size: usize) -> *mut c_void {
    let _g = enter();
    match new_region(size) {
        Some(r) => table::insert(r, Some(size), usize::MAX) as *mut c_void,
        None => std::ptr::null_mut(),
    }
}

/// Whether `p` may be one of our blocks: they all start 2 MiB aligned.
/// Engine threads never get here past `bypass`, so they never wait for the table lock
/// (which the forking thread holds while the engine quiesces them).
fn maybe_ours(p: *mut c_void) -> bool {
    let a = p as usize;
    a != 0 && a & (UNIT - 1) == 0 && table::may_overlap(a, a + 1) && !bypass()
}

/// Drop our block at `p`; false when it is not ours.
fn free_ours(p: *mut c_void) -> bool {
    if !maybe_ours(p) {
        return false;
    }
    let _g = enter();
    match table::take_block(p as usize) {
        Some(r) => {
            drop(r);
            true
        }
        None => false,
    }
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if size >= threshold() && !bypass() {
        let p = big_alloc(size);
        if !p.is_null() {
            return p;
        }
    }
    sys::malloc(size)
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(nmemb: size_t, size: size_t) -> *mut c_void {
    if let Some(total) = nmemb.checked_mul(size) {
        if total >= threshold() && !bypass() {
            // A fresh region reads as zeros: nothing to clear.
            let p = big_alloc(total);
            if !p.is_null() {
                return p;
            }
        }
    }
    sys::calloc(nmemb, size)
}

/// # Safety
/// The C `free` contract: `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || free_ours(p) {
        return;
    }
    // SAFETY: not ours, so glibc's.
    unsafe { sys::free(p) }
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: the malloc contract.
        return unsafe { malloc(size) };
    }
    let ours = if maybe_ours(p) {
        let _g = enter();
        table::block(p as usize)
    } else {
        None
    };
    let Some((region, old_size)) = ours else {
        // glibc's block.
        if size >= threshold() && !bypass() {
            let n = big_alloc(size);
            if !n.is_null() {
                // SAFETY: `p` is a live glibc block of at least its usable size; `n`
                // holds `size` bytes; distinct allocations.
                unsafe {
                    sys::copy(n, p, sys::usable_size(p).min(size));
                    sys::free(p);
                }
                return n;
            }
        }
        // SAFETY: `p` is glibc's.
        return unsafe { sys::realloc(p, size) };
    };
    if size == 0 {
        free_ours(p);
        return std::ptr::null_mut();
    }
    if size >= threshold() && size <= region.len() {
        // In place: shrink throws the tail pages away.
        let (keep, had) = (table::page_up(size), table::page_up(old_size));
        let _g = enter();
        if keep < had {
            let _ = region.discard(keep, had - keep);
        }
        table::set_block_size(p as usize, size);
        return p;
    }
    let n = if size >= threshold() && !bypass() {
        big_alloc(size)
    } else {
        std::ptr::null_mut()
    };
    let n = if n.is_null() { sys::malloc(size) } else { n };
    if n.is_null() {
        return n;
    }
    // SAFETY: both blocks are live and distinct; `n` holds `size` bytes, `p` `old_size`.
    unsafe { sys::copy(n, p, old_size.min(size)) };
    drop(region);
    free_ours(p);
    n
}

/// # Safety
/// The C `reallocarray` contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, nmemb: size_t, size: size_t) -> *mut c_void {
    match nmemb.checked_mul(size) {
        // SAFETY: the realloc contract.
        Some(t) => unsafe { realloc(p, t) },
        None => {
            sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

fn aligned_big(align: usize, size: usize) -> *mut c_void {
    if size >= threshold() && align <= UNIT && align.is_power_of_two() && !bypass() {
        big_alloc(size)
    } else {
        std::ptr::null_mut()
    }
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let p = aligned_big(align, size);
    if p.is_null() {
        sys::memalign(align, size)
    } else {
        p
    }
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { memalign(align, size) }
}

/// # Safety
/// The C `posix_memalign` contract: `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let mut p = aligned_big(align, size);
    if p.is_null() {
        p = sys::memalign(align, size);
        if p.is_null() && size != 0 {
            return libc::ENOMEM;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { *out = p };
    0
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    let p = aligned_big(table::PAGE, size);
    if p.is_null() {
        sys::valloc(size)
    } else {
        p
    }
}

/// # Safety
/// The C `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let p = aligned_big(table::PAGE, table::page_up(size));
    if p.is_null() {
        sys::pvalloc(size)
    } else {
        p
    }
}

/// # Safety
/// The C `malloc_usable_size` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    if maybe_ours(p) {
        let _g = enter();
        if let Some((r, _)) = table::block(p as usize) {
            return r.len();
        }
    }
    // SAFETY: not ours, so glibc's.
    unsafe { sys::usable_size(p) }
}

// ---- mapping calls ------------------------------------------------------------------

const REFUSED_FLAGS: c_int = libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_GROWSDOWN
    | libc::MAP_STACK
    | libc::MAP_HUGETLB
    | libc::MAP_32BIT
    | libc::MAP_SHARED;

fn eligible(len: usize, prot: c_int, flags: c_int, fd: c_int) -> bool {
    len >= threshold()
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & 0x0f == libc::MAP_PRIVATE
        && flags & REFUSED_FLAGS == 0
        && (flags & libc::MAP_ANONYMOUS != 0 || sys::is_dev_zero(fd))
}

fn gaps_result(gaps: &[(usize, usize)], f: impl Fn(usize, usize) -> c_int) -> c_int {
    let mut rc = 0;
    for &(a, z) in gaps {
        if f(a, z - a) != 0 {
            rc = -1;
        }
    }
    rc
}

/// # Safety
/// The C `mmap` contract.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if STATE.load(Relaxed) == 1 {
        if eligible(len, prot, flags, fd) {
            if !bypass() {
                let _g = enter();
                if let Some(r) = new_region(len) {
                    return table::insert(r, None, table::page_up(len)) as *mut c_void;
                }
            }
        } else if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == libc::MAP_FIXED {
            // A mapping placed over our memory: the engine gives that part up for good.
            let s = addr as usize;
            let e = s.saturating_add(table::page_up(len));
            if s.is_multiple_of(table::PAGE) && table::may_overlap(s, e) && !bypass() {
                let _g = enter();
                table::unmap(s, e, true).finish();
            }
        }
    }
    sys::mmap(addr, len, prot, flags, fd, off)
}

/// # Safety
/// The C `mmap64` contract (the same as `mmap` on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C `munmap` contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let s = addr as usize;
    let e = s.saturating_add(table::page_up(len));
    if len == 0 || !s.is_multiple_of(table::PAGE) || !table::may_overlap(s, e) || bypass() {
        return sys::munmap(addr, len);
    }
    let _g = enter();
    let plan = table::unmap(s, e, false);
    let rc = gaps_result(&plan.gaps, |a, n| sys::munmap(a as *mut c_void, n));
    plan.finish();
    rc
}

/// # Safety
/// The C `mremap` contract. Declared with five fixed arguments: on x86-64 and aarch64
/// Linux the variadic `new_address` arrives in the same register either way, and it is
/// read only with MREMAP_FIXED, when the caller passes it.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let s = old as usize;
    let old_end = s.saturating_add(table::page_up(old_len));
    if old_len == 0 || !s.is_multiple_of(table::PAGE) || !table::may_overlap(s, old_end) || bypass()
    {
        return sys::mremap(old, old_len, new_len, flags, new_addr);
    }
    let _g = enter();
    let (old_len, new_len) = (table::page_up(old_len), table::page_up(new_len));
    let fail = |e| {
        sys::set_errno(e);
        libc::MAP_FAILED
    };
    let (base, room) = match table::remap_target(s, old_len, new_len) {
        table::Remap::NotOurs => {
            if flags & libc::MREMAP_FIXED != 0 {
                let t = new_addr as usize;
                if table::may_overlap(t, t.saturating_add(new_len)) {
                    table::unmap(t, t + new_len, true).finish();
                }
            }
            return sys::mremap(old, old_len, new_len, flags, new_addr);
        }
        table::Remap::Mixed => return fail(libc::EINVAL),
        table::Remap::Ours { base, room } => (base, room),
    };
    if new_len == 0 || flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
        return fail(libc::EINVAL);
    }
    if new_len <= old_len {
        let plan = table::unmap(s + new_len, s + old_len, false);
        plan.finish();
        return old;
    }
    if room {
        table::add_live(base, s + old_len, s + new_len);
        return old;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return fail(libc::ENOMEM);
    }
    let Some(r) = new_region(new_len) else {
        return fail(libc::ENOMEM);
    };
    let n = r.as_ptr() as *mut c_void;
    // SAFETY: the old range is live memory of the program; the new region holds
    // `new_len` > `old_len` bytes; distinct mappings.
    unsafe { sys::copy(n, old, old_len) };
    table::insert(r, None, new_len);
    table::unmap(s, s + old_len, false).finish();
    n
}

/// # Safety
/// The C `madvise` contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    let s = addr as usize;
    let e = s.saturating_add(table::page_up(len));
    if len == 0 || !s.is_multiple_of(table::PAGE) || !table::may_overlap(s, e) || bypass() {
        return sys::madvise(addr, len, advice);
    }
    let _g = enter();
    let kernel = |a: usize, n: usize| sys::madvise(a as *mut c_void, n, advice);
    match advice {
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE | 24 /* MADV_DONTNEED_LOCKED */ => {
            let plan = table::discard(s, e);
            let rc = gaps_result(&plan.gaps, kernel);
            plan.finish();
            rc
        }
        // Hints and flags that mean nothing to uswap memory (or would disturb the
        // engine's own placement): accepted, no-op.
        libc::MADV_NORMAL
        | libc::MADV_RANDOM
        | libc::MADV_SEQUENTIAL
        | libc::MADV_WILLNEED
        | libc::MADV_HUGEPAGE
        | libc::MADV_NOHUGEPAGE
        | libc::MADV_DONTFORK
        | libc::MADV_DOFORK
        | libc::MADV_MERGEABLE
        | libc::MADV_UNMERGEABLE
        | libc::MADV_DONTDUMP
        | libc::MADV_DODUMP
        | libc::MADV_WIPEONFORK
        | libc::MADV_KEEPONFORK
        | libc::MADV_COLD
        | libc::MADV_PAGEOUT
        | 25 /* MADV_COLLAPSE */ => gaps_result(&table::gaps(s, e), kernel),
        // The rest (MADV_POPULATE_READ/WRITE, ...) is safe for the kernel to do on
        // userfaultfd memory: faults are served as usual.
        _ => kernel(s, e - s),
    }
}
