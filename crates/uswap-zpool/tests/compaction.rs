//! Compaction gives back the memory that frees left in sparse zspages, and every handle
//! still loads its own bytes after its object moved.

mod common;
use common::*;
use uswap_zpool::{Compressor, Config, DataKind, Zpool, PAGE_SIZE};

#[test]
fn compaction_frees_sparse_zspages_and_handles_follow_their_objects() {
    for compressor in [Compressor::Lz4, Compressor::Zstd { level: 3 }] {
        let pool = Zpool::new(Config {
            compressor,
            ..Config::default()
        })
        .unwrap();
        let mut kept = Vec::new();
        for i in 0..6000 {
            let data = page(DataKind::Mixed, 21, i);
            if let Ok(h) = pool.store_page(&data) {
                kept.push((h, data));
            }
        }
        let unit_data = unit(DataKind::Text, 21, 0);
        let unit_handle = pool.store_unit(&unit_data).unwrap();
        // Free three of every four, spread over every zspage.
        let mut i = 0;
        kept.retain(|(h, _)| {
            i += 1;
            if i % 4 == 0 {
                true
            } else {
                pool.free(*h).unwrap();
                false
            }
        });
        let before = pool.stats();
        assert!(
            before.compactable_bytes > before.pool_bytes / 3,
            "{compressor}: frees left little to compact: {before:?}"
        );
        assert_eq!(
            before.fragmented_bytes,
            before.pool_bytes - before.object_bytes
        );
        let freed = pool.compact();
        let after = pool.stats();
        assert_eq!(freed, before.compactable_bytes, "{compressor}: {before:?}");
        assert_eq!(after.pool_bytes, before.pool_bytes - freed);
        assert_eq!(after.compactable_bytes, 0);
        assert!(after.fragmented_bytes < before.fragmented_bytes / 2);
        assert_eq!(
            (after.compactions, after.compacted_pages),
            (1, freed / PAGE_SIZE as u64)
        );
        assert_eq!(after.objects, before.objects, "compaction lost objects");
        // Nothing left to gain: a second pass frees nothing.
        assert_eq!(pool.compact(), 0);
        let mut out = [0u8; PAGE_SIZE];
        for (h, data) in &kept {
            pool.load(*h, &mut out).unwrap();
            assert!(out == **data, "{compressor}: {h:?} changed by compaction");
        }
        let mut unit_out = zero_unit();
        pool.load(unit_handle, &mut unit_out[..]).unwrap();
        assert!(unit_out[..] == unit_data[..]);
        for (h, _) in kept {
            pool.free(h).unwrap();
        }
        pool.free(unit_handle).unwrap();
        assert_eq!(pool.pool_bytes(), 0);
    }
}

#[test]
fn compaction_runs_while_other_threads_load_the_objects_it_moves() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    with_deadline(120, || {
        let pool = Arc::new(Zpool::new(Config::default()).unwrap());
        let mut all = Vec::new();
        for i in 0..8000 {
            let data = page(DataKind::Text, 5, i);
            all.push((pool.store_page(&data).unwrap(), data));
        }
        // Keep one in five: every zspage sparse.
        let mut kept = Vec::new();
        for (i, (h, data)) in all.into_iter().enumerate() {
            if i % 5 == 0 {
                kept.push((h, data));
            } else {
                pool.free(h).unwrap();
            }
        }
        let kept = Arc::new(kept);
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (pool, kept, stop) = (pool.clone(), kept.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut out = [0u8; PAGE_SIZE];
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) || n < kept.len() {
                        let (h, data) = &kept[(n * 7 + t) % kept.len()];
                        pool.load(*h, &mut out).unwrap();
                        assert!(out == **data);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let freed = pool.compact();
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() >= kept.len());
        }
        assert!(freed > 0);
        assert_eq!(pool.stats().compactable_bytes, 0);
    });
}
