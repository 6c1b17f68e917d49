//! What the pool refuses: data that compresses over the threshold, and stores that
//! would pass the byte limit (settable at any time).

mod common;
use common::*;
use uswap_zpool::{Config, DataKind, Handle, Reject, Zpool, PAGE_SIZE, UNIT_SIZE};

/// A page whose first half is random and second half zero: lz4 gets it to ~51%.
fn half_random_page(i: u64) -> Page {
    let mut p = page(DataKind::Random, 4, i);
    p[PAGE_SIZE / 2..].fill(0);
    p
}

#[test]
fn the_threshold_decides_what_compresses_well_enough() {
    let pool = Zpool::new(Config::default()).unwrap();
    assert_eq!(pool.max_compressed_percent(), 80);
    // Random pages never compress (lz4 even adds a few bytes): refused even at 100%.
    for percent in [80, 100] {
        pool.set_max_compressed_percent(percent).unwrap();
        assert_eq!(
            pool.store_page(&page(DataKind::Random, 1, 0)),
            Err(Reject::PoorCompression)
        );
    }
    pool.set_max_compressed_percent(80).unwrap();
    let h = pool
        .store_page(&half_random_page(1))
        .expect("~51% is under 80%");
    pool.set_max_compressed_percent(45).unwrap();
    assert_eq!(
        pool.store_page(&half_random_page(2)),
        Err(Reject::PoorCompression)
    );
    // Same-filled pages are never refused for compression.
    assert!(pool.store_page(&page(DataKind::Zeros, 1, 0)).is_ok());
    // Units: one decision for the whole unit, on the sum of its chunks.
    let mut u = zero_unit();
    for p in 0..UNIT_SIZE / PAGE_SIZE {
        u[p * PAGE_SIZE..(p + 1) * PAGE_SIZE].copy_from_slice(&half_random_page(p as u64)[..]);
    }
    assert_eq!(pool.store_unit(&u), Err(Reject::PoorCompression));
    pool.set_max_compressed_percent(60).unwrap();
    let hu = pool.store_unit(&u).expect("~51% is under 60%");
    let s = pool.stats();
    assert_eq!(s.reject_poor_compression, 4);
    assert_eq!(s.stores, 3);
    let mut out = zero_unit();
    pool.load(hu, &mut out[..]).unwrap();
    assert!(out[..] == u[..]);
    let mut pout = [0u8; PAGE_SIZE];
    pool.load(h, &mut pout).unwrap();
    assert!(pout == *half_random_page(1));
}

/// Store text pages until the pool refuses one; the handles and pages stored.
fn fill_until_full(pool: &Zpool, seed: u64) -> Vec<(Handle, Page)> {
    let mut kept = Vec::new();
    for i in 0.. {
        let data = page(DataKind::Text, seed, i);
        match pool.store_page(&data) {
            Ok(h) => kept.push((h, data)),
            Err(Reject::PoolFull) => break,
            Err(e) => panic!("page {i}: {e}"),
        }
        assert!(i < 1_000_000, "the limit never bit");
    }
    kept
}

fn verify(pool: &Zpool, kept: &[(Handle, Page)]) {
    let mut out = [0u8; PAGE_SIZE];
    for (h, data) in kept {
        pool.load(*h, &mut out).unwrap();
        assert!(out == **data);
    }
}

#[test]
fn the_limit_holds_and_can_change_at_run_time() {
    const LIMIT: u64 = 2 << 20;
    let pool = Zpool::new(Config {
        limit_bytes: LIMIT,
        ..Config::default()
    })
    .unwrap();
    let mut kept = fill_until_full(&pool, 1);
    let s = pool.stats();
    assert!(s.pool_bytes <= LIMIT, "{} > {LIMIT}", s.pool_bytes);
    // Tables grow by one chunk at a time: at most a few KiB past it.
    assert!(pool.total_bytes() <= LIMIT + 16 * 1024, "{s:?}");
    assert!(
        pool.total_bytes() > LIMIT - 64 * 1024,
        "stopped far below the limit: {s:?}"
    );
    assert_eq!(s.reject_pool_full, 1);
    verify(&pool, &kept);
    // Full, a zero page still fits (it takes nothing), a unit does not.
    assert!(pool.store_page(&page(DataKind::Zeros, 1, 0)).is_ok());
    let before = pool.pool_bytes();
    assert_eq!(
        pool.store_unit(&unit(DataKind::Text, 1, 0)),
        Err(Reject::PoolFull)
    );
    assert_eq!(
        pool.pool_bytes(),
        before,
        "a refused unit left memory behind"
    );

    // Raise it: more fits.
    pool.set_limit(2 * LIMIT);
    assert_eq!(pool.limit(), 2 * LIMIT);
    let more = fill_until_full(&pool, 2);
    assert!(!more.is_empty());
    assert!(pool.pool_bytes() <= 2 * LIMIT && pool.pool_bytes() > LIMIT);
    kept.extend(more);
    verify(&pool, &kept);

    // Lower it below what is held: nothing new until enough is freed.
    pool.set_limit(LIMIT / 2);
    assert_eq!(
        pool.store_page(&page(DataKind::Text, 3, 0)),
        Err(Reject::PoolFull)
    );
    let mut unit_kept = None;
    while pool.total_bytes() >= LIMIT / 4 {
        let (h, _) = kept.pop().unwrap();
        pool.free(h).unwrap();
        pool.compact();
    }
    let h = pool
        .store_page(&page(DataKind::Text, 3, 0))
        .expect("room again");
    pool.set_limit(u64::MAX);
    unit_kept.get_or_insert(pool.store_unit(&unit(DataKind::Text, 3, 0)).unwrap());
    verify(&pool, &kept);
    pool.free(h).unwrap();
    pool.free(unit_kept.unwrap()).unwrap();
    for (h, _) in kept {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.pool_bytes(), 0);
    assert!(pool.stats().reject_pool_full >= 4);
}
