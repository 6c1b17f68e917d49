//! The remote tier against a real local Redis Cluster (scripts/redis-cluster.sh: 3
//! primaries and 3 replicas on loopback, stopped on drop): byte-exact through it,
//! through compressed + remote, a primary killed mid-run, a cluster down at start.

mod common;

use common::{with_deadline, Cluster};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use uswap::{FaultMode, Pool, RegionOptions, TierKind, UnitPolicy};

const MIB: u64 = 1 << 20;

/// The tests of this file one at a time: a fork copies every pool of the process into
/// the child, whose engine connects each to its cluster, and whose parent then leaves
/// the values the child holds to it; another test's pool would count keys that are not
/// its own, or wait on a cluster whose primary a test killed.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Pages of small numbers (compressible) and every third random.
fn word(seed: u64, i: usize) -> u64 {
    if (i / 512).is_multiple_of(3) {
        mix(seed ^ i as u64)
    } else {
        (seed + (i % 61) as u64) & 0xfff
    }
}

fn fill(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(word(seed, i), Relaxed);
    }
}

fn check(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        assert_eq!(
            w.load(Relaxed),
            word(seed, i),
            "word {i} (page {})",
            i / 512
        );
    }
}

#[test]
fn pages_round_trip_through_the_remote_tier() {
    let _serial = one_at_a_time();
    with_deadline(300, |t| {
        let c = Cluster::start_with(22100, Some(1000));
        for (tier, unit, mode) in [
            (TierKind::Remote, UnitPolicy::Small, FaultMode::Handler),
            (TierKind::Remote, UnitPolicy::Huge, FaultMode::Handler),
            (
                TierKind::CompressedRemote,
                UnitPolicy::Auto,
                FaultMode::Handler,
            ),
            // faults served by the faulting thread: its own blocking reads of the cluster
            (TierKind::Remote, UnitPolicy::Small, FaultMode::InThread),
        ] {
            t.phase(format!("{tier:?} {unit:?} {mode:?}"));
            let p = t.pool(
                Pool::builder()
                    .budget(24 * MIB)
                    .tier(tier)
                    .remote(c.nodes())
                    .compressed_max_percent(25),
            );
            let r = p
                .region_with(
                    64 * MIB,
                    RegionOptions {
                        unit: Some(unit),
                        fault_mode: Some(mode),
                        ..Default::default()
                    },
                )
                .unwrap();
            fill(r.as_words(), 1);
            check(r.as_words(), 1);
            fill(r.as_words(), 2);
            check(r.as_words(), 2);
            // one page in four rewritten: a unit stored whole (`--unit 2m`) now has some
            // slots freed and reused by single pages of their own, its value shared by
            // the rest; every byte still exact, twice round
            for round in [3u64, 4] {
                let seed_of = |page: usize| if page % 4 == 1 { round } else { 2 };
                for (i, w) in r.as_words().iter().enumerate() {
                    if (i / 512) % 4 == 1 {
                        w.store(word(round, i), Relaxed);
                    }
                }
                for (i, w) in r.as_words().iter().enumerate() {
                    assert_eq!(w.load(Relaxed), word(seed_of(i / 512), i), "word {i}");
                }
            }
            let n = p.counters();
            assert!(n.remote_writes > 0 && n.remote_reads > 0, "{tier:?}: {n:?}");
            // 4 KiB pages are read on the faulting side's own connections (the runtime
            // is the fallback: a connection still opening, a redirect); whole units
            // always go through the runtime
            if unit == UnitPolicy::Small {
                assert!(
                    n.remote_direct_reads * 2 > n.remote_reads,
                    "most reads direct: {tier:?} {mode:?}: {n:?}"
                );
            }
            assert_eq!(n.poisoned, 0, "{n:?}");
            assert!(n.peak_used_bytes <= 24 * MIB, "{n:?}");
            drop(r);
            drop(p);
            // the pool's end deleted every value it stored
            let keys: u64 = c
                .ports
                .iter()
                .filter(|&&port| c.cli(port, &["role"]).starts_with("master"))
                .map(|&port| {
                    c.cli(port, &["dbsize"])
                        .trim()
                        .parse::<u64>()
                        .expect("dbsize")
                })
                .sum();
            assert_eq!(keys, 0, "{tier:?} {unit:?}: keys left after the pool ended");
        }
    });
}

#[test]
fn a_primary_killed_mid_run_loses_nothing() {
    let _serial = one_at_a_time();
    with_deadline(300, |t| {
        let c = Cluster::start_with(22200, Some(1000));
        let p = t.pool(
            Pool::builder()
                .budget(16 * MIB)
                .tier(TierKind::Remote)
                .remote(c.nodes()),
        );
        let r = p.region(64 * MIB).unwrap();
        fill(r.as_words(), 3);
        c.kill_a_primary();
        // Faults during and after the failover: every read exact.
        check(r.as_words(), 3);
        fill(r.as_words(), 4);
        check(r.as_words(), 4);
        let n = p.counters();
        assert_eq!(
            n.poisoned, 0,
            "nothing lost with a replica to fail over to: {n:?}"
        );
    });
}

/// Values lost on the cluster with checksums off: each page whose value is gone reads
/// as lost (a system call's copy gets EFAULT where the program would get SIGBUS), never
/// as zeros or as another page's bytes, which nothing else would catch (a read's frame
/// may hold the last page read into it).
#[test]
fn lost_values_without_checksums_are_poisoned_not_read() {
    let _serial = one_at_a_time();
    with_deadline(300, |t| {
        let c = Cluster::start_with(22400, Some(1000));
        let p = t.pool(
            Pool::builder()
                .budget(16 * MIB)
                .tier(TierKind::Remote)
                .remote(c.nodes())
                .checksums(false),
        );
        let r = common::region_of(&p, 48 * MIB, UnitPolicy::Small);
        fill(r.as_words(), 5);
        check(r.as_words(), 5);
        for &port in &c.ports {
            if c.cli(port, &["role"]).starts_with("master") {
                assert_eq!(c.cli(port, &["flushall"]).trim(), "OK");
            }
        }
        // SAFETY: memfd_create with a NUL-terminated name; the fd is fresh and ours.
        let memfd = unsafe { libc::memfd_create(c"uswap-lost".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(
            memfd >= 0,
            "memfd_create: {}",
            std::io::Error::last_os_error()
        );
        let pages = r.as_words().len() / 512;
        let (mut lost, mut exact) = (0, 0);
        for page in 0..pages {
            let src = r.as_ptr() as usize + page * 4096;
            // SAFETY: the kernel copies 4 KiB of the region's live mapping into the memfd
            // (a fault on it is served by the pool, or fails with EFAULT when lost).
            let n = unsafe { libc::pwrite(memfd, src as *const libc::c_void, 4096, 0) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "page {page}: {err}");
                lost += 1;
                continue;
            }
            let mut buf = [0u64; 512];
            // SAFETY: reads 4 KiB into a live buffer of that length.
            let m = unsafe { libc::pread(memfd, buf.as_mut_ptr().cast(), 4096, 0) };
            assert_eq!(m, 4096);
            for (k, &w) in buf.iter().enumerate() {
                assert_eq!(
                    w,
                    word(5, page * 512 + k),
                    "page {page} word {k}: not its bytes"
                );
            }
            exact += 1;
        }
        // SAFETY: closes the memfd made above.
        unsafe { libc::close(memfd) };
        let n = p.counters();
        assert!(
            lost > pages / 2,
            "{lost} of {pages} pages lost, {exact} exact: {n:?}"
        );
        assert_eq!(n.poisoned, lost as u64, "{n:?}");
    });
}

#[test]
fn a_cluster_down_at_start_is_a_clear_error() {
    let _serial = one_at_a_time();
    // Nothing listens there.
    let e = Pool::builder()
        .budget(16 * MIB)
        .tier(TierKind::Remote)
        .remote("redis://127.0.0.1:1")
        .build()
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("remote tier") && msg.contains("127.0.0.1:1"),
        "{msg}"
    );
    let e = Pool::builder()
        .budget(16 * MIB)
        .tier(TierKind::Remote)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("--remote"), "{e}");
}

/// Keys in the cluster now (primaries only), each with its remaining TTL in ms.
fn keys_with_ttl(c: &Cluster) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for &port in &c.ports {
        if !c.cli(port, &["role"]).starts_with("master") {
            continue;
        }
        for key in c.cli(port, &["--scan"]).lines().filter(|k| !k.is_empty()) {
            let ttl = c.cli(port, &["pttl", key]).trim().parse().expect("pttl");
            out.push((key.to_string(), ttl));
        }
    }
    out
}

/// Waits for child `pid` (killing it past `secs`); whether it exited 0.
fn wait_child(pid: i32, secs: u64) -> bool {
    let t = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: polls a child this test forked.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if got < 0 || t.elapsed() > std::time::Duration::from_secs(secs) {
            // SAFETY: kills the hung child this test forked, then reaps it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Words `[from, to)` hold `seed`'s pattern.
fn check_range(words: &[AtomicU64], seed: u64, from: usize, to: usize) -> bool {
    (from..to).all(|i| words[i].load(Relaxed) == word(seed, i))
}

fn remote_pool(c: &Cluster, tier: TierKind) -> Pool {
    remote_pool_with(c, tier, false)
}

fn remote_pool_with(c: &Cluster, tier: TierKind, encrypt: bool) -> Pool {
    Pool::builder()
        .budget(8 * MIB)
        .tier(tier)
        .remote(c.nodes())
        .compressed_max_percent(25)
        .encrypt(encrypt)
        .build()
        .unwrap()
}

/// Issue 48: a forked child (and its own child) reads the pages it inherited on the remote
/// tier from its ancestors' keys, and evicts its own to keys of its own (encrypted too);
/// every byte checked in all three processes, and no key left once they all ended.
#[test]
fn forked_children_read_inherited_remote_pages_and_write_their_own() {
    let _serial = one_at_a_time();
    with_deadline(300, |t| {
        let c = Cluster::start_with(22300, Some(1000));
        for (tier, encrypt) in [
            (TierKind::Remote, false),
            (TierKind::CompressedRemote, false),
            // each process's own key for what it writes; its ancestors' for what it reads
            (TierKind::Remote, true),
        ] {
            t.phase(format!("{tier:?} encrypt {encrypt}"));
            let p = remote_pool_with(&c, tier, encrypt);
            let r = p.region(32 * MIB).unwrap();
            let w = r.as_words();
            let n = w.len();
            fill(w, 1);
            assert!(
                p.counters().remote_writes > 0,
                "{tier:?}: nothing went remote"
            );
            // SAFETY: fork; the child only runs uswap and these checks, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                common::child_deadline(120);
                let mut ok = check_range(w, 1, 0, n);
                for (i, x) in w.iter().enumerate().skip(n / 2) {
                    x.store(word(2, i), Relaxed);
                }
                ok &= check_range(w, 1, 0, n / 2) && check_range(w, 2, n / 2, n);
                // a grandchild reads both its ancestors' values
                // SAFETY: fork again; the grandchild checks, writes, checks, then _exit.
                let gpid = unsafe { libc::fork() };
                if gpid == 0 {
                    let mut ok = check_range(w, 1, 0, n / 2) && check_range(w, 2, n / 2, n);
                    for (i, x) in w.iter().enumerate().take(n / 4) {
                        x.store(word(3, i), Relaxed);
                    }
                    ok &= check_range(w, 3, 0, n / 4) && check_range(w, 2, n / 2, n);
                    let k = p.counters();
                    ok &= k.remote_writes > 0 && k.poisoned == 0;
                    drop(r);
                    drop(p);
                    // SAFETY: ends the grandchild without running the test harness's exit.
                    unsafe { libc::_exit(i32::from(!ok)) };
                }
                ok &= gpid > 0 && wait_child(gpid, 100);
                ok &= check_range(w, 1, 0, n / 2) && check_range(w, 2, n / 2, n);
                let k = p.counters();
                ok &= k.remote_writes > 0 && k.remote_reads > 0 && k.poisoned == 0;
                drop(r);
                drop(p);
                // SAFETY: ends the child without running the test harness's exit.
                unsafe { libc::_exit(i32::from(!ok)) };
            }
            assert!(wait_child(pid, 150), "{tier:?}: the child's checks failed");
            check(w, 1);
            assert_eq!(p.counters().poisoned, 0);
            drop(r);
            drop(p);
            let left = keys_with_ttl(&c);
            assert!(left.is_empty(), "{tier:?}: keys left: {left:?}");
        }
    });
}

/// Issue 48: eight children read in parallel while their parent ends first: the parent
/// leaves the values they hold to them (its other keys go), the last child to finish
/// deletes them, and nothing is left.
#[test]
fn a_parent_that_ends_first_leaves_its_values_to_its_children() {
    let _serial = one_at_a_time();
    with_deadline(300, |t| {
        let c = Cluster::start_with(22400, Some(1000));
        let p = remote_pool(&c, TierKind::Remote);
        let r = p.region(32 * MIB).unwrap();
        let w = r.as_words();
        let n = w.len();
        fill(w, 4);
        t.phase("fork 8");
        let mut go = [0i32; 2];
        // SAFETY: a pipe into a live array.
        assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
        let mut pids = Vec::new();
        for k in 0..8usize {
            // SAFETY: fork; the child waits for the parent's pool to end, checks, writes
            // its own, checks, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                common::child_deadline(120);
                let mut b = [0u8; 1];
                // SAFETY: closes this child's copy of the write end, then reads the pipe
                // (EOF once the parent closes its own).
                unsafe {
                    libc::close(go[1]);
                    libc::read(go[0], b.as_mut_ptr().cast(), 1);
                }
                let mut ok = check_range(w, 4, 0, n);
                let part = n / 8;
                for (i, x) in w.iter().enumerate().skip(k * part).take(part) {
                    x.store(word(10 + k as u64, i), Relaxed);
                }
                ok &= check_range(w, 4, 0, k * part)
                    && check_range(w, 10 + k as u64, k * part, (k + 1) * part)
                    && check_range(w, 4, (k + 1) * part, n);
                ok &= p.counters().poisoned == 0;
                drop(r);
                drop(p);
                // SAFETY: ends the child without running the test harness's exit.
                unsafe { libc::_exit(i32::from(!ok)) };
            }
            pids.push(pid);
        }
        check(w, 4);
        drop(r);
        drop(p);
        t.phase("parent ended");
        let left = keys_with_ttl(&c);
        assert!(
            !left.is_empty(),
            "the parent deleted values its children still read"
        );
        // SAFETY: closes the parent's ends: the children read EOF and go on.
        unsafe {
            libc::close(go[1]);
            libc::close(go[0]);
        }
        for pid in pids {
            assert!(wait_child(pid, 150), "a child's checks failed");
        }
        let left = keys_with_ttl(&c);
        assert!(
            left.is_empty(),
            "keys left after every process ended: {left:?}"
        );
    });
}

/// Issue 48: processes killed with SIGKILL cannot delete their keys; each key they leave
/// (values, and the keys that track who reads them) expires.
#[test]
fn keys_left_by_killed_processes_expire() {
    let _serial = one_at_a_time();
    with_deadline(300, |_t| {
        let c = Cluster::start_with(22500, Some(1000));
        let p = remote_pool(&c, TierKind::Remote);
        let r = p.region(16 * MIB).unwrap();
        let w = r.as_words();
        fill(w, 5);
        let mut ready = [0i32; 2];
        // SAFETY: a pipe into a live array.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: fork; the child reads and writes, says so, then waits to be killed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            common::child_deadline(120);
            let ok = check_range(w, 5, 0, w.len());
            fill(w, 6);
            let b = [u8::from(ok)];
            // SAFETY: writes one byte to the pipe, then sleeps until killed.
            unsafe {
                libc::write(ready[1], b.as_ptr().cast(), 1);
                libc::pause();
                libc::_exit(1);
            }
        }
        let mut b = [0u8; 1];
        // SAFETY: reads one byte from the pipe.
        assert_eq!(unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) }, 1);
        assert_eq!(b[0], 1, "the child read wrong bytes");
        // the parent ends (its values held for the child stay), then the child is killed
        drop(r);
        drop(p);
        // SAFETY: kills and reaps the child this test forked.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let left = keys_with_ttl(&c);
        assert!(left.len() > 1, "the child's and the left keys: {left:?}");
        for (key, ttl) in &left {
            assert!(*ttl > 0, "{key} has no expiry ({ttl})");
        }
    });
}

/// What the SIGUSR1 handler of the test below reads: a region's words (0: none), their
/// count and seed, and what it found.
static HANDLER_WORDS: AtomicUsize = AtomicUsize::new(0);
static HANDLER_LEN: AtomicUsize = AtomicUsize::new(0);
static HANDLER_SEED: AtomicU64 = AtomicU64::new(0);
static HANDLER_READS: AtomicU64 = AtomicU64::new(0);
static HANDLER_WRONG: AtomicU64 = AtomicU64::new(0);

/// Reads one word of a page picked by the handler's count (most are swapped out: a major
/// fault of an in-thread region, served in this handler's thread) and checks it. Nothing
/// here allocates.
extern "C" fn read_a_swapped_page(_: libc::c_int) {
    let (at, len) = (HANDLER_WORDS.load(Relaxed), HANDLER_LEN.load(Relaxed));
    if at == 0 {
        return;
    }
    let n = HANDLER_READS.fetch_add(1, Relaxed);
    let i = (mix(n) as usize % (len / 512)) * 512 + (n as usize % 512);
    // SAFETY: `at` is the first of `len` words of a live region (set while it is in use,
    // cleared before it is dropped); `i < len`.
    let w = unsafe { &*(at as *const AtomicU64).add(i) };
    if w.load(Relaxed) != word(HANDLER_SEED.load(Relaxed), i) {
        HANDLER_WRONG.fetch_add(1, Relaxed);
    }
}

/// Issue 40: a program's signal handler that read an in-thread region on the remote tier
/// deadlocked when its thread was interrupted inside malloc: the fault read the cluster
/// on that thread, and that read allocated, waiting for the allocator's lock its own
/// thread held (the stress test's remote configuration hung in round 11). A thread
/// allocates and frees blocks past the allocator's per-thread cache (each takes an arena
/// lock) while another signals it every ~50 µs; its handler reads a swapped page of an
/// in-thread region. Every byte it reads is checked.
#[test]
fn a_signal_handler_reads_in_thread_remote_memory_while_its_thread_allocates() {
    let _serial = one_at_a_time();
    with_deadline(120, |t| {
        let c = Cluster::start_with(22000, Some(1000));
        let p = t.pool(
            Pool::builder()
                .budget(8 * MIB)
                .tier(TierKind::Remote)
                .remote(c.nodes()),
        );
        let r = p
            .region_with(
                32 * MIB,
                RegionOptions {
                    fault_mode: Some(FaultMode::InThread),
                    ..Default::default()
                },
            )
            .unwrap();
        let w = r.as_words();
        fill(w, 6);
        t.phase("signals while allocating");
        // SAFETY: installs a plain handler from a zeroed struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = read_a_swapped_page as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
        }
        HANDLER_SEED.store(6, Relaxed);
        HANDLER_LEN.store(w.len(), Relaxed);
        HANDLER_WORDS.store(w.as_ptr() as usize, Relaxed);
        let before = p.counters();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // SAFETY: pthread_self of this thread, signalled only while the scope runs.
            let me = unsafe { libc::pthread_self() };
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    // SAFETY: signals this scope's thread, alive until `stop`.
                    unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            });
            struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    HANDLER_WORDS.store(0, Relaxed);
                    self.0.store(true, Relaxed);
                }
            }
            let _stop = Stop(stop);
            let t0 = std::time::Instant::now();
            let mut x = 1u64;
            let mut kept: Vec<Vec<u8>> = Vec::new();
            while t0.elapsed() < std::time::Duration::from_secs(4)
                || HANDLER_READS.load(Relaxed) < 2000
            {
                // 2-66 KiB: past the per-thread cache (1 KiB), below the mmap threshold
                x = mix(x);
                let mut v = Vec::<u8>::with_capacity(2048 + (x as usize % (64 << 10)));
                v.push(x as u8);
                kept.push(std::hint::black_box(v));
                if kept.len() > 16 {
                    kept.swap_remove(x as usize % kept.len());
                }
                assert!(t0.elapsed() < std::time::Duration::from_secs(60));
            }
        });
        let reads = HANDLER_READS.load(Relaxed);
        let n = p.counters();
        assert_eq!(HANDLER_WRONG.load(Relaxed), 0, "wrong words read: {n:?}");
        assert!(reads >= 2000, "the handler read {reads} times");
        assert!(
            n.remote_reads - before.remote_reads > 500,
            "most handler reads fetch from the cluster: {reads} reads, {n:?}"
        );
        assert_eq!(n.poisoned, 0, "{n:?}");
        check(w, 6);
        drop(r);
    });
}
