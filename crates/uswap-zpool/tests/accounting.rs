//! The pool's figures are exact: `metadata_bytes` is every heap byte the pool holds
//! (checked against a counting allocator), `stored_bytes` and `compressed_bytes` are
//! what was stored and what the compressor made of it, and the derived figures add up.
//! (`pool_bytes` against the kernel's page tables is checked in the crate's own tests,
//! which can see the pool's mappings.)
//!
//! One test only in this binary: the allocator counts every thread's allocations. It
//! prints nothing: captured output is heap memory too. It also counts allocation calls:
//! loads make none, stores few once the classes are set up.

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use uswap_zpool::{Compressor, Config, DataKind, Handle, Zpool, PAGE_SIZE, UNIT_CHUNK, UNIT_SIZE};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);
/// Allocation calls (alloc, alloc_zeroed, realloc).
static CALLS: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

fn calls() -> i64 {
    CALLS.load(Ordering::Relaxed)
}

#[test]
fn every_figure_is_exact() {
    for compressor in [Compressor::Lz4, Compressor::Zstd { level: 1 }] {
        let config = Config {
            compressor,
            ..Config::default()
        };
        // All the test's own buffers, and the threads' compressor state, first.
        let pages: Vec<Page> = (0..3000).map(|i| page(DataKind::Mixed, 8, i)).collect();
        let units: Vec<Unit> = (0..8).map(|i| unit(DataKind::Mixed, 8, i)).collect();
        let mut handles: Vec<Handle> = Vec::with_capacity(pages.len() + units.len());
        let mut out = zero_unit();
        {
            let warm = Zpool::new(config).unwrap();
            let h = warm.store_page(&page(DataKind::Text, 1, 1)).unwrap();
            warm.load(h, &mut out[..PAGE_SIZE]).unwrap();
            let h = warm.store_unit(&units[0]).unwrap();
            warm.load(h, &mut out[..]).unwrap();
        }
        let mut stored: Vec<usize> = Vec::with_capacity(pages.len());

        let base = live();
        let pool = Zpool::new(config).unwrap();
        let held = |_: &Zpool| live() - base;
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: new pool"
        );

        // Page stores allocate only when a table grows by a chunk or a zspage is made
        // (its bitmap): once the classes are set up (the first half), rarely.
        let mut calls_before = 0;
        for (i, p) in pages.iter().enumerate() {
            if i == pages.len() / 2 {
                calls_before = calls();
            }
            if let Ok(h) = pool.store_page(p) {
                handles.push(h);
                stored.push(i);
            }
        }
        let page_calls = calls() - calls_before;
        let stored_pages = stored.len() as u64;
        let measured = pages.len() as i64 / 2;
        assert!(
            page_calls * 5 < measured,
            "{compressor}: {page_calls} allocations in {measured} page stores"
        );
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: pages"
        );
        let mut calls_before = 0;
        for (i, u) in units.iter().enumerate() {
            if i == units.len() / 2 {
                calls_before = calls();
            }
            handles.push(pool.store_unit(u).unwrap());
        }
        // Once the classes are set up: per unit its chunk list, and now and then a
        // table chunk or a small class's zspage bitmap.
        let unit_calls = calls() - calls_before;
        let measured = units.len() as i64 / 2;
        assert!(
            unit_calls <= 16 * measured,
            "{unit_calls} allocations in {measured} unit stores"
        );
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: units"
        );
        // Loads allocate nothing at all.
        let calls_before = calls();
        for h in &handles {
            pool.load(*h, &mut out[..h.data_len()]).unwrap();
        }
        assert_eq!(calls() - calls_before, 0, "{compressor}: loads allocated");
        for (k, u) in units.iter().enumerate() {
            pool.load(handles[stored.len() + k], &mut out[..]).unwrap();
            assert!(out[..] == u[..]);
        }

        let s = pool.stats();
        assert_eq!(s.stored_pages, stored_pages);
        assert_eq!(s.stored_units, units.len() as u64);
        assert_eq!(
            s.stored_bytes,
            stored_pages * PAGE_SIZE as u64 + (units.len() * UNIT_SIZE) as u64
        );
        if compressor == Compressor::Lz4 {
            // Pages: what lz4 makes of each page stored (none for a same-filled one).
            let mut expect_compressed = 0u64;
            let mut lz4_out = vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE_SIZE)];
            for &i in &stored {
                let p = &pages[i][..];
                if p.chunks_exact(8).any(|w| w != &p[..8]) {
                    let n = lz4_flex::block::compress_into(p, &mut lz4_out).unwrap();
                    expect_compressed += n as u64;
                }
            }
            // Units: each 16 KiB chunk as lz4 makes it, raw if that is no smaller,
            // nothing if it is one repeated word.
            let mut chunk_out = vec![0u8; lz4_flex::block::get_maximum_output_size(UNIT_CHUNK)];
            for u in &units {
                for chunk in u.chunks(UNIT_CHUNK) {
                    if chunk.chunks_exact(8).all(|w| w == &chunk[..8]) {
                        continue;
                    }
                    let n = lz4_flex::block::compress_into(chunk, &mut chunk_out).unwrap();
                    expect_compressed += n.min(chunk.len()) as u64;
                }
            }
            assert_eq!(s.compressed_bytes, expect_compressed);
        }
        assert_eq!(s.fragmented_bytes, s.pool_bytes - s.object_bytes);
        assert!(s.object_bytes >= s.compressed_bytes);
        assert!(
            s.compression_ratio() > 2.0 && s.effective_ratio() > 1.5,
            "{s:?}"
        );
        assert_eq!(s.stores, stored_pages + units.len() as u64);

        // Frees, compaction, more frees: still exact.
        for h in handles.iter().step_by(2) {
            pool.free(*h).unwrap();
        }
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: after frees"
        );
        pool.compact();
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: compacted"
        );
        for h in handles.iter().skip(1).step_by(2) {
            pool.free(*h).unwrap();
        }
        handles.clear();
        stored.clear();
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: all freed"
        );
        let released = pool.release_unit_scratch();
        assert!(released >= UNIT_SIZE as u64);
        assert_eq!(
            held(&pool),
            pool.metadata_bytes() as i64,
            "{compressor}: released"
        );
        let s = pool.stats();
        assert_eq!(
            (s.pool_bytes, s.stored_bytes, s.compressed_bytes),
            (0, 0, 0)
        );
        drop(pool);
        assert_eq!(live(), base, "{compressor}: the pool leaked heap memory");
    }
}
