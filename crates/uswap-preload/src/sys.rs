//! The real memory functions: raw system calls for the mapping calls (never the
//! interposed symbols, so no recursion), glibc's `__libc_*` entry points for malloc.

use libc::{c_int, c_long, c_void, off_t, size_t};

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(nmemb: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn __libc_valloc(size: size_t) -> *mut c_void;
    fn __libc_pvalloc(size: size_t) -> *mut c_void;
}

/// The program break (the end of the `brk` heap): `sbrk(0)`, which reads glibc's
/// record of it without a system call once known.
pub fn program_break() -> usize {
    // SAFETY: sbrk(0) moves nothing; it only returns the current break.
    unsafe { libc::sbrk(0) as usize }
}

pub fn malloc(size: usize) -> *mut c_void {
    // SAFETY: glibc's own allocator entry point; any size is valid.
    unsafe { __libc_malloc(size) }
}

/// # Safety
/// `ptr` is null or a live block of glibc's allocator.
pub unsafe fn free(ptr: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { __libc_free(ptr) }
}

pub fn calloc(nmemb: usize, size: usize) -> *mut c_void {
    // SAFETY: glibc's own allocator entry point; it checks the product for overflow.
    unsafe { __libc_calloc(nmemb, size) }
}

/// # Safety
/// `ptr` is null or a live block of glibc's allocator.
pub unsafe fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { __libc_realloc(ptr, size) }
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: glibc's own allocator entry point; it validates `align`.
    unsafe { __libc_memalign(align, size) }
}

pub fn valloc(size: usize) -> *mut c_void {
    // SAFETY: glibc's own allocator entry point.
    unsafe { __libc_valloc(size) }
}

pub fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: glibc's own allocator entry point.
    unsafe { __libc_pvalloc(size) }
}

type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> size_t;
static REAL_USABLE: std::sync::OnceLock<Option<UsableSizeFn>> = std::sync::OnceLock::new();

/// glibc's `malloc_usable_size` (glibc exports no `__libc_` alias for it). Its
/// versioned definition: the first unversioned one may be another allocator's, which
/// cannot read glibc's blocks.
///
/// # Safety
/// `ptr` is null or a live block of glibc's allocator.
pub unsafe fn usable_size(ptr: *mut c_void) -> usize {
    let f = REAL_USABLE.get_or_init(|| {
        // SAFETY: the symbol, when found, has the C signature of malloc_usable_size.
        unsafe {
            let p = crate::owner::glibc(c"malloc_usable_size");
            if p.is_null() {
                None
            } else {
                Some(std::mem::transmute::<*mut c_void, UsableSizeFn>(p))
            }
        }
    });
    match f {
        // SAFETY: the caller's contract.
        Some(f) => unsafe { f(ptr) },
        None => 0,
    }
}

fn ret(r: c_long) -> *mut c_void {
    r as usize as *mut c_void
}

pub fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the raw mmap system call with the caller's arguments; the kernel checks them.
    ret(unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) })
}

pub fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: the raw munmap system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

pub fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the raw mremap system call with the caller's arguments.
    ret(unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) })
}

/// mprotect of `[addr, addr + len)`, by address (ranges of ours and the program's).
pub fn mprotect(addr: usize, len: usize, prot: c_int) -> c_int {
    // SAFETY: the raw mprotect system call; the kernel checks the range.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int }
}

pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: the raw madvise system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int }
}

pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Whether `fd` is /dev/zero (character device 1:5).
pub fn is_dev_zero(fd: c_int) -> bool {
    if fd < 0 {
        return false;
    }
    // SAFETY: fstat into a zeroed stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to `st`; a bad fd just fails.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    (st.st_mode & libc::S_IFMT) == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 5)
}

/// Write all of `bytes` to `fd`, ignoring errors.
pub fn write_all(fd: c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// # Safety
/// `src` and `dst` are valid for `n` bytes and do not overlap.
pub unsafe fn copy(dst: *mut c_void, src: *const c_void, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), n) }
}

/// The raw mlock2 system call (flags: 0 or MLOCK_ONFAULT), by address.
pub fn mlock2(addr: usize, len: usize, flags: c_int) -> c_int {
    // SAFETY: the raw mlock2 system call; it changes no data and checks the range.
    unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) as c_int }
}

pub fn munlock(addr: usize, len: usize) -> c_int {
    // SAFETY: the raw munlock system call; it changes no data and checks the range.
    unsafe { libc::syscall(libc::SYS_munlock, addr, len) as c_int }
}

pub fn mlockall(flags: c_int) -> c_int {
    // SAFETY: the raw mlockall system call with the caller's flags.
    unsafe { libc::syscall(libc::SYS_mlockall, flags) as c_int }
}

pub fn munlockall() -> c_int {
    // SAFETY: the raw munlockall system call.
    unsafe { libc::syscall(libc::SYS_munlockall) as c_int }
}
