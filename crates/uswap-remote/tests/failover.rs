//! Servers dying under the remote store (SIGKILL, real local cluster, node timeout 1 s):
//! a primary → its replica takes over and every acknowledged value reads back exact; a
//! primary and its replica → exactly their values are gone, the rest read back exact.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::{page, Cluster};
use uswap_remote::{Completion, RemoteError, RemoteStore};

const DEADLINE: Duration = Duration::from_secs(150);
const BATCH: u64 = 64; // ids per batch: 8 batches per group, one group per batch
const PAGE: usize = 4096;

/// One failover at a time: three clusters of six servers killing and repairing nodes at
/// once on 2 vCPUs starved the store's bounded close (38 of 48 group keys left in CI).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn primary_killed_mid_run_loses_no_acknowledged_write() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(21300, DEADLINE);
    let mut cfg = cluster.config();
    cfg.retry_for = Duration::from_secs(20);
    cfg.wait_timeout = Duration::from_millis(500);
    let store = RemoteStore::connect(cfg).expect("connect");
    assert_eq!(store.replicas_to_wait(), 1);
    let client = store.client(None).unwrap();

    let victim = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary)
        .expect("a primary");
    let heir = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary_of.as_deref() == Some(&victim.id))
        .expect("the victim's replica");

    // batch b writes ids b*64 .. b*64+63 with seed b; 8 batches in flight; the victim dies
    // after batch 150 was submitted; reads of acknowledged ids run all along (the fault path)
    let batches = 300u64;
    let kill_at = 100u64;
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new(); // id -> seed
    let mut failed_batches = 0u64;
    let mut acked_after_kill = 0u64;
    let mut in_flight = HashSet::new();
    let mut next = 0u64;
    let mut done: Vec<Completion> = Vec::new();
    let mut reads_checked = 0u64;
    let mut killed_at = None;
    let end = Instant::now() + Duration::from_secs(100);
    while next < batches || !in_flight.is_empty() {
        assert!(
            Instant::now() < end,
            "run did not finish: {next} submitted, in flight {in_flight:?}, {:?}",
            store.counters()
        );
        while next < batches && in_flight.len() < 8 {
            let items = (next * BATCH..(next + 1) * BATCH)
                .map(|id| (id, page(id, next, PAGE)))
                .collect();
            client.put_batch(next, items);
            in_flight.insert(next);
            next += 1;
            if next == kill_at {
                cluster.kill(victim.port);
                killed_at = Some(Instant::now());
            }
        }
        done.clear();
        client.wait_completions(&mut done, Duration::from_millis(100));
        for c in &done {
            if c.token >= 1 << 32 {
                // a read: exact, or the cluster not answering yet — never other bytes, never lost
                let id = c.token - (1 << 32);
                match &c.result {
                    Ok(Some(bytes)) => {
                        assert!(
                            *bytes == page(id, acked[&id], PAGE),
                            "read of id {id} not exact"
                        );
                        reads_checked += 1;
                    }
                    Err(RemoteError::Unavailable { .. }) => {}
                    other => panic!("read of acknowledged id {id} during failover: {other:?}"),
                }
                continue;
            }
            let b = c.token;
            assert!(in_flight.remove(&b));
            match &c.result {
                Ok(None) => {
                    for id in b * BATCH..(b + 1) * BATCH {
                        acked.insert(id, b);
                    }
                    if b >= kill_at {
                        acked_after_kill += 1;
                    }
                    // read back one acknowledged id of an earlier batch
                    let id = (b * 7919) % ((b + 1) * BATCH);
                    if acked.contains_key(&id) {
                        client.get((1 << 32) + id, id);
                    }
                }
                Err(RemoteError::NotReplicated { .. } | RemoteError::Unavailable { .. }) => {
                    failed_batches += 1
                }
                other => panic!("batch {b}: {other:?}"),
            }
        }
    }
    // drain the last reads
    std::thread::sleep(Duration::from_millis(100));
    done.clear();
    client.poll_completions(&mut done);
    let killed_at = killed_at.expect("the victim was killed");
    eprintln!(
        "acked {} ids, {failed_batches} batches failed, {acked_after_kill} acked after the kill, {reads_checked} reads checked, run {:?} after the kill",
        acked.len(),
        killed_at.elapsed()
    );

    // the replica took over
    cluster.wait_until("the replica is primary", Duration::from_secs(20), |c| {
        c.nodes()
            .iter()
            .any(|n| n.id == heir.id && n.primary && !n.failed)
    });
    // every acknowledged value is still there, exact
    let ids: Vec<u64> = acked.keys().copied().collect();
    for (chunk_ids, results) in ids.chunks(512).map(|ch| (ch, store.get_batch_blocking(ch))) {
        for (&id, r) in chunk_ids.iter().zip(results) {
            assert_eq!(
                r.as_deref().ok(),
                Some(&page(id, acked[&id], PAGE)[..]),
                "acknowledged id {id} after failover: {:?}",
                r.as_ref().err()
            );
        }
    }
    let c = store.counters();
    eprintln!("{c:?}");
    assert!(
        acked.len() as u64 >= batches * BATCH / 2,
        "most batches acknowledged"
    );
    assert!(acked_after_kill > 0, "writes went on after the kill");
    assert!(
        c.connection_losses + c.failovers_seen + c.redirects > 0,
        "the store saw the failover: {c:?}"
    );
    assert_eq!((c.lost, c.corrupt), (0, 0), "{c:?}");
    // new writes to every shard: the orphaned shard's primary has no replica left, so its
    // writes are refused as not replicated (kept by the engine), the others succeed
    let mut refused = 0;
    for g in 0..48u64 {
        let id = 10_000_000 + g * 512;
        match store.put_batch_blocking(vec![(id, page(id, 1, PAGE))]) {
            Ok(()) => assert_eq!(store.get_blocking(id), Ok(page(id, 1, PAGE))),
            Err(RemoteError::NotReplicated {
                acked: 0,
                wanted: 1,
            }) => refused += 1,
            Err(e) => panic!("write after failover: {e}"),
        }
    }
    assert!(
        refused > 0 && refused < 48,
        "only the orphaned shard refuses: {refused} of 48"
    );
    store.close().unwrap();
    assert_eq!(cluster.total_keys(), 0);
}

#[test]
fn primary_and_replica_killed_lose_exactly_their_values() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(21320, DEADLINE);
    let mut cfg = cluster.config();
    cfg.retry_for = Duration::from_secs(3);
    let store = RemoteStore::connect(cfg).expect("connect");
    // 48 groups, 8 ids each
    let ids: Vec<u64> = (0..48u64)
        .flat_map(|g| (0..8).map(move |k| g * 512 + k * 61))
        .collect();
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 5, PAGE))).collect())
        .unwrap();

    let victim = cluster.nodes().into_iter().find(|n| n.primary).unwrap();
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary_of.as_deref() == Some(&victim.id))
        .unwrap();
    let on_victim = |id: u64| {
        let slot = cluster.keyslot(&store.location(id).unwrap().key);
        victim.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    };
    let doomed: HashSet<u64> = ids.iter().copied().filter(|&id| on_victim(id)).collect();
    assert!(
        !doomed.is_empty() && doomed.len() < ids.len(),
        "the victim holds some groups, not all"
    );
    cluster.kill(victim.port);
    cluster.kill(replica.port);

    // while nothing serves those slots: exactly the doomed ids are unavailable (after
    // retry_for), the rest read exact
    let started = Instant::now();
    let results = store.get_batch_blocking(&ids);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by retry_for"
    );
    for (&id, r) in ids.iter().zip(&results) {
        if doomed.contains(&id) {
            assert!(
                matches!(r, Err(RemoteError::Unavailable { .. })),
                "id {id} on the dead shard: {r:?}"
            );
        } else {
            assert_eq!(
                r.as_ref().ok(),
                Some(&page(id, 5, PAGE)),
                "id {id} on a live shard"
            );
        }
    }

    // an operator gives the dead shard's slots to a live primary (the data is gone: no copy
    // survived): those ids now read as Lost, exactly them, the rest still exact
    let live: Vec<u16> = cluster.live_ports();
    for &port in &live {
        for dead in [&victim.id, &replica.id] {
            cluster.cli(port, &["CLUSTER", "FORGET", dead]);
        }
    }
    let heir = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary && !n.failed && n.port != victim.port)
        .unwrap();
    for &(a, b) in &victim.slots {
        let ok = cluster.cli(
            heir.port,
            &["CLUSTER", "ADDSLOTSRANGE", &a.to_string(), &b.to_string()],
        );
        assert_eq!(ok, "OK", "ADDSLOTSRANGE {a} {b}");
    }
    cluster.wait_until("all slots served again", Duration::from_secs(20), |c| {
        live.iter().all(|&p| {
            c.cli(p, &["CLUSTER", "INFO"])
                .contains("cluster_slots_ok:16384")
        })
    });
    // the client learns the new owner on its next redirect; until then the slots still map
    // to the dead node (reads of them say Unavailable)
    let started = Instant::now();
    // each round counts its own Lost reads: compare the last round's
    let mut lost_before;
    let results = loop {
        lost_before = store.counters().lost;
        let results = store.get_batch_blocking(&ids);
        let waiting = results
            .iter()
            .filter(|r| matches!(r, Err(RemoteError::Unavailable { .. })))
            .count();
        eprintln!(
            "after repair +{:?}: {waiting} unavailable",
            started.elapsed()
        );
        if waiting == 0 || started.elapsed() > Duration::from_secs(30) {
            break results;
        }
    };
    for (&id, r) in ids.iter().zip(&results) {
        if doomed.contains(&id) {
            assert!(
                matches!(r, Err(RemoteError::Lost { .. })),
                "id {id} on the dead shard: {r:?}"
            );
        } else {
            assert_eq!(
                r.as_ref().ok(),
                Some(&page(id, 5, PAGE)),
                "id {id} on a live shard"
            );
        }
    }
    let c = store.counters();
    eprintln!("{c:?}");
    assert_eq!(c.lost - lost_before, doomed.len() as u64, "{c:?}");
    assert_eq!(c.corrupt, 0);
    // close deletes what is left (the dead shard's keys are already gone). Its time is
    // bounded (retry_for + op_timeout: a dead cluster must not hold the exit); on a loaded
    // machine, with the cluster just repaired, some deletes may not make it (seen once in
    // CI: 4 of 48 groups). Then close says so, and what it left expires by its TTL: nothing
    // stays for good.
    match store.close() {
        Ok(_) => assert_eq!(cluster.total_keys(), 0),
        Err(err) => {
            eprintln!("close: {err}");
            assert!(
                err.to_string().contains("not deleted at close"),
                "close failed otherwise: {err}"
            );
            // ask the primaries only: a replica answers PTTL with a redirect (an earlier
            // version of this check read that as "no expiry")
            let primaries: Vec<u16> = cluster
                .nodes()
                .into_iter()
                .filter(|n| n.primary && !n.failed && cluster.pid(n.port).is_some())
                .map(|n| n.port)
                .collect();
            for port in primaries {
                let keys = cluster.cli(port, &["--scan", "--pattern", "uswap:*"]);
                for key in keys.lines().map(str::trim).filter(|k| !k.is_empty()) {
                    let answer = cluster.cli(port, &["PTTL", key]);
                    let ttl: i64 = answer
                        .trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("PTTL {key} on {port} answered {answer:?}"));
                    // -2: deleted since the scan; -1: no expiry
                    assert!(ttl != -1, "{key} on {port} left without an expiry");
                }
            }
        }
    }
}

/// Why writes wait for a replica: the same failover with `replicas_to_wait` 0 loses writes
/// the store had acknowledged (reads say `Lost`, never other bytes), while the store waiting
/// for a replica never acknowledged them in the first place.
#[test]
fn without_wait_acknowledged_writes_are_lost_in_a_failover() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(21340, DEADLINE);
    let mut cfg = cluster.config();
    cfg.wait_timeout = Duration::from_millis(500);
    let strict = RemoteStore::connect(cfg.clone()).expect("connect");
    cfg.replicas_to_wait = Some(0);
    let loose = RemoteStore::connect(cfg).expect("connect");
    assert_eq!(
        (strict.replicas_to_wait(), loose.replicas_to_wait()),
        (1, 0)
    );

    let victim = cluster.nodes().into_iter().find(|n| n.primary).unwrap();
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary_of.as_deref() == Some(&victim.id))
        .unwrap();
    // groups of each store that the victim serves (key format: uswap::layout)
    let victim_groups = |store: &RemoteStore, n: usize| -> Vec<u64> {
        (0u64..)
            .filter(|g| {
                let slot = uswap_remote::layout::slot_of(&format!(
                    "uswap:{{{}.{:x}}}",
                    store.prefix_hex(),
                    g
                ));
                victim.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .take(n)
            .collect()
    };
    let ids_of = |groups: &[u64]| -> Vec<u64> {
        groups.iter().flat_map(|g| g * 512..(g + 1) * 512).collect()
    };
    let (strict_groups, loose_groups) = (victim_groups(&strict, 20), victim_groups(&loose, 20));
    let (strict_a, strict_b) = (ids_of(&strict_groups[..4]), ids_of(&strict_groups[4..]));
    let (loose_a, loose_b) = (ids_of(&loose_groups[..4]), ids_of(&loose_groups[4..]));

    // A: written while the replica is healthy (and given time to replicate). With the
    // short WAIT above, a loaded machine can miss the replica's ack for 8 MiB: writing the
    // same values again is what a caller does with NotReplicated, until it is acked.
    let put_replicated = |store: &RemoteStore, ids: &[u64]| {
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            match store.put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, PAGE))).collect())
            {
                Ok(()) => break,
                Err(RemoteError::NotReplicated { .. }) if Instant::now() < give_up => {}
                Err(e) => panic!("phase A write with the replica healthy: {e:?}"),
            }
        }
    };
    put_replicated(&strict, &strict_a);
    put_replicated(&loose, &loose_a);
    std::thread::sleep(Duration::from_millis(300));

    // B: written while the replica is stopped (32 MiB each, more than the sockets buffer),
    // then the primary dies before the replica could have it all
    let replica_pid = cluster.pid(replica.port).unwrap().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &replica_pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let strict_result =
        strict.put_batch_blocking(strict_b.iter().map(|&id| (id, page(id, 2, PAGE))).collect());
    let loose_result =
        loose.put_batch_blocking(loose_b.iter().map(|&id| (id, page(id, 2, PAGE))).collect());
    cluster.kill(victim.port);
    signal("-CONT");
    assert!(
        matches!(
            strict_result,
            Err(RemoteError::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{strict_result:?}"
    );
    assert_eq!(
        loose_result,
        Ok(()),
        "without WAIT the primary's answer is the acknowledgement"
    );

    cluster.wait_until("the replica is primary", Duration::from_secs(30), |c| {
        c.nodes()
            .iter()
            .any(|n| n.id == replica.id && n.primary && !n.failed)
    });
    // what was acknowledged with WAIT is all there
    for (&id, r) in strict_a.iter().zip(strict.get_batch_blocking(&strict_a)) {
        assert_eq!(r, Ok(page(id, 1, PAGE)), "strict id {id}");
    }
    for (&id, r) in loose_a.iter().zip(loose.get_batch_blocking(&loose_a)) {
        assert_eq!(
            r,
            Ok(page(id, 1, PAGE)),
            "loose id {id} (replicated before the stop)"
        );
    }
    // what was acknowledged without WAIT is partly gone; the store says so, per id
    let mut lost = 0;
    for (&id, r) in loose_b.iter().zip(loose.get_batch_blocking(&loose_b)) {
        match r {
            Ok(bytes) => assert!(bytes == page(id, 2, PAGE), "loose id {id}: other bytes"),
            Err(RemoteError::Lost { .. }) => lost += 1,
            Err(e) => panic!("loose id {id}: {e}"),
        }
    }
    eprintln!(
        "without WAIT: {lost} of {} acknowledged writes lost in the failover",
        loose_b.len()
    );
    assert!(
        lost > 0,
        "the failover lost acknowledged writes of the store that did not WAIT"
    );
    assert_eq!(loose.counters().lost, lost);
    assert_eq!(
        strict.counters().lost + strict.counters().corrupt + loose.counters().corrupt,
        0
    );
}
