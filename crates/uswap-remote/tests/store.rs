//! The remote store against a real local Redis Cluster (scripts/redis-cluster.sh): exact
//! bytes, damage detection, TTL, cleanup, privacy, clear errors at connect.

mod common;

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::Duration;

use common::{page, Cluster};
use uswap_remote::{Completion, DirectReads, RemoteClient, RemoteConfig, RemoteError, RemoteStore};

const DEADLINE: Duration = Duration::from_secs(120);

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd(2) with valid flags; a non-negative return is a new fd we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just created and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The eventfd's counter (0 when it was not written), reset.
fn eventfd_take(fd: &OwnedFd) -> u64 {
    use std::io::Read;
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    let mut buf = [0u8; 8];
    match f.read(&mut buf) {
        Ok(8) => u64::from_ne_bytes(buf),
        _ => 0,
    }
}

/// Waits for `n` completions (at most 60 s).
fn collect(client: &uswap_remote::RemoteClient, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while done.len() < n {
        assert!(
            std::time::Instant::now() < end,
            "only {} of {n} completions in 60 s",
            done.len()
        );
        client.wait_completions(&mut done, Duration::from_millis(200));
    }
    assert_eq!(done.len(), n, "no extra completions");
    done
}

/// Waits for `n` completions of direct reads (here, or handed on to the client's queue),
/// polling the sockets the way an engine thread's ring would (at most 60 s).
fn collect_direct(d: &mut DirectReads, client: &RemoteClient, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    let mut tokens = Vec::new();
    while done.len() < n {
        assert!(
            std::time::Instant::now() < end,
            "only {} of {n} completions in 60 s",
            done.len()
        );
        tokens.clear();
        d.arm(|token, _fd| tokens.push(token));
        for &t in &tokens {
            d.readable(t);
        }
        d.expire();
        d.poll_completions(&mut done);
        client.wait_completions(&mut done, Duration::from_millis(1));
    }
    assert_eq!(done.len(), n, "no extra completions");
    done
}

/// Direct reads of `ids` (tokens: their index), checked against `want`.
fn direct_reads_exact(
    d: &mut DirectReads,
    client: &RemoteClient,
    ids: &[u64],
    want: impl Fn(u64) -> Result<Vec<u8>, RemoteError>,
) {
    d.get_batch(
        ids.iter()
            .enumerate()
            .map(|(t, &id)| (t as u64, id))
            .collect(),
    );
    for c in collect_direct(d, client, ids.len()) {
        let id = ids[c.token as usize];
        assert_eq!(c.result, want(id).map(Some), "id {id}");
    }
}

#[test]
fn pages_and_units_read_back_exact() {
    let cluster = Cluster::start(21100, DEADLINE);
    let store = RemoteStore::connect(cluster.config()).expect("connect");
    assert_eq!(
        store.replicas_to_wait(),
        1,
        "3+3 cluster: WAIT for one replica"
    );
    let efd = eventfd();
    let client = store.client(Some(efd.as_fd())).unwrap();

    // 4 KiB pages: 2000 ids over several groups, in batches of 100, through the async client
    let ids: Vec<u64> = (0..2000u64).map(|i| i * 3 + 1).collect();
    for (n, chunk) in ids.chunks(100).enumerate() {
        client.put_batch(
            n as u64,
            chunk.iter().map(|&id| (id, page(id, 1, 4096))).collect(),
        );
    }
    let done = collect(&client, ids.len() / 100);
    assert!(
        done.iter().all(|c| c.result == Ok(None)),
        "{:?}",
        done.iter().find(|c| c.result.is_err())
    );
    assert!(eventfd_take(&efd) > 0, "completions wrote the eventfd");

    // single gets and a batched get, exact
    for (t, &id) in ids.iter().enumerate().step_by(7) {
        client.get(t as u64, id);
    }
    let done = collect(&client, ids.len().div_ceil(7));
    for c in done {
        let id = ids[c.token as usize];
        assert_eq!(c.result, Ok(Some(page(id, 1, 4096))), "id {id}");
    }
    client.get_batch(
        ids.iter()
            .enumerate()
            .map(|(t, &id)| (t as u64, id))
            .collect(),
    );
    for c in collect(&client, ids.len()) {
        let id = ids[c.token as usize];
        assert_eq!(c.result, Ok(Some(page(id, 1, 4096))), "id {id}");
    }

    // 2 MiB units (ids 512 apart, as the engine gives them) and odd sizes (compressed values)
    let units: Vec<u64> = (0..12u64).map(|u| 1_000_000 + u * 512).collect();
    store
        .put_batch_blocking(units.iter().map(|&id| (id, page(id, 2, 2 << 20))).collect())
        .expect("units written");

    // direct reads (an engine thread's own connections), exact: the first requests to a
    // node go through the runtime while its connection opens, later ones go direct
    let mut d = client.direct().expect("direct reads without TLS");
    let before = store.counters();
    direct_reads_exact(&mut d, &client, &ids, |id| Ok(page(id, 1, 4096)));
    let mid = store.counters();
    assert_eq!(
        (mid.direct_reads - before.direct_reads) + (mid.direct_handed_on - before.direct_handed_on),
        ids.len() as u64,
        "{mid:?}"
    );
    direct_reads_exact(&mut d, &client, &ids, |id| Ok(page(id, 1, 4096)));
    direct_reads_exact(&mut d, &client, &units, |id| Ok(page(id, 2, 2 << 20)));
    direct_reads_exact(&mut d, &client, &[77], |id| {
        Err(RemoteError::NotStored { id })
    });
    let warm = store.counters();
    assert_eq!(
        warm.direct_reads - mid.direct_reads,
        (ids.len() + units.len()) as u64,
        "connected: every stored value read direct: {warm:?}"
    );
    assert_eq!(d.owed(), 0);
    // a wrong route (every request to one primary): the others answer MOVED, and those
    // reads end through the runtime, exact
    let one = cluster
        .primary_of_slot(cluster.keyslot(&store.location(ids[0]).unwrap().key))
        .unwrap()
        .port;
    d.pin_node_for_tests(&format!("127.0.0.1:{one}"));
    direct_reads_exact(&mut d, &client, &ids, |id| Ok(page(id, 1, 4096)));
    let pinned = store.counters();
    assert!(
        pinned.direct_reads > warm.direct_reads
            && pinned.direct_handed_on > warm.direct_handed_on
            && pinned.redirects > warm.redirects,
        "some read direct, others redirected through the runtime: {pinned:?}"
    );
    let direct_total = pinned.reads - before.reads;
    let odd: Vec<(u64, Vec<u8>)> = (0..50u64)
        .map(|i| (5_000_000 + i, page(i, 3, (i as usize * 977) % 9000)))
        .collect();
    store
        .put_batch_blocking(odd.clone())
        .expect("odd sizes written");
    for (&id, got) in units.iter().zip(store.get_batch_blocking(&units)) {
        assert!(
            got.as_ref().ok() == Some(&page(id, 2, 2 << 20)),
            "unit {id}"
        );
    }
    for (id, want) in &odd {
        assert_eq!(store.get_blocking(*id).as_ref(), Ok(want), "odd {id}");
    }

    // a rewrite replaces the value; the old field is deleted once the new write is acknowledged
    let old_loc = store.location(ids[0]).unwrap();
    store
        .put_batch_blocking(vec![(ids[0], page(ids[0], 9, 4096))])
        .unwrap();
    assert_eq!(store.get_blocking(ids[0]), Ok(page(ids[0], 9, 4096)));
    let new_loc = store.location(ids[0]).unwrap();
    assert_ne!(old_loc.field, new_loc.field);
    assert!(store.quiesce(Duration::from_secs(10)));
    let port = cluster
        .primary_of_slot(cluster.keyslot(&old_loc.key))
        .unwrap()
        .port;
    assert_eq!(
        cluster.hget_raw(port, &old_loc.key, &old_loc.field),
        None,
        "replaced field deleted"
    );

    // never written → NotStored, not zeros
    assert_eq!(
        store.get_blocking(77),
        Err(RemoteError::NotStored { id: 77 })
    );

    let c = store.counters();
    assert_eq!(
        c.writes,
        ids.len() as u64 + units.len() as u64 + odd.len() as u64 + 1
    );
    let reads = ids.len().div_ceil(7) + ids.len() + units.len() + odd.len() + 1;
    assert_eq!(c.reads, reads as u64 + direct_total, "{c:?}");
    assert_eq!(c.read_errors, 2, "the NotStored reads: {c:?}");
    assert_eq!((c.lost, c.corrupt, c.write_errors), (0, 0, 0), "{c:?}");
    assert!(c.get_latency.count > 0 && c.get_latency.p50_us > 0, "{c:?}");
    assert!(c.put_latency.count > 0, "{c:?}");
    let report = store.close().expect("close");
    assert!(report.groups_deleted > 0);
    assert_eq!(cluster.total_keys(), 0, "close left keys behind");
    // a client that outlives its store still gets one completion per request
    client.get(1, ids[0]);
    client.put_batch(2, vec![(ids[0], page(ids[0], 1, 4096))]);
    client.get_batch(vec![(3, ids[1]), (4, ids[2])]);
    let mut done = collect(&client, 4);
    done.sort_by_key(|c| c.token);
    assert!(
        done.iter().all(|c| c.result == Err(RemoteError::Closed)),
        "{done:?}"
    );
}

#[test]
fn damaged_values_are_corrupt_and_missing_values_lost() {
    let cluster = Cluster::start(21120, DEADLINE);
    let store = RemoteStore::connect(cluster.config()).expect("connect");
    let ids: Vec<u64> = (0..40).collect(); // one group
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, 4096))).collect())
        .unwrap();
    let loc = |id| store.location(id).unwrap();
    let port = cluster
        .primary_of_slot(cluster.keyslot(&loc(0).key))
        .unwrap()
        .port;
    let raw = |id| {
        cluster
            .hget_raw(port, &loc(id).key, &loc(id).field)
            .expect("value there")
    };

    // a flipped payload byte (written with redis-cli, binary via stdin)
    let mut v = raw(1);
    v[100] ^= 1;
    let l = loc(1);
    assert_eq!(
        cluster.cli_with_value(port, &["HSET", &l.key, &l.field], &v),
        "0"
    );
    // another id's value under this id's field
    let l = loc(2);
    cluster.hset_raw(port, &l.key, &l.field, &raw(3));
    // truncated
    let v = raw(4);
    let l = loc(4);
    cluster.hset_raw(port, &l.key, &l.field, &v[..v.len() - 10]);
    // zeros of the right length
    let l = loc(5);
    cluster.hset_raw(port, &l.key, &l.field, &vec![0u8; v.len()]);
    // gone
    let l = loc(6);
    assert_eq!(cluster.cli(port, &["HDEL", &l.key, &l.field]), "1");

    let results = store.get_batch_blocking(&ids);
    for (&id, r) in ids.iter().zip(&results) {
        match id {
            1 | 2 | 4 | 5 => assert!(
                matches!(r, Err(RemoteError::Corrupt { id: i, .. }) if *i == id),
                "id {id}: {r:?}"
            ),
            6 => assert!(
                matches!(r, Err(RemoteError::Lost { id: 6, .. })),
                "id 6: {r:?}"
            ),
            _ => assert_eq!(r.as_ref().ok(), Some(&page(id, 1, 4096)), "id {id}"),
        }
    }
    assert!(
        matches!(&results[2], Err(RemoteError::Corrupt { why, .. }) if why.contains("checksum") || why.contains("id 3"))
    );
    let c = store.counters();
    assert_eq!((c.corrupt, c.lost), (4, 1), "{c:?}");
    assert!(
        results
            .iter()
            .filter(|r| r.as_ref().is_err_and(|e| e.is_data_loss()))
            .count()
            == 5
    );

    // direct reads accept only what passes the checks: the damaged and the missing go
    // through the runtime and end the same way; twice, so the second goes direct
    let client = store.client(None).unwrap();
    let mut d = client.direct().expect("direct reads");
    let mut first = store.counters();
    for round in 0..2 {
        if round == 1 {
            first = store.counters();
        }
        d.get_batch(ids.iter().map(|&id| (id, id)).collect());
        for c in collect_direct(&mut d, &client, ids.len()) {
            let (id, r) = (c.token, c.result);
            match id {
                1 | 2 | 4 | 5 => assert!(
                    matches!(r, Err(RemoteError::Corrupt { id: i, .. }) if i == id),
                    "round {round}, id {id}: {r:?}"
                ),
                6 => assert!(
                    matches!(r, Err(RemoteError::Lost { id: 6, .. })),
                    "round {round}, id 6: {r:?}"
                ),
                _ => assert_eq!(r, Ok(Some(page(id, 1, 4096))), "round {round}, id {id}"),
            }
        }
    }
    let after = store.counters();
    assert_eq!((after.corrupt, after.lost), (12, 3), "{after:?}");
    assert_eq!(
        after.direct_reads - first.direct_reads,
        35,
        "the good values of round 2: {after:?}"
    );
}

/// A group's fields and its key's expiry land together or not at all: a user that may
/// write fields but neither set expiries nor delete fields (an ACL, standing in for a
/// connection lost or a replica promoted between the two commands, then the pool
/// killed before it could clean up) gets its write refused whole, and no key is left
/// without an expiry. Pipelined apart, the fields landed and the key had none
/// (PTTL -1: kept forever once the pool is killed).
#[test]
fn a_group_never_lands_without_its_expiry() {
    let cluster = Cluster::start(21260, DEADLINE);
    for &port in &cluster.ports {
        let ok = cluster.cli(
            port,
            &[
                "ACL",
                "SETUSER",
                "nottl",
                "on",
                ">nottl-pw",
                "~uswap:*",
                "+@all",
                "-pexpire",
                "-hdel",
            ],
        );
        assert_eq!(ok, "OK");
    }
    let mut cfg = cluster.config();
    cfg.username = Some("nottl".into());
    cfg.password = Some("nottl-pw".into());
    let store = RemoteStore::connect(cfg).expect("connect as nottl");
    let ids: Vec<u64> = (0..1500).collect(); // 3 groups
    let err = store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, 512))).collect())
        .unwrap_err();
    assert!(matches!(err, RemoteError::Denied { .. }), "{err}");
    let no_expiry: Vec<String> = cluster
        .nodes()
        .iter()
        .filter(|n| n.primary)
        .flat_map(|n| {
            let keys = cluster.cli(n.port, &["KEYS", "*"]);
            keys.lines()
                .filter(|k| !k.is_empty())
                .filter(|k| cluster.cli(n.port, &["PTTL", k]).trim() == "-1")
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(no_expiry.is_empty(), "keys with no expiry: {no_expiry:?}");
    assert_eq!(cluster.total_keys(), 0, "nothing written");
    drop(store);
    // The same writes by a user that may set expiries: every key has one.
    let store = RemoteStore::connect(cluster.config()).expect("connect");
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 2, 512))).collect())
        .unwrap();
    for &id in &[0, 600, 1100] {
        assert_eq!(store.get_blocking(id), Ok(page(id, 2, 512)));
        let key = store.location(id).unwrap().key;
        let port = cluster.primary_of_slot(cluster.keyslot(&key)).unwrap().port;
        let pttl: i64 = cluster.cli(port, &["PTTL", &key]).parse().unwrap();
        assert!(pttl > 0, "group of id {id}: PTTL {pttl}");
    }
    store.close().unwrap();
}

#[test]
fn ttl_is_set_refreshed_and_close_deletes_everything() {
    let cluster = Cluster::start(21140, DEADLINE);
    let mut cfg = cluster.config();
    cfg.key_ttl = Duration::from_secs(8);
    let store = RemoteStore::connect(cfg).expect("connect");
    let ids: Vec<u64> = (0..3000).collect(); // 6 groups
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, 1024))).collect())
        .unwrap();
    let pttl = |id: u64| -> i64 {
        let key = store.location(id).unwrap().key;
        let port = cluster.primary_of_slot(cluster.keyslot(&key)).unwrap().port;
        cluster.cli(port, &["PTTL", &key]).parse().unwrap()
    };
    let first = pttl(0);
    assert!(
        first > 6000 && first <= 8000,
        "TTL set on write: {first} ms"
    );
    for id in (0..3000).step_by(512) {
        store.refresh_ttl_blocking().unwrap();
        let refreshed = pttl(id);
        assert!(
            refreshed > 7000 && refreshed <= 8000,
            "refresh sets the full TTL again: {refreshed} ms"
        );
    }
    // the background refresh (every 2 s here) keeps keys alive well past their TTL
    std::thread::sleep(Duration::from_secs(12));
    assert!(
        store.get_batch_blocking(&ids).iter().all(|r| r.is_ok()),
        "keys kept alive"
    );
    assert!(
        store.counters().ttl_refreshes >= 6 * 3,
        "{:?}",
        store.counters()
    );

    // deletes remove the fields; a group whose ids are all deleted disappears
    store.delete_batch(&ids[..512]);
    assert!(store.quiesce(Duration::from_secs(10)));
    assert_eq!(store.get_blocking(0), Err(RemoteError::NotStored { id: 0 }));
    assert_eq!(cluster.total_keys(), 5, "group 0 deleted, 5 left");
    assert_eq!(store.counters().deletes, 512);
    assert_eq!(store.counters().live_ids, ids.len() as u64 - 512);

    // the engine frees slots one at a time: those deletes go out together, a request per
    // group per round, not one per id (one each once queued 262k requests that timed out)
    let before = store.counters().delete_requests;
    for &id in &ids[512..1024] {
        store.delete_batch(&[id]);
    }
    assert!(store.quiesce(Duration::from_secs(10)));
    assert_eq!(cluster.total_keys(), 4, "group 1 deleted, 4 left");
    let requests = store.counters().delete_requests - before;
    assert!(
        requests <= 512 / 4,
        "{requests} HDEL requests for 512 single deletes"
    );

    let report = store.close().unwrap();
    assert_eq!(report.groups_deleted, 4);
    assert_eq!(cluster.total_keys(), 0, "close deleted every key");
}

/// Run by `keys_left_by_a_killed_process_expire` in a child process: writes 1024 ids to the
/// cluster named in USWAP_REMOTE_CHILD_NODES, then dies by SIGKILL (no close, no refresh).
#[test]
#[ignore = "helper: run as a child process by keys_left_by_a_killed_process_expire"]
fn child_writes_then_is_killed() {
    let nodes = std::env::var("USWAP_REMOTE_CHILD_NODES").expect("run by its parent test");
    let mut cfg = RemoteConfig::new(nodes.split(','));
    cfg.key_ttl = Duration::from_secs(4);
    let store = RemoteStore::connect(cfg).expect("connect");
    store
        .put_batch_blocking((0..1024).map(|id| (id, page(id, 1, 512))).collect())
        .unwrap();
    println!("CHILD-WROTE");
    // SAFETY: kill(2) on our own pid.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL");
}

#[test]
fn keys_left_by_a_killed_process_expire() {
    let cluster = Cluster::start(21160, DEADLINE);
    let nodes: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_writes_then_is_killed",
            "--nocapture",
        ])
        .env("USWAP_REMOTE_CHILD_NODES", nodes.join(","))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("CHILD-WROTE"),
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "the child died by SIGKILL"
    );
    assert_eq!(
        cluster.total_keys(),
        2,
        "the killed process left its 2 group keys"
    );
    cluster.wait_until("keys expired", Duration::from_secs(15), |c| {
        c.total_keys() == 0
    });
}

/// A page that lz4 shrinks to about a third: words from a small vocabulary, varied by id.
fn text_page(id: u64, seed: u64, len: usize) -> Vec<u8> {
    let words: [&[u8]; 6] = [b"alpha ", b"swap ", b"page ", b"fault ", b"unit ", b"slot "];
    let mut v = Vec::with_capacity(len + 16);
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(words[(x % 6) as usize]);
        if x.is_multiple_of(5) {
            v.extend_from_slice(&id.to_le_bytes());
        }
    }
    v.truncate(len);
    v
}

#[test]
fn compressible_values_are_stored_compressed_and_read_back_exact() {
    let cluster = Cluster::start(21240, DEADLINE);
    let store = RemoteStore::connect(cluster.config()).expect("connect");
    let efd = eventfd();
    let client = store.client(Some(efd.as_fd())).unwrap();
    // text-like pages, zero pages and noise, interleaved; 2 MiB text-like units
    let want = |id: u64| match id % 3 {
        0 => text_page(id, 1, 4096),
        1 => vec![0u8; 4096],
        _ => page(id, 1, 4096),
    };
    let ids: Vec<u64> = (0..600u64).collect();
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, want(id))).collect())
        .expect("pages written");
    let units: Vec<u64> = (0..4u64).map(|u| 2_000_000 + u * 512).collect();
    store
        .put_batch_blocking(
            units
                .iter()
                .map(|&id| (id, text_page(id, 2, 2 << 20)))
                .collect(),
        )
        .expect("units written");
    let c = store.counters();
    let raw = (ids.len() * 4096 + units.len() * (2 << 20)) as u64;
    assert_eq!(c.bytes_out, raw, "{c:?}");
    assert!(
        c.stored_bytes_out < raw / 2,
        "text and zeros stored compressed: {} of {raw} bytes",
        c.stored_bytes_out
    );
    // in the cluster: a text page's value is smaller than the page, noise's is not
    let stored_len = |id: u64| {
        let l = store.location(id).unwrap();
        let port = cluster
            .primary_of_slot(cluster.keyslot(&l.key))
            .unwrap()
            .port;
        cluster.hget_raw(port, &l.key, &l.field).unwrap().len()
    };
    assert!(
        stored_len(3) < 4096 / 2,
        "text page: {} bytes",
        stored_len(3)
    );
    assert!(stored_len(5) > 4096, "noise: {} bytes", stored_len(5));
    // back exact: through the runtime, and on the thread's own connections
    for (&id, got) in ids.iter().zip(store.get_batch_blocking(&ids)) {
        assert_eq!(got, Ok(want(id)), "id {id}");
    }
    for (&id, got) in units.iter().zip(store.get_batch_blocking(&units)) {
        assert!(
            got.as_ref().ok() == Some(&text_page(id, 2, 2 << 20)),
            "unit {id}"
        );
    }
    let mut d = client.direct().expect("direct reads without TLS");
    direct_reads_exact(&mut d, &client, &ids, |id| Ok(want(id)));
    direct_reads_exact(&mut d, &client, &ids, |id| Ok(want(id)));
    direct_reads_exact(&mut d, &client, &units, |id| Ok(text_page(id, 2, 2 << 20)));
    // a flipped bit in a compressed value is caught, not decompressed into a page
    let l = store.location(3).unwrap();
    let port = cluster
        .primary_of_slot(cluster.keyslot(&l.key))
        .unwrap()
        .port;
    let mut bad = cluster.hget_raw(port, &l.key, &l.field).unwrap();
    bad[10] ^= 0x40;
    cluster.hset_raw(port, &l.key, &l.field, &bad);
    assert!(matches!(
        store.get_blocking(3),
        Err(RemoteError::Corrupt { id: 3, .. })
    ));
    let c = store.counters();
    assert_eq!((c.lost, c.write_errors), (0, 0), "{c:?}");
    store.close().unwrap();

    // with compression off every value is stored as it is
    let mut cfg = cluster.config();
    cfg.compress = false;
    let plain = RemoteStore::connect(cfg).expect("connect");
    plain
        .put_batch_blocking(ids.iter().map(|&id| (id, want(id))).collect())
        .unwrap();
    let c = plain.counters();
    assert_eq!(c.stored_bytes_out, c.bytes_out, "{c:?}");
    for (&id, got) in ids.iter().zip(plain.get_batch_blocking(&ids)) {
        assert_eq!(got, Ok(want(id)), "id {id}");
    }
    plain.close().unwrap();
    assert_eq!(cluster.total_keys(), 0);
}

#[test]
fn prefixes_are_private() {
    let cluster = Cluster::start(21180, DEADLINE);
    let a = RemoteStore::connect(cluster.config()).unwrap();
    let b = RemoteStore::connect(cluster.config()).unwrap();
    assert_ne!(a.prefix_hex(), b.prefix_hex());
    assert_eq!(a.prefix_hex().len(), 32);
    assert!(a.prefix_hex().chars().all(|c| c.is_ascii_hexdigit()));
    let ids: Vec<u64> = (0..100).collect();
    a.put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, 4096))).collect())
        .unwrap();
    // b has nothing under the same ids
    assert!(b
        .get_batch_blocking(&ids)
        .iter()
        .all(|r| matches!(r, Err(RemoteError::NotStored { .. }))));
    b.put_batch_blocking(ids.iter().map(|&id| (id, page(id, 2, 4096))).collect())
        .unwrap();
    for (&id, (ra, rb)) in ids.iter().zip(
        a.get_batch_blocking(&ids)
            .into_iter()
            .zip(b.get_batch_blocking(&ids)),
    ) {
        assert_eq!(ra, Ok(page(id, 1, 4096)));
        assert_eq!(rb, Ok(page(id, 2, 4096)));
    }
    // a's value copied under b's key: b detects it is not its own (the prefix is in the checksum)
    let (la, lb) = (a.location(7).unwrap(), b.location(7).unwrap());
    assert_ne!(la.key, lb.key);
    let pa = cluster
        .primary_of_slot(cluster.keyslot(&la.key))
        .unwrap()
        .port;
    let pb = cluster
        .primary_of_slot(cluster.keyslot(&lb.key))
        .unwrap()
        .port;
    let stolen = cluster.hget_raw(pa, &la.key, &la.field).unwrap();
    cluster.hset_raw(pb, &lb.key, &lb.field, &stolen);
    assert!(matches!(
        b.get_blocking(7),
        Err(RemoteError::Corrupt { id: 7, .. })
    ));
    a.close().unwrap();
    b.close().unwrap();
    assert_eq!(cluster.total_keys(), 0);
}

#[test]
fn connect_errors_are_clear() {
    // nothing listening
    let mut cfg = RemoteConfig::new(["redis://127.0.0.1:1", "127.0.0.1:2"]);
    cfg.op_timeout = Duration::from_millis(500);
    cfg.wait_timeout = Duration::from_millis(100);
    let err = RemoteStore::connect(cfg).err().expect("no cluster");
    assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");

    // a standalone redis-server is not a cluster
    // a free port (nothing listens there once the probe socket is closed)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("uswap-remote-standalone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/redis-cluster.sh installs it)");
    struct Kill(std::process::Child, std::path::PathBuf);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _server_guard = {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < end,
                "standalone redis did not start"
            );
            if let Ok(Some(st)) = server.try_wait() {
                panic!("standalone redis exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Kill(server, dir)
    };
    let err = RemoteStore::connect(RemoteConfig::new([format!("127.0.0.1:{port}")]))
        .err()
        .expect("not a cluster");
    assert!(matches!(err, RemoteError::NotACluster { .. }), "{err}");

    // a cluster with a password: refused without it, works with it; down once stopped
    let cluster = Cluster::start_with(21200, DEADLINE, Some("s3cret-pw"), false);
    let mut cfg = cluster.config();
    cfg.password = None;
    let err = RemoteStore::connect(cfg.clone())
        .err()
        .expect("no password");
    assert!(matches!(err, RemoteError::Denied { .. }), "{err}");
    cfg.password = Some("wrong".into());
    let err = RemoteStore::connect(cfg.clone())
        .err()
        .expect("wrong password");
    assert!(matches!(err, RemoteError::Denied { .. }), "{err}");
    let store = RemoteStore::connect(cluster.config()).expect("right password");
    store
        .put_batch_blocking(vec![(1, page(1, 1, 4096))])
        .unwrap();
    assert_eq!(store.get_blocking(1), Ok(page(1, 1, 4096)));
    store.close().unwrap();

    // ACL users (set on every node: ACLs are per node): one allowed the pool's keys, one not
    for &port in &cluster.ports {
        let ok = cluster.cli(
            port,
            &[
                "ACL", "SETUSER", "pool", "on", ">pool-pw", "~uswap:*", "+@all",
            ],
        );
        assert_eq!(ok, "OK");
        let ok = cluster.cli(
            port,
            &[
                "ACL",
                "SETUSER",
                "other",
                "on",
                ">other-pw",
                "~other:*",
                "+@all",
            ],
        );
        assert_eq!(ok, "OK");
    }
    let mut cfg = cluster.config();
    cfg.username = Some("pool".into());
    cfg.password = Some("pool-pw".into());
    let store = RemoteStore::connect(cfg.clone()).expect("ACL user pool");
    store
        .put_batch_blocking(vec![(2, page(2, 1, 4096))])
        .unwrap();
    assert_eq!(store.get_blocking(2), Ok(page(2, 1, 4096)));
    store.close().unwrap();
    cfg.password = Some("wrong".into());
    let err = RemoteStore::connect(cfg.clone())
        .err()
        .expect("wrong ACL password");
    assert!(matches!(err, RemoteError::Denied { .. }), "{err}");
    cfg.username = Some("other".into());
    cfg.password = Some("other-pw".into());
    let store = RemoteStore::connect(cfg).expect("ACL user other may connect");
    let err = store
        .put_batch_blocking(vec![(3, page(3, 1, 4096))])
        .unwrap_err();
    assert!(
        matches!(err, RemoteError::Denied { .. }),
        "keys outside its ACL: {err}"
    );
    drop(store);

    // a store whose cluster dies: close gives up within retry_for + op_timeout, says so
    let mut cfg = cluster.config();
    cfg.retry_for = Duration::from_secs(2);
    cfg.op_timeout = Duration::from_millis(1500);
    let orphan = RemoteStore::connect(cfg).unwrap();
    orphan
        .put_batch_blocking((0..2048).map(|id| (id, page(id, 1, 64))).collect())
        .unwrap();
    // replicas_to_wait above what the cluster has is refused
    let mut cfg = cluster.config();
    cfg.replicas_to_wait = Some(2);
    let err = RemoteStore::connect(cfg)
        .err()
        .expect("2 replicas asked, 1 there");
    assert!(
        matches!(err, RemoteError::Config(ref m) if m.contains("replicas_to_wait")),
        "{err}"
    );
    let cfg = cluster.config();
    drop(cluster);
    let started = std::time::Instant::now();
    let err = orphan.close().unwrap_err();
    assert!(matches!(err, RemoteError::Unavailable { .. }), "{err}");
    assert!(
        err.to_string().contains("4 of 4 group keys not deleted"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "close took {:?}",
        started.elapsed()
    );
    let mut cfg = cfg;
    cfg.op_timeout = Duration::from_millis(500);
    cfg.wait_timeout = Duration::from_millis(100);
    let err = RemoteStore::connect(cfg).err().expect("cluster stopped");
    assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
}

#[test]
fn tls_cluster_round_trip() {
    let cluster = Cluster::start_with(21220, DEADLINE, None, true);
    let store = RemoteStore::connect(cluster.config()).expect("connect over TLS");
    let ids: Vec<u64> = (0..600).collect();
    store
        .put_batch_blocking(ids.iter().map(|&id| (id, page(id, 1, 4096))).collect())
        .unwrap();
    store
        .put_batch_blocking(vec![(1 << 20, page(1 << 20, 1, 2 << 20))])
        .unwrap();
    for (&id, r) in ids.iter().zip(store.get_batch_blocking(&ids)) {
        assert_eq!(r, Ok(page(id, 1, 4096)), "id {id}");
    }
    assert_eq!(store.get_blocking(1 << 20), Ok(page(1 << 20, 1, 2 << 20)));
    assert_eq!(cluster.total_keys(), 3);
    store.close().unwrap();
    assert_eq!(cluster.total_keys(), 0);

    // the test CA is not among the system's roots: refused, and said so
    let mut cfg = cluster.config();
    cfg.tls_ca_file = None;
    cfg.op_timeout = Duration::from_millis(1000);
    cfg.wait_timeout = Duration::from_millis(100);
    let err = RemoteStore::connect(cfg.clone()).err().expect("unknown CA");
    assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    // plain redis:// to TLS ports fails at connect, clearly
    let mut cfg = RemoteConfig::new(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")));
    cfg.op_timeout = Duration::from_millis(1000);
    cfg.wait_timeout = Duration::from_millis(100);
    let err = RemoteStore::connect(cfg)
        .err()
        .expect("plain text to TLS ports");
    assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
}
