//! Tests that need the pool's insides: its mappings (to check `pool_bytes` against the
//! kernel's page tables) and its objects (to damage them, as bad memory would).

use crate::handle::Entry;
use crate::{Config, DataKind, Error, Handle, Zpool, PAGE_SIZE, UNIT_SIZE};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// Pages of `[addr, addr + len)` that are in memory (or swapped out by the kernel:
/// still memory the pool holds), from /proc/self/pagemap.
fn resident_pages(addr: usize, len: usize) -> u64 {
    let mut f = File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
    let pages = len / PAGE_SIZE;
    let mut buf = vec![0u8; pages * 8];
    f.seek(SeekFrom::Start((addr / PAGE_SIZE * 8) as u64))
        .unwrap();
    f.read_exact(&mut buf).expect("read pagemap");
    buf.chunks_exact(8)
        .filter(|e| u64::from_ne_bytes((*e).try_into().unwrap()) & (3 << 62) != 0)
        .count() as u64
}

fn pool_resident_bytes(pool: &Zpool) -> u64 {
    pool.objects
        .arena
        .mappings()
        .iter()
        .map(|&(a, l)| resident_pages(a, l))
        .sum::<u64>()
        * PAGE_SIZE as u64
}

fn page(kind: DataKind, i: u64) -> Box<[u8; PAGE_SIZE]> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    kind.fill_page(3, i, &mut p[..]);
    p
}

fn unit(kind: DataKind, i: u64) -> Box<[u8; UNIT_SIZE]> {
    let mut u: Box<[u8; UNIT_SIZE]> = vec![0u8; UNIT_SIZE].into_boxed_slice().try_into().unwrap();
    kind.fill(3, i * 512, &mut u[..]);
    u
}

#[test]
fn pool_bytes_is_exactly_what_the_kernel_has_mapped() {
    let pool = Zpool::new(Config::default()).unwrap();
    assert_eq!(pool.pool_bytes(), 0);
    let mut handles = Vec::new();
    for i in 0..3000 {
        if let Ok(h) = pool.store_page(&page(DataKind::Mixed, i)) {
            handles.push(h);
        }
    }
    for i in 0..4 {
        handles.push(pool.store_unit(&unit(DataKind::Text, i)).unwrap());
    }
    let check = |when: &str| {
        let (held, mapped) = (pool.pool_bytes(), pool_resident_bytes(&pool));
        assert_eq!(
            held, mapped,
            "{when}: pool_bytes {held} but {mapped} resident"
        );
        let zspage_bytes: u64 = pool
            .objects
            .classes()
            .iter()
            .flat_map(|c| c.zspage_spans())
            .map(|(_, pages)| (pages * PAGE_SIZE) as u64)
            .sum();
        assert_eq!(held, zspage_bytes, "{when}: pool_bytes is not the zspages");
    };
    assert!(pool.pool_bytes() > 0);
    check("after stores");
    // Free two of every three: zspages empty (given back at once) or get sparse.
    for (i, h) in handles.iter().enumerate() {
        if i % 3 != 0 {
            pool.free(*h).unwrap();
        }
    }
    check("after frees");
    let before = pool.pool_bytes();
    let freed = pool.compact();
    assert!(freed > 0, "nothing compacted");
    assert_eq!(pool.pool_bytes(), before - freed);
    check("after compaction");
    for (i, h) in handles.iter().enumerate() {
        if i % 3 == 0 {
            pool.free(*h).unwrap();
        }
    }
    assert_eq!(pool.pool_bytes(), 0);
    check("after freeing everything");
}

/// Damage byte `at` of the object of a page handle (0..4 is the back-pointer, 4..8
/// the checksum, 8..10 the length, then the stored bytes).
fn damage(pool: &Zpool, obj: crate::zsmalloc::ObjRef, at: usize) {
    pool.objects
        .write_raw(obj, |slot| slot[at] ^= 0x40)
        .expect("object exists");
}

fn object_of(h: Handle) -> crate::zsmalloc::ObjRef {
    match h.entry() {
        Entry::Object(o) => o,
        e => panic!("not an object: {e:?}"),
    }
}

#[test]
fn damaged_pages_are_refused_never_returned() {
    let pool = Zpool::new(Config::default()).unwrap();
    let data = page(DataKind::Text, 1);
    let mut out = [0u8; PAGE_SIZE];
    // Checksum, length, first, middle and last stored byte.
    for at in [4, 7, 8, 9, 10, 200, 400] {
        let h = pool.store_page(&data).unwrap();
        let obj = object_of(h);
        damage(&pool, obj, at);
        assert_eq!(pool.load(h, &mut out), Err(Error::Corrupt(h)), "byte {at}");
        damage(&pool, obj, at); // undo
        pool.load(h, &mut out).unwrap();
        assert_eq!(out, *data);
        pool.free(h).unwrap();
    }
    assert_eq!(pool.stats().corrupt_loads, 7);
    assert_eq!(pool.stats().stored_pages, 0);
}

/// Pages that compress poorly, stored as they are: exact back, counted while stored,
/// checked like any (a damaged byte is refused), refused when the pool is full;
/// same-filled pages still take no object.
#[test]
fn incompressible_pages_are_stored_as_they_are() {
    let pool = Zpool::new(Config::default()).unwrap();
    let mut out = [0u8; PAGE_SIZE];
    let random: Vec<_> = (0..64).map(|i| page(DataKind::Random, i)).collect();
    let handles: Vec<Handle> = random
        .iter()
        .map(|p| {
            assert_eq!(pool.store_page(p), Err(crate::Reject::PoorCompression));
            pool.store_page_raw(p).unwrap()
        })
        .collect();
    let st = pool.stats();
    assert_eq!(
        (st.incompressible_pages, st.stored_pages),
        (64, 64),
        "{st:?}"
    );
    assert_eq!(st.compressed_bytes, 64 * PAGE_SIZE as u64, "{st:?}");
    for (h, p) in handles.iter().zip(&random) {
        pool.load(*h, &mut out).unwrap();
        assert_eq!(out, **p);
    }
    let obj = object_of(handles[7]);
    damage(&pool, obj, 3000);
    assert_eq!(
        pool.load(handles[7], &mut out),
        Err(Error::Corrupt(handles[7]))
    );
    damage(&pool, obj, 3000);
    let zeros = pool.store_page_raw(&[0u8; PAGE_SIZE]).unwrap();
    assert!(
        !matches!(zeros.entry(), Entry::Object(_)),
        "zeros kept as a word"
    );
    pool.free(zeros).unwrap();
    // A unit's raw chunks (half of it random) are not pages stored as they are.
    let mut half_random = unit(DataKind::Zeros, 1);
    for i in 256..512 {
        half_random[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
            .copy_from_slice(&page(DataKind::Random, i as u64)[..]);
    }
    let u = pool.store_unit(&half_random).unwrap();
    assert_eq!(pool.stats().incompressible_pages, 64);
    pool.free(u).unwrap();
    for h in &handles[..32] {
        pool.free(*h).unwrap();
    }
    let st = pool.stats();
    assert_eq!(
        (st.incompressible_pages, st.stored_pages),
        (32, 32),
        "{st:?}"
    );
    // Full: refused, nothing counted.
    pool.set_limit(pool.total_bytes());
    assert_eq!(
        pool.store_page_raw(&random[0]),
        Err(crate::Reject::PoolFull)
    );
    assert_eq!(pool.stats().incompressible_pages, 32);
    for h in &handles[32..] {
        pool.free(*h).unwrap();
    }
    assert_eq!(pool.stats().incompressible_pages, 0);
    assert_eq!(pool.stats().compressed_bytes, 0);
}

#[test]
fn damaged_unit_chunks_are_refused() {
    for kind in [DataKind::Text, DataKind::Mixed] {
        let pool = Zpool::new(Config {
            max_compressed_percent: 100,
            ..Config::default()
        })
        .unwrap();
        let data = unit(kind, 2);
        let h = pool.store_unit(&data).unwrap();
        let objs = pool.unit_objects(h);
        assert!(objs.len() > 100, "{kind}: {} objects", objs.len());
        let mut out = vec![0u8; UNIT_SIZE];
        for &obj in [objs[0], objs[objs.len() / 2], *objs.last().unwrap()].iter() {
            damage(&pool, obj, 20);
            assert_eq!(pool.load(h, &mut out), Err(Error::Corrupt(h)));
            damage(&pool, obj, 20);
        }
        pool.load(h, &mut out).unwrap();
        assert!(
            out[..] == data[..],
            "{kind}: unit differs after undoing the damage"
        );
        pool.free(h).unwrap();
        assert_eq!(pool.pool_bytes(), 0);
    }
}

#[test]
fn a_damaged_back_pointer_does_not_misdirect_compaction() {
    let pool = Zpool::new(Config::default()).unwrap();
    let pages: Vec<_> = (0..400).map(|i| page(DataKind::Text, i)).collect();
    let handles: Vec<Handle> = pages.iter().map(|p| pool.store_page(p).unwrap()).collect();
    for h in handles.iter().skip(1).step_by(2) {
        pool.free(*h).unwrap();
    }
    // Point every kept object's back-pointer elsewhere: compaction must find the
    // right handle anyway.
    for h in handles.iter().step_by(2) {
        damage(&pool, object_of(*h), 0);
        damage(&pool, object_of(*h), 1);
    }
    assert!(pool.compact() > 0);
    let mut out = [0u8; PAGE_SIZE];
    for (i, h) in handles.iter().enumerate().step_by(2) {
        pool.load(*h, &mut out).unwrap();
        assert!(out == *pages[i], "page {i} wrong after compaction");
    }
}

#[test]
fn metadata_counter_agrees_with_the_tables() {
    let pool = Zpool::new(Config::default()).unwrap();
    // Everything that grows: class tables, record tables, the arena's lists.
    let tables = |pool: &Zpool| -> u64 {
        pool.objects
            .classes()
            .iter()
            .map(|c| c.heap_bytes())
            .sum::<u64>()
            + pool.records.table_heap_bytes()
            + pool.objects.arena.bookkeeping_bytes()
    };
    let fixed = pool.metadata_bytes() - tables(&pool);
    let mut handles = Vec::new();
    for i in 0..5000 {
        if let Ok(h) = pool.store_page(&page(DataKind::Mixed, i)) {
            handles.push(h);
        }
    }
    assert!(
        pool.records.table_heap_bytes() > 0,
        "no odd same-filled page stored"
    );
    assert_eq!(pool.metadata_bytes(), fixed + tables(&pool));
    for h in handles.iter().step_by(2) {
        pool.free(*h).unwrap();
    }
    pool.compact();
    assert_eq!(pool.metadata_bytes(), fixed + tables(&pool));
    for h in handles.iter().skip(1).step_by(2) {
        pool.free(*h).unwrap();
    }
    assert_eq!(pool.pool_bytes(), 0);
    assert_eq!(pool.metadata_bytes(), fixed + tables(&pool));
}
