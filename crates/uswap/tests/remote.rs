//! The remote tier against a real local Redis Cluster (scripts/redis-cluster.sh: 3
//! primaries and 3 replicas on loopback, stopped on drop): byte-exact through it,
//! through compressed + remote, a primary killed mid-run, a cluster down at start.

mod common;

use common::{with_deadline, Cluster};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{FaultMode, Pool, RegionOptions, TierKind, UnitPolicy};

const MIB: u64 = 1 << 20;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Pages of small numbers (compressible) and every third random.
fn word(seed: u64, i: usize) -> u64 {
    if (i / 512).is_multiple_of(3) {
        mix(seed ^ i as u64)
    } else {
        (seed + (i % 61) as u64) & 0xfff
    }
}

fn fill(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(word(seed, i), Relaxed);
    }
}

fn check(words: &[AtomicU64], seed: u64) {
    for (i, w) in words.iter().enumerate() {
        assert_eq!(
            w.load(Relaxed),
            word(seed, i),
            "word {i} (page {})",
            i / 512
        );
    }
}

#[test]
fn pages_round_trip_through_the_remote_tier() {
    with_deadline(300, |t| {
        let c = Cluster::start(22100);
        for (tier, unit, mode) in [
            (TierKind::Remote, UnitPolicy::Small, FaultMode::Handler),
            (TierKind::Remote, UnitPolicy::Huge, FaultMode::Handler),
            (
                TierKind::CompressedRemote,
                UnitPolicy::Auto,
                FaultMode::Handler,
            ),
            // faults served by the faulting thread: its own blocking reads of the cluster
            (TierKind::Remote, UnitPolicy::Small, FaultMode::InThread),
        ] {
            t.phase(format!("{tier:?} {unit:?} {mode:?}"));
            let p = t.pool(
                Pool::builder()
                    .budget(24 * MIB)
                    .tier(tier)
                    .remote(c.nodes())
                    .compressed_max_percent(25),
            );
            let r = p
                .region_with(
                    64 * MIB,
                    RegionOptions {
                        unit: Some(unit),
                        fault_mode: Some(mode),
                        ..Default::default()
                    },
                )
                .unwrap();
            fill(r.as_words(), 1);
            check(r.as_words(), 1);
            fill(r.as_words(), 2);
            check(r.as_words(), 2);
            // one page in four rewritten: a unit stored whole (`--unit 2m`) now has some
            // slots freed and reused by single pages of their own, its value shared by
            // the rest; every byte still exact, twice round
            for round in [3u64, 4] {
                let seed_of = |page: usize| if page % 4 == 1 { round } else { 2 };
                for (i, w) in r.as_words().iter().enumerate() {
                    if (i / 512) % 4 == 1 {
                        w.store(word(round, i), Relaxed);
                    }
                }
                for (i, w) in r.as_words().iter().enumerate() {
                    assert_eq!(w.load(Relaxed), word(seed_of(i / 512), i), "word {i}");
                }
            }
            let n = p.counters();
            assert!(n.remote_writes > 0 && n.remote_reads > 0, "{tier:?}: {n:?}");
            // 4 KiB pages are read on the faulting side's own connections (the runtime
            // is the fallback: a connection still opening, a redirect); whole units
            // always go through the runtime
            if unit == UnitPolicy::Small {
                assert!(
                    n.remote_direct_reads * 2 > n.remote_reads,
                    "most reads direct: {tier:?} {mode:?}: {n:?}"
                );
            }
            assert_eq!(n.poisoned, 0, "{n:?}");
            assert!(n.peak_used_bytes <= 24 * MIB, "{n:?}");
            drop(r);
            drop(p);
            // the pool's end deleted every value it stored
            let keys: u64 = c
                .ports
                .iter()
                .filter(|&&port| c.cli(port, &["role"]).starts_with("master"))
                .map(|&port| {
                    c.cli(port, &["dbsize"])
                        .trim()
                        .parse::<u64>()
                        .expect("dbsize")
                })
                .sum();
            assert_eq!(keys, 0, "{tier:?} {unit:?}: keys left after the pool ended");
        }
    });
}

#[test]
fn a_primary_killed_mid_run_loses_nothing() {
    with_deadline(300, |t| {
        let c = Cluster::start(22200);
        let p = t.pool(
            Pool::builder()
                .budget(16 * MIB)
                .tier(TierKind::Remote)
                .remote(c.nodes()),
        );
        let r = p.region(64 * MIB).unwrap();
        fill(r.as_words(), 3);
        c.kill_a_primary();
        // Faults during and after the failover: every read exact.
        check(r.as_words(), 3);
        fill(r.as_words(), 4);
        check(r.as_words(), 4);
        let n = p.counters();
        assert_eq!(
            n.poisoned, 0,
            "nothing lost with a replica to fail over to: {n:?}"
        );
    });
}

/// Values lost on the cluster with checksums off: each page whose value is gone reads
/// as lost (a system call's copy gets EFAULT where the program would get SIGBUS), never
/// as zeros or as another page's bytes, which nothing else would catch (a read's frame
/// may hold the last page read into it).
#[test]
fn lost_values_without_checksums_are_poisoned_not_read() {
    with_deadline(300, |t| {
        let c = Cluster::start(22400);
        let p = t.pool(
            Pool::builder()
                .budget(16 * MIB)
                .tier(TierKind::Remote)
                .remote(c.nodes())
                .checksums(false),
        );
        let r = common::region_of(&p, 48 * MIB, UnitPolicy::Small);
        fill(r.as_words(), 5);
        check(r.as_words(), 5);
        for &port in &c.ports {
            if c.cli(port, &["role"]).starts_with("master") {
                assert_eq!(c.cli(port, &["flushall"]).trim(), "OK");
            }
        }
        // SAFETY: memfd_create with a NUL-terminated name; the fd is fresh and ours.
        let memfd = unsafe { libc::memfd_create(c"uswap-lost".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(
            memfd >= 0,
            "memfd_create: {}",
            std::io::Error::last_os_error()
        );
        let pages = r.as_words().len() / 512;
        let (mut lost, mut exact) = (0, 0);
        for page in 0..pages {
            let src = r.as_ptr() as usize + page * 4096;
            // SAFETY: the kernel copies 4 KiB of the region's live mapping into the memfd
            // (a fault on it is served by the pool, or fails with EFAULT when lost).
            let n = unsafe { libc::pwrite(memfd, src as *const libc::c_void, 4096, 0) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "page {page}: {err}");
                lost += 1;
                continue;
            }
            let mut buf = [0u64; 512];
            // SAFETY: reads 4 KiB into a live buffer of that length.
            let m = unsafe { libc::pread(memfd, buf.as_mut_ptr().cast(), 4096, 0) };
            assert_eq!(m, 4096);
            for (k, &w) in buf.iter().enumerate() {
                assert_eq!(
                    w,
                    word(5, page * 512 + k),
                    "page {page} word {k}: not its bytes"
                );
            }
            exact += 1;
        }
        // SAFETY: closes the memfd made above.
        unsafe { libc::close(memfd) };
        let n = p.counters();
        assert!(
            lost > pages / 2,
            "{lost} of {pages} pages lost, {exact} exact: {n:?}"
        );
        assert_eq!(n.poisoned, lost as u64, "{n:?}");
    });
}

#[test]
fn a_cluster_down_at_start_is_a_clear_error() {
    // Nothing listens there.
    let e = Pool::builder()
        .budget(16 * MIB)
        .tier(TierKind::Remote)
        .remote("redis://127.0.0.1:1")
        .build()
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("remote tier") && msg.contains("127.0.0.1:1"),
        "{msg}"
    );
    let e = Pool::builder()
        .budget(16 * MIB)
        .tier(TierKind::Remote)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("--remote"), "{e}");
}
