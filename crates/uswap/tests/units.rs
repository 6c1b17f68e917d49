//! 2 MiB units (issue 3): byte-exact through whole-unit swap-out and swap-in, mixed
//! with 4 KiB regions in one pool; fallbacks under fragmentation; real THPs after
//! swap-in.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, RegionOptions, UnitPolicy};

const MIB: u64 = 1 << 20;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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
    let p = Pool::builder().budget(24 * MIB).build().unwrap();
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
}

#[test]
fn fragmented_swap_falls_back_and_stays_exact() {
    // Swap exactly as large as the regions: 4 KiB regions written randomly take
    // slots from many clusters, then the 2 MiB region finds no whole free cluster.
    let p = Pool::builder()
        .budget(16 * MIB)
        .swap_size(96 * MIB)
        .build()
        .unwrap();
    let small = p.region_with(64 * MIB, opts(UnitPolicy::Small)).unwrap();
    let huge = p.region_with(32 * MIB, opts(UnitPolicy::Huge)).unwrap();
    // Scatter small-page writes so that evictions take slots all over the file.
    let words = small.as_words();
    let pages = words.len() / 512;
    let mut x = 1u64;
    for round in 0..3 {
        for _ in 0..pages {
            x = mix(x);
            let pg = (x as usize) % pages;
            words[pg * 512].store(mix(pg as u64 + round), Relaxed);
        }
    }
    fill(huge.as_words(), 5);
    check(huge.as_words(), 5, "huge under fragmentation");
    fill(huge.as_words(), 6);
    check(huge.as_words(), 6, "huge under fragmentation, pass 2");
    let c = huge.counters();
    assert!(
        c.thp_swpout_fallback > 0,
        "no fallback with a fragmented swap file: {c:?}"
    );
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
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[never]") {
        eprintln!("THP disabled on this machine: skipping");
        return;
    }
    let p = Pool::builder().budget(16 * MIB).build().unwrap();
    let r = p.region_with(64 * MIB, opts(UnitPolicy::Huge)).unwrap();
    fill(r.as_words(), 7);
    // The first units were swapped out by the later ones; touch two of them again.
    let words = r.as_words();
    let unit_words = (2 * MIB / 8) as usize;
    check(&words[..2 * unit_words], 7, "first units");
    assert!(r.counters().thp_swpin >= 2, "{:?}", r.counters());
    let kb = anon_huge_kb(r.as_ptr() as usize, r.len()).expect("region in smaps");
    assert!(
        kb >= 2048,
        "no AnonHugePages after whole-unit swap-in: {kb} kB"
    );
}
