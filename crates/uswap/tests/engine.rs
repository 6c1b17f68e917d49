//! End-to-end tests of the engine: data written is read back byte-exact across
//! swap-out and swap-in, under threads, through system calls, under injected I/O
//! errors; bad input gives typed errors.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::atomic::Ordering::Relaxed;
use uswap::{
    Error, FaultInjection, Pool, ReadaheadPolicy, RegionOptions, StaleSlotPolicy, UnitPolicy,
    PAGE_SIZE,
};

const MIB: u64 = 1 << 20;

/// splitmix64: a cheap, well-mixed pattern generator.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn pool(budget: u64) -> Pool {
    Pool::builder()
        .budget(budget)
        .build()
        .expect("pool (needs root or /dev/userfaultfd access)")
}

fn fill(words: &[std::sync::atomic::AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(mix(seed ^ i as u64), Relaxed);
    }
}

fn check(words: &[std::sync::atomic::AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        let v = w.load(Relaxed);
        assert_eq!(
            v,
            mix(seed ^ i as u64),
            "word {i} (page {}) differs",
            i * 8 / PAGE_SIZE
        );
    }
}

#[test]
fn byte_exact_across_swap_out_and_in() {
    let p = pool(16 * MIB);
    let r = p.region(64 * MIB).unwrap();
    fill(r.as_words(), 1);
    check(r.as_words(), 1);
    // Twice round: the second pass swaps in what the first swapped out.
    fill(r.as_words(), 2);
    check(r.as_words(), 2);
    let c = p.counters();
    assert!(c.pswpout > 0 && c.pswpin > 0, "{c:?}");
    assert!(c.peak_used_bytes <= 16 * MIB, "budget overrun: {c:?}");
}

#[test]
fn random_pages_one_and_several_threads() {
    for threads in [1usize, 4] {
        let p = pool(16 * MIB);
        let r = p.region(48 * MIB).unwrap();
        let words = r.as_words();
        let pages = words.len() * 8 / PAGE_SIZE;
        let wpp = PAGE_SIZE / 8;
        // Each thread owns pages p % threads == t, writes them in a random order
        // with a version, then everybody checks everything.
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mine: Vec<usize> = (0..pages).filter(|p| p % threads == t).collect();
                    let mut x = t as u64 + 7;
                    for round in 0..3u64 {
                        for _ in 0..mine.len() {
                            x = mix(x);
                            let pg = mine[(x as usize) % mine.len()];
                            words[pg * wpp].store(mix(pg as u64 * 31 + round), Relaxed);
                        }
                    }
                });
            }
        });
        // Record what each page's first word holds, then touch everything again.
        let first: Vec<u64> = (0..pages).map(|pg| words[pg * wpp].load(Relaxed)).collect();
        for pg in (0..pages).rev() {
            assert_eq!(
                words[pg * wpp].load(Relaxed),
                first[pg],
                "page {pg}, threads {threads}"
            );
            for w in 1..wpp {
                assert_eq!(
                    words[pg * wpp + w].load(Relaxed),
                    0,
                    "untouched word {w} of page {pg} not zero"
                );
            }
        }
        let c = p.counters();
        assert!(c.pswpout > 0, "{c:?}");
        assert!(
            c.peak_used_bytes <= 16 * MIB,
            "budget overrun, {threads} threads: {c:?}"
        );
    }
}

/// The budget holds at every instant while threads fault on two fault threads and
/// new regions' page maps join the budget: each fault reserves its room before it
/// maps, and a new region's metadata is reclaimed for before it counts.
#[test]
fn budget_holds_under_concurrent_faults_and_new_regions() {
    let budget = 24 * MIB;
    let p = Pool::builder()
        .budget(budget)
        .fault_threads(2)
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let p = &p;
            s.spawn(move || {
                let mut kept = Vec::new();
                for k in 0..6u64 {
                    let r = p.region(12 * MIB).unwrap();
                    fill(r.as_words(), t * 100 + k);
                    kept.push((r, t * 100 + k));
                }
                for (r, seed) in &kept {
                    check(r.as_words(), *seed);
                }
            });
        }
    });
    let c = p.counters();
    assert!(c.pswpout > 0 && c.pswpin > 0, "{c:?}");
    assert!(c.peak_used_bytes <= budget, "budget overrun: {c:?}");
}

#[test]
fn concurrent_readers_of_swapped_pages() {
    let p = Pool::builder()
        .budget(16 * MIB)
        .fault_threads(2)
        .build()
        .unwrap();
    let r = p.region(64 * MIB).unwrap();
    fill(r.as_words(), 9);
    let words = r.as_words();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                // Everybody reads everything, in different orders: the same pages are
                // faulted by several threads at once.
                let n = words.len();
                for k in 0..n {
                    let i = if t % 2 == 0 { k } else { n - 1 - k };
                    assert_eq!(words[i].load(Relaxed), mix(9 ^ i as u64));
                }
            });
        }
    });
}

#[test]
fn syscalls_read_and_write_swapped_pages() {
    let p = pool(16 * MIB);
    let mut r = p.region(64 * MIB).unwrap();
    let len = r.len();
    let data: Vec<u8> = (0..len)
        .map(|i| (mix(i as u64 / 8) >> (i % 8 * 8)) as u8)
        .collect();
    r.as_mut_slice().copy_from_slice(&data);
    // Most of the region is swapped out now. write(2) reads from it in the kernel.
    let mut f = tempfile_in_tmp();
    f.write_all(r.as_slice()).unwrap();
    // Overwrite the region, then read(2) the file back into it: the kernel writes to
    // pages that are swapped out.
    r.as_mut_slice().fill(0xEE);
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(r.as_mut_slice()).unwrap();
    assert!(
        r.as_slice() == &data[..],
        "data differs after read(2)/write(2) through the region"
    );
    assert!(p.counters().pswpin > 0);
}

fn tempfile_in_tmp() -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "uswap-syscall-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

#[test]
fn stale_slot_policies_both_exact_and_differ_in_slots() {
    let mut slots = Vec::new();
    for policy in [
        StaleSlotPolicy::FreeOnWrite,
        StaleSlotPolicy::KeepUntilReclaim,
    ] {
        let p = Pool::builder()
            .budget(16 * MIB)
            .stale_slot_policy(policy)
            .build()
            .unwrap();
        let r = p.region(64 * MIB).unwrap();
        fill(r.as_words(), 3);
        check(r.as_words(), 3); // swapped in clean: pages own valid slots
                                // Rewrite the first half only while it is resident: those slots go stale.
        let half = &r.as_words()[..r.as_words().len() / 8];
        fill(half, 4);
        check(half, 4);
        let c = p.counters();
        slots.push((policy, c.stale_slot_freed, c.slots_used));
    }
    assert!(
        slots[0].1 > 0,
        "free-on-write freed no stale slot: {slots:?}"
    );
}

#[test]
fn readahead_policies_are_exact() {
    for ra in [
        ReadaheadPolicy::Vma,
        ReadaheadPolicy::Cluster,
        ReadaheadPolicy::Off,
    ] {
        let p = pool(16 * MIB);
        let r = p
            .region_with(
                64 * MIB,
                RegionOptions {
                    readahead: Some(ra),
                    unit: Some(UnitPolicy::Small),
                },
            )
            .unwrap();
        fill(r.as_words(), 5);
        check(r.as_words(), 5);
        let c = r.counters();
        if ra == ReadaheadPolicy::Off {
            assert_eq!(c.swap_ra, 0);
        } else {
            assert!(c.swap_ra > 0, "{ra:?}: no readahead on a sequential read");
        }
    }
}

#[test]
fn injected_write_errors_lose_nothing() {
    let p = Pool::builder()
        .budget(16 * MIB)
        .inject_io_errors(FaultInjection {
            fail_write_every: 7,
            fail_read_every: 0,
        })
        .build()
        .unwrap();
    let r = p.region(64 * MIB).unwrap();
    fill(r.as_words(), 11);
    check(r.as_words(), 11);
    assert!(p.counters().io_errors > 0);
}

#[test]
fn injected_read_errors_are_retried() {
    let p = Pool::builder()
        .budget(16 * MIB)
        .inject_io_errors(FaultInjection {
            fail_read_every: 5,
            fail_write_every: 0,
        })
        .build()
        .unwrap();
    let r = p.region(64 * MIB).unwrap();
    fill(r.as_words(), 12);
    check(r.as_words(), 12);
    assert!(p.counters().io_errors > 0);
}

#[test]
fn persistent_read_errors_raise_sigbus_not_wrong_data() {
    // In a child process: every read fails, so a swapped-out page is lost; touching
    // it must kill the child with SIGBUS, never return other bytes.
    let exe = std::env::current_exe().unwrap();
    if std::env::var("USWAP_SIGBUS_CHILD").is_ok() {
        let p = Pool::builder()
            .budget(16 * MIB)
            .inject_io_errors(FaultInjection {
                fail_read_every: 1,
                fail_write_every: 0,
            })
            .build()
            .unwrap();
        let r = p.region(64 * MIB).unwrap();
        fill(r.as_words(), 13);
        let v = r.as_words()[0].load(Relaxed); // swapped out by now
        println!("read {v:#x} instead of SIGBUS");
        std::process::exit(0);
    }
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "persistent_read_errors_raise_sigbus_not_wrong_data",
            "--nocapture",
        ])
        .env("USWAP_SIGBUS_CHILD", "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A page the engine holds as resident but that is gone from the region (discarded
/// behind its back with madvise) must not hang the program on an endless fault: the
/// engine says so and poisons it (SIGBUS on the next touch).
#[test]
fn resident_page_gone_behind_the_engine_gives_sigbus_not_a_hang() {
    let exe = std::env::current_exe().unwrap();
    let name = "resident_page_gone_behind_the_engine_gives_sigbus_not_a_hang";
    if std::env::var("USWAP_GONE_CHILD").is_ok() {
        let p = Pool::builder().budget(64 * MIB).build().unwrap();
        let r = p.region(8 * MIB).unwrap();
        fill(r.as_words(), 21);
        let page = r.as_ptr() as usize + 3 * 4096;
        // SAFETY: discards one page of this test's own region (the misuse under test).
        unsafe { libc::madvise(page as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
        let v = r.as_words()[3 * 512].load(Relaxed);
        println!("read {v:#x} instead of SIGBUS");
        std::process::exit(0);
    }
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture"])
        .env("USWAP_GONE_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A hang is the failure this test exists for: give it 30 s.
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the child hung on a page gone behind the engine");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "child: {status:?} {} {err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("not mapped"), "no message: {err}");
}

#[test]
fn bad_input_gives_typed_errors() {
    assert!(matches!(
        Pool::builder().budget(0).build(),
        Err(Error::BudgetTooSmall { .. })
    ));
    assert!(matches!(
        Pool::builder().budget(MIB).build(),
        Err(Error::BudgetTooSmall { .. })
    ));
    assert!(matches!(
        Pool::builder().budget(1 << 50).build(),
        Err(Error::BudgetExceedsRam { .. })
    ));
    assert!(matches!(
        uswap::parse_size("12Q"),
        Err(Error::InvalidSize { .. })
    ));
    let e = Pool::builder()
        .swap_file("/nonexistent/dir/swap")
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::SwapFile { .. }), "{e}");
    let p = Pool::builder()
        .budget(16 * MIB)
        .swap_size(32 * MIB)
        .build()
        .unwrap();
    assert!(matches!(p.region(0), Err(Error::InvalidRegionSize { .. })));
    let r = p.region(24 * MIB).unwrap();
    // The swap file cannot back a second region: refused up front, not at fault time.
    assert!(matches!(p.region(24 * MIB), Err(Error::SwapFull { .. })));
    drop(r);
    // Once the first is gone its swap is available again.
    assert!(p.region(24 * MIB).is_ok());
}

#[test]
fn drop_frees_slots_and_swap_file_is_private() {
    // On the build's disk: /tmp may be a tmpfs, which is refused as a swap place.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("uswap-drop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    {
        let p = Pool::builder()
            .budget(16 * MIB)
            .swap_file(&dir)
            .build()
            .unwrap();
        let r = p.region(64 * MIB).unwrap();
        fill(r.as_words(), 14);
        assert!(p.counters().slots_used > 0);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "the swap file must be unnamed"
        );
        drop(r);
        // Wait out writes still in flight at drop time.
        let t = std::time::Instant::now();
        while p.counters().slots_used > 0 && t.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(p.counters().slots_used, 0, "slots leaked after region drop");
        assert_eq!(p.counters().resident_bytes, 0);
    }
    std::fs::remove_dir(&dir).unwrap();
}
