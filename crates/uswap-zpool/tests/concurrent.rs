//! Several threads store, load and free pages and units while another compacts and
//! another reads the stats, the way the engine's fault and reclaim threads and its
//! background thread will. Every byte loaded is checked; at the end everything is
//! freed and every gauge must be back at zero.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uswap_zpool::{Compressor, Config, DataKind, Handle, Reject, Zpool, PAGE_SIZE, UNIT_SIZE};

/// What a worker keeps of an entry: its handle and how to make its data again.
struct Held {
    handle: Handle,
    kind: DataKind,
    seed: u64,
    index: u64,
    unit: bool,
}

fn expected(h: &Held) -> Vec<u8> {
    let mut v = vec![0u8; if h.unit { UNIT_SIZE } else { PAGE_SIZE }];
    if h.unit {
        h.kind.fill(h.seed, h.index * 512, &mut v);
    } else {
        h.kind.fill_page(h.seed, h.index, &mut v);
    }
    v
}

/// xorshift, per worker.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn worker(pool: &Zpool, id: u64, ops: u64, loaded: &AtomicU64) {
    let kinds = [
        DataKind::Mixed,
        DataKind::Text,
        DataKind::Zeros,
        DataKind::Mixed,
    ];
    let mut rng = 0x9e37_79b9 ^ ((id + 1) * 0x1234_5678_9abc);
    let mut held: Vec<Held> = Vec::new();
    let mut page_buf = Box::new([0u8; PAGE_SIZE]);
    let mut unit_buf = unit_of(vec![0u8; UNIT_SIZE]);
    for op in 0..ops {
        let r = next(&mut rng);
        match r % 10 {
            // Store (more often while few are held).
            0..=3 if held.len() < 3000 => {
                let unit = r.is_multiple_of(97);
                let kind = kinds[(r >> 8) as usize % kinds.len()];
                let h = Held {
                    handle: Handle::from_raw(1 << 40).unwrap(), // set below once stored
                    kind,
                    seed: id,
                    index: op,
                    unit,
                };
                let data = expected(&h);
                let stored = if unit {
                    pool.store_unit(data[..].try_into().unwrap())
                } else {
                    pool.store_page(data[..].try_into().unwrap())
                };
                match stored {
                    Ok(handle) => held.push(Held { handle, ..h }),
                    Err(Reject::PoorCompression) => assert_eq!(kind, DataKind::Mixed),
                    Err(Reject::PoolFull) => {
                        assert!(pool.limit() != u64::MAX, "full without a limit")
                    }
                }
            }
            // Load one held entry and check every byte.
            0..=7 if !held.is_empty() => {
                let h = &held[(r >> 16) as usize % held.len()];
                let out: &mut [u8] = if h.unit {
                    &mut unit_buf[..]
                } else {
                    &mut page_buf[..]
                };
                pool.load(h.handle, out).unwrap();
                assert!(out == &expected(h)[..], "worker {id}: {:?} wrong", h.handle);
                loaded.fetch_add(1, Ordering::Relaxed);
            }
            // Free one.
            _ if !held.is_empty() => {
                let h = held.swap_remove((r >> 16) as usize % held.len());
                pool.free(h.handle).unwrap();
            }
            _ => {}
        }
    }
    // Check and free the rest.
    for h in held {
        let mut out = vec![0u8; h.handle.data_len()];
        pool.load(h.handle, &mut out).unwrap();
        assert!(
            out == expected(&h),
            "worker {id}: {:?} wrong at the end",
            h.handle
        );
        pool.free(h.handle).unwrap();
    }
}

fn run(compressor: Compressor, workers: u64, ops: u64, limit_bytes: u64) {
    let pool = Arc::new(
        Zpool::new(Config {
            compressor,
            limit_bytes,
            ..Config::default()
        })
        .unwrap(),
    );
    let fresh_metadata = pool.metadata_bytes();
    let done = Arc::new(AtomicBool::new(false));
    let loaded = Arc::new(AtomicU64::new(0));
    let compactor = {
        let (pool, done) = (pool.clone(), done.clone());
        std::thread::spawn(move || {
            let mut freed = 0;
            while !done.load(Ordering::Relaxed) {
                freed += pool.compact();
                // The zspages never pass the limit, whatever the threads do at once.
                for _ in 0..20 {
                    let held = pool.pool_bytes();
                    assert!(
                        held <= limit_bytes,
                        "{held} bytes held, limit {limit_bytes}"
                    );
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
            freed
        })
    };
    let threads: Vec<_> = (0..workers)
        .map(|id| {
            let (pool, loaded) = (pool.clone(), loaded.clone());
            std::thread::spawn(move || worker(&pool, id, ops, &loaded))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let compacted = compactor.join().unwrap();
    let s = pool.stats();
    assert!(loaded.load(Ordering::Relaxed) > workers * ops / 4);
    assert!(s.compactions > 0);
    if limit_bytes != u64::MAX {
        assert!(s.reject_pool_full > 0, "the limit never bit");
    }
    println!("{compressor}: {s:?}, compaction freed {compacted} bytes");
    assert_eq!(
        (
            s.stored_pages,
            s.stored_units,
            s.same_filled_pages,
            s.same_filled_units
        ),
        (0, 0, 0, 0)
    );
    assert_eq!((s.stored_bytes, s.compressed_bytes), (0, 0));
    assert_eq!((s.objects, s.zspages, s.pool_bytes), (0, 0, 0));
    assert_eq!(s.stores, s.frees);
    assert_eq!(s.corrupt_loads, 0);
    // Tables shrink with the entries: what stays is the arena's address lists and a
    // few list capacities.
    pool.release_unit_scratch();
    let left = pool.metadata_bytes() - fresh_metadata;
    println!("metadata left after freeing everything: {left} bytes");
    assert!(left < 128 << 10, "{left} bytes of metadata left");
}

#[test]
fn threads_store_load_free_and_compact_at_once_lz4() {
    with_deadline(240, || run(Compressor::Lz4, 4, 20_000, u64::MAX));
}

#[test]
fn threads_at_the_limit_never_pass_it() {
    // Four threads that would hold ~40 MiB in a pool limited to 8 MiB.
    with_deadline(240, || run(Compressor::Lz4, 4, 12_000, 8 << 20));
}

#[test]
fn threads_store_load_free_and_compact_at_once_zstd() {
    with_deadline(240, || {
        run(Compressor::Zstd { level: 1 }, 3, 8_000, u64::MAX)
    });
}

/// Units compressed side by side (`prepare_unit`, as the engine's reclaim thread and a
/// fault's direct reclaim do) and stored one at a time (`commit`) load back exact; with
/// two buffers reserved, two at once make no new one (the pool does not grow in the
/// middle of an eviction); a prepared unit dropped stores nothing and gives its buffer
/// back; a unit that compresses poorly is refused at its preparing.
#[test]
fn units_prepared_side_by_side_store_exact_within_their_reserved_buffers() {
    with_deadline(120, || {
        let pool = Arc::new(Zpool::new(Config::default()).unwrap());
        assert_eq!(pool.reserve_unit_scratches(2), 2);
        let meta = pool.metadata_bytes();
        let stored = pool.stats().stored_pages;
        // A prepared unit dropped: nothing stored, the buffer back.
        let u = unit(DataKind::Text, 7, 0);
        drop(pool.prepare_unit(&u).unwrap());
        assert_eq!(pool.stats().stored_pages, stored);
        assert_eq!(pool.metadata_bytes(), meta);
        // Refused while preparing: random data does not compress.
        let r = unit(DataKind::Random, 7, 1);
        assert_eq!(pool.prepare_unit(&r).err(), Some(Reject::PoorCompression));
        assert_eq!(pool.metadata_bytes(), meta);
        // Two threads, each preparing its units while the other does, committing under
        // one lock (the engine's `storing`), as many rounds as it takes to overlap.
        let commit = Arc::new(std::sync::Mutex::new(()));
        let peak_meta = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (pool, commit, peak_meta) = (pool.clone(), commit.clone(), peak_meta.clone());
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..40u64 {
                        let kind = if i % 3 == 0 {
                            DataKind::Text
                        } else {
                            DataKind::Mixed
                        };
                        let data = unit(kind, t, i);
                        let prepared = match pool.prepare_unit(&data) {
                            Ok(p) => p,
                            Err(Reject::PoorCompression) => continue,
                            Err(e) => panic!("unit {i} of thread {t} refused: {e:?}"),
                        };
                        peak_meta.fetch_max(pool.metadata_bytes(), Ordering::Relaxed);
                        let h = {
                            let _one = commit.lock().unwrap();
                            prepared.commit().expect("stored")
                        };
                        held.push((h, kind, i));
                    }
                    held
                })
            })
            .collect();
        let mut out = zero_unit();
        let mut n = 0;
        for (t, w) in workers.into_iter().enumerate() {
            for (h, kind, i) in w.join().unwrap() {
                pool.load(h, &mut out[..]).unwrap();
                assert!(
                    out[..] == unit(kind, t as u64, i)[..],
                    "unit {i} of thread {t} came back different"
                );
                pool.free(h).unwrap();
                n += 1;
            }
        }
        assert!(n >= 40, "too few units stored to mean anything: {n}");
        // Buffers: only the two reserved (records and tables grow with what is stored,
        // so the check is that no 2 MiB buffer was added).
        let buffer = (UNIT_SIZE as u64) * 2;
        assert!(
            peak_meta.load(Ordering::Relaxed) < meta + buffer / 2,
            "preparing two units at once made a new buffer: metadata {} -> {}",
            meta,
            peak_meta.load(Ordering::Relaxed)
        );
        assert_eq!(pool.stats().stored_pages, stored);
    });
}
