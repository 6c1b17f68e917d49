//! fork(2): parent and child each see their own copy-on-write view of a region,
//! including pages swapped out at the moment of fork (never a silent zero page).
//! Alone in its test binary: fork in a process with other test threads is unsafe, and
//! the tests here take turns (`serial`): a fork switches the swap files of every pool
//! of the process, which the swap-file counts below must not see from another test.

mod common;

use common::{child_deadline, mix, with_deadline, Test};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, UnitPolicy};

const MIB: u64 = 1 << 20;

/// One fork test at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pattern of the words of one test: random words, or random bytes in words
/// (`MASK`: compressible, ~3:1, for the compressed tier).
struct Words<const MASK: u64>;

impl<const MASK: u64> Words<MASK> {
    fn value(offset: usize, i: usize, seed: u64) -> u64 {
        mix(seed ^ (offset + i) as u64) & MASK
    }

    fn fill(words: &[AtomicU64], offset: usize, seed: u64) {
        for (i, w) in words.iter().enumerate() {
            w.store(Self::value(offset, i, seed), Relaxed);
        }
    }

    /// First mismatching word, if any.
    fn find_bad(words: &[AtomicU64], offset: usize, seed: u64) -> Option<usize> {
        words
            .iter()
            .enumerate()
            .find(|(i, w)| w.load(Relaxed) != Self::value(offset, *i, seed))
            .map(|(i, _)| offset + i)
    }
}

/// Random words (most tests).
type Random = Words<{ u64::MAX }>;

fn fill(words: &[AtomicU64], offset: usize, seed: u64) {
    Random::fill(words, offset, seed)
}

fn find_bad(words: &[AtomicU64], offset: usize, seed: u64) -> Option<usize> {
    Random::find_bad(words, offset, seed)
}

fn run(t: &Test, unit: UnitPolicy) {
    run_with::<{ u64::MAX }>(t, Pool::builder().budget(16 * MIB), 64 * MIB, unit, false);
}

/// Each side of a fork sees its own copy of a region of `size` (pattern `MASK`),
/// swapped out before the fork: the child checks and writes one half, the parent the
/// other, and each checks again. Returns the pool's counters at the fork.
fn run_with<const MASK: u64>(
    t: &Test,
    pool: uswap::PoolBuilder,
    size: u64,
    unit: UnitPolicy,
    read_first: bool,
) -> uswap::Counters {
    t.phase(format!("{unit:?}, read first: {read_first}"));
    let (fill, find_bad) = (Words::<MASK>::fill, Words::<MASK>::find_bad);
    let p = t.pool(pool);
    let r = common::region_of(&p, size, unit);
    let words = r.as_words();
    let half = words.len() / 2;
    fill(words, 0, 1);
    if read_first {
        // Units read back before the fork: from packed blobs they are mapped clean,
        // the blobs kept as their copies (some resident at the fork, some evicted),
        // so the pass writes back little (only what the pool held).
        let c0 = p.counters();
        assert_eq!(find_bad(words, 0, 1), None, "before the fork");
        let c1 = p.counters();
        let pages = size / 4096;
        assert!(
            c1.zswpwb - c0.zswpwb < pages / 2,
            "a read pass wrote back {} of {pages} pages: {c1:?}",
            c1.zswpwb - c0.zswpwb
        );
    }
    let before = p.counters();
    assert!(before.pswpout > 0, "nothing swapped out before fork");

    common::flush();
    uswap::prepare_fork();
    // SAFETY: fork; the child only runs uswap and this function's checks, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        uswap::after_fork_child();
        child_deadline(60);
        let mut code = 0;
        if let Some(i) = find_bad(words, 0, 1) {
            common::say(&format!("child: pre-fork data wrong at word {i}"));
            code = 1;
        }
        fill(&words[..half], 0, 2);
        if let Some(i) = find_bad(&words[..half], 0, 2) {
            common::say(&format!("child: own writes wrong at word {i}"));
            code = 1;
        }
        if let Some(i) = find_bad(&words[half..], half, 1) {
            common::say(&format!("child: untouched half wrong at word {i}"));
            code = 1;
        }
        if let Err(e) = p.check_invariants() {
            common::say(&format!("child: engine invariants broken: {e}"));
            code = 1;
        }
        // SAFETY: leave without running the parent's test harness teardown.
        unsafe { libc::_exit(code) };
    }
    uswap::after_fork_parent();
    // The parent writes the other half meanwhile and must not see the child's writes.
    fill(&words[half..], half, 3);
    assert_eq!(
        find_bad(&words[..half], 0, 1),
        None,
        "parent sees changed pre-fork data"
    );
    assert_eq!(
        find_bad(&words[half..], half, 3),
        None,
        "parent's own writes wrong"
    );
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
    // And once more after the child is gone (its swap is frozen, still readable).
    assert_eq!(find_bad(&words[..half], 0, 1), None);
    assert_eq!(find_bad(&words[half..], half, 3), None);
    let c = p.counters();
    assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    before
}

/// Units the compressed tier wrote back packed before the fork (and some whose writes
/// may be in flight as it happens): the child reads them from the parent's file, or
/// takes them back from the writes' frames; each side keeps its own copy; every slot,
/// the blobs' included, goes back once the child and the region are gone. Also with
/// the units read back before the fork: mapped clean, their blobs shared by both.
#[test]
fn packed_units_cross_a_fork() {
    let _serial = serial();
    for read_first in [false, true] {
        with_deadline(180, |t| packed_fork(t, read_first));
    }
}

fn packed_fork(t: &Test, read_first: bool) {
    let pool = Pool::builder()
        .budget(48 * MIB)
        .tier(uswap::TierKind::CompressedFile)
        .compressed_max_percent(25);
    let c = run_with::<0xff>(t, pool, 128 * MIB, UnitPolicy::Huge, read_first);
    // Units were written back packed before the fork.
    assert!(c.zswpwb_packed_units > 0, "{c:?}");
}

/// Review finding: units stored in the pool before a fork and written back packed
/// after it, while the child holds references on their slots. A blob that counted only
/// the parent's references went with the child's, and the parent's pages with it
/// (SIGBUS). Such units are written back unpacked; the parent reads them after the child
/// is gone.
#[test]
fn units_stored_before_a_fork_outlive_the_child() {
    let _serial = serial();
    with_deadline(180, |t| {
        let p = t.pool(
            Pool::builder()
                .budget(48 * MIB)
                .tier(uswap::TierKind::CompressedFile)
                .compressed_max_percent(25),
        );
        let r = common::region_of(&p, 128 * MIB, UnitPolicy::Huge);
        let words = r.as_words();
        let third = words.len() / 3;
        type Small = Words<0xff>;
        Small::fill(&words[..third], 0, 1);
        common::flush();
        uswap::prepare_fork();
        // SAFETY: fork; the child only waits, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            uswap::after_fork_child();
            child_deadline(60);
            // Alive while the parent writes back what it stored before the fork.
            std::thread::sleep(std::time::Duration::from_millis(1500));
            // SAFETY: leave without running the parent's test harness teardown.
            unsafe { libc::_exit(0) };
        }
        uswap::after_fork_parent();
        Small::fill(&words[third..], third, 2);
        let before = p.counters();
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child: status {status:#x}");
        // Its references go when the reclaim thread sees its pipe close.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(Small::find_bad(&words[..third], 0, 1), None);
        assert_eq!(Small::find_bad(&words[third..], third, 2), None);
        let c = p.counters();
        assert!(
            before.zswpwb > 0,
            "nothing written back while the child lived: {before:?}"
        );
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    });
}

/// Units first touched after a fork, by both sides, with spare zeroed THPs in play
/// (the budget keeps two): each side gets zeros, then its own data.
#[test]
fn first_touch_after_fork_is_zero_and_private() {
    let _serial = serial();
    with_deadline(120, first_touch_after_fork);
}

fn first_touch_after_fork(t: &Test) {
    let p = t.pool(Pool::builder().budget(128 * MIB));
    let r = common::region_of(&p, 64 * MIB, UnitPolicy::Huge);
    let words = r.as_words();
    let half = words.len() / 2;
    // First touches before the fork: the reclaim thread starts making spares.
    fill(&words[..half], 0, 4);
    std::thread::sleep(std::time::Duration::from_millis(50));
    common::flush();
    uswap::prepare_fork();
    // SAFETY: fork; the child only runs uswap and this function's checks, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    let (seed, who) = if pid == 0 {
        (5, "child")
    } else {
        (6, "parent")
    };
    if pid == 0 {
        uswap::after_fork_child();
        child_deadline(60);
    } else {
        uswap::after_fork_parent();
    }
    let mut bad = Vec::new();
    if let Some(i) = words[half..].iter().position(|w| w.load(Relaxed) != 0) {
        bad.push(format!(
            "{who}: untouched half not zero at word {}",
            half + i
        ));
    }
    fill(&words[half..], half, seed);
    std::thread::sleep(std::time::Duration::from_millis(20));
    if let Some(i) = find_bad(&words[..half], 0, 4) {
        bad.push(format!("{who}: pre-fork half wrong at word {i}"));
    }
    if let Some(i) = find_bad(&words[half..], half, seed) {
        bad.push(format!("{who}: own writes wrong at word {}", half + i));
    }
    if pid == 0 {
        if let Err(e) = p.check_invariants() {
            bad.push(format!("child: engine invariants broken: {e}"));
        }
        for b in &bad {
            common::say(b);
        }
        // SAFETY: leave without running the parent's test harness teardown.
        unsafe { libc::_exit(i32::from(!bad.is_empty())) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(bad.is_empty(), "{bad:?}");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
}

#[test]
fn fork_gives_each_side_its_own_copy() {
    let _serial = serial();
    with_deadline(180, |t| {
        run(t, UnitPolicy::Small);
        run(t, UnitPolicy::Huge);
    });
}

/// A directory of its own for one test's swap files (so that they can be counted),
/// removed when dropped.
struct SwapDir(std::path::PathBuf);

impl SwapDir {
    fn new(what: &str) -> SwapDir {
        let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("uswap-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        SwapDir(d)
    }
}

impl Drop for SwapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Distinct swap files (in `dir`) open in any of `pids`, and their allocated bytes.
fn swap_files_of(pids: &[u32], dir: &std::path::Path) -> (usize, u64) {
    let mut all: Vec<(u64, u64, u64)> = Vec::new();
    for &pid in pids {
        for f in common::open_swap_files(pid, dir) {
            if !all.iter().any(|g| (g.0, g.1) == (f.0, f.1)) {
                all.push(f);
            }
        }
    }
    (all.len(), all.iter().map(|f| f.2).sum())
}

/// Issue 11: every fork made a new full-size swap file in parent and child and never
/// closed the frozen ones. A program that forks 20 times, its children exiting at once
/// (even forks) or staying alive (odd forks), must hold no more swap files than it has
/// live processes (counted over the parent and its live children), and its disk use
/// must fall back as the children exit. Every child checks its copy first.
#[test]
fn forks_hold_no_more_swap_files_than_live_processes() {
    let _serial = serial();
    with_deadline(240, |t| {
        let dir = SwapDir::new("fork-files");
        let p = t.pool(Pool::builder().budget(16 * MIB).swap_file(&dir.0));
        let r = common::region_of(&p, 32 * MIB, UnitPolicy::Small);
        let words = r.as_words();
        fill(words, 0, 7);
        let me = std::process::id();
        let (files0, bytes0) = swap_files_of(&[me], &dir.0);
        assert_eq!(files0, 1, "one swap file before any fork");
        // The children that stay alive wait for EOF on this pipe.
        let mut hold = [0i32; 2];
        // SAFETY: pipe(2) into a live array of two fds.
        assert_eq!(unsafe { libc::pipe(hold.as_mut_ptr()) }, 0);
        let mut alive: Vec<i32> = Vec::new();
        let mut most = (0usize, 0u64);
        for k in 0..20u64 {
            t.phase(format!("fork {k}"));
            let mut ready = [0i32; 2];
            // SAFETY: as above.
            assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
            common::flush();
            uswap::prepare_fork();
            // SAFETY: fork; the child runs uswap, its checks and reads a pipe, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                uswap::after_fork_child();
                // Staying children live through all 20 forks: under the parent's 240.
                child_deadline(220);
                let mut code = 0;
                // The first half as filled before the forks; the second half as the
                // parent rewrote it after the previous fork.
                let half = words.len() / 2;
                let second = if k == 0 { 7 } else { 200 + k - 1 };
                let bad = find_bad(&words[..half], 0, 7)
                    .or_else(|| find_bad(&words[half..], half, second));
                if let Some(i) = bad {
                    common::say(&format!("child {k}: pre-fork data wrong at word {i}"));
                    code = 1;
                }
                fill(&words[..words.len() / 4], 0, 100 + k); // writes of its own
                                                             // SAFETY: fds of this process; one byte from a live buffer.
                unsafe {
                    libc::close(hold[1]);
                    libc::write(ready[1], b"r".as_ptr().cast(), 1);
                    if k % 2 == 1 {
                        let mut b = 0u8;
                        libc::read(hold[0], (&mut b as *mut u8).cast(), 1);
                    }
                    libc::_exit(code);
                }
            }
            uswap::after_fork_parent();
            // SAFETY: fds of this process; reads one byte into a live buffer.
            unsafe {
                libc::close(ready[1]);
                let mut b = 0u8;
                libc::read(ready[0], (&mut b as *mut u8).cast(), 1);
                libc::close(ready[0]);
            }
            fill(&words[words.len() / 2..], words.len() / 2, 200 + k);
            if k % 2 == 0 {
                wait_ok(pid, &format!("child {k}"));
            } else {
                alive.push(pid);
            }
            let mut pids = vec![me];
            pids.extend(alive.iter().map(|&p| p as u32));
            let (files, bytes) = swap_files_of(&pids, &dir.0);
            most = (most.0.max(files), most.1.max(bytes));
            assert!(
                files <= pids.len(),
                "after fork {k}: {files} swap files open ({} MiB allocated) for {} live \
                 processes",
                bytes >> 20,
                pids.len()
            );
        }
        t.phase("children exit");
        // SAFETY: closes this process's ends of the pipe: the waiting children see EOF.
        unsafe {
            libc::close(hold[0]);
            libc::close(hold[1]);
        }
        for (i, pid) in alive.iter().enumerate() {
            wait_ok(*pid, &format!("staying child {i}"));
        }
        // The parent learns that its children are gone from their pipes, drops what it
        // held for them, and gives the disk space of the freed slots back, in its
        // reclaim thread: a moment after the last exit.
        let settled = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (files, bytes) = loop {
            let (files, bytes) = swap_files_of(&[me], &dir.0);
            if (files <= 1 && bytes <= bytes0 + 32 * MIB) || std::time::Instant::now() > settled {
                break (files, bytes);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(
            files <= 1 && bytes <= bytes0 + 32 * MIB,
            "all children gone: {files} swap files, {} MiB allocated (before the forks: \
             {} MiB; most: {most:?})",
            bytes >> 20,
            bytes0 >> 20
        );
        assert_eq!(find_bad(&words[..words.len() / 2], 0, 7), None);
        assert_eq!(
            find_bad(&words[words.len() / 2..], words.len() / 2, 219),
            None
        );
    });
}

fn wait_ok(pid: i32, what: &str) {
    wait_ok_within(pid, 600, what);
}

/// Issue 11: after a fork, every EBUSY from UFFDIO_MOVE was taken as copy-on-write
/// sharing, so a page pinned by the program's own O_DIRECT read was copied out before
/// the DMA ended and the program kept stale bytes. Here: one fork (the child exits at
/// once), then O_DIRECT reads into region memory (buffers filled with a marker first)
/// while another thread streams through the rest of the region, so that reclaim runs
/// on the buffers' units during the DMA. Every read must land.
#[test]
fn o_direct_reads_into_region_after_fork_land() {
    let _serial = serial();
    with_deadline(180, |t| o_direct_reads_land(t, true));
}

/// The same without a fork: a pinned page is left alone (the control of the test
/// above: what fails there is the fork's doing).
#[test]
fn o_direct_reads_into_region_land() {
    let _serial = serial();
    with_deadline(180, |t| o_direct_reads_land(t, false));
}

fn o_direct_reads_land(t: &Test, fork: bool) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let secs = 8;
    let dir = SwapDir::new("odirect");
    let data = dir.0.join("data");
    const FILE: usize = 16 << 20;
    const CHUNK: usize = 1 << 20;
    let pattern = |off: usize, i: usize| mix(0xD1 ^ (off / 8 + i) as u64);
    {
        let bytes: Vec<u8> = (0..FILE / 8)
            .flat_map(|i| pattern(0, i).to_ne_bytes())
            .collect();
        std::fs::write(&data, bytes).unwrap();
    }
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&data)
    {
        Ok(f) => f,
        Err(e) => panic!(
            "O_DIRECT open of {} failed ({e}): this test needs a filesystem with O_DIRECT",
            data.display()
        ),
    };
    let p = t.pool(Pool::builder().budget(16 * MIB));
    let r = common::region_of(&p, 64 * MIB, UnitPolicy::Small);
    let words = r.as_words();
    fill(words, 0, 1);
    // One fork: from now on the engine knows pages may be shared.
    if fork {
        common::flush();
        uswap::prepare_fork();
        // SAFETY: fork; the child only calls the engine's hook and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            uswap::after_fork_child();
            // SAFETY: leave at once.
            unsafe { libc::_exit(0) };
        }
        uswap::after_fork_parent();
        wait_ok(pid, "child");
    }
    t.phase("O_DIRECT reads under reclaim");
    let readers = 2usize;
    let buf_words = 4 * CHUNK / 8; // 4 MiB of buffer per reader
    let (bufs, rest) = words.split_at(readers * buf_words);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let base = r.as_ptr() as usize;
    let (reads, bad) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                fill(rest, readers * buf_words, 1000 + k);
                k += 1;
            }
        });
        let hs: Vec<_> = (0..readers)
            .map(|id| {
                let (f, stop) = (&f, &stop);
                let buf = &bufs[id * buf_words..(id + 1) * buf_words];
                s.spawn(move || {
                    let t0 = std::time::Instant::now();
                    let (mut n, mut x) = (0u64, id as u64);
                    // At least `secs`, and at least 60 reads (a loaded machine is
                    // slow) unless a minute passes.
                    while (t0.elapsed().as_secs() < secs || n < 60) && t0.elapsed().as_secs() < 60 {
                        x = mix(x);
                        let slot = (x as usize % 4) * CHUNK; // within this buffer
                        let off = (x >> 8) as usize % (FILE / CHUNK) * CHUNK;
                        let w = &buf[slot / 8..(slot + CHUNK) / 8];
                        for v in w {
                            v.store(0xDEAD_BEEF_0000_0000 | n, Relaxed);
                        }
                        let addr = base + (id * buf_words * 8) + slot;
                        // SAFETY: CHUNK bytes of this test's own region, alive for
                        // the scope; no Rust reference writes them during the read.
                        let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, CHUNK) };
                        f.read_exact_at(dst, off as u64).expect("O_DIRECT pread");
                        if let Some(i) =
                            (0..w.len()).find(|&i| w[i].load(Relaxed) != pattern(off, i))
                        {
                            stop.store(true, Relaxed);
                            return (
                                n,
                                Some(format!(
                                    "reader {id}, read {n}: file offset {off:#x} into buffer \
                                 offset {slot:#x}: word {i} is {:#x}, want {:#x}",
                                    w[i].load(Relaxed),
                                    pattern(off, i)
                                )),
                            );
                        }
                        n += 1;
                    }
                    (n, None)
                })
            })
            .collect();
        let res: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Relaxed);
        (
            res.iter().map(|r| r.0).sum::<u64>(),
            res.into_iter().find_map(|r| r.1),
        )
    });
    let c = p.counters();
    assert_eq!(bad, None, "stale bytes after an O_DIRECT read; {c:?}");
    assert!(reads > 100 && c.pswpout > 0, "{reads} reads; {c:?}");
}

/// Review finding: a fault served in its own thread that waits for room when a fork
/// begins held the fork up (the reclaim thread, which would make that room, waits for
/// the fork) until its 10 s limit, and then went over the budget. It now leaves the
/// engine for the fork and comes again. A writer streams through an in-thread region
/// twice the budget while the fork preparation runs again and again, each timed.
#[test]
fn a_fault_waiting_for_room_in_its_thread_lets_a_fork_begin() {
    let _one = serial();
    with_deadline(180, |t| {
        let p = t.pool(Pool::builder().budget(16 * MIB));
        let r = p
            .region_with(
                256 * MIB,
                uswap::RegionOptions {
                    fault_mode: Some(uswap::FaultMode::InThread),
                    ..Default::default()
                },
            )
            .unwrap();
        let words = r.as_words();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let slowest = std::thread::scope(|s| {
            let quarter = words.len() / 4;
            let writers: Vec<_> = (0..4)
                .map(|k| {
                    let part = &words[k * quarter..(k + 1) * quarter];
                    let stop = &stop;
                    s.spawn(move || {
                        let mut round = 1u64;
                        while !stop.load(Relaxed) {
                            fill(part, k * quarter, round);
                            round += 1;
                        }
                        round - 1
                    })
                })
                .collect();
            let mut slowest = std::time::Duration::ZERO;
            for _ in 0..60 {
                std::thread::sleep(std::time::Duration::from_millis(15));
                let t0 = std::time::Instant::now();
                uswap::prepare_fork();
                slowest = slowest.max(t0.elapsed());
                uswap::after_fork_parent();
            }
            stop.store(true, Relaxed);
            for (k, w) in writers.into_iter().enumerate() {
                let last = w.join().expect("writer");
                let part = &words[k * quarter..(k + 1) * quarter];
                assert_eq!(find_bad(part, k * quarter, last), None, "round {last}");
            }
            slowest
        });
        let c = p.counters();
        assert!(c.pswpout > 0 && c.pswpin > 0, "{c:?}");
        // A fork waits for faults in flight (each a few ms at most here), not for
        // room that only the reclaim thread, stopped for the fork, can make.
        assert!(
            slowest < std::time::Duration::from_secs(3),
            "a fork preparation took {slowest:?}: {c:?}"
        );
    });
}

fn in_thread_region(p: &Pool, size: u64) -> uswap::Region {
    p.region_with(
        size,
        uswap::RegionOptions {
            fault_mode: Some(uswap::FaultMode::InThread),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Issue 40: the child registered its in-thread regions with the fault threads'
/// userfaultfd, which then mapped through the region's own (new, empty) descriptor:
/// the copy failed and the child waited in the kernel for good on its first fault. An
/// in-thread region swapped out under its budget, forked: the child reads every page,
/// writes half and reads it back; the parent writes the other half meanwhile.
#[test]
fn in_thread_regions_cross_a_fork() {
    let _serial = serial();
    with_deadline(120, |t| {
        let p = t.pool(Pool::builder().budget(16 * MIB));
        let r = in_thread_region(&p, 64 * MIB);
        let words = r.as_words();
        let half = words.len() / 2;
        fill(words, 0, 1);
        let before = p.counters();
        assert!(before.pswpout > 0, "nothing swapped out before the fork");
        common::flush();
        // SAFETY: fork; the child only runs uswap and this test's checks, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child_deadline(60);
            let mut code = 0;
            if let Some(i) = find_bad(words, 0, 1) {
                common::say(&format!("child: pre-fork data wrong at word {i}"));
                code = 1;
            }
            fill(&words[..half], 0, 2);
            if let Some(i) = find_bad(&words[..half], 0, 2) {
                common::say(&format!("child: own writes wrong at word {i}"));
                code = 1;
            }
            let c = p.counters();
            if c.pswpin <= before.pswpin {
                common::say(&format!("child: nothing swapped in: {c:?}"));
                code = 1;
            }
            if let Err(e) = p.check_invariants() {
                common::say(&format!("child: engine invariants broken: {e}"));
                code = 1;
            }
            // SAFETY: leave without running the parent's test harness teardown.
            unsafe { libc::_exit(code) };
        }
        fill(&words[half..], half, 3);
        assert_eq!(
            find_bad(&words[..half], 0, 1),
            None,
            "parent: pre-fork half"
        );
        assert_eq!(
            find_bad(&words[half..], half, 3),
            None,
            "parent: own writes"
        );
        wait_ok(pid, "the child");
        let c = p.counters();
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    });
}

/// Wait for child `pid` for at most `secs` seconds; on a hang, kill it and fail.
fn wait_ok_within(pid: i32, secs: u64, what: &str) {
    let t = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: polls a child this test forked.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got == pid {
            break;
        }
        assert_eq!(got, 0, "waitpid {what}");
        if t.elapsed() > std::time::Duration::from_secs(secs) {
            // SAFETY: kills the hung child this test forked, then reaps it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{what} hung for {secs} s (killed)");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what} failed: status {status:#x}"
    );
}

/// Issue 40: a fork while other threads took in-thread faults could copy a lock held by
/// one of them (the engine list, a region table, a unit, a swap-cache shard: the SIGBUS
/// handler took them outside the fork's gate) into the child, whose fork hook then
/// waited for it for good (hung at forks 34 and 64 in two runs). Six threads read then
/// write random pages of a hot set larger than the budget while a seventh forks again
/// and again; each child checks a page and leaves at once.
#[test]
fn forks_while_threads_fault_in_their_own_thread() {
    let _serial = serial();
    with_deadline(240, |t| {
        let p = t.pool(Pool::builder().budget(16 * MIB));
        let r = in_thread_region(&p, 64 * MIB);
        let words = r.as_words();
        let hot = (24 * MIB / 8) as usize;
        fill(&words[..hot], 0, 1);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let per_page = 512;
        let forks = std::thread::scope(|s| {
            for k in 0..6u64 {
                let stop = &stop;
                s.spawn(move || {
                    let pages = hot / per_page;
                    let mut x = k + 1;
                    while !stop.load(Relaxed) {
                        x = mix(x);
                        let page = x as usize % pages;
                        // Each thread writes only pages `k` mod 6 (the values stay known);
                        // it reads any page.
                        let w = page * per_page + (x >> 32) as usize % per_page;
                        let v = words[w].load(Relaxed);
                        if page % 6 == k as usize {
                            assert_eq!(v, mix(1 ^ w as u64), "word {w}");
                            words[w].store(v, Relaxed);
                        } else {
                            assert_eq!(v, mix(1 ^ w as u64), "word {w}");
                        }
                    }
                });
            }
            let mut forks = 0;
            let t0 = std::time::Instant::now();
            while forks < 200 && t0.elapsed() < std::time::Duration::from_secs(40) {
                // SAFETY: fork; the child reads one word and leaves with _exit.
                let pid = unsafe { libc::fork() };
                assert!(pid >= 0, "fork failed");
                if pid == 0 {
                    child_deadline(30);
                    let ok =
                        words[forks * 97 % hot].load(Relaxed) == mix(1 ^ (forks * 97 % hot) as u64);
                    // SAFETY: leave without running the parent's test harness teardown.
                    unsafe { libc::_exit(i32::from(!ok)) };
                }
                wait_ok_within(pid, 20, &format!("child of fork {forks}"));
                forks += 1;
            }
            stop.store(true, Relaxed);
            forks
        });
        let c = p.counters();
        assert!(forks >= 50, "only {forks} forks in 40 s: {c:?}");
        assert!(c.pswpin > 0 && c.pswpout > 0, "{c:?}");
        assert_eq!(find_bad(&words[..hot], 0, 1), None);
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    });
}
