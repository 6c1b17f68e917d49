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
//!   least the threshold, and `munmap`, `mremap`, `madvise`, `mprotect` on what was
//!   handed out;
//! - `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall` on that memory: locked by
//!   the engine, outside the budget (`mlock`);
//! - reservations: PROT_NONE anonymous mappings of at least the threshold are recorded
//!   and the parts the program commits (mprotect, mmap MAP_FIXED) become uswap memory
//!   (`resv`);
//! - mid-size blocks are extents of a few large uswap areas, and the small blocks of
//!   threads other than the main one come from uswap-backed arenas (`heap`).
//!
//! All of the malloc part holds only where glibc owns `malloc`. A program that brings
//! its own allocator (jemalloc, tcmalloc, mimalloc) keeps it for every block; only its
//! mappings go under uswap (`owner`, `plain`).
//!
//! Reentrancy: the engine itself allocates and maps memory and runs its own threads.
//! A thread-local guard is set around every call into the engine and every use of the
//! table; with it set, or on an engine thread (marked when started, see
//! `pthread_create`), mappings go straight to the kernel and the malloc family to the
//! plain heap (`plain`), never to the program's allocator.

mod heap;
mod mlock;
mod owner;
mod plain;
mod resv;
mod sys;
mod table;

use libc::{c_int, c_void, off_t, size_t};
use std::cell::Cell;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use uswap::{Pool, Region, UnitPolicy};

const UNIT: usize = 2 << 20;

/// 0: not configured yet (everything passes through), 1: on, 2: off.
static STATE: AtomicU8 = AtomicU8::new(0);
static THRESHOLD: AtomicUsize = AtomicUsize::new(1 << 20);
static FALLBACKS: AtomicUsize = AtomicUsize::new(0);
/// Whether threads other than the main one take their small blocks from uswap arenas.
static THREAD_ARENAS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

struct Config {
    budget: u64,
    swap_file: Option<PathBuf>,
    max_swap: uswap::MaxSwap,
    /// Free space to leave on the swap filesystem, the same for every process of a
    /// `uswap run` (None: what this process's `max_swap` leaves).
    keep_free: Option<u64>,
    unit: UnitPolicy,
    threshold: usize,
    stats: Option<String>,
    root_pid: Option<i32>,
    encrypt: bool,
    thread_arenas: bool,
    tier: uswap::TierKind,
    compressor: uswap::Compressor,
    /// None: the engine's default for the tier.
    compressed_max: Option<u32>,
    /// None: the engine's default (stored where a tier is behind the pool).
    store_incompressible: Option<bool>,
    remote: Option<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static POOL: OnceLock<Option<Pool>> = OnceLock::new();

thread_local! {
    /// One thread-local for all per-thread state: each access to a thread-local of a
    /// shared library is a call (`__tls_get_addr`), and small blocks come through here.
    static T: ThreadState = const {
        ThreadState {
            inside: Cell::new(false),
            engine: Cell::new(false),
            main: Cell::new(0),
            main_mallocs: Cell::new(0),
            arena: Cell::new(usize::MAX),
            cache: heap::ThreadCache::new(),
        }
    };
}

struct ThreadState {
    /// The "inside uswap" guard is set.
    inside: Cell<bool>,
    /// An engine thread.
    engine: Cell<bool>,
    /// 0: not known yet, 1: the main thread on glibc's main arena, 2: another thread,
    /// or the main thread once on the uswap arenas (`small_alloc`).
    main: Cell<u8>,
    /// The main thread's small mallocs while on glibc's main arena.
    main_mallocs: Cell<u32>,
    /// This thread's arena (usize::MAX: none yet).
    arena: Cell<usize>,
    /// Small blocks this thread freed, for its next mallocs.
    cache: heap::ThreadCache,
}

/// Give this thread's cached small blocks back to their arenas (at its exit).
fn flush_thread_cache() {
    T.with(|t| t.cache.flush());
}

/// The "inside uswap" guard: while one is alive on a thread, the interposed functions
/// go straight to glibc / the kernel on that thread.
struct Inside(bool);

fn enter() -> Inside {
    Inside(T.with(|t| t.inside.replace(true)))
}

impl Drop for Inside {
    fn drop(&mut self) {
        T.with(|t| t.inside.set(self.0));
    }
}

/// Whether this call must bypass uswap: guard set, engine thread, or uswap off.
/// Engine threads are marked from their first instruction (`pthread_create` below),
/// so that none of their memory, not even a small block, is ever uswap memory (a fault
/// thread touching memory that faults to itself would wait for itself forever).
fn bypass() -> bool {
    STATE.load(Relaxed) != 1 || T.with(|t| t.inside.get() || t.engine.get())
}

/// Where an allocation of the malloc family goes.
enum Route {
    /// glibc owns malloc: this library's own policy (uswap blocks, arenas, glibc).
    Ours,
    /// The library's own memory (the guard set, an engine thread), and everything
    /// while the owner is being found out: the plain heap.
    Plain,
    /// The program's allocator, unchanged.
    Foreign(&'static owner::Foreign),
}

fn route() -> Route {
    match owner::get() {
        owner::Owner::Glibc => {
            if T.with(|t| t.inside.get() || t.engine.get()) {
                Route::Plain
            } else {
                Route::Ours
            }
        }
        owner::Owner::Unknown => Route::Plain,
        owner::Owner::Foreign(f) => {
            if T.with(|t| t.inside.get() || t.engine.get()) {
                Route::Plain
            } else {
                Route::Foreign(f)
            }
        }
    }
}

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut c_void,
) -> c_int;

/// A thread the engine starts: its start routine, run with the engine mark set.
struct EngineStart {
    start: StartFn,
    arg: *mut c_void,
}

extern "C" fn engine_thread_start(p: *mut c_void) -> *mut c_void {
    T.with(|t| t.engine.set(true));
    // SAFETY: `p` is the Box made by `pthread_create` below for this thread, used once.
    let s = unsafe { Box::from_raw(p.cast::<EngineStart>()) };
    (s.start)(s.arg)
}

/// # Safety
/// The C `pthread_create` contract. Threads started from inside uswap (the engine's
/// fault and reclaim threads, started while the guard is set, or by an engine thread)
/// are marked as engine threads before their start routine runs.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut c_void,
) -> c_int {
    static REAL: OnceLock<Option<PthreadCreateFn>> = OnceLock::new();
    let real = REAL.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library; the
        // symbol has pthread_create's C signature.
        unsafe {
            let p = libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr());
            (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, PthreadCreateFn>(p))
        }
    });
    let Some(real) = *real else {
        return libc::EAGAIN;
    };
    let engine = T.with(|t| t.inside.get() || t.engine.get());
    if !engine {
        // SAFETY: the caller's contract.
        return unsafe { real(thread, attr, start, arg) };
    }
    let s = Box::into_raw(Box::new(EngineStart { start, arg }));
    // SAFETY: the caller's contract; the new thread owns `s`.
    let rc = unsafe { real(thread, attr, engine_thread_start, s.cast()) };
    if rc != 0 {
        // SAFETY: not started, so still ours.
        drop(unsafe { Box::from_raw(s) });
    }
    rc
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
        // The memory cgroup's whole room (`uswap run --fill-memcg`).
        Ok(s) if s == "auto" => uswap::memcg::limit().ok_or(
            "USWAP_BUDGET=auto: this process's memory cgroup has no limit below the \
             machine's RAM",
        )?,
        Ok(s) => uswap::parse_size(&s).map_err(|e| format!("USWAP_BUDGET: {e}"))?,
        Err(_) => return Err("USWAP_BUDGET is not set".into()),
    };
    let unit = match std::env::var("USWAP_UNIT").as_deref() {
        Ok("4k") | Ok("4K") => UnitPolicy::Small,
        Ok("2m") | Ok("2M") => UnitPolicy::Huge,
        Err(_) | Ok("") | Ok("auto") => UnitPolicy::Auto,
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
        max_swap: match std::env::var("USWAP_MAX_SWAP").as_deref() {
            Err(_) | Ok("") => uswap::MaxSwap::DEFAULT,
            Ok(m) => m.parse().map_err(|e| format!("USWAP_MAX_SWAP: {e}"))?,
        },
        keep_free: match std::env::var("USWAP_KEEP_FREE").as_deref() {
            Err(_) | Ok("") => None,
            Ok(k) => Some(uswap::parse_size(k).map_err(|e| format!("USWAP_KEEP_FREE: {e}"))?),
        },
        unit,
        threshold,
        stats: std::env::var("USWAP_STATS").ok().filter(|s| !s.is_empty()),
        root_pid: std::env::var("USWAP_ROOT_PID")
            .ok()
            .and_then(|s| s.parse().ok()),
        encrypt: match std::env::var("USWAP_ENCRYPT").as_deref() {
            Err(_) | Ok("") | Ok("0") | Ok("off") => false,
            Ok("1") | Ok("on") => true,
            Ok(o) => return Err(format!("USWAP_ENCRYPT={o:?}: use on or off")),
        },
        thread_arenas: match std::env::var("USWAP_THREAD_ARENAS").as_deref() {
            Err(_) | Ok("") | Ok("1") | Ok("on") => true,
            Ok("0") | Ok("off") => false,
            Ok(o) => return Err(format!("USWAP_THREAD_ARENAS={o:?}: use on or off")),
        },
        tier: match std::env::var("USWAP_TIER").as_deref() {
            Err(_) | Ok("") => uswap::TierKind::File,
            Ok(t) => t.parse().map_err(|e| format!("USWAP_TIER: {e}"))?,
        },
        compressor: match std::env::var("USWAP_COMPRESSOR").as_deref() {
            Err(_) | Ok("") => uswap::Compressor::Lz4,
            Ok(c) => c.parse().map_err(|e| format!("USWAP_COMPRESSOR: {e}"))?,
        },
        compressed_max: match std::env::var("USWAP_COMPRESSED_MAX").as_deref() {
            Err(_) | Ok("") => None,
            Ok(p) => match p.trim_end_matches('%').parse::<u32>() {
                Ok(n @ 1..=90) => Some(n),
                _ => {
                    return Err(format!(
                        "USWAP_COMPRESSED_MAX={p:?}: use a percent of the budget, 1-90"
                    ))
                }
            },
        },
        store_incompressible: match std::env::var("USWAP_INCOMPRESSIBLE").as_deref() {
            Ok("store") => Some(true),
            Ok("pass") => Some(false),
            Err(_) | Ok("") => None,
            Ok(o) => return Err(format!("USWAP_INCOMPRESSIBLE={o:?}: use store or pass")),
        },
        remote: std::env::var("USWAP_REMOTE").ok().filter(|r| !r.is_empty()),
    })
}

extern "C" fn init() {
    let _g = enter();
    // An executable `uswap run` found we could harm (a Go program maps and releases
    // its heap with raw system calls): stay out of it; it has said why.
    if let Some(skip) = std::env::var_os("USWAP_SKIP_EXE") {
        if std::fs::read_link("/proc/self/exe").is_ok_and(|e| e.as_os_str() == skip) {
            STATE.store(2, Relaxed);
            return;
        }
    }
    let cfg = match read_config() {
        Ok(c) => c,
        Err(e) => {
            eprint_line(&format!("{e}; running without uswap"));
            STATE.store(2, Relaxed);
            return;
        }
    };
    THRESHOLD.store(cfg.threshold, Relaxed);
    THREAD_ARENAS.store(cfg.thread_arenas, Relaxed);
    BRK_AT_START.store(sys::program_break(), Relaxed);
    let stats = cfg.stats.is_some();
    // Said where the figures go to stderr (as `uswap run` says where the swap is), and
    // only for the case that changes what goes under uswap.
    if let owner::Owner::Foreign(f) = owner::get() {
        if cfg.stats.as_deref() == Some("-") {
            eprint_line(&format!(
                "malloc is {}'s: left to it (its mappings go under uswap)",
                f.name
            ));
        }
    }
    let _ = CONFIG.set(cfg);
    // SAFETY: registers plain extern "C" handlers that live as long as the process.
    unsafe {
        // The plain heap's hooks first: its lock is taken after these, which allocate.
        uswap::heap::register_fork_hooks();
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        libc::atexit(close_remote);
        if stats {
            libc::atexit(print_stats);
        }
    }
    STATE.store(1, Relaxed);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// At exit, after the stats (exit handlers run last-registered first, and this one is
/// registered before `print_stats`): the remote tier's values go, as a dropped pool's
/// would. A process that ends without exit handlers (`_exit`, exec, a kill) leaves them
/// to its parent's pool, which deletes them once it and its descendants are gone, or to
/// their expiry.
extern "C" fn close_remote() {
    let _g = enter();
    if let Some(p) = POOL.get().and_then(|p| p.as_ref()) {
        p.close_remote_at_exit();
        p.close_live_at_exit();
    }
}

/// The pool, started at the first allocation that needs it. Call with the guard set.
fn pool() -> Option<&'static Pool> {
    POOL.get_or_init(|| {
        let cfg = CONFIG.get()?;
        // The preload orders the fork hooks with its own locks (`fork_prepare`).
        let mut b = Pool::builder()
            .budget(cfg.budget)
            .max_swap(cfg.max_swap)
            .unit(cfg.unit)
            .encrypt(cfg.encrypt)
            .tier(cfg.tier)
            .compressor(cfg.compressor)
            .fork_hooks(false);
        if let Some(p) = cfg.compressed_max {
            b = b.compressed_max_percent(p);
        }
        if let Some(on) = cfg.store_incompressible {
            b = b.store_incompressible(on);
        }
        if let Some(r) = &cfg.remote {
            b = b.remote(r.clone());
        }
        if let Some(p) = &cfg.swap_file {
            b = b.swap_file(p);
        }
        if let Some(k) = cfg.keep_free {
            b = b.keep_free(k);
        }
        match std::panic::catch_unwind(move || b.build()) {
            Ok(Ok(p)) => {
                if cfg.stats.is_some() {
                    start_sampler();
                }
                Some(p)
            }
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
    make_region(len, None)
}

/// A new region at `addr` (2 MiB aligned) replacing an empty PROT_NONE reservation of
/// ours or of the program's, or None (the range is left reserved PROT_NONE). Call
/// with the guard set.
fn new_region_at(addr: usize, len: usize) -> Option<Arc<Region>> {
    make_region(len, Some(addr))
}

fn make_region(len: usize, at: Option<usize>) -> Option<Arc<Region>> {
    let pool = pool()?;
    let made = std::panic::catch_unwind(|| match at {
        // SAFETY: callers pass ranges that are empty reservations nothing else uses
        // (the heap's span, or parts of the program's reservations it just
        // committed and that were never committed before).
        Some(a) => unsafe { pool.region_at(a as *mut u8, len as u64, Default::default()) },
        None => pool.region(len as u64),
    });
    match made {
        Ok(Ok(r)) => Some(Arc::new(r)),
        // A request no memory could hold (a probe such as mmap(SIZE_MAX)): the kernel
        // answers it, as it would without uswap; nothing to say.
        Ok(Err(uswap::Error::InvalidRegionSize { .. })) => None,
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

// ---- engine threads and the program's memory -----------------------------------------
//
// An engine thread must never touch memory that can fault to the engine: it would wait
// for itself. Its own allocations bypass uswap (`bypass`), but libc keeps global state
// that its functions read on the engine's behalf: `strerror` (formatting an I/O error)
// reads the locale and the environment, lazy symbol binding walks the link maps of
// dlopen'd libraries. A JVM calls `setlocale` and `dlopen` on a thread other than the
// main one, so that state would land in a uswap arena and be swapped out (seen: the
// fault thread hung in `guess_category_value` under `strerror_r`). So the calls that
// allocate such state run with the guard set (their memory is the plain heap's), and the
// library binds its symbols at load (build.rs: -z now).

/// Interpose a libc function so that it runs with the guard set.
macro_rules! outside_uswap {
    ($name:ident, $cname:literal, fn($($a:ident: $t:ty),*) -> $r:ty, $fail:expr) => {
        /// # Safety
        /// The C contract of the function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            type F = unsafe extern "C" fn($($t),*) -> $r;
            static REAL: OnceLock<Option<F>> = OnceLock::new();
            let real = REAL.get_or_init(|| {
                // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this
                // library; the symbol has the C signature declared here.
                unsafe {
                    let p = libc::dlsym(libc::RTLD_NEXT, $cname.as_ptr());
                    (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, F>(p))
                }
            });
            let Some(real) = *real else {
                sys::set_errno(libc::ENOSYS);
                return $fail;
            };
            let _g = enter();
            // SAFETY: the caller's contract.
            unsafe { real($($a),*) }
        }
    };
}

use libc::c_char;
outside_uswap!(
    dlopen,
    c"dlopen",
    fn(file: *const c_char, mode: c_int) -> *mut c_void,
    std::ptr::null_mut()
);
outside_uswap!(
    dlmopen,
    c"dlmopen",
    fn(ns: libc::c_long, file: *const c_char, mode: c_int) -> *mut c_void,
    std::ptr::null_mut()
);
outside_uswap!(
    setlocale,
    c"setlocale",
    fn(cat: c_int, locale: *const c_char) -> *mut c_char,
    std::ptr::null_mut()
);
outside_uswap!(
    newlocale,
    c"newlocale",
    fn(mask: c_int, locale: *const c_char, base: libc::locale_t) -> libc::locale_t,
    std::ptr::null_mut()
);
outside_uswap!(
    duplocale,
    c"duplocale",
    fn(l: libc::locale_t) -> libc::locale_t,
    std::ptr::null_mut()
);
outside_uswap!(
    setenv,
    c"setenv",
    fn(name: *const c_char, value: *const c_char, over: c_int) -> c_int,
    -1
);
outside_uswap!(putenv, c"putenv", fn(s: *mut c_char) -> c_int, -1);
outside_uswap!(unsetenv, c"unsetenv", fn(name: *const c_char) -> c_int, -1);

// ---- fork and exit ------------------------------------------------------------------

thread_local! {
    /// The table lock, held by the forking thread from prepare to parent/child.
    static FORK_LOCK: std::cell::RefCell<Option<std::sync::MutexGuard<'static, std::collections::BTreeMap<usize, table::Entry>>>> =
        const { std::cell::RefCell::new(None) };
    static FORK_INSIDE: Cell<bool> = const { Cell::new(false) };
}

extern "C" fn fork_prepare() {
    let prev = T.with(|t| t.inside.replace(true));
    FORK_INSIDE.with(|c| c.set(prev));
    let g = table::lock();
    FORK_LOCK.with(|l| *l.borrow_mut() = Some(g));
    heap::fork_prepare();
    uswap::prepare_fork();
}

extern "C" fn fork_parent() {
    uswap::after_fork_parent();
    heap::fork_done();
    FORK_LOCK.with(|l| l.borrow_mut().take());
    T.with(|t| t.inside.set(FORK_INSIDE.with(|f| f.get())));
}

extern "C" fn fork_child() {
    uswap::after_fork_child();
    heap::fork_done();
    FORK_LOCK.with(|l| l.borrow_mut().take());
    T.with(|t| t.inside.set(FORK_INSIDE.with(|f| f.get())));
}

/// Peaks of what uswap held (resident + swapped) and of the anonymous memory outside
/// it, sampled every 100 ms for --stats (at exit some programs have freed everything:
/// Node tears its heap down first).
static PEAK_HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK_OUTSIDE: AtomicUsize = AtomicUsize::new(0);

/// (held, outside) now: uswap's resident and swapped bytes, and `RssAnon` minus uswap's
/// RAM (resident and swap cache), which `RssAnon` counts too.
fn coverage(c: &uswap::Counters) -> (u64, u64) {
    let held = c.resident_bytes + c.slots_used * 4096;
    let outside = status_bytes("RssAnon:").saturating_sub(c.resident_bytes + c.cached_bytes);
    (held, outside)
}

fn sample_coverage() {
    if let Some(p) = POOL.get().and_then(|p| p.as_ref()) {
        let (held, outside) = coverage(&p.counters());
        PEAK_HELD.fetch_max(held as usize, Relaxed);
        PEAK_OUTSIDE.fetch_max(outside as usize, Relaxed);
    }
}

/// The sampler: started from inside uswap, so it is an engine thread (never uswap
/// memory); it only reads the engine's counters and /proc/self/status.
fn start_sampler() {
    let _ = std::thread::Builder::new()
        .name("uswap-stats".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            sample_coverage();
        });
}

/// A `kB` field of /proc/self/status, in bytes (0 if absent).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
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
    // How much of the program's memory uswap held: at exit, and at the peaks sampled.
    sample_coverage();
    let (held, outside) = coverage(&counters);
    let (peak_held, peak_outside) = (
        PEAK_HELD.load(Relaxed) as u64,
        PEAK_OUTSIDE.load(Relaxed) as u64,
    );
    let percent = |a: u64, b: u64| {
        if a + b > 0 {
            (a as f64 * 1000.0 / (a + b) as f64).round() / 10.0
        } else {
            0.0
        }
    };
    let v = serde_json::json!({
        "uswap_stats": {
            "pid": me,
            "program": program.trim(),
            "budget": cfg.budget,
            "threshold": cfg.threshold,
            "active": pool.is_some(),
            "malloc": match owner::get() {
                owner::Owner::Foreign(f) => f.name.as_str(),
                _ => "glibc",
            },
            "plain_heap_bytes": plain::committed_bytes(),
            "swap": pool.map(|p| p.swap_place()),
            "tier": cfg.tier.name(),
            "compressor": cfg.tier.is_compressed().then(|| cfg.compressor.to_string()),
            "compressed_max_pct": cfg.tier.is_compressed().then(|| {
                cfg.compressed_max
                    .unwrap_or(cfg.tier.default_compressed_max_percent())
            }),
            "zswap_ratio": cfg.tier.is_compressed().then(|| counters.zswap_ratio()),
            "regions_created": table::REGIONS_CREATED.load(Relaxed),
            "malloc_blocks": table::MALLOC_BLOCKS.load(Relaxed),
            "mmap_regions": table::MMAP_REGIONS.load(Relaxed),
            "live_regions": table::LIVE_REGIONS.load(Relaxed),
            "peak_region_bytes": table::PEAK_LIVE_BYTES.load(Relaxed),
            "heap_blocks": table::HEAP_BLOCKS.load(Relaxed),
            "heap_slabs": heap::MID_SLABS.load(Relaxed),
            "reservations": resv::RESERVATIONS.load(Relaxed),
            "reservation_regions": table::RESERVATION_REGIONS.load(Relaxed),
            "arena_slabs": heap::ARENA_SLABS.load(Relaxed),
            "arena_bytes": heap::ARENA_BYTES.load(Relaxed),
            "main_thread_on_arenas": MAIN_ON_ARENAS.load(Relaxed),
            "fallbacks": FALLBACKS.load(Relaxed),
            "peak_used_bytes": counters.peak_used_bytes,
            "vm_hwm_bytes": status_bytes("VmHWM:"),
            "rss_anon_bytes": status_bytes("RssAnon:"),
            "uswap_resident_bytes": counters.resident_bytes,
            "uswap_swapped_bytes": counters.slots_used * 4096,
            "outside_uswap_bytes": outside,
            "under_uswap_percent": percent(held, outside),
            "peak_under_uswap_bytes": peak_held,
            "peak_outside_uswap_bytes": peak_outside,
            "peak_under_uswap_percent": percent(peak_held, peak_outside),
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

/// How far the main thread's `brk` heap may grow past where it was at start before
/// its small blocks go to the uswap arenas too. Below it, glibc's main arena is the
/// faster home (a malloc+free pair ~8 ns against the arenas' ~37); past it, the
/// program keeps its data there (SQLite's page cache, glibc-malloc Redis), and a
/// budget that left it out would hold almost nothing of the program.
const MAIN_HEAP_MAX: usize = 32 << 20;

/// The program break when the library started (`sbrk(0)`); 0: not read.
static BRK_AT_START: AtomicUsize = AtomicUsize::new(0);

/// Whether the main thread's small blocks have gone to the uswap arenas (its `brk`
/// heap passed `MAIN_HEAP_MAX`); said in `--stats`.
static MAIN_ON_ARENAS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the main thread's `brk` heap has grown `MAIN_HEAP_MAX` past its start.
fn main_heap_outgrown() -> bool {
    let start = BRK_AT_START.load(Relaxed);
    start != 0 && sys::program_break().saturating_sub(start) >= MAIN_HEAP_MAX
}

/// A small block for this thread: from its cache, or its arena; null: glibc's (an
/// engine thread, inside uswap, arenas off or uswap off, and the main thread until
/// its `brk` heap outgrows `MAIN_HEAP_MAX`, looked at every 256th of its small
/// mallocs). One thread-local access. (After a fork, the forking thread keeps its
/// answer, which only changes where its small blocks go.)
fn small_alloc(size: usize) -> *mut c_void {
    if STATE.load(Relaxed) != 1 || !THREAD_ARENAS.load(Relaxed) {
        return std::ptr::null_mut();
    }
    let idx = T.with(|t| {
        if t.inside.get() || t.engine.get() {
            return None;
        }
        if t.main.get() == 0 {
            // SAFETY: gettid and getpid have no preconditions.
            let main = unsafe { libc::gettid() == libc::getpid() };
            t.main.set(if main { 1 } else { 2 });
        }
        if t.main.get() == 1 {
            let n = t.main_mallocs.get().wrapping_add(1);
            t.main_mallocs.set(n);
            if !n.is_multiple_of(256) || !main_heap_outgrown() {
                return None;
            }
            t.main.set(2);
            MAIN_ON_ARENAS.store(true, Relaxed);
        }
        if let Some(p) = t.cache.take(size) {
            return Some(Err(p));
        }
        if t.arena.get() == usize::MAX {
            t.arena.set(heap::next_arena());
        }
        Some(Ok(t.arena.get()))
    });
    match idx {
        Some(Err(p)) => p.as_ptr().cast(),
        // Whole size classes, so that the block can serve its class from the cache.
        Some(Ok(idx)) => heap::arena_alloc(idx, size.max(1).next_multiple_of(16))
            .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast()),
        None => std::ptr::null_mut(),
    }
}

/// A uswap-backed block of `size` >= threshold bytes (zero-filled), or null: a
/// mid-size extent, or a region of its own.
fn big_alloc(size: usize) -> *mut c_void {
    let _g = enter();
    if size < heap::MID_MAX {
        let len = table::page_up(size);
        if let Some((a, r)) = heap::mid_alloc(len) {
            return table::insert_block(r, a, len, true, table::Kind::Malloc(size), len)
                as *mut c_void;
        }
    }
    match new_region(size) {
        Some(r) => table::insert(r, table::Kind::Malloc(size), usize::MAX) as *mut c_void,
        None => std::ptr::null_mut(),
    }
}

/// Whether `p` may be one of our table blocks: regions start 2 MiB aligned, mid-size
/// blocks lie in the heap span. Engine threads never get here past `bypass`, so they
/// never wait for the table lock (which the forking thread holds while the engine
/// quiesces them).
fn maybe_ours(p: *mut c_void) -> bool {
    let a = p as usize;
    a != 0 && (a & (UNIT - 1) == 0 || heap::in_mid(a)) && table::may_overlap(a, a + 1) && !bypass()
}

/// Drop our block at `p`; false when it is not ours.
fn free_ours(p: *mut c_void) -> bool {
    if let Some(idx) = heap::arena_of(p as usize) {
        // SAFETY: a block in arena `idx`'s part of the span is one of its blocks (the
        // free contract: `p` is live and no longer used).
        unsafe {
            let np = NonNull::new_unchecked(p.cast());
            // Only threads that take small blocks from the arenas cache (not engine
            // threads, which must not touch program memory, nor the main thread while
            // on glibc's main arena).
            let cached = T.with(|t| {
                !(t.inside.get() || t.engine.get()) && t.main.get() == 2 && t.cache.keep(np)
            });
            if !cached {
                heap::arena_free(idx, np);
            }
        }
        return true;
    }
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
    match route() {
        Route::Ours => {}
        Route::Plain => return plain::alloc(size, heap::ARENA_ALIGN),
        // SAFETY: the program's allocator's malloc: the same contract.
        Route::Foreign(f) => return unsafe { (f.malloc)(size) },
    }
    let p = if size >= threshold() {
        if bypass() {
            std::ptr::null_mut()
        } else {
            big_alloc(size)
        }
    } else {
        small_alloc(size)
    };
    if p.is_null() {
        sys::malloc(size)
    } else {
        p
    }
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(nmemb: size_t, size: size_t) -> *mut c_void {
    match route() {
        Route::Ours => {}
        Route::Plain => {
            let Some(total) = nmemb.checked_mul(size) else {
                sys::set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            };
            let p = plain::alloc(total, heap::ARENA_ALIGN);
            if !p.is_null() {
                // SAFETY: a fresh block of `total` bytes (the heap reuses memory).
                unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, total) };
            }
            return p;
        }
        // SAFETY: the program's allocator's calloc: the same contract.
        Route::Foreign(f) => return unsafe { (f.calloc)(nmemb, size) },
    }
    if let Some(total) = nmemb.checked_mul(size) {
        if total >= threshold() && !bypass() {
            // A fresh block reads as zeros: nothing to clear.
            let p = big_alloc(total);
            if !p.is_null() {
                return p;
            }
        } else if total < threshold() {
            let p = small_alloc(total);
            if !p.is_null() {
                // SAFETY: a fresh arena block of `total` bytes (arena memory is reused).
                unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, total) };
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
    if p.is_null() {
        return;
    }
    // Whoever frees it, a block is its allocator's: the plain heap's by address, the
    // rest the owner's.
    if plain::contains(p as usize) {
        // SAFETY: the free contract: a live block, of the plain heap.
        return unsafe { plain::free(p) };
    }
    match owner::get() {
        owner::Owner::Glibc => {}
        // SAFETY: not the plain heap's, so the program allocator's.
        owner::Owner::Foreign(f) => return unsafe { (f.free)(p) },
        // Nothing was handed out before the owner was known: not a block of ours to
        // give to anyone (left alone).
        owner::Owner::Unknown => return,
    }
    if free_ours(p) {
        return;
    }
    // SAFETY: not ours, so glibc's.
    unsafe { sys::free(p) }
}

/// Whose a live block is.
enum Block {
    /// A small block of arena `.0`.
    Arena(usize, NonNull<u8>),
    /// A block of the table (mid-size extent or region of its own): its region and the
    /// size asked for.
    Table(Arc<Region>, usize),
    Glibc,
}

fn block_of(p: *mut c_void) -> Block {
    if let Some(idx) = heap::arena_of(p as usize) {
        // SAFETY: non-null (checked by callers) pointer into an arena.
        return Block::Arena(idx, unsafe { NonNull::new_unchecked(p.cast()) });
    }
    if maybe_ours(p) {
        let _g = enter();
        if let Some((r, size)) = table::block(p as usize) {
            return Block::Table(r, size);
        }
    }
    Block::Glibc
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: the malloc contract.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // SAFETY: the free contract (glibc frees and returns null too).
        unsafe { free(p) };
        return std::ptr::null_mut();
    }
    if plain::contains(p as usize) {
        // SAFETY: a live block of the plain heap (the realloc contract).
        return unsafe { plain::realloc(p, size) };
    }
    match owner::get() {
        owner::Owner::Glibc => {}
        // SAFETY: not the plain heap's, so the program allocator's.
        owner::Owner::Foreign(f) => return unsafe { (f.realloc)(p, size) },
        owner::Owner::Unknown => {
            sys::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
    }
    let old = match block_of(p) {
        Block::Glibc => {
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
        }
        Block::Arena(idx, np) => {
            if size < threshold() {
                // SAFETY: `np` is a live block of arena `idx`.
                if let Some(n) = unsafe { heap::arena_realloc(idx, np, size) } {
                    return n.as_ptr().cast();
                }
            }
            // SAFETY: as above.
            unsafe { heap::arena_usable(idx, np) }
        }
        Block::Table(region, old_size) => {
            let in_place = size >= threshold()
                && if heap::in_mid(p as usize) {
                    size <= table::page_up(old_size)
                } else {
                    size <= region.len()
                };
            if in_place {
                // Shrink throws the tail pages away.
                let (keep, had) = (table::page_up(size), table::page_up(old_size));
                let _g = enter();
                if keep < had {
                    let off = p as usize - region.as_ptr() as usize;
                    let _ = region.discard(off + keep, had - keep);
                }
                table::set_block_size(p as usize, size);
                return p;
            }
            old_size
        }
    };
    // SAFETY: the malloc contract.
    let n = unsafe { malloc(size) };
    if n.is_null() {
        return n;
    }
    // SAFETY: both blocks are live and distinct; `n` holds `size` bytes, `p` `old`.
    unsafe { sys::copy(n, p, old.min(size)) };
    // SAFETY: `p` is a live block of ours or glibc's.
    unsafe { free(p) };
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

/// A block of ours with alignment `align`, or null (glibc's then).
fn aligned_ours(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        return std::ptr::null_mut();
    }
    if size >= threshold() {
        // Mid-size blocks are page aligned, regions 2 MiB aligned.
        if align > UNIT || bypass() {
            return std::ptr::null_mut();
        }
        if align > table::PAGE && size < heap::MID_MAX {
            let _g = enter();
            return match new_region(size) {
                Some(r) => table::insert(r, table::Kind::Malloc(size), usize::MAX) as *mut c_void,
                None => std::ptr::null_mut(),
            };
        }
        big_alloc(size)
    } else if align <= heap::ARENA_ALIGN {
        small_alloc(size)
    } else {
        std::ptr::null_mut()
    }
}

/// A plain-heap block with alignment `align` (glibc's memalign rounding), or null.
fn plain_aligned(align: usize, size: usize) -> *mut c_void {
    match align.checked_next_power_of_two() {
        Some(a) if a <= UNIT => plain::alloc(size, a),
        _ => {
            sys::set_errno(libc::EINVAL);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    match route() {
        Route::Ours => {}
        Route::Plain => return plain_aligned(align, size),
        Route::Foreign(f) => return f.memalign(align, size),
    }
    let p = aligned_ours(align, size);
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
    let p = match route() {
        Route::Ours => {
            let p = aligned_ours(align, size);
            if p.is_null() {
                sys::memalign(align, size)
            } else {
                p
            }
        }
        Route::Plain => plain_aligned(align, size),
        Route::Foreign(f) => {
            if let Some(pm) = f.posix_memalign {
                // SAFETY: the program's allocator's posix_memalign: the same contract.
                return unsafe { pm(out, align, size) };
            }
            f.memalign(align, size)
        }
    };
    if p.is_null() && size != 0 {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = p };
    0
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    match route() {
        Route::Ours => {}
        Route::Plain => return plain_aligned(table::PAGE, size),
        Route::Foreign(f) => {
            return match f.valloc {
                // SAFETY: the program's allocator's valloc: the same contract.
                Some(v) => unsafe { v(size) },
                None => f.memalign(table::PAGE, size),
            };
        }
    }
    let p = if size >= threshold() {
        aligned_ours(table::PAGE, size)
    } else {
        std::ptr::null_mut()
    };
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
    match route() {
        Route::Ours => {}
        Route::Plain => return plain_aligned(table::PAGE, table::page_up(size)),
        Route::Foreign(f) => {
            return match f.pvalloc {
                // SAFETY: the program's allocator's pvalloc: the same contract.
                Some(v) => unsafe { v(size) },
                None => f.memalign(table::PAGE, table::page_up(size)),
            };
        }
    }
    let size = table::page_up(size);
    let p = if size >= threshold() {
        aligned_ours(table::PAGE, size)
    } else {
        std::ptr::null_mut()
    };
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
    if plain::contains(p as usize) {
        // SAFETY: a live block of the plain heap.
        return unsafe { plain::usable(p) };
    }
    match owner::get() {
        owner::Owner::Glibc => {}
        owner::Owner::Foreign(f) => {
            // SAFETY: not the plain heap's, so the program allocator's.
            return f.usable_size.map_or(0, |u| unsafe { u(p) });
        }
        owner::Owner::Unknown => return 0,
    }
    match block_of(p) {
        Block::Arena(idx, np) => {
            // SAFETY: a live block of arena `idx`.
            unsafe { heap::arena_usable(idx, np) }
        }
        Block::Table(r, size) => {
            if heap::in_mid(p as usize) {
                table::page_up(size)
            } else {
                r.len()
            }
        }
        // SAFETY: not ours, so glibc's.
        Block::Glibc => unsafe { sys::usable_size(p) },
    }
}

// ---- mapping calls ------------------------------------------------------------------

const REFUSED_FLAGS: c_int = libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_GROWSDOWN
    | libc::MAP_STACK
    | libc::MAP_HUGETLB
    | libc::MAP_32BIT
    | libc::MAP_SHARED;
const RW: c_int = libc::PROT_READ | libc::PROT_WRITE;

/// Anonymous (or /dev/zero) private memory.
fn anon_private(flags: c_int, fd: c_int) -> bool {
    flags & 0x0f == libc::MAP_PRIVATE
        && flags & (libc::MAP_SHARED | libc::MAP_HUGETLB) == 0
        && (flags & libc::MAP_ANONYMOUS != 0 || sys::is_dev_zero(fd))
}

/// A new mapping that goes under uswap at once: read-write.
fn eligible(len: usize, prot: c_int, flags: c_int, fd: c_int) -> bool {
    len >= threshold() && prot == RW && anon_private(flags, fd) && flags & REFUSED_FLAGS == 0
}

/// A reservation: PROT_NONE, to be committed later.
fn reservation(len: usize, prot: c_int, flags: c_int, fd: c_int) -> bool {
    len >= threshold()
        && prot == libc::PROT_NONE
        && anon_private(flags, fd)
        && flags & REFUSED_FLAGS == 0
}

/// MADV_WIPEONFORK / MADV_DONTFORK on `[s, e)`: refused (EINVAL, as the kernel refuses
/// them where it cannot honor them) if any of it is uswap memory, else the kernel's. A
/// region's pages live in the engine's regions and tiers, which a child inherits whole
/// (fork.rs): accepted as no-ops, the child read the parent's bytes where the program
/// had asked for zeros or no mapping. Refused, the program knows and keeps its own way
/// (OpenSSL and glibc's arc4random fall back to checking the pid).
fn fork_advice(s: usize, e: usize, kernel: impl Fn(usize, usize) -> c_int) -> c_int {
    let gaps = table::gaps(s, e);
    let covered: usize = gaps.iter().map(|&(a, z)| z - a).sum();
    if covered < e - s {
        sys::set_errno(libc::EINVAL);
        return -1;
    }
    gaps_result(&gaps, kernel)
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

/// Whether `[s, e)` may touch memory of ours or a reservation of the program's.
fn may_touch(s: usize, e: usize) -> bool {
    table::may_overlap(s, e) || resv::may_overlap(s, e)
}

/// The program commits `[s, e)` (read-write): the empty reservation chunks holding it
/// become regions first, their parts outside `[s, e)` PROT_NONE as they were.
fn commit(s: usize, e: usize) {
    for (a, z) in resv::take_for_commit(s, e) {
        match new_region_at(a, z - a) {
            Some(r) => {
                table::insert(r, table::Kind::Reservation, z - a);
                if a < s {
                    sys::mprotect(a, s - a, libc::PROT_NONE);
                }
                if z > e {
                    sys::mprotect(e, z - e, libc::PROT_NONE);
                }
            }
            None => resv::give_back(a, z),
        }
    }
}

/// mmap(MAP_FIXED) of anonymous private memory, read-write or PROT_NONE, over `[s, e)`
/// that may be ours: our pieces stay ours (fresh: discarded, then protected as asked),
/// the rest goes to the kernel.
fn map_fixed_anon(s: usize, e: usize, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> c_int {
    if prot == RW {
        commit(s, e);
    }
    let (plan, ours) = table::remap_fresh(s, e);
    let gaps = plan.gaps.clone();
    plan.finish();
    for (a, z) in ours {
        sys::mprotect(a, z - a, prot);
    }
    gaps_result(&gaps, |a, n| {
        // A fresh PROT_NONE mapping is still empty reserved space; a read-write one is
        // the kernel's memory now.
        if prot != libc::PROT_NONE {
            resv::taken(a, a + n);
        }
        let off = off + (a - s) as off_t;
        let r = sys::mmap(a as *mut c_void, n, prot, flags, fd, off);
        if r == libc::MAP_FAILED {
            -1
        } else {
            0
        }
    })
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
    if STATE.load(Relaxed) != 1 || bypass() {
        return sys::mmap(addr, len, prot, flags, fd, off);
    }
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == libc::MAP_FIXED;
    if eligible(len, prot, flags, fd) {
        let _g = enter();
        let plen = table::page_up(len);
        if plen < heap::MID_MAX {
            if let Some((a, r)) = heap::mid_alloc(plen) {
                return table::insert_block(r, a, plen, true, table::Kind::Map, plen)
                    as *mut c_void;
            }
        }
        if let Some(r) = new_region(len) {
            let rlen = r.len();
            let base = table::insert(r, table::Kind::Map, plen);
            // The region's rounding past the mapping faults, as past a real mapping
            // (mremap grows into it: read-write again).
            if rlen > plen {
                sys::mprotect(base + plen, rlen - plen, libc::PROT_NONE);
            }
            return base as *mut c_void;
        }
    } else if reservation(len, prot, flags, fd) {
        let p = sys::mmap(addr, len, prot, flags, fd, off);
        if p != libc::MAP_FAILED {
            let _g = enter();
            resv::record(p as usize, p as usize + table::page_up(len));
        }
        return p;
    } else if fixed {
        let s = addr as usize;
        let e = s.saturating_add(table::page_up(len));
        if s.is_multiple_of(table::PAGE) && may_touch(s, e) {
            let _g = enter();
            if anon_private(flags, fd) && (prot == RW || prot == libc::PROT_NONE) {
                // Commit or uncommit (a JVM does both so): ours stays ours.
                return if map_fixed_anon(s, e, prot, flags, fd, off) == 0 {
                    addr
                } else {
                    libc::MAP_FAILED
                };
            }
            // Another mapping placed over our memory: the engine gives that part up
            // for good; and it is no empty reservation any more.
            table::unmap(s, e, true).finish();
            resv::taken(s, e);
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
/// The C `mprotect` contract.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    let s = addr as usize;
    let e = s.saturating_add(table::page_up(len));
    if len == 0 || !s.is_multiple_of(table::PAGE) || !may_touch(s, e) || bypass() {
        return sys::mprotect(s, len, prot);
    }
    let _g = enter();
    if prot == RW {
        commit(s, e);
    }
    let (live, holes, gaps) = table::live_parts(s, e);
    let mut rc = gaps_result(&gaps, |a, n| {
        if prot != libc::PROT_NONE {
            resv::taken(a, a + n);
        }
        sys::mprotect(a, n, prot)
    });
    rc |= gaps_result(&live, |a, n| sys::mprotect(a, n, prot));
    if !holes.is_empty() {
        // Unmapped: the kernel's answer for unmapped memory.
        sys::set_errno(libc::ENOMEM);
        rc = -1;
    }
    rc
}

/// # Safety
/// The C `munmap` contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let s = addr as usize;
    let e = s.saturating_add(table::page_up(len));
    if len == 0 || !s.is_multiple_of(table::PAGE) || !may_touch(s, e) || bypass() {
        return sys::munmap(addr, len);
    }
    let _g = enter();
    resv::taken(s, e);
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
    if old_len == 0 || !s.is_multiple_of(table::PAGE) || !may_touch(s, old_end) || bypass() {
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
            // A reservation that moves or shrinks stops being one we follow.
            resv::taken(s, old_end);
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
        // The tail becomes a PROT_NONE hole: a stray access faults as after a real
        // shrink.
        table::unmap(s + new_len, s + old_len, false).finish();
        return old;
    }
    if room {
        // Back from a hole (or never used): mapped read-write again.
        table::add_live(base, s + old_len, s + new_len);
        sys::mprotect(s + old_len, new_len - old_len, RW);
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
    table::insert(r, table::Kind::Map, new_len);
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
        libc::MADV_WIPEONFORK | libc::MADV_DONTFORK => fork_advice(s, e, kernel),
        // Hints and flags that mean nothing to uswap memory (or would disturb the
        // engine's own placement): accepted, no-op.
        libc::MADV_NORMAL
        | libc::MADV_RANDOM
        | libc::MADV_SEQUENTIAL
        | libc::MADV_WILLNEED
        | libc::MADV_HUGEPAGE
        | libc::MADV_NOHUGEPAGE
        | libc::MADV_DOFORK
        | libc::MADV_MERGEABLE
        | libc::MADV_UNMERGEABLE
        | libc::MADV_DONTDUMP
        | libc::MADV_DODUMP
        | libc::MADV_KEEPONFORK
        | libc::MADV_COLD
        | libc::MADV_PAGEOUT
        | 25 /* MADV_COLLAPSE */ => gaps_result(&table::gaps(s, e), kernel),
        // The rest (MADV_POPULATE_READ/WRITE, ...) is safe for the kernel to do on
        // userfaultfd memory: faults are served as usual.
        _ => kernel(s, e - s),
    }
}
