//! A page whose swap-in failed: the engine poisons it (UFFDIO_POISON), and the workload
//! thread that touches it gets SIGBUS with the page's address in `si_addr`. The bench
//! catches that signal, says which page of which region was lost and why, and exits 1
//! (a verification failure), instead of dying with a bare "Bus error".
//!
//! The handler only reads what [`watch`] stored before the workload started and calls
//! write(2) and _exit(2): async-signal-safe, no allocation, no lock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;

/// Regions watched: (start, length), by index; length 0: not in use.
static REGIONS: [(AtomicUsize, AtomicUsize); 2] = [
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
];
/// Region names, and where the swap is, fixed at the first [`watch`].
static NAMES: OnceLock<[&'static str; 2]> = OnceLock::new();
static PLACE: OnceLock<String> = OnceLock::new();
static FIRED: AtomicBool = AtomicBool::new(false);

/// Report SIGBUS in `regions` (name, start address, length; at most two) as lost data
/// of a swap at `place`, until [`unwatch`].
pub fn watch(regions: &[(&'static str, usize, usize)], place: &str) {
    let mut names = [""; 2];
    for (i, &(name, start, len)) in regions.iter().take(2).enumerate() {
        names[i] = name;
        REGIONS[i].0.store(start, SeqCst);
        REGIONS[i].1.store(len, SeqCst);
    }
    // The first run's names and place stay (one run per process, but tests run more).
    let _ = NAMES.set(names);
    let _ = PLACE.set(place.to_string());
    install();
}

/// Stop reporting (the regions are about to be unmapped).
pub fn unwatch() {
    for r in &REGIONS {
        r.1.store(0, SeqCst);
    }
}

/// Install the handler (once). Before the pool exists: the engine's in-thread fault
/// handler (`--fault-mode in-thread`), installed when its first region is made, serves
/// its own SIGBUS and chains the rest (lost pages) to this one; installed after it,
/// this one would take every in-thread fault for a lost page.
pub fn install() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: sigaction is plain old data; all zeros is a valid value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        // SAFETY: installs a handler that is async-signal-safe (see the module doc);
        // sa_mask is emptied first.
        unsafe {
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

/// A message built on the stack.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }
    fn num(&mut self, mut v: u64, radix: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v % radix) as usize];
            v /= radix;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SA_SIGINFO handlers; SIGBUS
    // fills si_addr.
    let addr = unsafe { (*info).si_addr() } as usize;
    let names = NAMES.get().copied().unwrap_or([""; 2]);
    let hit = REGIONS.iter().enumerate().find_map(|(i, (start, len))| {
        let (s, l) = (start.load(SeqCst), len.load(SeqCst));
        (l > 0 && addr >= s && addr < s + l).then_some((names[i], addr - s))
    });
    let Some((name, off)) = hit else {
        // Not a page of ours: a bug elsewhere. The default action, on return.
        // SAFETY: signal(2) is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        return;
    };
    if FIRED.swap(true, SeqCst) {
        // Another thread reports and exits; wait for it.
        loop {
            // SAFETY: pause(2) is async-signal-safe.
            unsafe { libc::pause() };
        }
    }
    let page = off as u64 / 4096;
    let mut l = Line {
        buf: [0; 512],
        len: 0,
    };
    l.push(b"uswap: verify FAILED: the data of region ");
    l.push(name.as_bytes());
    l.push(b", page ");
    l.num(page, 10);
    l.push(b" (byte offset 0x");
    l.num(page * 4096, 16);
    l.push(b") was lost: its swap-in failed with an I/O error on the swap device (");
    l.push(PLACE.get().map_or("?", String::as_str).as_bytes());
    l.push(b"), and the engine poisoned the page rather than return other bytes\n");
    // SAFETY: write(2) from a live stack buffer, then _exit(2): both async-signal-safe.
    unsafe {
        libc::write(2, l.buf.as_ptr().cast(), l.len);
        libc::_exit(1);
    }
}
