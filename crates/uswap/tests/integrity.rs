//! Integrity and privacy of swapped data (issue 17): encryption at rest round trips
//! byte-exact in every unit mode, in-thread and through the compressed tier's
//! writeback; the swap device holds no plaintext with it (and does without, so the
//! scan can fail); a byte flipped in the swap device while the program runs is
//! caught every time, over 10,000 corruptions, never read back as wrong bytes.
//!
//! The swap device is a loop device over the `disk` of a uswap-faultfs FUSE mount,
//! whose backing file the test reads (the scan) and writes (the corruptions)
//! directly. Needs root, userfaultfd, /dev/fuse and loop devices: without them these
//! tests FAIL, they never skip.

mod common;

use common::{mix, with_deadline, Test};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, ReadaheadPolicy, RegionOptions, TierKind, UnitPolicy};
use uswap_faultfs::harness::FaultMount;

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;
const WORDS_PER_PAGE: usize = PAGE / 8;

fn word(seed: u64, i: usize) -> u64 {
    mix(seed ^ (i as u64).wrapping_mul(0x9E37_79B9))
}

fn fill(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(word(seed, i), Relaxed);
    }
}

fn check(words: &[AtomicU64], seed: u64, what: &str) {
    for (i, w) in words.iter().enumerate() {
        let v = w.load(Relaxed);
        assert_eq!(
            v,
            word(seed, i),
            "{what}: word {i} (page {})",
            i / WORDS_PER_PAGE
        );
    }
}

fn opts(unit: UnitPolicy) -> RegionOptions {
    RegionOptions {
        unit: Some(unit),
        ..Default::default()
    }
}

/// Fill, check, fill again and check again (the second pass swaps in what the first
/// wrote, then writes over it): every byte exact, nothing lost, no checksum failure.
fn round_trip(t: &Test, b: uswap::PoolBuilder, o: RegionOptions, what: &str) {
    t.phase(what.to_string());
    let p = t.pool(b.budget(16 * MIB).encrypt(true));
    let r = p.region_with(64 * MIB, o).unwrap();
    for seed in [1, 2] {
        fill(r.as_words(), seed);
        check(r.as_words(), seed, what);
    }
    let c = p.counters();
    assert!(c.pswpout > 0 && c.pswpin > 0, "{what}: no swap I/O: {c:?}");
    assert_eq!(c.swap_csum_fail, 0, "{what}: {c:?}");
    assert_eq!(c.poisoned, 0, "{what}: {c:?}");
    assert_eq!(c.io_errors, 0, "{what}: {c:?}");
}

#[test]
fn encrypted_swap_round_trips_in_every_unit_mode() {
    with_deadline(300, |t| {
        for unit in [UnitPolicy::Small, UnitPolicy::Huge, UnitPolicy::Auto] {
            round_trip(t, Pool::builder(), opts(unit), &format!("{unit:?}"));
        }
        round_trip(
            t,
            Pool::builder().readahead(ReadaheadPolicy::Cluster),
            opts(UnitPolicy::Small),
            "Small, cluster readahead",
        );
        round_trip(
            t,
            Pool::builder(),
            RegionOptions {
                fault_mode: Some(uswap::FaultMode::InThread),
                ..Default::default()
            },
            "in-thread",
        );
    });
}

#[test]
fn encrypted_swap_round_trips_through_the_compressed_tier() {
    with_deadline(300, |t| {
        for unit in [UnitPolicy::Small, UnitPolicy::Huge] {
            t.phase(format!("{unit:?}"));
            let p = t.pool(
                Pool::builder()
                    .budget(48 * MIB)
                    .tier(TierKind::CompressedFile)
                    .compressed_max_percent(25)
                    .encrypt(true),
            );
            let r = p.region_with(160 * MIB, opts(unit)).unwrap();
            // Pages half random, half small integers (they compress about 2:1, more
            // than the compressed pool's share holds: it writes back to the file),
            // every third one all random (it does not compress, and goes to the file
            // directly).
            let word = |seed: u64, i: usize| {
                let in_page = i % WORDS_PER_PAGE;
                match (i / WORDS_PER_PAGE) % 3 {
                    _ if in_page < WORDS_PER_PAGE / 2 => mix(seed ^ i as u64),
                    2 => mix(seed ^ i as u64),
                    _ => (seed * 7 + (i % 61) as u64) & 0xff,
                }
            };
            for seed in [3u64, 4] {
                for (i, w) in r.as_words().iter().enumerate() {
                    w.store(word(seed, i), Relaxed);
                }
                for (i, w) in r.as_words().iter().enumerate() {
                    assert_eq!(w.load(Relaxed), word(seed, i), "{unit:?}: word {i}");
                }
            }
            let c = p.counters();
            assert!(c.zswpout > 0 && c.zswpin > 0, "{unit:?}: {c:?}");
            // The compressed pool's writeback went through the encrypted write path.
            assert!(c.zswpwb > 0, "{unit:?}: no writeback to the file: {c:?}");
            assert!(
                c.peak_used_bytes <= 48 * MIB,
                "{unit:?}: over budget: {c:?}"
            );
            assert!(c.pswpout > 0 && c.pswpin > 0, "{unit:?}: {c:?}");
            assert_eq!(c.swap_csum_fail + c.poisoned, 0, "{unit:?}: {c:?}");
            drop(r);
            t.finish_pool(p, &format!("{unit:?}"));
        }
    });
}

#[test]
fn encrypted_swap_round_trips_under_concurrency() {
    with_deadline(300, |t| {
        for unit in [UnitPolicy::Small, UnitPolicy::Huge] {
            t.phase(format!("{unit:?}"));
            let p = t.pool(
                Pool::builder()
                    .budget(16 * MIB)
                    .fault_threads(2)
                    .encrypt(true),
            );
            let r = p.region_with(64 * MIB, opts(unit)).unwrap();
            // Four threads, each on its own quarter, two passes each: every pass swaps
            // in what the other threads' writes pushed out.
            let quarter = r.as_words().len() / 4;
            std::thread::scope(|s| {
                for (k, words) in r.as_words().chunks(quarter).enumerate() {
                    s.spawn(move || {
                        for pass in 0..2u64 {
                            let seed = 100 + 10 * k as u64 + pass;
                            fill(words, seed);
                            check(words, seed, &format!("{unit:?}, thread {k}, pass {pass}"));
                        }
                    });
                }
            });
            let c = p.counters();
            assert!(
                c.pswpout > 0 && c.pswpin > 0,
                "{unit:?}: no swap I/O: {c:?}"
            );
            assert_eq!(
                c.swap_csum_fail + c.poisoned + c.io_errors,
                0,
                "{unit:?}: {c:?}"
            );
            drop(r);
            t.finish_pool(p, &format!("{unit:?}"));
        }
    });
}

/// The ciphertext of every page of `r` whose only copy is on the swap device (read
/// from `backing`, the device's bytes): page number and bytes.
fn ciphertexts(r: &uswap::Region, backing: &std::fs::File) -> Vec<(usize, Vec<u8>)> {
    (0..r.len() / PAGE)
        .filter_map(|page| {
            let at = r.swap_offset(page * PAGE)?;
            let mut buf = vec![0u8; PAGE];
            backing.read_exact_at(&mut buf, at).unwrap();
            Some((page, buf))
        })
        .collect()
}

/// Every page holds the same bytes, and is written to the swap device twice: no two
/// writes, of any slot or of the same slot, may give the same ciphertext (one would
/// if a nonce were used twice with the key), and all of it reads back.
#[test]
fn no_two_encrypted_writes_give_the_same_ciphertext() {
    with_deadline(240, |t| {
        let fm = swap_device(96);
        let p = t.pool(
            Pool::builder()
                .budget(16 * MIB)
                .swap_file(loop_path(&fm))
                // A page keeps its slot when written again: the same slot is rewritten.
                .stale_slot_policy(uswap::StaleSlotPolicy::KeepUntilReclaim)
                .encrypt(true),
        );
        let r = p.region_with(48 * MIB, opts(UnitPolicy::Small)).unwrap();
        let backing = std::fs::File::open(fm.backing()).unwrap();
        let same = |words: &[AtomicU64]| {
            for (i, w) in words.iter().enumerate() {
                w.store(word(7, i % WORDS_PER_PAGE), Relaxed);
            }
        };
        let mut seen: std::collections::HashMap<Vec<u8>, (u32, usize)> =
            std::collections::HashMap::new();
        let mut rewritten_in_place = 0;
        // Where each page was last seen on the device.
        let mut last_at: std::collections::HashMap<usize, Option<u64>> =
            std::collections::HashMap::new();
        // Two rounds at least; more (up to 6) until some page was written to the same
        // slot twice, which depends on reclaim's timing.
        for round in 0..6u32 {
            if round >= 2 && rewritten_in_place > 0 {
                break;
            }
            t.phase(format!("round {round}"));
            same(r.as_words());
            let found = ciphertexts(&r, &backing);
            assert!(
                found.len() > 4096,
                "round {round}: only {} pages on the device",
                found.len()
            );
            for (page, bytes) in found {
                let at = r.swap_offset(page * PAGE);
                if last_at.insert(page, at) == Some(at) {
                    rewritten_in_place += 1;
                }
                if let Some((r0, p0)) = seen.insert(bytes, (round, page)) {
                    panic!(
                        "page {page} (round {round}) has the same ciphertext as page {p0} \
                         (round {r0}): a nonce was used twice"
                    );
                }
            }
        }
        common::say(&format!(
            "{} page writes, all ciphertexts distinct; {rewritten_in_place} pages rewritten \
             at the same slot",
            seen.len()
        ));
        // Whether a slot was rewritten depends on reclaim's timing (a dirty page's kept
        // slot is usually given up for a new one); the nonce is a pool-wide generation,
        // so distinct ciphertexts of identical pages across slots prove its uniqueness
        // too. Said loudly when this run saw no slot rewritten.
        if rewritten_in_place == 0 {
            common::say(
                "NOTE: no page was written twice to the same slot in this run: only \
                 distinctness across slots was checked",
            );
        }
        for (i, w) in r.as_words().iter().enumerate() {
            assert_eq!(w.load(Relaxed), word(7, i % WORDS_PER_PAGE), "word {i}");
        }
        assert_eq!(p.counters().swap_csum_fail + p.counters().poisoned, 0);
        drop(r);
        t.finish_pool(p, "nonces");
        fm.close().unwrap();
    });
}

/// Encrypted writes take no memory beyond their frames (they are encrypted in place):
/// the budget holds at every instant (it did not with bounce pages: a 16 MiB budget
/// peaked at 20-23 MB), also with the compressed tier's writeback in the mix.
#[test]
fn encrypted_writes_stay_within_the_budget() {
    with_deadline(120, |t| {
        for unit in [UnitPolicy::Small, UnitPolicy::Huge] {
            for compressed in [false, true] {
                let what = format!("{unit:?}, compressed {compressed}");
                t.phase(what.clone());
                let mut b = Pool::builder().budget(32 * MIB).encrypt(true);
                if compressed {
                    b = b.tier(TierKind::CompressedFile).compressed_max_percent(25);
                }
                let p = t.pool(b);
                let r = p.region_with(128 * MIB, opts(unit)).unwrap();
                for seed in [9, 10] {
                    fill(r.as_words(), seed);
                    check(r.as_words(), seed, &what);
                }
                let c = p.counters();
                assert!(c.pswpout > 0 && c.pswpin > 0, "{what}: {c:?}");
                assert!(c.peak_used_bytes <= 32 * MIB, "{what}: over budget: {c:?}");
                assert_eq!(c.swap_csum_fail + c.poisoned, 0, "{what}: {c:?}");
                drop(r);
                t.finish_pool(p, &what);
            }
        }
    });
}

/// A loop device over a FUSE mount's `disk` of `mib` MiB, for the swap.
fn swap_device(mib: u64) -> FaultMount {
    FaultMount::with_loop(mib * MIB)
}

fn loop_path(fm: &FaultMount) -> &Path {
    fm.loop_device().expect("loop device")
}

/// How often `needle` occurs in the file at `path`.
fn occurrences(path: &Path, needle: &[u8]) -> usize {
    let data = std::fs::read(path).unwrap();
    data.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn the_swap_device_holds_no_plaintext_with_encryption() {
    const MARKER: &[u8] = b"uswap-plaintext-marker-0123456789";
    with_deadline(240, |t| {
        for encrypt in [false, true] {
            t.phase(format!("encrypt {encrypt}"));
            let fm = swap_device(96);
            let p = t.pool(
                Pool::builder()
                    .budget(16 * MIB)
                    .swap_file(loop_path(&fm))
                    .encrypt(encrypt),
            );
            let mut r = p.region(64 * MIB).unwrap();
            // The marker at the start of every page, a page number after it.
            for (k, page) in r.as_mut_slice().chunks_mut(PAGE).enumerate() {
                page[..MARKER.len()].copy_from_slice(MARKER);
                page[MARKER.len()..MARKER.len() + 8].copy_from_slice(&(k as u64).to_le_bytes());
            }
            let written = p.counters().pswpout;
            assert!(written > 4096, "too little swapped out: {:?}", p.counters());
            let found = occurrences(fm.backing(), MARKER);
            if encrypt {
                assert_eq!(
                    found, 0,
                    "plaintext in the swap device of an encrypted pool"
                );
            } else {
                // The scan can fail: every page written carries the marker in clear.
                assert!(
                    found as u64 >= written / 2,
                    "the scan found {found} markers in {written} pages written"
                );
            }
            // And it all reads back.
            for (k, page) in r.as_slice().chunks(PAGE).enumerate() {
                assert_eq!(&page[..MARKER.len()], MARKER, "page {k}");
                assert_eq!(
                    page[MARKER.len()..MARKER.len() + 8],
                    (k as u64).to_le_bytes()
                );
            }
            drop(r);
            t.finish_pool(p, &format!("encrypt {encrypt}"));
            fm.close().unwrap();
        }
    });
}

/// Read page `page` of `r` as a system call does (the kernel copies it into a
/// memfd): Some(bytes), or None when the page's bytes were lost (poisoned: the
/// kernel's copy fails with EFAULT where the program would get SIGBUS).
fn read_page(r: &uswap::Region, memfd: &OwnedFd, page: usize) -> Option<Vec<u8>> {
    let src = r.as_ptr() as usize + page * PAGE;
    // SAFETY: the kernel reads 4 KiB of the region's live mapping (a fault on it is
    // served by the pool's fault thread, or fails with EFAULT when poisoned).
    let n = unsafe { libc::pwrite(memfd.as_raw_fd(), src as *const libc::c_void, PAGE, 0) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EFAULT),
            "reading page {page}: {err}"
        );
        return None;
    }
    assert_eq!(n as usize, PAGE, "short copy of page {page}");
    let mut buf = vec![0u8; PAGE];
    // SAFETY: reads 4 KiB into a live buffer of that length.
    let n = unsafe { libc::pread(memfd.as_raw_fd(), buf.as_mut_ptr().cast(), PAGE, 0) };
    assert_eq!(n as usize, PAGE);
    Some(buf)
}

fn expected_page(seed: u64, page: usize) -> Vec<u8> {
    (0..WORDS_PER_PAGE)
        .flat_map(|w| word(seed, page * WORDS_PER_PAGE + w).to_ne_bytes())
        .collect()
}

fn memfd() -> OwnedFd {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is fresh and ours.
    let fd = unsafe { libc::memfd_create(c"uswap-integrity".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Corruptions injected by [`corruptions_are_all_caught`].
const CORRUPTIONS: usize = 10_000;

/// A region four times the budget is written; then, `corruptions` times, one random
/// byte of a random page whose only copy is in the swap device is flipped there
/// (XOR with a random non-zero value) while the program runs, and the page is read.
/// Every corruption must be caught (the read fails: the page is poisoned), and every
/// page not corrupted must read back exact: never a wrong byte.
fn corruptions_are_all_caught(t: &Test, encrypt: bool, unit: UnitPolicy, corruptions: usize) {
    let seed = std::env::var("USWAP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0017u64);
    t.seed(seed);
    t.phase(format!("encrypt {encrypt}: writing"));
    let fm = swap_device(160);
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(fm.backing())
        .unwrap();
    let p = t.pool(
        Pool::builder()
            .budget(16 * MIB)
            .swap_file(loop_path(&fm))
            // One read per fault: each corruption is met by exactly the read of its page.
            .readahead(ReadaheadPolicy::Off)
            .encrypt(encrypt),
    );
    let r = p.region_with(96 * MIB, opts(unit)).unwrap();
    fill(r.as_words(), seed);
    let pages = r.len() / PAGE;
    let memfd = memfd();
    let mut corrupted = vec![false; pages];
    let mut rng = seed;
    let mut next = || {
        rng = mix(rng);
        rng
    };
    let (mut injected, mut caught) = (0usize, 0usize);
    t.phase(format!("encrypt {encrypt}: corrupting"));
    let mut misses = 0u64;
    while injected < corruptions {
        let page = (next() % pages as u64) as usize;
        if corrupted[page] {
            continue;
        }
        let Some(at) = r.swap_offset(page * PAGE) else {
            // Resident or cached: its bytes are not only on the device.
            misses += 1;
            assert!(
                misses < 100 * corruptions as u64,
                "too few pages swapped out"
            );
            continue;
        };
        let byte = at + next() % PAGE as u64;
        let xor = (next() % 255 + 1) as u8;
        let mut b = [0u8; 1];
        backing.read_exact_at(&mut b, byte).unwrap();
        backing.write_all_at(&[b[0] ^ xor], byte).unwrap();
        corrupted[page] = true;
        injected += 1;
        match read_page(&r, &memfd, page) {
            None => caught += 1,
            Some(got) => {
                let want = expected_page(seed, page);
                assert_ne!(
                    got, want,
                    "corruption {injected} (page {page}, device byte {byte}, xor {xor:#x}) \
                     was not read: the page came back from elsewhere"
                );
                panic!(
                    "corruption {injected} (page {page}, device byte {byte}, xor {xor:#x}) \
                     was NOT caught: the program got wrong bytes"
                );
            }
        }
    }
    let c = p.counters();
    common::say(&format!(
        "encrypt {encrypt}: {injected} corruptions injected, {caught} caught; {c:?}"
    ));
    assert_eq!(caught, injected);
    assert_eq!(c.poisoned, injected as u64, "{c:?}");
    assert!(c.swap_csum_fail >= injected as u64, "{c:?}");
    // Every page not corrupted is exact.
    t.phase(format!("encrypt {encrypt}: checking the rest"));
    for page in (0..pages).filter(|&p| !corrupted[p]) {
        let got = read_page(&r, &memfd, page)
            .unwrap_or_else(|| panic!("page {page} was lost, but not corrupted"));
        assert!(got == expected_page(seed, page), "page {page}: wrong bytes");
    }
    assert_eq!(p.counters().poisoned, injected as u64);
    drop(r);
    t.finish_pool(p, &format!("encrypt {encrypt}"));
    fm.close().unwrap();
}

#[test]
fn ten_thousand_corruptions_are_all_caught_by_checksums() {
    with_deadline(600, |t| {
        corruptions_are_all_caught(t, false, UnitPolicy::Small, CORRUPTIONS)
    });
}

#[test]
fn ten_thousand_corruptions_are_all_caught_by_encryption() {
    with_deadline(600, |t| {
        corruptions_are_all_caught(t, true, UnitPolicy::Small, CORRUPTIONS)
    });
}

/// With whole 2 MiB units, a corrupted page is read with its unit: that page alone is
/// lost (poisoned), the rest of its unit maps exact.
#[test]
fn corruptions_in_whole_units_are_caught_by_encryption_page_by_page() {
    with_deadline(600, |t| {
        corruptions_are_all_caught(t, true, UnitPolicy::Huge, 1000)
    });
}
