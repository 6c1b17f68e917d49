//! Units the compressed tier writes back packed (compressed, `tier/packed.rs`): every
//! byte back through packing and reading back, in order and at random; fewer blocks
//! written than pages written back; every slot given back; injected write and read
//! errors never give wrong bytes.

mod common;

use common::{check_compressible as check, compressible_word as word};
use common::{fill_compressible as fill, mix, with_deadline, WORDS_PER_PAGE};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{FaultInjection, Pool, RegionOptions, TierKind, UnitPolicy};

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

fn packing_pool(t: &common::Test, budget: u64, inject: FaultInjection) -> common::TestPool {
    t.pool(
        Pool::builder()
            .budget(budget)
            .tier(TierKind::CompressedFile)
            .compressed_max_percent(25)
            .inject_io_errors(inject),
    )
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
