//! 2 MiB units (issue 3): byte-exact through whole-unit swap-out and swap-in, mixed
//! with 4 KiB regions in one pool; fallbacks under fragmentation; real THPs after
//! swap-in.

mod common;

use common::{mix, with_deadline, Test, TestPool};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, RegionOptions, StaleSlotPolicy, UnitPolicy};

const MIB: u64 = 1 << 20;
/// Seconds any test here may take before the watchdog fails it.
const DEADLINE: u64 = 180;

fn fill(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(mix(seed ^ i as u64), Relaxed);
    }
}

fn check(words: &[AtomicU64], seed: u64, what: &str) {
    for (i, w) in words.iter().enumerate() {
        assert_eq!(
            w.load(Relaxed),
            mix(seed ^ i as u64),
            "{what}: word {i} differs"
        );
    }
}

fn opts(unit: UnitPolicy) -> RegionOptions {
    RegionOptions {
        unit: Some(unit),
        ..Default::default()
    }
}

#[test]
fn huge_and_small_regions_in_one_pool_are_exact() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(24 * MIB));
        let huge = p.region_with(48 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let small = p.region_with(32 * MIB, opts(UnitPolicy::Small)).unwrap();
        let auto = p.region_with(32 * MIB, opts(UnitPolicy::Auto)).unwrap();
        for round in 0..2u64 {
            fill(huge.as_words(), 10 + round);
            fill(small.as_words(), 20 + round);
            fill(auto.as_words(), 30 + round);
            check(huge.as_words(), 10 + round, "huge");
            check(small.as_words(), 20 + round, "small");
            check(auto.as_words(), 30 + round, "auto");
        }
        // Read-only pass over swapped units (clean swap-in), then a write into each unit
        // (whole-unit write-protect lift), then check again.
        check(huge.as_words(), 11, "huge re-read");
        for w in huge.as_words().iter().step_by(4096) {
            w.fetch_add(1, Relaxed);
        }
        for (i, w) in huge.as_words().iter().enumerate() {
            let want = mix(11 ^ i as u64).wrapping_add(if i % 4096 == 0 { 1 } else { 0 });
            assert_eq!(w.load(Relaxed), want, "huge after partial writes: word {i}");
        }
        let c = huge.counters();
        assert!(c.thp_swpout > 0 && c.thp_swpin > 0, "{c:?}");
        assert_eq!(small.counters().thp_swpout, 0);
    });
}

/// A pool whose swap file is fragmented. The swap file holds exactly the two regions.
/// The 4 KiB region fills 40 of its 48 clusters, the 2 MiB region the other 8; then
/// every other 4 KiB page is discarded: plenty of free slots, but in no cluster wholly
/// free. Stale copies are kept until reclaim, so a rewritten unit cannot get its own
/// cluster back either: the 2 MiB region, rewritten with seed 6, swaps out through
/// 4 KiB fallback slots (and reads back in several parts).
fn fragmented(t: &Test) -> (TestPool, uswap::Region, uswap::Region) {
    let p = t.pool(
        Pool::builder()
            .budget(16 * MIB)
            .swap_size(96 * MIB)
            .stale_slot_policy(StaleSlotPolicy::KeepUntilReclaim),
    );
    let small = p.region_with(80 * MIB, opts(UnitPolicy::Small)).unwrap();
    let huge = p.region_with(16 * MIB, opts(UnitPolicy::Huge)).unwrap();
    fill(small.as_words(), 4);
    fill(huge.as_words(), 5);
    fill(&small.as_words()[..2 * 512], 4); // push the last of the 2 MiB units out
    for page in (0..small.len() / 4096).step_by(2) {
        small.discard(page * 4096, 4096).unwrap();
    }
    fill(huge.as_words(), 6);
    (p, small, huge)
}

#[test]
fn fragmented_swap_falls_back_and_stays_exact() {
    with_deadline(DEADLINE, |t| {
        let (_p, small, huge) = fragmented(t);
        fill(&small.as_words()[..2 * 512], 4);
        check(huge.as_words(), 6, "huge under fragmentation");
        let c = huge.counters();
        assert!(
            c.thp_swpout_fallback > 0,
            "no fallback with a fragmented swap file: {c:?}"
        );
        for (i, w) in small.as_words().iter().enumerate() {
            let page = i / 512;
            // Pages 0 and 1 were written again after the discard.
            let want = if page % 2 == 0 && page >= 2 {
                0
            } else {
                mix(4 ^ i as u64)
            };
            assert_eq!(w.load(Relaxed), want, "small: word {i} (page {page})");
        }
    });
}

fn anon_huge_kb(addr: usize, len: usize) -> Option<u64> {
    // Find the smaps entry of the mapping that contains `addr`.
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_it = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    in_it = a <= addr && addr + len <= b;
                    continue;
                }
            }
        }
        if in_it {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches(" kB").trim().parse().ok();
            }
        }
    }
    None
}

#[test]
fn swapped_in_units_are_real_thps() {
    with_deadline(DEADLINE, |t| {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        // Fails rather than skips: whole-unit swap-in is what this checks.
        assert!(
            !thp.contains("[never]"),
            "transparent hugepages are off here ({}): uswap's 2 MiB units need them \
             (echo madvise > /sys/kernel/mm/transparent_hugepage/enabled)",
            thp.trim()
        );
        let p = t.pool(Pool::builder().budget(16 * MIB));
        let r = p.region_with(64 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        let unit_words = (2 * MIB / 8) as usize;
        // A THP is the kernel's to give: under memory pressure from the tests running
        // beside this one it may give 4 KiB pages once. Three rounds, one must show it.
        let mut seen = Vec::new();
        for round in 0..3u64 {
            fill(words, 7 + round);
            // The first units were swapped out by the later ones; touch two of them again.
            check(&words[..2 * unit_words], 7 + round, "first units");
            let kb = anon_huge_kb(r.as_ptr() as usize, r.len()).expect("region in smaps");
            if kb >= 2048 {
                assert!(r.counters().thp_swpin >= 2, "{:?}", r.counters());
                return;
            }
            seen.push(kb);
        }
        panic!(
            "no AnonHugePages after whole-unit swap-in in 3 rounds: {seen:?} kB; {:?}",
            r.counters()
        );
    });
}

/// Unit readahead: a stream through units swapped out whole reads the next units
/// ahead. Forward and backward streams stay byte-exact and hit; a random access in
/// between does not disturb them; with 0 units ahead nothing is read ahead.
#[test]
fn unit_readahead_streams_are_exact_and_hit() {
    with_deadline(DEADLINE, |t| {
        for ahead in [2u32, 0] {
            let p = t.pool(Pool::builder().budget(48 * MIB).readahead_units(ahead));
            let r = p.region_with(128 * MIB, opts(UnitPolicy::Huge)).unwrap();
            let words = r.as_words();
            fill(words, 40);
            check(words, 40, "forward");
            // Backward, unit by unit (each unit read in order).
            let per_unit = (2 * MIB / 8) as usize;
            for u in (0..words.len() / per_unit).rev() {
                let base = u * per_unit;
                for (k, w) in words[base..base + per_unit].iter().enumerate() {
                    let i = base + k;
                    assert_eq!(w.load(Relaxed), mix(40 ^ i as u64), "backward: word {i}");
                }
            }
            let c = r.counters();
            assert!(c.thp_swpin > 0, "{c:?}");
            if ahead == 0 {
                assert_eq!(c.swap_ra, 0, "{c:?}");
            } else {
                assert!(c.swap_ra > 0 && c.swap_ra_hit > 0, "{c:?}");
                assert!(c.swap_ra_hit <= c.swap_ra, "{c:?}");
            }
        }
    });
}

/// A sequential read stream reads every unit once: units read ahead must not be
/// dropped for room before the stream gets to them (a regression once made every
/// unit be read three times, 3% readahead hits).
#[test]
fn sequential_read_reads_each_unit_once() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(64 * MIB).readahead_units(2));
        let r = p.region_with(256 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        fill(words, 60);
        let units = 256 * MIB / (2 * MIB);
        for pass in 0..2 {
            let before = r.counters();
            check(words, 60, "sequential read");
            let c = r.counters();
            let reads = c.read_requests - before.read_requests;
            let ra = c.swap_ra - before.swap_ra;
            let hit = c.swap_ra_hit - before.swap_ra_hit;
            // Up to the budget's worth may still be in RAM; everything else is read,
            // once: allow an eighth more for a stream's start and the odd retry.
            assert!(
                reads <= units + units / 8,
                "pass {pass}: {reads} reads for {units} units; {c:?}"
            );
            assert!(
                ra > 0 && hit * 10 >= ra * 8,
                "pass {pass}: readahead hits {hit} of {ra}; {c:?}"
            );
        }
    });
}

/// A stream that checks and rewrites each unit in turn (swap-w-seq's second pass) uses
/// (nearly) every unit read ahead for it: reclaim drops the clean copies of units just written
/// back before the units read ahead of the stream. (It used to drop them oldest first,
/// and units read ahead arrived in the list before the copies of units whose writes
/// completed later: 32 of the 255 units read ahead in this test's first pass were read
/// twice; in swap-w-seq 1 GiB / 256 MiB, 44 of 1,035 on the file tier and 133 of 1,061
/// on the remote tier.)
#[test]
fn a_rewrite_stream_reads_each_unit_once() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(64 * MIB).readahead_units(2));
        let r = p.region_with(512 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        let units = 512 * MIB / (2 * MIB);
        fill(words, 80);
        for pass in 0..3u64 {
            let before = r.counters();
            let per_unit = (2 * MIB / 8) as usize;
            for u in 0..words.len() / per_unit {
                let unit = &words[u * per_unit..(u + 1) * per_unit];
                for (k, w) in unit.iter().enumerate() {
                    let i = (u * per_unit + k) as u64;
                    assert_eq!(
                        w.load(Relaxed),
                        mix((80 + pass) ^ i),
                        "pass {pass}: word {i}"
                    );
                    w.store(mix((81 + pass) ^ i), Relaxed);
                }
            }
            let c = r.counters();
            let reads = c.read_requests - before.read_requests;
            let wasted = (c.swap_ra - before.swap_ra) - (c.swap_ra_hit - before.swap_ra_hit);
            // Two units may be read ahead for nothing, and read again when the stream
            // reaches them: with the reclaim thread woken from what faults promise
            // (2026-11-25) it takes a read-ahead unit now and then while the stream
            // is over the high watermark (1 of 256 in 2 of ~20 runs under a loaded
            // CI). The misordering this test guards against read 32 of 255 twice.
            assert!(
                reads <= units + 2 && wasted <= 2 * 512,
                "pass {pass}: {reads} reads for {units} units, {wasted} pages read ahead \
                 for nothing; {c:?}"
            );
        }
        check(words, 83, "after three rewrite passes");
    });
}

/// Many rewrite streams at once in a small budget: reclaim passes over units read ahead
/// of a stream only up to a sixteenth of the budget, and must still find room without
/// going over the budget or stalling; every byte exact. (Sparing every unit read ahead,
/// reclaim found nothing to drop and waited up to 10 s per pass: `uswap run` of 8
/// threads in 64 MiB, `threads_small_blocks_go_to_uswap_arenas` in uswap-cli's
/// tests/run.rs, ran past its 240 s deadline. This test passes on that code too: it
/// checks the bytes and the budget under many streams, not that stall.)
#[test]
fn concurrent_rewrite_streams_stay_in_budget() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(64 * MIB).readahead_units(2));
        let regions: Vec<uswap::Region> = (0..8)
            .map(|_| p.region_with(32 * MIB, opts(UnitPolicy::Huge)).unwrap())
            .collect();
        for (k, r) in regions.iter().enumerate() {
            fill(r.as_words(), 90 + k as u64 * 10);
        }
        std::thread::scope(|s| {
            for (k, r) in regions.iter().enumerate() {
                s.spawn(move || {
                    let words = r.as_words();
                    let seed = 90 + k as u64 * 10;
                    for pass in 0..3u64 {
                        for (i, w) in words.iter().enumerate() {
                            let i = i as u64;
                            assert_eq!(
                                w.load(Relaxed),
                                mix((seed + pass) ^ i),
                                "region {k}, pass {pass}: word {i}"
                            );
                            w.store(mix((seed + pass + 1) ^ i), Relaxed);
                        }
                    }
                });
            }
        });
        for (k, r) in regions.iter().enumerate() {
            check(r.as_words(), 93 + k as u64 * 10, "after the streams");
        }
        let c = p.counters();
        assert!(c.swap_ra > 0 && c.thp_swpin > 0, "{c:?}");
        assert!(c.peak_used_bytes <= 64 * MIB, "budget overrun: {c:?}");
    });
}

/// A sequential write stream takes one fault per unit: reclaim never evicts the
/// unit being written. (Each direct reclaim once evicted the whole resident set
/// while writes were in flight, the unit just mapped included; the writer then
/// faulted on it page by page, 512 faults waiting on its write.)
#[test]
fn sequential_writes_fault_once_per_unit() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(256 * MIB));
        let r = p.region_with(1024 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        let units = 1024 * MIB / (2 * MIB);
        for pass in 0..3 {
            fill(words, 70 + pass);
        }
        let c = r.counters();
        let faults = c.minflt + c.majflt;
        assert!(
            faults <= 3 * (units + units / 16) && c.thp_swpin_fallback == 0,
            "{faults} faults for {units} units written three times; {c:?}"
        );
        check(words, 72, "after three write passes");
    });
}

/// First touches of 2 MiB units take THPs the reclaim thread zeroed ahead: every
/// byte of a new unit reads zero, and the units are mapped as real THPs.
#[test]
fn first_touch_takes_zeroed_spares() {
    with_deadline(DEADLINE, |t| {
        let p = t.pool(Pool::builder().budget(256 * MIB));
        let r = p.region_with(64 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        let per_unit = (2 * MIB / 8) as usize;
        for (u, unit) in words.chunks(per_unit).enumerate() {
            // A first write maps the unit whole; everything else in it must be zero.
            unit[0].store(u as u64 + 1, Relaxed);
            let nonzero = unit[1..].iter().position(|w| w.load(Relaxed) != 0);
            assert_eq!(nonzero, None, "unit {u}: not zero after first touch");
            for (i, w) in unit.iter().enumerate() {
                w.store(mix((u * per_unit + i) as u64), Relaxed);
            }
            // The reclaim thread makes spares between faults.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let c = r.counters();
        assert!(c.thp_fault_spare > 0, "no first touch took a spare: {c:?}");
        for (j, w) in words.iter().enumerate() {
            assert_eq!(w.load(Relaxed), mix(j as u64), "word {j}");
        }
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[never]") {
            // Half at least: the kernel may give 4 KiB pages under the other tests' pressure.
            let kb = anon_huge_kb(r.as_ptr() as usize, r.len()).expect("region in smaps");
            assert!(
                kb >= 32 * 1024,
                "AnonHugePages {kb} kB for 64 MiB of units; {c:?}"
            );
        }
        assert!(
            p.counters().peak_used_bytes <= 256 * MIB,
            "{:?}",
            p.counters()
        );
    });
}

/// Reads ahead that fail are retried or dropped, never mapped wrong: injected read
/// errors and short reads (on first tries) under unit readahead keep every byte exact. Also with page
/// checksums off, so that the request's own result alone must keep a failed read's
/// frames (scribbled over by the injection, as a real failure leaves them undefined;
/// some recycled from evicted units) from being mapped.
#[test]
fn unit_readahead_under_read_errors_is_exact() {
    for checksums in [true, false] {
        with_deadline(DEADLINE, |t| {
            t.phase(format!("checksums {checksums}"));
            let p = t.pool(
                Pool::builder()
                    .budget(48 * MIB)
                    .checksums(checksums)
                    .inject_io_errors(uswap::FaultInjection {
                        fail_read_every: 3,
                        short_read_every: 5,
                        // First tries only: a read failing three times would lose
                        // its pages (SIGBUS, `packed.rs` tests that).
                        transient: true,
                        ..Default::default()
                    }),
            );
            let r = p.region_with(128 * MIB, opts(UnitPolicy::Huge)).unwrap();
            fill(r.as_words(), 50);
            check(r.as_words(), 50, "first read");
            fill(r.as_words(), 51);
            check(r.as_words(), 51, "second read");
            let c = p.counters();
            assert!(c.io_errors > 0 && c.swap_ra > 0, "{c:?}");
            // (Whether some reads landed in recycled 2 MiB frames depends on timing
            // here: at 48 MiB, with units read ahead, the stash grows only when a
            // frame's charge fits under the high watermark, and in some runs, of this
            // code and of the code before it, none did. A mapped frame the read did
            // not fill holds the injection's scribble either way.)
        });
    }
}

/// Several threads fault on units whose whole-unit read is in flight in several
/// parts (written through 4 KiB fallback slots): the first parts land as clean
/// entries before the last; every fault must still be served (once, whole) and see
/// exact data. Guarded by a deadline: a lost fault hangs its thread.
#[test]
fn concurrent_faults_on_a_unit_read_in_parts() {
    with_deadline(DEADLINE, |t| {
        let (_p, small, huge) = fragmented(t); // its units read back in parts
        for _ in 0..3 {
            fill(&small.as_words()[..8 * MIB as usize / 8], 4); // push the units out
            let words = huge.as_words();
            std::thread::scope(|s| {
                for t in 0..4usize {
                    s.spawn(move || {
                        // Each thread walks the units from a different start page, so
                        // faults land in the middle of units already being read.
                        let n = words.len();
                        for k in 0..n {
                            let i = (k + t * 97 * 512) % n;
                            assert_eq!(words[i].load(Relaxed), mix(6 ^ i as u64), "word {i}");
                        }
                    });
                }
            });
        }
        let c = huge.counters();
        assert!(c.thp_swpout_fallback > 0 && c.thp_swpin > 0, "{c:?}");
    });
}

/// Pages of `[addr, addr + len)` present in memory (mincore).
fn present_pages(addr: usize, len: usize) -> usize {
    let mut v = vec![0u8; len / 4096];
    // SAFETY: mincore over a live mapping the test owns, into a vector of one byte per
    // page.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// A first touch whose 2 MiB move stops part-way (injected: every other move, from a
/// spare or a frame, moves only the unit's first half) keeps the pages it moved as the
/// unit's, resident and charged, and maps the rest as zeros: every unit comes back
/// exact through eviction, the region never holds more pages than the budget, and a
/// discarded unit reads zeros. (Counted as untouched, the moved pages were never
/// charged nor evicted, and kept their bytes across a discard.)
#[test]
fn first_touch_moves_that_stop_part_way_are_counted() {
    with_deadline(60, |t| {
        let budget = 64 * MIB;
        let p = t.pool(
            Pool::builder()
                .budget(budget)
                .inject_io_errors(uswap::FaultInjection {
                    partial_move_every: 2,
                    ..Default::default()
                }),
        );
        let r = p.region_with(160 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let words = r.as_words();
        let per_unit = (2 * MIB / 8) as usize;
        let units = words.len() / per_unit;
        let budget_pages = (budget / 4096) as usize;
        let mut most = 0;
        for (u, unit) in words.chunks(per_unit).enumerate() {
            for (i, w) in unit.iter().enumerate() {
                w.store(mix(1 ^ (u * per_unit + i) as u64), Relaxed);
            }
            most = most.max(present_pages(r.as_ptr() as usize, r.len()));
            // The reclaim thread makes spares between faults.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            most <= budget_pages,
            "{most} pages of the region present, over the budget's {budget_pages}: {:?}",
            p.counters()
        );
        check(words, 1, "after the first touches");
        // Every third unit discarded, while resident (its last page just read) or not.
        for u in (0..units).step_by(3) {
            let _ = words[u * per_unit + per_unit - 1].load(Relaxed);
            r.discard(u * 2 * MIB as usize, 2 * MIB as usize).unwrap();
        }
        for (i, w) in words.iter().enumerate() {
            let want = if (i / per_unit).is_multiple_of(3) {
                0
            } else {
                mix(1 ^ i as u64)
            };
            assert_eq!(w.load(Relaxed), want, "after the discards: word {i}");
        }
        let c = p.counters();
        assert!(c.thp_fault_spare > 0, "no first touch took a spare: {c:?}");
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
        assert!(c.peak_used_bytes <= budget, "budget overrun: {c:?}");
    });
}
