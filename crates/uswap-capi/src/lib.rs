//! C API of uswap (`libuswap.so`, `libuswap.a`, `include/uswap.h`).
//!
//! Every function that can fail returns NULL (or -1) and sets `errno`; the message of
//! the last failure on the calling thread is `uswap_last_error()`.

use engine::{Counters, Error, Pool, Region};
use libc::{c_char, c_int};
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The engine allocates apart from the C program's `malloc`: a program's signal handler
/// that touches uswap memory while its thread is inside `malloc` must not wait for an
/// engine thread that waits for `malloc` (`uswap::EngineHeap`).
#[global_allocator]
static HEAP: engine::EngineHeap = engine::EngineHeap;

/// Opaque pool handle.
pub struct UswapPool(Pool);
/// Opaque region handle.
pub struct UswapRegion(Region);

/// Counters of a pool or region (names as in /proc/vmstat). Layout matches
/// `uswap_counters` in uswap.h.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UswapCounters {
    pub pswpin: u64,
    pub pswpout: u64,
    pub swap_ra: u64,
    pub swap_ra_hit: u64,
    pub thp_swpout: u64,
    pub thp_swpout_fallback: u64,
    pub thp_swpin: u64,
    pub thp_swpin_fallback: u64,
    pub majflt: u64,
    pub minflt: u64,
    pub swapcache_hit: u64,
    pub wpflt: u64,
    pub stale_slot_freed: u64,
    pub evicted: u64,
    pub io_errors: u64,
    pub slots_used: u64,
    pub resident_bytes: u64,
    pub cached_bytes: u64,
    pub metadata_bytes: u64,
    pub peak_used_bytes: u64,
}

impl From<Counters> for UswapCounters {
    fn from(c: Counters) -> Self {
        UswapCounters {
            pswpin: c.pswpin,
            pswpout: c.pswpout,
            swap_ra: c.swap_ra,
            swap_ra_hit: c.swap_ra_hit,
            thp_swpout: c.thp_swpout,
            thp_swpout_fallback: c.thp_swpout_fallback,
            thp_swpin: c.thp_swpin,
            thp_swpin_fallback: c.thp_swpin_fallback,
            majflt: c.majflt,
            minflt: c.minflt,
            swapcache_hit: c.swapcache_hit,
            wpflt: c.wpflt,
            stale_slot_freed: c.stale_slot_freed,
            evicted: c.evicted,
            io_errors: c.io_errors,
            slots_used: c.slots_used,
            resident_bytes: c.resident_bytes,
            cached_bytes: c.cached_bytes,
            metadata_bytes: c.metadata_bytes,
            peak_used_bytes: c.peak_used_bytes,
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Record `msg` as the thread's last error and set errno.
fn fail(errno: c_int, msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
    set_errno(errno);
}

/// The errno for each engine error.
pub fn errno_of(e: &Error) -> c_int {
    let os = |s: &std::io::Error| s.raw_os_error().unwrap_or(libc::EIO);
    match e {
        Error::UffdNotPermitted { .. } => libc::EPERM,
        Error::UffdFeatureMissing { .. } => libc::ENOSYS,
        Error::SwapFile { source, .. } => os(source),
        Error::SwapFull { .. } => libc::ENOSPC,
        Error::BudgetTooSmall { .. }
        | Error::BudgetExceedsRam { .. }
        | Error::InvalidSize { .. }
        | Error::InvalidRegionSize { .. }
        | Error::SwapInRam { .. }
        | Error::SwapSizeTooSmall { .. }
        | Error::InvalidSetting { .. } => libc::EINVAL,
        Error::NoSwapPlace { .. } => libc::ENOENT,
        Error::Remote { .. } => libc::EHOSTUNREACH,
        Error::Sys { source, .. } => os(source),
    }
}

fn guarded<T>(null: T, f: impl FnOnce() -> Result<T, Error>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            fail(errno_of(&e), e.to_string());
            null
        }
        Err(_) => {
            fail(libc::EIO, "internal error (panic) in uswap".into());
            null
        }
    }
}

/// A pool with a resident budget of `budget` bytes, swapping to `swap_path` (a
/// directory, a new file or a block device; NULL: an unlinked file in $TMPDIR).
///
/// # Safety
/// `swap_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn uswap_pool_new(budget: u64, swap_path: *const c_char) -> *mut UswapPool {
    let path = if swap_path.is_null() {
        None
    } else {
        // SAFETY: the caller's contract.
        let s = unsafe { CStr::from_ptr(swap_path) };
        match s.to_str() {
            Ok(s) => Some(s.to_owned()),
            Err(_) => {
                fail(libc::EINVAL, "swap path is not UTF-8".into());
                return std::ptr::null_mut();
            }
        }
    };
    guarded(std::ptr::null_mut(), || {
        let mut b = Pool::builder().budget(budget);
        if let Some(p) = path {
            b = b.swap_file(p);
        }
        Ok(Box::into_raw(Box::new(UswapPool(b.build()?))))
    })
}

/// Release the pool handle. Regions made from it stay valid until freed; the engine
/// stops once the pool and all its regions are freed.
///
/// # Safety
/// `pool` is NULL or from `uswap_pool_new`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn uswap_pool_free(pool: *mut UswapPool) {
    if !pool.is_null() {
        // SAFETY: the caller's contract: a Box made by uswap_pool_new.
        drop(unsafe { Box::from_raw(pool) });
    }
}

/// A region of at least `size` bytes (rounded up to 2 MiB), zero-filled.
///
/// # Safety
/// `pool` is a live pool handle.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_new(pool: *mut UswapPool, size: u64) -> *mut UswapRegion {
    if pool.is_null() {
        fail(libc::EINVAL, "pool is NULL".into());
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's contract.
    let pool = unsafe { &*pool };
    guarded(std::ptr::null_mut(), || {
        Ok(Box::into_raw(Box::new(UswapRegion(pool.0.region(size)?))))
    })
}

/// Start address of the region's memory.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_ptr(r: *const UswapRegion) -> *mut libc::c_void {
    if r.is_null() {
        fail(libc::EINVAL, "region is NULL".into());
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's contract.
    unsafe { (*r).0.as_ptr().cast() }
}

/// Length of the region in bytes (0 with errno EINVAL for NULL).
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_len(r: *const UswapRegion) -> u64 {
    if r.is_null() {
        fail(libc::EINVAL, "region is NULL".into());
        return 0;
    }
    // SAFETY: the caller's contract.
    unsafe { (*r).0.len() as u64 }
}

/// Throw away `[offset, offset + len)` (page aligned): it reads as zeros afterwards.
/// Returns 0, or -1 with errno EINVAL.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_discard(
    r: *const UswapRegion,
    offset: u64,
    len: u64,
) -> c_int {
    if r.is_null() {
        fail(libc::EINVAL, "region is NULL".into());
        return -1;
    }
    // SAFETY: the caller's contract.
    let r = unsafe { &*r };
    guarded(-1, || {
        r.0.discard(offset as usize, len as usize)?;
        Ok(0)
    })
}

/// Unregister, unmap and free the region.
///
/// # Safety
/// `r` is NULL or from `uswap_region_new`, not freed before; its memory is not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_free(r: *mut UswapRegion) {
    if !r.is_null() {
        // SAFETY: the caller's contract: a Box made by uswap_region_new.
        drop(unsafe { Box::from_raw(r) });
    }
}

/// Fill `out` with the pool's counters. Returns 0, or -1 with errno EINVAL.
///
/// # Safety
/// `pool` is a live pool handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_pool_counters(
    pool: *const UswapPool,
    out: *mut UswapCounters,
) -> c_int {
    if pool.is_null() || out.is_null() {
        fail(libc::EINVAL, "NULL argument".into());
        return -1;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = (*pool).0.counters().into() };
    0
}

/// Change the pool's budget while it runs: growing, it may hold more at once;
/// shrinking, the limit drops now and the engine evicts down to it in the background
/// (a fault meanwhile waits for room; the regions' bytes are kept).
/// From 8 MiB up to the budget the pool started with. Returns 0, or -1 with errno
/// EINVAL (and `uswap_last_error`).
///
/// # Safety
/// `pool` is a live pool handle.
#[no_mangle]
pub unsafe extern "C" fn uswap_pool_set_budget(pool: *const UswapPool, budget: u64) -> c_int {
    if pool.is_null() {
        fail(libc::EINVAL, "NULL argument".into());
        return -1;
    }
    // SAFETY: the caller's contract.
    let pool = unsafe { &(*pool).0 };
    guarded(-1, || pool.set_budget(budget).map(|()| 0))
}

/// Fill `out` with the region's counters (with the pool's gauges).
///
/// # Safety
/// `r` is a live region handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_counters(
    r: *const UswapRegion,
    out: *mut UswapCounters,
) -> c_int {
    if r.is_null() || out.is_null() {
        fail(libc::EINVAL, "NULL argument".into());
        return -1;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = (*r).0.counters().into() };
    0
}

/// Parse a size such as "256M" or "2G" into `*out`. Returns 0, or -1 with errno EINVAL.
///
/// # Safety
/// `s` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_parse_size(s: *const c_char, out: *mut u64) -> c_int {
    if s.is_null() || out.is_null() {
        fail(libc::EINVAL, "NULL argument".into());
        return -1;
    }
    // SAFETY: the caller's contract.
    let s = unsafe { CStr::from_ptr(s) }.to_string_lossy();
    guarded(-1, || {
        let v = engine::parse_size(&s)?;
        // SAFETY: the caller's contract.
        unsafe { *out = v };
        Ok(0)
    })
}

/// The message of the last failure on this thread ("" if none). Valid until the next
/// failing call on this thread.
#[no_mangle]
pub extern "C" fn uswap_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> c_int {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    fn last_error() -> String {
        // SAFETY: uswap_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(uswap_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The header's promise: a NULL argument fails with EINVAL and a message, for every
    /// function that takes a handle.
    #[test]
    fn null_handles_set_errno_einval() {
        let null_r: *const UswapRegion = std::ptr::null();
        let mut c = UswapCounters::default();
        set_errno(0);
        // SAFETY: NULL is what is being tested; no handle is dereferenced.
        assert!(unsafe { uswap_region_ptr(null_r) }.is_null());
        assert_eq!(errno(), libc::EINVAL, "uswap_region_ptr(NULL)");
        assert!(last_error().contains("NULL"), "{}", last_error());
        set_errno(0);
        // SAFETY: as above.
        assert_eq!(unsafe { uswap_region_len(null_r) }, 0);
        assert_eq!(errno(), libc::EINVAL, "uswap_region_len(NULL)");
        set_errno(0);
        // SAFETY: as above.
        assert_eq!(unsafe { uswap_region_discard(null_r, 0, 4096) }, -1);
        assert_eq!(errno(), libc::EINVAL, "uswap_region_discard(NULL)");
        set_errno(0);
        // SAFETY: as above; `c` is a live struct.
        assert_eq!(unsafe { uswap_region_counters(null_r, &mut c) }, -1);
        assert_eq!(errno(), libc::EINVAL, "uswap_region_counters(NULL)");
        set_errno(0);
        // SAFETY: as above.
        assert!(unsafe { uswap_region_new(std::ptr::null_mut(), 1 << 20) }.is_null());
        assert_eq!(errno(), libc::EINVAL, "uswap_region_new(NULL)");
        set_errno(0);
        // SAFETY: as above.
        assert_eq!(unsafe { uswap_pool_counters(std::ptr::null(), &mut c) }, -1);
        assert_eq!(errno(), libc::EINVAL, "uswap_pool_counters(NULL)");
    }

    /// Errors of the swap place map to the errno the header lists.
    #[test]
    fn swap_place_errors_map_to_errno() {
        let e = Error::SwapSizeTooSmall {
            size: 0,
            minimum: 2 << 20,
        };
        assert_eq!(errno_of(&e), libc::EINVAL);
        let e = Error::SwapInRam {
            path: "/dev/shm".into(),
            what: "tmpfs".into(),
        };
        assert_eq!(errno_of(&e), libc::EINVAL);
    }
}
