//! Every kind of data, pages and units, both compressors: what goes in comes out
//! byte for byte; same-filled data takes no memory; bad calls get clear errors.

mod common;
use common::*;
use uswap_zpool::{
    Compressor, Config, DataKind, Error, Handle, Reject, Zpool, PAGE_SIZE, UNIT_CHUNK, UNIT_SIZE,
};

fn pool_with(compressor: Compressor) -> Zpool {
    Zpool::new(Config {
        compressor,
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn pages_of_every_kind_round_trip_with_every_compressor() {
    for c in COMPRESSORS {
        let pool = pool_with(c);
        let mut kept = Vec::new();
        let mut refused = 0;
        for kind in DataKind::ALL {
            for i in 0..400 {
                let data = page(kind, 11, i);
                match pool.store_page(&data) {
                    Ok(h) => {
                        assert!(!h.is_unit());
                        assert_eq!(h.data_len(), PAGE_SIZE);
                        kept.push((h, data));
                    }
                    Err(Reject::PoorCompression) => {
                        // (Accelerated lz4 leaves some text pages over the threshold.)
                        let poor_text =
                            matches!(c, Compressor::Lz4Fast { .. }) && kind == DataKind::Text;
                        assert!(
                            matches!(kind, DataKind::Random | DataKind::Mixed) || poor_text,
                            "{c}: {kind} page {i} refused"
                        );
                        refused += 1;
                    }
                    Err(e) => panic!("{c}: {kind} page {i}: {e}"),
                }
            }
        }
        let s = pool.stats();
        assert!(refused >= 400, "{c}: random pages were stored");
        assert_eq!(s.reject_poor_compression, refused);
        assert_eq!(s.stored_pages, kept.len() as u64);
        assert_eq!(s.stored_bytes, (kept.len() * PAGE_SIZE) as u64);
        assert!(
            s.same_filled_pages >= 400,
            "{c}: zero pages not same-filled"
        );
        let mut out = [0u8; PAGE_SIZE];
        // Twice: load does not free.
        for _ in 0..2 {
            for (h, data) in &kept {
                out.fill(0xa5);
                pool.load(*h, &mut out).unwrap();
                assert!(out == **data, "{c}: {h:?} came back different");
            }
        }
        for (h, _) in &kept {
            pool.free(*h).unwrap();
        }
        let s = pool.stats();
        assert_eq!(
            (s.stored_pages, s.stored_bytes, s.compressed_bytes),
            (0, 0, 0)
        );
        assert_eq!((s.pool_bytes, s.objects, s.zspages), (0, 0, 0));
    }
}

#[test]
fn same_filled_pages_take_no_pool_memory() {
    let pool = pool_with(Compressor::Lz4);
    let words: [u64; 6] = [
        0,
        u64::MAX,
        0x0101_0101_0101_0101,
        0x0000_0007_0000_0007, // an array of one i32
        0x0000_0000_0000_0001, // an array of one i64: not a repeated u32
        0x0000_5612_3456_7890, // one pointer repeated
    ];
    let mut handles = Vec::new();
    for w in words {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        for c in p.chunks_exact_mut(8) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
        let h = pool.store_page(&p).unwrap();
        assert_eq!(
            h.is_inline_same_filled(),
            w >> 32 == w & 0xffff_ffff,
            "{w:#x}"
        );
        handles.push((h, p));
    }
    let s = pool.stats();
    assert_eq!(s.pool_bytes, 0);
    assert_eq!(s.objects, 0);
    assert_eq!(s.same_filled_pages, words.len() as u64);
    assert_eq!(s.compressed_bytes, 0);
    let mut out = [0u8; PAGE_SIZE];
    for (h, p) in &handles {
        pool.load(*h, &mut out).unwrap();
        assert!(out == **p);
        pool.free(*h).unwrap();
    }
    assert_eq!(pool.stats().same_filled_pages, 0);
    // A record-kept pattern is gone after its free.
    let (odd, _) = handles[4];
    assert_eq!(pool.load(odd, &mut out), Err(Error::InvalidHandle(odd)));
    assert_eq!(pool.free(odd), Err(Error::InvalidHandle(odd)));
}

/// A unit with a bit of everything: zero chunks, a chunk of one odd word, text, heap
/// objects, and a run of random pages long enough to make chunks that store raw.
fn motley_unit() -> Unit {
    let mut u = zero_unit();
    let pages = UNIT_SIZE / PAGE_SIZE;
    for p in 0..pages {
        let kind = match p {
            0..=63 => DataKind::Zeros,
            64..=191 => DataKind::Text,
            192..=255 => DataKind::Mixed,
            256..=271 => DataKind::Random, // 4 whole chunks of random bytes
            _ => DataKind::Text,
        };
        kind.fill_page(5, p as u64, &mut u[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]);
    }
    // One whole chunk of a word that does not fit in a handle.
    let c = 40 * UNIT_CHUNK;
    for w in u[c..c + UNIT_CHUNK].chunks_exact_mut(8) {
        w.copy_from_slice(&0x0000_7fff_0000_1234u64.to_ne_bytes());
    }
    // And the short last chunk: random.
    DataKind::Random.fill_page(6, 0, &mut u[UNIT_SIZE - 2048..]);
    u
}

#[test]
fn units_round_trip_with_every_compressor() {
    let mut odd = zero_unit();
    for w in odd.chunks_exact_mut(8) {
        w.copy_from_slice(&0x1234_5678_0000_0001u64.to_ne_bytes());
    }
    let mut ff = zero_unit();
    ff.fill(0xff);
    for c in COMPRESSORS {
        let pool = pool_with(c);
        let cases: Vec<(&str, Unit)> = vec![
            ("text", unit(DataKind::Text, 1, 0)),
            ("mixed", unit(DataKind::Mixed, 1, 1)),
            ("mixed 2", unit(DataKind::Mixed, 2, 7)),
            ("motley", motley_unit()),
            ("zeros", zero_unit()),
            ("ff", ff.clone()),
            ("odd word", odd.clone()),
        ];
        let mut kept = Vec::new();
        for (name, data) in cases {
            let h = pool
                .store_unit(&data)
                .unwrap_or_else(|e| panic!("{c}: {name}: {e}"));
            assert!(h.is_unit() && h.data_len() == UNIT_SIZE);
            kept.push((name, h, data));
        }
        let s = pool.stats();
        assert_eq!(s.stored_units, 7);
        assert_eq!(s.same_filled_units, 3);
        assert_eq!(s.stored_bytes, 7 * UNIT_SIZE as u64);
        assert!(s.compressed_bytes < 4 * UNIT_SIZE as u64 * 8 / 10);
        let mut out = zero_unit();
        for _ in 0..2 {
            for (name, h, data) in &kept {
                out.fill(0x5a);
                pool.load(*h, &mut out[..]).unwrap();
                assert!(out[..] == data[..], "{c}: unit {name} came back different");
            }
        }
        for (_, h, _) in &kept {
            pool.free(*h).unwrap();
        }
        let s = pool.stats();
        assert_eq!(
            (s.stored_units, s.stored_bytes, s.compressed_bytes),
            (0, 0, 0)
        );
        assert_eq!(s.pool_bytes, 0);
    }
}

/// Every page of a unit, and ranges across chunk edges, read alone with `load_part`:
/// the unit's bytes at that place, for every kind of chunk (same-filled in the handle,
/// in a record, compressed, raw); a page handle or a range past the unit is refused.
#[test]
fn parts_of_a_unit_load_alone_with_every_compressor() {
    let mut odd = zero_unit();
    for w in odd.chunks_exact_mut(8) {
        w.copy_from_slice(&0x1234_5678_0000_0001u64.to_ne_bytes());
    }
    for c in COMPRESSORS {
        let pool = pool_with(c);
        for (name, data) in [
            ("motley", motley_unit()),
            ("mixed", unit(DataKind::Mixed, 3, 2)),
            ("zeros", zero_unit()),
            ("odd word", odd.clone()),
        ] {
            let h = pool.store_unit(&data).unwrap();
            let mut page = [0x5au8; PAGE_SIZE];
            for p in 0..UNIT_SIZE / PAGE_SIZE {
                page.fill(0x5a);
                pool.load_part(h, p * PAGE_SIZE, &mut page).unwrap();
                let want = &data[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
                assert!(
                    page[..] == want[..],
                    "{c}: {name}: page {p} came back different"
                );
            }
            // Ranges that start and end inside chunks, spanning up to three.
            for (off, len) in [
                (UNIT_CHUNK - 8, 16),
                (3 * UNIT_CHUNK - 64, UNIT_CHUNK + 128),
            ] {
                let mut out = vec![0x5au8; len];
                pool.load_part(h, off, &mut out).unwrap();
                assert!(out[..] == data[off..off + len], "{c}: {name}: {off}+{len}");
            }
            let tail = UNIT_SIZE - PAGE_SIZE;
            assert!(
                pool.load_part(h, tail + 8, &mut page).is_err(),
                "past the unit"
            );
            pool.free(h).unwrap();
            // (Zeros are in the handle itself: nothing to free, nothing to refuse.)
            if name != "zeros" {
                assert!(
                    pool.load_part(h, 0, &mut page).is_err(),
                    "{c}: {name}: freed"
                );
            }
        }
        let p = pool.store_page(&page(DataKind::Text, 1, 0)).unwrap();
        assert!(
            pool.load_part(p, 0, &mut [0u8; PAGE_SIZE]).is_err(),
            "a page's handle"
        );
    }
}

#[test]
fn incompressible_units_are_refused_whole_or_kept_raw_at_100_percent() {
    let data = unit(DataKind::Random, 9, 0);
    let pool = pool_with(Compressor::Lz4);
    assert_eq!(pool.store_unit(&data), Err(Reject::PoorCompression));
    let s = pool.stats();
    assert_eq!(
        (s.pool_bytes, s.stored_units, s.reject_poor_compression),
        (0, 0, 1)
    );
    // At 100% a unit of raw chunks is accepted (no chunk grows): it must still round
    // trip.
    pool.set_max_compressed_percent(100).unwrap();
    let h = pool.store_unit(&data).unwrap();
    assert_eq!(pool.compressed_bytes(), UNIT_SIZE as u64);
    let mut out = zero_unit();
    pool.load(h, &mut out[..]).unwrap();
    assert!(out[..] == data[..]);
    pool.free(h).unwrap();
    assert_eq!(pool.pool_bytes(), 0);
}

#[test]
fn misuse_gets_errors_not_panics() {
    let pool = pool_with(Compressor::Lz4);
    let text = page(DataKind::Text, 1, 1);
    let h = pool.store_page(&text).unwrap();
    let u = pool.store_unit(&unit(DataKind::Text, 1, 1)).unwrap();
    let mut small = vec![0u8; 100];
    assert_eq!(
        pool.load(h, &mut small),
        Err(Error::WrongLength {
            handle: h,
            expected: PAGE_SIZE,
            got: 100
        })
    );
    let mut page_buf = [0u8; PAGE_SIZE];
    assert!(matches!(
        pool.load(u, &mut page_buf),
        Err(Error::WrongLength {
            expected: UNIT_SIZE,
            ..
        })
    ));
    pool.free(h).unwrap();
    assert_eq!(pool.free(h), Err(Error::InvalidHandle(h)));
    assert_eq!(pool.load(h, &mut page_buf), Err(Error::InvalidHandle(h)));
    pool.free(u).unwrap();
    assert_eq!(pool.free(u), Err(Error::InvalidHandle(u)));
    let mut unit_buf = zero_unit();
    assert_eq!(
        pool.load(u, &mut unit_buf[..]),
        Err(Error::InvalidHandle(u))
    );
    // A freed handle stays refused after its table entry is reused.
    let h2 = pool.store_page(&text).unwrap();
    assert_ne!(h2, h);
    assert_eq!(pool.load(h, &mut page_buf), Err(Error::InvalidHandle(h)));
    pool.load(h2, &mut page_buf).unwrap();
    // Numbers that are not handles, and handles this pool never made.
    assert_eq!(Handle::from_raw(0), None);
    assert_eq!(Handle::from_raw(u64::MAX), None);
    let other = Zpool::new(Config::default()).unwrap();
    for raw in [
        h2.to_raw(),
        u.to_raw(),
        1 << 40 | 5,
        0xF2 << 40 | 3,
        0xF3 << 40,
    ] {
        let hh = Handle::from_raw(raw).expect("well-formed");
        assert!(other.load(hh, &mut vec![0u8; hh.data_len()]).is_err());
        assert!(other.free(hh).is_err());
    }
    assert_eq!(other.stats().frees, 0);
}

#[test]
fn bad_settings_are_refused() {
    for percent in [0, 101] {
        let e = Zpool::new(Config {
            max_compressed_percent: percent,
            ..Config::default()
        });
        assert!(e.is_err(), "{percent}% accepted");
    }
    assert!(Zpool::new(Config {
        compressor: Compressor::Zstd { level: 99 },
        ..Config::default()
    })
    .is_err());
    let pool = Zpool::new(Config::default()).unwrap();
    assert!(pool.set_max_compressed_percent(0).is_err());
    assert_eq!(pool.max_compressed_percent(), 80);
    assert_eq!(pool.compressor(), Compressor::Lz4);
}
