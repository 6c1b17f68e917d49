//! Units the compressed tier writes back packed (compressed, `tier/packed.rs`): every
//! byte back through packing and reading back, in order and at random; fewer blocks
//! written than pages written back; every slot given back; injected write and read
//! errors never give wrong bytes.

mod common;

use common::{check_compressible as check, compressible_word as word};
use common::{fill_compressible as fill, mix, with_deadline, WORDS_PER_PAGE};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{FaultInjection, Pool, RegionOptions, StaleSlotPolicy, TierKind, UnitPolicy};

const MIB: u64 = 1 << 20;

/// Every page, in `order` (page indices).
fn check_pages(words: &[AtomicU64], seed: u64, order: impl Iterator<Item = usize>) {
    for p in order {
        let first = p * WORDS_PER_PAGE;
        for (k, w) in words[first..first + WORDS_PER_PAGE].iter().enumerate() {
            let i = first + k;
            assert_eq!(w.load(Relaxed), word(seed, i), "word {i} (page {p})");
        }
    }
}

/// The pages of `words` in a shuffled order (random faults: the 4 KiB path of `Auto`).
fn shuffled(words: &[AtomicU64], seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..words.len() / WORDS_PER_PAGE).collect();
    for i in (1..v.len()).rev() {
        let j = (mix(seed ^ i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// A compressed pool a quarter of `budget` in front of a swap file.
fn packing_builder(budget: u64) -> uswap::PoolBuilder {
    Pool::builder()
        .budget(budget)
        .tier(TierKind::CompressedFile)
        .compressed_max_percent(25)
}

fn packing_pool(t: &common::Test, budget: u64, inject: FaultInjection) -> common::TestPool {
    t.pool(packing_builder(budget).inject_io_errors(inject))
}

/// The end of a test: nothing lost, no engine error, the budget held; every slot goes
/// with the region (blobs included).
fn finish(t: &common::Test, p: &common::TestPool, r: uswap::Region, budget: u64) {
    let c = p.counters();
    assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
    assert!(c.peak_used_bytes <= budget, "{c:?}");
    drop(r);
    t.check_pools();
}

fn opts(unit: UnitPolicy) -> RegionOptions {
    RegionOptions {
        unit: Some(unit),
        ..Default::default()
    }
}

#[test]
fn packed_units_come_back_exact_in_fewer_blocks() {
    // (`Auto` regions are written back page by page: their random faults take pages.)
    for unit in [UnitPolicy::Huge, UnitPolicy::Auto] {
        with_deadline(180, |t| {
            t.phase(format!("{unit:?}"));
            let p = packing_pool(t, 48 * MIB, FaultInjection::default());
            let r = p.region_with(160 * MIB, opts(unit)).unwrap();
            let w = r.as_words();
            fill(w, 1);
            check(w, 1);
            fill(w, 2);
            // A quarter of the pages at random, then all in order.
            let pages = shuffled(w, 2);
            check_pages(w, 2, pages[..pages.len() / 4].iter().copied());
            check(w, 2);
            let c = p.counters();
            assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
            assert!(c.zswpwb > 0, "a pool at its share writes back: {c:?}");
            // Packed, a unit takes fewer blocks than its 512 pages (this data packs
            // ~3:1); pages written back decompressed take one block each, as do units
            // refused by a full pool, written whole.
            let packed = unit == UnitPolicy::Huge;
            let whole = 512 * (c.thp_swpout + c.thp_swpout_fallback);
            assert!(
                (c.pswpout.saturating_sub(whole) * 2 < c.zswpwb) == packed,
                "{} blocks written for {} pages written back: {c:?}",
                c.pswpout,
                c.zswpwb
            );
            assert_eq!(c.zswpwb_packed_units > 0, packed, "{c:?}");
            assert!(c.pswpin > 0, "units read back: {c:?}");
            assert!(c.peak_used_bytes <= 48 * MIB, "{c:?}");
            // Units read back into frames that evicted units gave back (stale bytes,
            // overwritten whole), every byte checked above.
            if packed {
                common::assert_frames_recycled(&c);
            }
            // Every slot goes with the region (the blobs' holds included).
            drop(r);
            t.check_pools();
        });
    }
}

/// A packed unit read back by reads is mapped clean, its blob kept as its copy, and
/// leaves again without a write; a write to it (a whole pass, or one word in some
/// pages) makes it dirty, and the new bytes come back exact, under either stale-slot
/// policy.
#[test]
fn packed_units_read_back_leave_again_unwritten() {
    for stale in [
        StaleSlotPolicy::FreeOnWrite,
        StaleSlotPolicy::KeepUntilReclaim,
    ] {
        with_deadline(180, |t| {
            t.phase(format!("{stale:?}"));
            let p = t.pool(packing_builder(48 * MIB).stale_slot_policy(stale));
            let r = p.region_with(160 * MIB, opts(UnitPolicy::Huge)).unwrap();
            let w = r.as_words();
            let pages = w.len() / WORDS_PER_PAGE;
            fill(w, 1);
            check(w, 1); // packed units come back mapped clean
            let c1 = p.counters();
            check(w, 1); // and leave again unwritten
            let c2 = p.counters();
            assert!(c2.clean_evicted > c1.clean_evicted, "{c1:?} {c2:?}");
            // Only units the pool held are written back again (its share is a quarter
            // of the budget): every unit was, each pass, when units read back from
            // blobs came back dirty.
            let rewritten = c2.zswpwb - c1.zswpwb;
            assert!(
                rewritten < pages as u64 / 2,
                "{rewritten} of {pages} pages written back again by a pass of reads"
            );
            // One word in every seventh page, each just after a read of its page (which
            // maps its unit clean, if packed): the write makes the unit dirty (a
            // write-protect fault), and must not be lost at the unit's eviction.
            let marked = |i: usize| (i / WORDS_PER_PAGE) % 7 == 3 && i % WORDS_PER_PAGE == 5;
            for p in (3..pages).step_by(7) {
                let i = p * WORDS_PER_PAGE + 5;
                assert_eq!(w[i - 1].load(Relaxed), word(1, i - 1), "word {}", i - 1);
                w[i].store(!word(1, i), Relaxed);
            }
            for round in 0..2 {
                for (i, v) in w.iter().enumerate() {
                    let want = if marked(i) { !word(1, i) } else { word(1, i) };
                    assert_eq!(v.load(Relaxed), want, "round {round}: word {i}");
                }
            }
            fill(w, 2);
            check(w, 2);
            // A page of each unit read (mapping it clean, if packed), then another page
            // of it discarded: the discarded pages read zeros, the rest their bytes,
            // across their evictions.
            let unit_words = 512 * WORDS_PER_PAGE;
            for u in 0..w.len() / unit_words {
                let _ = w[u * unit_words + 7 * WORDS_PER_PAGE].load(Relaxed);
                r.discard((u * 512 + 9) * 4096, 4096).unwrap();
            }
            let zeroed = |i: usize| (i / WORDS_PER_PAGE) % 512 == 9;
            for round in 0..2 {
                for (i, v) in w.iter().enumerate() {
                    let want = if zeroed(i) { 0 } else { word(2, i) };
                    assert_eq!(
                        v.load(Relaxed),
                        want,
                        "after discards, round {round}: word {i}"
                    );
                }
            }
            let c = p.counters();
            assert!(c.wpflt > 0, "{c:?}");
            finish(t, &p, r, 48 * MIB);
        });
    }
}

/// Threads reading and writing pages of the same units at once: a unit one thread's
/// read mapped clean from its blob is written by another (a write-protect fault); no
/// write is lost at the unit's eviction, no byte comes back wrong. (A write in the
/// instant between a unit's move and its protection is caught by the eviction's
/// checksum; this test seldom lands one there: with that check off it still passed.)
#[test]
fn packed_units_read_and_written_by_threads_at_once_stay_exact() {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 6;
    with_deadline(240, |t| {
        let p = packing_pool(t, 48 * MIB, FaultInjection::default());
        let r = p.region_with(160 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let w = r.as_words();
        let pages = w.len() / WORDS_PER_PAGE;
        // Thread k owns every page p with p % THREADS == k: each unit is shared by all.
        let mine = |k: usize| (k..pages).step_by(THREADS);
        let page_words = |p: usize| {
            let first = p * WORDS_PER_PAGE;
            (first..).zip(&w[first..first + WORDS_PER_PAGE])
        };
        let write_page = |p: usize, seed: u64| {
            for (i, v) in page_words(p) {
                v.store(word(seed, i), Relaxed);
            }
        };
        let check_page = |p: usize, seed: u64, what: &str| {
            for (i, v) in page_words(p) {
                assert_eq!(
                    v.load(Relaxed),
                    word(seed, i),
                    "{what}: word {i} (page {p})"
                );
            }
        };
        std::thread::scope(|s| {
            for k in 0..THREADS {
                s.spawn(move || {
                    let seed_of = |round: u64| 100 * round + k as u64;
                    mine(k).for_each(|p| write_page(p, seed_of(0)));
                    let mut last = 0;
                    for round in 1..ROUNDS {
                        // Half the threads write while the other half read, swapping
                        // each round; a reading thread's faults map units clean.
                        if (round + k as u64).is_multiple_of(2) {
                            mine(k).for_each(|p| write_page(p, seed_of(round)));
                            last = round;
                        } else {
                            let what = format!("thread {k}, round {round}");
                            mine(k).for_each(|p| check_page(p, seed_of(last), &what));
                        }
                    }
                    mine(k).for_each(|p| check_page(p, seed_of(last), "at the end"));
                });
            }
        });
        let c = p.counters();
        assert!(c.clean_evicted > 0 && c.zswpwb > 0 && c.pswpin > 0, "{c:?}");
        finish(t, &p, r, 48 * MIB);
    });
}

/// Packed writes that fail (every other one, for good; some short): their units stay
/// compressed in RAM and come back exact; writeback pauses and goes on.
#[test]
fn packed_writes_that_fail_keep_their_units_exact() {
    with_deadline(180, |t| {
        let p = packing_pool(
            t,
            48 * MIB,
            FaultInjection {
                fail_write_every: 2,
                short_write_every: 7,
                ..Default::default()
            },
        );
        let r = p.region_with(128 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let w = r.as_words();
        for seed in [3, 4] {
            fill(w, seed);
            check(w, seed);
        }
        let c = p.counters();
        assert!(c.io_errors > 0 && c.zswpwb > 0, "{c:?}");
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
        drop(r);
        t.check_pools();
    });
}

/// Reads of packed units that fail once (transient) are tried again: exact.
#[test]
fn packed_reads_that_fail_once_are_retried_exact() {
    with_deadline(180, |t| {
        let p = packing_pool(
            t,
            48 * MIB,
            FaultInjection {
                fail_read_every: 2,
                transient: true,
                ..Default::default()
            },
        );
        let r = p.region_with(128 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let w = r.as_words();
        for seed in [5, 6] {
            fill(w, seed);
            check(w, seed);
        }
        let c = p.counters();
        assert!(c.io_errors > 0 && c.pswpin > 0, "{c:?}");
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
        // Some reads landed in recycled frames (stale bytes): retried, never mapped
        // before a good read.
        common::assert_frames_recycled(&c);
    });
}

/// Every read fails, for good: a packed unit's pages are lost, and touching one kills
/// the process with SIGBUS, never other bytes.
#[test]
fn packed_units_lost_on_read_raise_sigbus() {
    with_deadline(120, |_| {
        let name = "packed_units_lost_on_read_raise_sigbus";
        if std::env::var("USWAP_PACKED_SIGBUS_CHILD").is_ok() {
            let p = Pool::builder()
                .budget(48 * MIB)
                .tier(TierKind::CompressedFile)
                .compressed_max_percent(25)
                .inject_io_errors(FaultInjection {
                    fail_read_every: 1,
                    ..Default::default()
                })
                .build()
                .unwrap();
            let r = p.region_with(128 * MIB, opts(UnitPolicy::Huge)).unwrap();
            fill(r.as_words(), 7);
            // Until the first unit's write completed (its bytes are then only on disk).
            let t0 = std::time::Instant::now();
            while p.counters().cached_bytes > 0 && t0.elapsed().as_secs() < 20 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let c = p.counters();
            if c.zswpwb == 0 || c.pswpout == 0 {
                println!("nothing was written back: {c:?}");
                std::process::exit(2);
            }
            let v = r.as_words()[0].load(Relaxed); // packed by now (the oldest unit)
            println!("read {v:#x} instead of SIGBUS: {:?}", p.counters());
            std::process::exit(0);
        }
        common::child_dies_of(name, "USWAP_PACKED_SIGBUS_CHILD", libc::SIGBUS);
    });
}

/// Packed writes leave the compressed pool's store its part of reclaim's reserve, as
/// writeback's decompressed copies do: eight threads rewriting units at random at the
/// limit (each unit evicted stored whole, then written back packed from the store
/// path), and the budget holds at every instant. Packed writes that took all the
/// reserve left the next unit store's growth, charged unconditionally, past the budget
/// (issue 40: 8 of 10 runs went over, by 32-1,408 KiB, most within 3-6 s).
#[test]
fn packed_writes_leave_the_stores_reserve() {
    const THREADS: usize = 8;
    const UNIT_WORDS: usize = 512 * WORDS_PER_PAGE;
    with_deadline(60, |t| {
        let budget = 64 * MIB;
        // A big share keeps the pool at its share, writing back from the store path.
        let p = t.pool(
            Pool::builder()
                .budget(budget)
                .tier(TierKind::CompressedFile)
                .compressed_max_percent(75)
                .fault_threads(2),
        );
        let r = p.region_with(256 * MIB, opts(UnitPolicy::Huge)).unwrap();
        let w = r.as_words();
        let units = w.len() / UNIT_WORDS;
        let t0 = std::time::Instant::now();
        let over = || p.counters().peak_used_bytes > budget;
        std::thread::scope(|s| {
            for k in 0..THREADS {
                let over = &over;
                s.spawn(move || {
                    // Thread k owns units k, k + THREADS, ...: the last seed of each.
                    let mine: Vec<usize> = (k..units).step_by(THREADS).collect();
                    let mut last = vec![0u64; mine.len()];
                    let mut n = 0u64;
                    while t0.elapsed().as_secs() < 12 && !over() {
                        n += 1;
                        let j = (mix((k as u64) << 32 | n) % mine.len() as u64) as usize;
                        let first = mine[j] * UNIT_WORDS;
                        for (i, v) in w[first..first + UNIT_WORDS].iter().enumerate() {
                            v.store(word(n, first + i), Relaxed);
                        }
                        last[j] = n;
                    }
                    for (&u, &seed) in mine.iter().zip(&last).filter(|(_, &s)| s > 0) {
                        let first = u * UNIT_WORDS;
                        for (i, v) in w[first..first + UNIT_WORDS].iter().enumerate() {
                            assert_eq!(v.load(Relaxed), word(seed, first + i), "unit {u}");
                        }
                    }
                });
            }
        });
        let c = p.counters();
        assert!(
            c.zswpwb > 0 && c.pswpout * 2 < c.zswpwb,
            "units written back packed: {c:?}"
        );
        assert!(
            c.peak_used_bytes <= budget,
            "peak {} B over the budget {budget} B by {} KiB: {c:?}",
            c.peak_used_bytes,
            (c.peak_used_bytes - budget) >> 10
        );
        finish(t, &p, r, budget);
    });
}
