//! `UnitPolicy::Auto` decides per region from the faults it sees (issue 42): random
//! faults on units swapped out whole come back in 4 KiB pages (a unit stored whole in
//! the compressed pool is split where the pool takes its pages), and fully resident units of such a region leave as
//! pages; a stream keeps whole units, and gets them back after random access. Every
//! byte stays exact.

mod common;

use common::{compressible_word as word, mix, with_deadline};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, RegionOptions, TierKind, UnitPolicy};

const MIB: u64 = 1 << 20;
const WORDS_PER_PAGE: usize = 512;

fn auto() -> RegionOptions {
    RegionOptions {
        unit: Some(UnitPolicy::Auto),
        ..Default::default()
    }
}

/// The expected words of a region filled with `word(seed, _)` whose page `p`'s first
/// word was then bumped `bumps[p]` times.
fn check(words: &[AtomicU64], seed: u64, bumps: &[u64], what: &str) {
    for (i, w) in words.iter().enumerate() {
        let p = i / WORDS_PER_PAGE;
        let bump = if i % WORDS_PER_PAGE == 0 { bumps[p] } else { 0 };
        assert_eq!(
            w.load(Relaxed),
            word(seed, i).wrapping_add(bump),
            "{what}: word {i} (page {p})"
        );
    }
}

/// `n` accesses to random pages (one word each): one in five a write that bumps it,
/// the others reads checked against what was written.
fn random_accesses(words: &[AtomicU64], seed: u64, bumps: &mut [u64], n: u64, salt: u64) {
    let pages = bumps.len() as u64;
    for k in 0..n {
        let x = mix(salt ^ k);
        let p = (x % pages) as usize;
        let i = p * WORDS_PER_PAGE;
        if x >> 60 < 3 {
            words[i].fetch_add(1, Relaxed);
            bumps[p] += 1;
        } else {
            assert_eq!(
                words[i].load(Relaxed),
                word(seed, i).wrapping_add(bumps[p]),
                "random read of page {p}"
            );
        }
    }
}

/// Fill sequentially (units leave whole), then access pages at random: after the
/// first few faults the region takes its units in 4 KiB pages, pages of units stored
/// whole in the pool come back one by one, and no unit comes back whole; then every
/// byte is checked.
fn random_access_after_whole_swap_out(tier: TierKind) {
    with_deadline(240, |t| {
        t.phase(format!("{tier:?}"));
        let budget = 48 * MIB;
        let p = t.pool(Pool::builder().budget(budget).tier(tier));
        let r = p.region_with(128 * MIB, auto()).unwrap();
        let words = r.as_words();
        let mut bumps = vec![0u64; words.len() / WORDS_PER_PAGE];
        common::fill_compressible(words, 7);
        let filled = r.counters();
        assert!(
            filled.zswpout > 0 && filled.thp_swpout_declined == 0,
            "a stream's units leave whole: {filled:?}"
        );
        random_accesses(words, 7, &mut bumps, 3000, 1);
        let warm = r.counters();
        assert!(
            warm.thp_swpin - filled.thp_swpin <= 1,
            "random faults bring units back whole: {warm:?}"
        );
        assert!(
            warm.thp_swpin_declined > filled.thp_swpin_declined,
            "the decision is counted: {warm:?}"
        );
        // Whole, each fault on a unit stored whole would load 512 pages from the pool.
        assert!(
            warm.zswpin - filled.zswpin <= 2 * 3000,
            "random faults load pages, not units, from the pool: {warm:?}"
        );
        random_accesses(words, 7, &mut bumps, 6000, 2);
        let c = r.counters();
        assert_eq!(
            c.thp_swpin, warm.thp_swpin,
            "no unit comes back whole once the region looks random: {c:?}"
        );
        check(words, 7, &bumps, "after random access");
        let c = p.counters();
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
        // (With no tier behind the pool, what does not compress stays resident, over
        // the budget.)
        assert!(
            tier == TierKind::Compressed || c.peak_used_bytes <= budget,
            "peak {} over the budget: {c:?}",
            c.peak_used_bytes
        );
    });
}

#[test]
fn random_faults_on_units_stored_whole_come_back_in_pages() {
    random_access_after_whole_swap_out(TierKind::CompressedFile);
}

#[test]
fn random_faults_on_a_compressed_only_pool_come_back_in_pages() {
    random_access_after_whole_swap_out(TierKind::Compressed);
}

/// A stream reads units back whole; random access then turns whole units off; a
/// sequential rewrite turns them on again: its units leave whole, and the next
/// sequential read brings them back whole.
#[test]
fn a_stream_after_random_access_swaps_whole_units_again() {
    with_deadline(240, |t| {
        let budget = 32 * MIB;
        let p = t.pool(Pool::builder().budget(budget));
        let r = p.region_with(96 * MIB, auto()).unwrap();
        let words = r.as_words();
        let mut bumps = vec![0u64; words.len() / WORDS_PER_PAGE];
        common::fill_compressible(words, 3);
        check(words, 3, &bumps, "first read");
        let read = r.counters();
        assert!(
            read.thp_swpout > 0 && read.thp_swpin > 0,
            "a stream swaps whole units out and in: {read:?}"
        );
        random_accesses(words, 3, &mut bumps, 3000, 5);
        let random = r.counters();
        assert!(
            random.thp_swpin - read.thp_swpin <= 1,
            "random faults bring units back whole: {random:?}"
        );
        assert!(
            random.thp_swpin_declined > read.thp_swpin_declined,
            "{random:?}"
        );
        // Rewrite sequentially (each page's first word keeps its bumps), then read.
        for (i, w) in words.iter().enumerate() {
            let bump = if i % WORDS_PER_PAGE == 0 {
                bumps[i / WORDS_PER_PAGE]
            } else {
                0
            };
            w.store(word(4, i).wrapping_add(bump), Relaxed);
        }
        let rewritten = r.counters();
        assert!(
            rewritten.thp_swpout > random.thp_swpout,
            "a sequential rewrite swaps whole units out again: {rewritten:?}"
        );
        check(words, 4, &bumps, "read after the rewrite");
        let c = r.counters();
        assert!(
            c.thp_swpin > rewritten.thp_swpin + 8,
            "a stream swaps whole units in again: {c:?}"
        );
        let c = p.counters();
        assert_eq!((c.poisoned, c.internal_errors), (0, 0), "{c:?}");
        assert!(c.peak_used_bytes <= budget, "{c:?}");
    });
}
