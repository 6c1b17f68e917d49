//! Regions whose faults are served in the faulting thread (`FaultMode::InThread`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{FaultInjection, FaultMode, Pool, RegionOptions};

/// The engine's allocations apart from the program's, as in uswap's C library and
/// Python module: these tests' handlers fault while their thread may be in `malloc`.
#[global_allocator]
static HEAP: uswap::EngineHeap = uswap::EngineHeap;

const MIB: u64 = 1 << 20;
const WORDS_PER_PAGE: usize = 512;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn in_thread() -> RegionOptions {
    RegionOptions {
        fault_mode: Some(FaultMode::InThread),
        ..Default::default()
    }
}

/// Fails the test instead of hanging it.
fn watchdog(secs: u64) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(std::time::Duration::from_secs(secs))
            == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        {
            eprintln!("in_thread test: no progress for {secs} s: a fault was lost");
            std::process::abort();
        }
    });
    tx
}

fn fill(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate().step_by(7) {
        w.store(mix(seed ^ i as u64), Relaxed);
    }
}

fn check(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate().step_by(7) {
        let v = w.load(Relaxed);
        assert_eq!(
            v,
            mix(seed ^ i as u64),
            "word {i} (page {})",
            i / WORDS_PER_PAGE
        );
    }
}

#[test]
fn in_thread_regions_are_exact_across_swap_out_and_in() {
    let _w = watchdog(120);
    // The faulting thread's own read: polled on its own ring (the default), and a
    // synchronous pread (polling off).
    for poll_us in [uswap::OWN_READ_POLL_US, 0] {
        let pool = Pool::builder()
            .budget(16 * MIB)
            .own_read_poll_us(poll_us)
            .build()
            .unwrap();
        let r = pool.region_with(64 * MIB, in_thread()).unwrap();
        fill(r.as_words(), 1);
        check(r.as_words(), 1);
        fill(r.as_words(), 2);
        check(r.as_words(), 2);
        let c = r.counters();
        assert!(c.pswpout > 0 && c.pswpin > 0, "poll {poll_us} µs: {c:?}");
        assert!(c.majflt > 0, "poll {poll_us} µs: {c:?}");
        assert!(
            c.peak_used_bytes <= 16 * MIB,
            "poll {poll_us} µs: peak {} over the budget",
            c.peak_used_bytes
        );
        pool.check_invariants().unwrap();
    }
}

/// A write to a swapped page comes back dirty and writable on its one trap (x86-64's
/// signal frame says the access was a write), not clean and then trapping again to be
/// unprotected; its bytes are the ones swapped out.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_write_to_a_swapped_page_traps_once() {
    let _w = watchdog(120);
    let pool = Pool::builder().budget(16 * MIB).build().unwrap();
    let r = pool.region_with(64 * MIB, in_thread()).unwrap();
    let words = r.as_words();
    fill(words, 1);
    let before = r.counters();
    // The first access to each page is a write of word 0 (after checking it).
    for (i, w) in words.iter().enumerate().step_by(WORDS_PER_PAGE) {
        let old = w.swap(mix(3 ^ i as u64), Relaxed);
        let want = if i % 7 == 0 { mix(1 ^ i as u64) } else { 0 }; // as `fill` left it
        assert_eq!(old, want, "word {i}: not its bytes");
    }
    let c = r.counters();
    let (majflt, wpflt) = (c.majflt - before.majflt, c.wpflt - before.wpflt);
    assert!(majflt > 1000, "pages were not swapped in: {c:?}");
    assert!(
        wpflt * 20 < majflt,
        "{wpflt} write-protect faults after {majflt} major faults by writes"
    );
    // The rest of each page as filled.
    for (i, w) in words.iter().enumerate().step_by(7) {
        if i % WORDS_PER_PAGE != 0 {
            // (the words `fill` wrote that the loop above did not overwrite)
            assert_eq!(w.load(Relaxed), mix(1 ^ i as u64), "word {i}");
        }
    }
    pool.check_invariants().unwrap();
}

/// A fault that finds its page's write (or read) in flight waits for the completion to
/// map it; when that mapping fails (injected UFFDIO_COPY failures) the copy goes back to
/// the cache clean and the fault must map it itself on its next try, not wait for good.
/// Random rewrites over a region half again the budget touch pages under write often.
#[test]
fn a_fault_waiting_on_io_whose_mapping_fails_maps_it_itself() {
    let _w = watchdog(120);
    let pool = Pool::builder()
        .budget(16 * MIB)
        .inject_io_errors(FaultInjection {
            fail_map_every: 5,
            ..Default::default()
        })
        .build()
        .unwrap();
    let r = pool.region_with(24 * MIB, in_thread()).unwrap();
    let words = r.as_words();
    let pages = words.len() / WORDS_PER_PAGE;
    let mut version = vec![0u64; pages];
    let value = |p: usize, v: u64| mix(((p as u64) << 32) | v);
    let mut x = 1u64;
    for _ in 0..100_000 {
        x = mix(x);
        let p = x as usize % pages;
        let w = &words[p * WORDS_PER_PAGE];
        let want = if version[p] == 0 {
            0
        } else {
            value(p, version[p])
        };
        assert_eq!(w.load(Relaxed), want, "page {p} at version {}", version[p]);
        version[p] += 1;
        w.store(value(p, version[p]), Relaxed);
    }
    let c = r.counters();
    assert!(c.pswpout > 0 && c.pswpin > 0, "{c:?}");
    pool.check_invariants().unwrap();
}

#[test]
fn many_threads_fault_in_their_own_pages_and_each_others() {
    let _w = watchdog(180);
    let pool = Pool::builder().budget(24 * MIB).build().unwrap();
    let r = pool.region_with(96 * MIB, in_thread()).unwrap();
    let words = r.as_words();
    let pages = words.len() / WORDS_PER_PAGE;
    // Each page's first word holds its generation; threads own pages by index mod T.
    const T: usize = 4;
    std::thread::scope(|s| {
        for t in 0..T {
            s.spawn(move || {
                let mut x = t as u64 + 1;
                for round in 1..=3u64 {
                    for p in (t..pages).step_by(T) {
                        words[p * WORDS_PER_PAGE].store(mix(p as u64) ^ round, Relaxed);
                    }
                    for _ in 0..4000 {
                        x = mix(x);
                        let p = x as usize % pages;
                        // Another thread's page: zeros until its owner wrote it, then
                        // any round it wrote, never other bytes.
                        let raw = words[p * WORDS_PER_PAGE].load(Relaxed);
                        assert!(
                            raw == 0 || raw ^ mix(p as u64) <= 3,
                            "page {p} holds {raw:#x}"
                        );
                    }
                }
                for p in (t..pages).step_by(T) {
                    assert_eq!(
                        words[p * WORDS_PER_PAGE].load(Relaxed),
                        mix(p as u64) ^ 3,
                        "page {p}"
                    );
                }
            });
        }
    });
    pool.check_invariants().unwrap();
}

#[test]
fn in_thread_and_handler_regions_share_a_pool() {
    let _w = watchdog(120);
    let pool = Pool::builder().budget(16 * MIB).build().unwrap();
    let a = pool.region_with(48 * MIB, in_thread()).unwrap();
    let b = pool.region(48 * MIB).unwrap();
    fill(a.as_words(), 3);
    fill(b.as_words(), 4);
    check(a.as_words(), 3);
    check(b.as_words(), 4);
    pool.check_invariants().unwrap();
}

#[test]
fn lost_pages_raise_sigbus_in_thread_too() {
    // Every read fails: the first swapped page touched is lost, and the program gets
    // SIGBUS (the default action), never other bytes. Run in a child process.
    let _w = watchdog(120);
    // SAFETY: fork in a test process; the child only runs the code below and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let pool = Pool::builder()
            .budget(16 * MIB)
            .inject_io_errors(FaultInjection {
                fail_read_every: 1,
                ..Default::default()
            })
            .build()
            .unwrap();
        let r = pool.region_with(64 * MIB, in_thread()).unwrap();
        fill(r.as_words(), 5);
        let v = r.as_words()[0].load(Relaxed); // swapped out by now: lost
                                               // Not reached: exit 0 would mean wrong (or zero) bytes were returned.
        eprintln!("read {v:#x} from a lost page");
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
        "child status {status:#x}: expected death by SIGBUS"
    );
}

#[test]
fn system_calls_on_swapped_in_thread_memory_fail_with_efault() {
    // The documented cost of the mode: the kernel cannot raise SIGBUS inside a system
    // call, so a read(2) into a page that is not resident, or resident but clean
    // (write-protected until written), fails with EFAULT; one into a page the program
    // has written works.
    let _w = watchdog(60);
    let pool = Pool::builder().budget(16 * MIB).build().unwrap();
    let mut r = pool.region_with(64 * MIB, in_thread()).unwrap();
    fill(r.as_words(), 6);
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    use std::os::fd::AsRawFd;
    // Page 0 was swapped out long ago.
    // SAFETY: reads into the region's first page, which is live memory of `r`.
    let n = unsafe { libc::read(file.as_raw_fd(), r.as_ptr().cast(), 64) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFAULT)
    );
    // Read first: resident but clean, still refused.
    let _ = r.as_slice()[0];
    // SAFETY: as above.
    let n = unsafe { libc::read(file.as_raw_fd(), r.as_ptr().cast(), 64) };
    assert_eq!(n, -1, "a read(2) into a clean page");
    // Written first: then the system call works.
    r.as_mut_slice()[0] = 1;
    // SAFETY: as above.
    let n = unsafe { libc::read(file.as_raw_fd(), r.as_ptr().cast(), 64) };
    assert!(n > 0, "read into a written page: {n}");
    pool.check_invariants().unwrap();
}

/// What the program's handlers read, by test (SIGUSR1: 0, SIGUSR2: 1; the tests run at
/// once): an address of a live region (0: none), and how many reads they made.
static READ_AT: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];
static READS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn read_for(k: usize) {
    let at = READ_AT[k].load(Relaxed);
    if at != 0 {
        // SAFETY: `at` is a word of a live region (set while the region is in use,
        // cleared before it is dropped), read atomically as the rest of the test does.
        let w = unsafe { &*(at as *const AtomicU64) };
        std::hint::black_box(w.load(Relaxed));
        READS[k].fetch_add(1, Relaxed);
    }
}

extern "C" fn on_sigusr1(_: libc::c_int) {
    read_for(0);
}

extern "C" fn on_sigusr2(_: libc::c_int) {
    read_for(1);
}

/// Run `body` on this thread while another signals it (SIGUSR1 or SIGUSR2) every
/// `period_us`; the handler reads what `READ_AT` names. Returns how many reads it made.
fn signalled(sig: libc::c_int, period_us: u64, body: impl FnOnce()) -> u64 {
    let (k, handler): (usize, extern "C" fn(libc::c_int)) = match sig {
        libc::SIGUSR1 => (0, on_sigusr1),
        _ => (1, on_sigusr2),
    };
    // SAFETY: installs a plain handler from a zeroed struct.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
    let reads0 = READS[k].load(Relaxed);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // SAFETY: pthread_self of this thread, signalled only while the scope runs.
        let me = unsafe { libc::pthread_self() };
        let stop = &stop;
        s.spawn(move || {
            while !stop.load(Relaxed) {
                // SAFETY: signals this scope's thread, alive until `stop`.
                unsafe { libc::pthread_kill(me, sig) };
                std::thread::sleep(std::time::Duration::from_micros(period_us));
            }
        });
        // Also when `body` fails: the signaller stops, the handler reads nothing more.
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool, usize);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                READ_AT[self.1].store(0, Relaxed);
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(stop, k);
        body();
    });
    READS[k].load(Relaxed) - reads0
}

/// Issue 40: the SIGBUS handler let asynchronous signals in, so a program's handler
/// that reads in-thread memory ran on top of a fault in progress; one on the same unit
/// waited for the unit's lock its own thread held (deadlocked on the first tick). A
/// thread reads pages one after another while another signals it every ~25 µs; its
/// SIGUSR1 handler reads the page after the one being read.
#[test]
fn a_signal_handler_that_reads_in_thread_memory_during_a_fault() {
    let _w = watchdog(120);
    let pool = Pool::builder().budget(16 * MIB).build().unwrap();
    let r = pool.region_with(64 * MIB, in_thread()).unwrap();
    fill(r.as_words(), 3);
    let words = r.as_words();
    let pages = words.len() / WORDS_PER_PAGE;
    let reads = signalled(libc::SIGUSR1, 25, || {
        for round in 0..3 {
            for page in 0..pages {
                let next = ((page + 1) % pages) * WORDS_PER_PAGE;
                READ_AT[0].store(&words[next] as *const AtomicU64 as usize, Relaxed);
                // `fill` wrote every 7th word.
                let i = page * WORDS_PER_PAGE + round * 7 % WORDS_PER_PAGE;
                let i = i - i % 7;
                assert_eq!(words[i].load(Relaxed), mix(3 ^ i as u64), "word {i}");
            }
        }
    });
    let c = r.counters();
    assert!(c.majflt > 1000, "{c:?}");
    assert!(reads > 100, "the handler read {reads} times");
    assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    pool.check_invariants().unwrap();
}

/// A program's signal handler ran on top of the engine's own work on its thread: a
/// discard holding a unit's lock, interrupted by a handler that reads a swapped page of
/// the same unit, waited for itself (in-thread regions) or for the fault thread, which
/// waited for the lock (the stress test's in-thread configuration hung within seconds).
/// Inside the engine a program thread now holds its signals, as in a system call. Both
/// fault modes: a thread discards and rewrites pages while another signals it every
/// ~20 µs; the handler reads another page of the unit being discarded.
#[test]
fn a_signal_during_a_discard_reads_the_same_unit() {
    let _w = watchdog(120);
    for opts in [RegionOptions::default(), in_thread()] {
        let pool = Pool::builder().budget(16 * MIB).build().unwrap();
        let r = pool.region_with(64 * MIB, opts).unwrap();
        let words = r.as_words();
        fill(words, 5);
        let pages = words.len() / WORDS_PER_PAGE;
        let reads = signalled(libc::SIGUSR2, 20, || {
            let t0 = std::time::Instant::now();
            let mut x = 1u64;
            while t0.elapsed() < std::time::Duration::from_secs(3) {
                x = mix(x);
                let page = x as usize % pages;
                // Another page of the same 2 MiB unit.
                let other = (page ^ 1 ^ (((x >> 20) as usize % 512) & !1)).min(pages - 1);
                READ_AT[1].store(&words[other * WORDS_PER_PAGE] as *const _ as usize, Relaxed);
                r.discard(page * 4096, 4096).unwrap();
                let w = page * WORDS_PER_PAGE;
                assert_eq!(words[w].load(Relaxed), 0, "page {page} after its discard");
                words[w].store(mix(5 ^ w as u64), Relaxed);
            }
        });
        let c = r.counters();
        assert!(reads > 100, "the handler read {reads} times: {c:?}");
        assert!(c.pswpin > 0, "{c:?}");
        pool.check_invariants().unwrap();
    }
}
