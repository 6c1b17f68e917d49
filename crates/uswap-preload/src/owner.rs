//! Which allocator owns the program's `malloc`: glibc's, or one the program brought
//! (jemalloc, tcmalloc, mimalloc, linked or preloaded).
//!
//! This library comes first in the symbol search order, so every `malloc`, `free` and
//! `malloc_usable_size` call of the program comes here, while the program's allocator
//! may also be called directly (`mallocx`, `sdallocx`, `tc_malloc`, `mi_free`, C++
//! `new` of that library). Handing out glibc's blocks there breaks it: Debian's
//! redis-server (linked to libjemalloc.so.2) asked jemalloc's `malloc_usable_size`
//! about a glibc block and crashed at start. So one allocator owns the family per
//! process: the `malloc` the dynamic linker finds after this library. When that is not
//! glibc's, every family call of the program goes to it unchanged (its arenas reach the
//! kernel through `mmap`, which is interposed, so they still go under uswap), and the
//! library's own allocations come from `crate::plain`.

use libc::{c_char, c_int, c_void, size_t};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// glibc's symbol version of the malloc family.
#[cfg(target_arch = "x86_64")]
const GLIBC: &std::ffi::CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const GLIBC: &std::ffi::CStr = c"GLIBC_2.17";

type MallocFn = unsafe extern "C" fn(size_t) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> size_t;

/// The program's allocator, when it is not glibc's. The entry points it does not
/// export itself (jemalloc has no `pvalloc`) are None: the callers
/// build them from the others, never from glibc's.
pub struct Foreign {
    /// The library that defines it (for the start line and the stats).
    pub name: String,
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub calloc: CallocFn,
    pub realloc: ReallocFn,
    pub memalign: Option<MemalignFn>,
    pub aligned_alloc: Option<MemalignFn>,
    pub posix_memalign: Option<PosixMemalignFn>,
    pub valloc: Option<MallocFn>,
    pub pvalloc: Option<MallocFn>,
    pub usable_size: Option<UsableFn>,
}

/// 0: not known yet, 1: being found out (on this or another thread), 2: glibc,
/// 3: foreign.
static STATE: AtomicU8 = AtomicU8::new(0);
static FOREIGN: OnceLock<Foreign> = OnceLock::new();

pub enum Owner {
    Glibc,
    Foreign(&'static Foreign),
    /// Being found out: allocations made meanwhile (by the dynamic linker, on behalf of
    /// the lookup) come from `crate::plain`, which `free` knows by address.
    Unknown,
}

/// Who owns `malloc` in this process (found out at the first call).
pub fn get() -> Owner {
    match STATE.load(Ordering::Acquire) {
        2 => Owner::Glibc,
        3 => Owner::Foreign(FOREIGN.get().expect("set before the state")),
        1 => Owner::Unknown,
        _ => {
            if STATE
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return get_settled();
            }
            let found = find();
            match found {
                Some(f) => {
                    let _ = FOREIGN.set(f);
                    STATE.store(3, Ordering::Release);
                }
                None => STATE.store(2, Ordering::Release),
            }
            get()
        }
    }
}

fn get_settled() -> Owner {
    match STATE.load(Ordering::Acquire) {
        2 => Owner::Glibc,
        3 => Owner::Foreign(FOREIGN.get().expect("set before the state")),
        _ => Owner::Unknown,
    }
}

/// `name` as the dynamic linker finds it after this library.
fn next(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// glibc's own `name` (its versioned definition: the other allocators' are
/// unversioned, so this never finds theirs, even when they come first).
pub fn glibc(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlvsym with NUL-terminated name and version; RTLD_NEXT skips this library.
    unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), GLIBC.as_ptr()) }
}

/// The file that defines the code at `p` (its base address and path), or None.
fn object_of(p: *mut c_void) -> Option<(usize, String)> {
    // SAFETY: a zeroed Dl_info for dladdr to fill; dladdr only reads the link maps.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out pointer.
    if p.is_null() || unsafe { libc::dladdr(p, &mut info) } == 0 {
        return None;
    }
    let name = if info.dli_fname.is_null() {
        String::new()
    } else {
        // SAFETY: dladdr's file name is a NUL-terminated string of the link map.
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname as *const c_char) }
            .to_string_lossy()
            .into_owned()
    };
    Some((info.dli_fbase as usize, name))
}

fn find() -> Option<Foreign> {
    let m = next(c"malloc");
    let g = glibc(c"malloc");
    if m.is_null() || g.is_null() || m == g {
        return None;
    }
    let (base, name) = object_of(m)?;
    // An entry point of the same library as its `malloc`, or None (then glibc's would
    // be found, whose blocks this allocator cannot free).
    let own = |n: &std::ffi::CStr| {
        let p = next(n);
        (!p.is_null() && object_of(p).is_some_and(|(b, _)| b == base)).then_some(p)
    };
    let (free, calloc, realloc) = (own(c"free")?, own(c"calloc")?, own(c"realloc")?);
    // SAFETY: each pointer is the allocator's definition of the C function of that
    // name, whose signature the target type declares.
    unsafe {
        use std::mem::transmute as t;
        Some(Foreign {
            name,
            malloc: t::<*mut c_void, MallocFn>(m),
            free: t::<*mut c_void, FreeFn>(free),
            calloc: t::<*mut c_void, CallocFn>(calloc),
            realloc: t::<*mut c_void, ReallocFn>(realloc),
            memalign: own(c"memalign").map(|p| t::<*mut c_void, MemalignFn>(p)),
            aligned_alloc: own(c"aligned_alloc").map(|p| t::<*mut c_void, MemalignFn>(p)),
            posix_memalign: own(c"posix_memalign").map(|p| t::<*mut c_void, PosixMemalignFn>(p)),
            valloc: own(c"valloc").map(|p| t::<*mut c_void, MallocFn>(p)),
            pvalloc: own(c"pvalloc").map(|p| t::<*mut c_void, MallocFn>(p)),
            usable_size: own(c"malloc_usable_size").map(|p| t::<*mut c_void, UsableFn>(p)),
        })
    }
}

impl Foreign {
    /// `size` bytes aligned to `align` (any value: rounded up to a power of two of at
    /// least a pointer, as glibc's memalign does), from this allocator, or null.
    pub fn memalign(&self, align: usize, size: usize) -> *mut c_void {
        let align = align
            .max(std::mem::size_of::<*mut c_void>())
            .checked_next_power_of_two();
        let Some(align) = align else {
            crate::sys::set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: the allocator's entry points with their C contracts: a power-of-two
        // alignment, a multiple of the pointer size; `p` is a valid out pointer.
        unsafe {
            if let Some(f) = self.posix_memalign {
                let mut p = std::ptr::null_mut();
                let rc = f(&mut p, align, size);
                if rc != 0 {
                    crate::sys::set_errno(rc);
                    return std::ptr::null_mut();
                }
                return p;
            }
            if let Some(f) = self.memalign {
                return f(align, size);
            }
            if let Some(f) = self.aligned_alloc {
                return f(align, size.next_multiple_of(align));
            }
        }
        crate::sys::set_errno(libc::ENOMEM);
        std::ptr::null_mut()
    }
}
