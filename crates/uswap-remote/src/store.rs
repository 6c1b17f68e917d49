//! The store: connections to the cluster, the requests, their retries, their completions.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use redis::cluster::ClusterClientBuilder;
use redis::{
    ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs,
    Value,
};

use crate::completion::{Completion, CompletionQueue};
use crate::conn::Conn;
use crate::counters::Counters;
use crate::layout::{self, group_of, Prefix};
use crate::lineage::{self, Ancestor, ChildHold, Inheritance, Lineage};
use crate::live::LiveSet;
use crate::{RemoteConfig, RemoteCounters, RemoteError};

/// How often the store reads the cluster's layout.
const TOPOLOGY_PERIOD: Duration = Duration::from_millis(500);
/// Most payload bytes in one `HSET` (Redis refuses a request over `client-query-buffer-limit`,
/// 1 GiB by default; smaller commands also keep one slow write from holding a connection long).
const HSET_BYTES: usize = 32 << 20;
/// Concurrent requests of a TTL refresh or a close.
const BACKGROUND_CONCURRENCY: usize = 64;
/// Longest pause between two attempts of a request.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// A pool's private store in a Redis Cluster. See the crate docs for the API and its contract.
pub struct RemoteStore {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    /// the TTL refresh and topology loops
    background: Vec<tokio::task::JoinHandle<()>>,
}

/// A handle for one engine thread: requests go out without blocking, completions come back
/// to its queue and wake its eventfd.
#[derive(Clone)]
pub struct RemoteClient {
    pub(crate) shared: Arc<Shared>,
    queue: Arc<CompletionQueue>,
}

/// What `close` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Group keys deleted.
    pub groups_deleted: u64,
    /// Group keys whose delete failed (they expire within `key_ttl`).
    pub groups_failed: u64,
    /// Group keys left to live children (the last of them deletes them).
    pub groups_left: u64,
}

/// Where an id's value lives: for tools and tests that look at the cluster directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The hash key (one per group of 512 ids).
    pub key: String,
    /// The field inside the hash: `<id % 512>:<generation, hex>`.
    pub field: String,
}

pub(crate) struct Shared {
    /// unique in the process ([`RemoteStore::id`])
    id: u64,
    pub(crate) cfg: RemoteConfig,
    pub(crate) prefix: Prefix,
    replicas_to_wait: u32,
    runtime: tokio::runtime::Handle,
    /// reads only, so a fault never waits behind a write's `WAIT`
    reads: Conn,
    /// writes; a group always uses the same one (its writes stay in order)
    writes: Vec<Conn>,
    /// deletes, TTL refresh, close
    background: Conn,
    /// guarded: live ids and their generations
    pub(crate) live: Mutex<LiveSet>,
    /// the ancestors' values this store may read (a forked child's)
    lineage: Lineage,
    /// guarded: groups listed in the prefix's `groups` meta key (a forked child's store
    /// lists each group before its first write, for the parent to delete if the child
    /// ends without closing)
    listed: Mutex<HashSet<u64>>,
    pub(crate) counters: Counters,
    /// guarded: addresses that were primaries (a new one is a failover seen)
    primaries: Mutex<HashSet<String>>,
    /// guarded: healthy replicas per slot, from the last `CLUSTER NODES` (every
    /// `TOPOLOGY_PERIOD`): a write to a shard that cannot satisfy `WAIT` fails at once
    /// instead of holding a connection for `wait_timeout`
    slot_replicas: Mutex<Arc<Vec<u8>>>,
    /// guarded: which primary serves each slot (same source and period), for the engine
    /// threads' own read connections ([`crate::direct`])
    pub(crate) routes: Mutex<Arc<Routes>>,
    pub(crate) closed: AtomicBool,
    in_flight: AtomicUsize,
    /// guarded: fields waiting to be deleted (see [`Deletes`])
    deletes: Mutex<Deletes>,
    /// Values in a row that lz4 did not shrink enough to store compressed; past
    /// [`POOR_RUN`] only one value in `POOR_RUN` is tried (data that does not compress
    /// costs a compression each time, ~2.5 ms per 2 MiB here, for nothing).
    poor_run: AtomicU32,
}

/// See `Shared::poor_run`.
const POOR_RUN: u32 = 32;

/// Fields waiting for their `HDEL`, per group. The engine frees slots one at a time (a
/// rewritten page frees its stale slot at once): a request per slot queued 262,144 one-field
/// `HDEL`s on one connection in a swap-w-seq run; each waited past `op_timeout`, was retried,
/// and the retries (1.4 M) took the connection from everything else, with the process's
/// memory growing to 1.6 GiB on a 256 MiB budget. Queued here instead, they go out as one
/// `HDEL` per group per round, from one task at a time, while the next round gathers.
#[derive(Default)]
struct Deletes {
    groups: BTreeMap<u64, Vec<String>>,
    /// a task is sending them (it takes every round until the queue is empty)
    draining: bool,
}

/// One value of a write batch.
struct Put {
    id: u64,
    generation: u64,
    /// The payload as stored: compressed when `flags` says so.
    value: Vec<u8>,
    /// [`layout::FLAG_LZ4`] or 0.
    flags: u16,
    /// The payload's length as the engine gave it.
    raw: usize,
}

/// The value argument of an `HSET`: payload and trailer written straight into the command
/// buffer (no intermediate copy of the payload).
struct Framed<'a> {
    payload: &'a [u8],
    trailer: [u8; layout::TRAILER_LEN],
}

impl ToRedisArgs for Framed<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Room for both parts first: the trailer appended to a buffer just grown to the
        // payload doubled it (4 MiB for a unit; peak RSS +40 MiB on swap-w-seq 2m).
        out.reserve_space_for_args([self.payload.len() + self.trailer.len()]);
        let mut arg = out.writer_for_next_arg();
        // the writer appends to the command's Vec: it cannot fail
        let _ = arg.write_all(self.payload);
        let _ = arg.write_all(&self.trailer);
    }
}

pub(crate) fn field(id: u64, generation: u64) -> String {
    format!("{}:{:x}", id % layout::GROUP_IDS, generation)
}

/// Counts a request in flight from spawn to completion (close waits for them).
///
/// Taken before the request checks `closed` (both SeqCst), so that either the request sees
/// the store closed, or `close` sees the request and waits for it.
struct InFlight(Arc<Shared>);

impl InFlight {
    /// `None` when the store is closed.
    fn enter(shared: &Arc<Shared>) -> Option<InFlight> {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(shared.clone());
        (!shared.closed.load(Ordering::SeqCst)).then_some(guard)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The completions a spawned request owes: if its task is dropped unfinished (the runtime
/// shutting down at close), each token still completes, with [`RemoteError::Closed`], so
/// no engine thread waits forever.
struct Owed {
    queue: Arc<CompletionQueue>,
    tokens: Vec<u64>,
}

impl Owed {
    fn pay(mut self, results: impl IntoIterator<Item = Result<Option<Vec<u8>>, RemoteError>>) {
        for (token, result) in std::mem::take(&mut self.tokens).into_iter().zip(results) {
            self.queue.push(Completion { token, result });
        }
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        for &token in &self.tokens {
            self.queue.push(Completion {
                token,
                result: Err(RemoteError::Closed),
            });
        }
    }
}

enum Failure {
    Transient(String),
    /// no answer in time (twice in a row: the connection is rebuilt)
    Timeout(String),
    Fatal(RemoteError),
}

impl Shared {
    /// Where a read of `id` finds its value: this store's (source 0) or an ancestor's
    /// (source k + 1 for ancestor k, newest first), and the generation to expect. Ids of a
    /// forked child's own writes never collide with inherited ones (the engine gives the
    /// child slots past its parent's).
    pub(crate) fn resolve(&self, live: &LiveSet, id: u64) -> Option<(usize, u64)> {
        if let Some(g) = live.generation(id) {
            return Some((0, g));
        }
        let ancestors = &self.lineage.ancestors;
        (0..ancestors.len())
            .rev()
            .find_map(|k| ancestors[k].live.generation(id).map(|g| (k + 1, g)))
    }

    /// The prefix of values from `source` (see [`Shared::resolve`]).
    pub(crate) fn prefix_of(&self, source: usize) -> &Prefix {
        match source {
            0 => &self.prefix,
            k => &self.lineage.ancestors[k - 1].prefix,
        }
    }

    /// Takes a fresh layout of the cluster: per-slot replica health, and new primaries (a
    /// failover seen).
    fn update_layout(&self, layout: Layout) {
        {
            let mut primaries = self.primaries.lock().expect("primaries");
            for p in layout.primaries {
                if primaries.insert(p) {
                    Counters::add(&self.counters.failovers_seen, 1);
                }
            }
        }
        *self.slot_replicas.lock().expect("topology") = Arc::new(layout.slot_replicas);
        *self.routes.lock().expect("routes") = Arc::new(layout.routes);
    }

    /// Asks a random node for the layout (bounded by `op_timeout`, no retry: the next round
    /// asks again).
    async fn fetch_layout(&self) -> Option<Layout> {
        let (_, mut conn) = self.background.get();
        let ask = conn.route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            redis::cluster_routing::RoutingInfo::SingleNode(
                redis::cluster_routing::SingleNodeRoutingInfo::Random,
            ),
        );
        match tokio::time::timeout(self.cfg.op_timeout, ask).await {
            Ok(Ok(Value::BulkString(text))) => parse_nodes(&String::from_utf8_lossy(&text)),
            Ok(Ok(Value::VerbatimString { text, .. })) => parse_nodes(&text),
            _ => None,
        }
    }

    /// Sorts an error into retry-worthy or final, counting what it says about the cluster.
    fn classify(&self, e: &RedisError) -> Failure {
        let c = &self.counters;
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) | ErrorKind::Server(ServerErrorKind::Ask) => {
                Counters::add(&c.redirects, 1);
                if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) {
                    if let Some((addr, _slot)) = e.redirect_node() {
                        let mut primaries = self.primaries.lock().expect("primaries");
                        if primaries.insert(addr.to_string()) {
                            Counters::add(&c.failovers_seen, 1);
                        }
                    }
                }
                Failure::Transient(e.to_string())
            }
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly,
            ) => {
                Counters::add(&c.cluster_down, 1);
                Failure::Transient(e.to_string())
            }
            ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
                Failure::Fatal(RemoteError::Denied {
                    node: "cluster".into(),
                    cause: e.to_string(),
                })
            }
            ErrorKind::Io | ErrorKind::ClusterConnectionNotFound | ErrorKind::Parse => {
                if e.is_timeout() {
                    Counters::add(&c.timeouts, 1);
                    Failure::Timeout(e.to_string())
                } else {
                    Counters::add(&c.connection_losses, 1);
                    Failure::Transient(e.to_string())
                }
            }
            _ => Failure::Fatal(RemoteError::Server(e.to_string())),
        }
    }

    /// `NotReplicated` when the primary serving `slot` has fewer healthy replicas than
    /// `replicas_to_wait` (as the last layout says): a `WAIT` there could only time out, and
    /// would hold the connection for `wait_timeout` meanwhile.
    fn replica_shortfall(&self, slot: u16) -> Option<RemoteError> {
        let healthy = self.slot_replicas.lock().expect("topology")[slot as usize];
        (healthy != NO_PRIMARY && (healthy as u32) < self.replicas_to_wait).then_some(
            RemoteError::NotReplicated {
                acked: healthy as u32,
                wanted: self.replicas_to_wait,
            },
        )
    }

    /// Runs `pipe` (all of one slot) on `conn`, retrying transient failures for `retry_for`;
    /// each attempt bounded by `op_timeout`. Error replies inside the pipeline count too,
    /// those of a transaction's commands (in `EXEC`'s answer) included.
    /// `waits_on`: the slot of a pipeline ending in `WAIT`, checked before every attempt.
    async fn run(
        &self,
        conn: &Conn,
        pipe: &Pipeline,
        waits_on: Option<u16>,
    ) -> Result<Vec<Value>, RemoteError> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(2);
        let mut attempts = 0u32;
        let mut timeouts_in_a_row = 0;
        loop {
            attempts += 1;
            if let Some(shortfall) = waits_on.and_then(|slot| self.replica_shortfall(slot)) {
                return Err(shortfall);
            }
            let (generation, mut c) = conn.get();
            let attempt = tokio::time::timeout(
                self.cfg.op_timeout,
                redis::aio::ConnectionLike::req_packed_commands(&mut c, pipe, 0, pipe.len()),
            )
            .await;
            let failure = match attempt {
                Ok(Ok(values)) => {
                    let is_err = |v: &&Value| matches!(v, Value::ServerError(_));
                    let nested = |v: &Value| match v {
                        Value::Array(vs) => vs.iter().find(is_err).cloned(),
                        _ => None,
                    };
                    let err = values
                        .iter()
                        .find(is_err)
                        .cloned()
                        .or_else(|| values.iter().find_map(nested));
                    match err {
                        None => return Ok(values),
                        Some(err) => match err.extract_error() {
                            Err(e) => self.classify(&e),
                            Ok(_) => {
                                Failure::Fatal(RemoteError::Server("unreadable error reply".into()))
                            }
                        },
                    }
                }
                Ok(Err(e)) => self.classify(&e),
                Err(_) => {
                    Counters::add(&self.counters.timeouts, 1);
                    Failure::Timeout(format!(
                        "no answer within op_timeout {:?}",
                        self.cfg.op_timeout
                    ))
                }
            };
            let last = match failure {
                Failure::Fatal(e) => return Err(e),
                Failure::Transient(last) => {
                    timeouts_in_a_row = 0;
                    last
                }
                Failure::Timeout(last) => {
                    timeouts_in_a_row += 1;
                    if timeouts_in_a_row >= 2 && conn.rebuild(generation, self.cfg.op_timeout).await
                    {
                        Counters::add(&self.counters.reconnects, 1);
                        timeouts_in_a_row = 0;
                    }
                    last
                }
            };
            let waited = start.elapsed();
            if waited + backoff >= self.cfg.retry_for {
                return Err(RemoteError::Unavailable {
                    waited,
                    attempts,
                    last,
                });
            }
            Counters::add(&self.counters.retries, 1);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn write_conn(&self, group: u64) -> &Conn {
        &self.writes[(group % self.writes.len() as u64) as usize]
    }

    /// Writes one batch: one pipeline per group (`HSET`s, `PEXPIRE`, `WAIT`), all groups at
    /// once; done when every group is acknowledged by the primary and the replicas.
    async fn put_batch(self: &Arc<Self>, items: Vec<(u64, Vec<u8>)>) -> Result<(), RemoteError> {
        let started = Instant::now();
        let mut by_group: BTreeMap<u64, Vec<Put>> = BTreeMap::new();
        {
            let mut live = self.live.lock().expect("live set");
            for (id, payload) in items {
                if payload.len() > u32::MAX as usize {
                    return Err(RemoteError::Config(format!(
                        "id {id}: payload of {} bytes is over 4 GiB",
                        payload.len()
                    )));
                }
                let generation = live.next_generation();
                by_group.entry(group_of(id)).or_default().push(Put {
                    id,
                    generation,
                    raw: payload.len(),
                    value: payload,
                    flags: 0,
                });
            }
        }
        // compressed outside the live set's lock: this is the batch's CPU work
        if self.cfg.compress {
            for put in by_group.values_mut().flatten() {
                let run = self.poor_run.load(Ordering::Relaxed);
                if run >= POOR_RUN && !run.is_multiple_of(POOR_RUN) {
                    self.poor_run.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match layout::compress(&put.value) {
                    Some(packed) => {
                        put.value = packed;
                        put.flags = layout::FLAG_LZ4;
                        self.poor_run.store(0, Ordering::Relaxed);
                    }
                    None => {
                        self.poor_run.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let results = futures_util::future::join_all(
            by_group
                .into_iter()
                .map(|(group, items)| self.put_group(group, items)),
        )
        .await;
        let result = results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()));
        let c = &self.counters;
        match &result {
            Ok(()) => c
                .put_latency
                .lock()
                .expect("latency")
                .record(started.elapsed()),
            Err(e) => {
                Counters::add(&c.write_errors, 1);
                if matches!(e, RemoteError::NotReplicated { .. }) {
                    Counters::add(&c.not_replicated, 1);
                }
            }
        }
        result
    }

    async fn put_group(self: &Arc<Self>, group: u64, items: Vec<Put>) -> Result<(), RemoteError> {
        let key = self.prefix.group_key(group);
        if self.lineage.token.is_some() && self.listed.lock().expect("listed").insert(group) {
            let meta = lineage::meta_keys(&self.prefix);
            let mut pipe = redis::pipe();
            pipe.cmd("SADD").arg(&meta[4]).arg(&key);
            pipe.cmd("PEXPIRE")
                .arg(&meta[4])
                .arg(self.cfg.key_ttl.as_millis() as u64);
            if self.run(&self.background, &pipe, None).await.is_err() {
                // listed on the next write (unlisted, it would only expire)
                self.listed.lock().expect("listed").remove(&group);
            }
        }
        let slot = layout::slot_of(&key);
        let mut pipe = redis::pipe();
        // The fields and their key's expiry as one transaction: pipelined apart, a
        // connection lost or a replica promoted between them left a key with no expiry,
        // kept forever once the pool was killed. A command refused while queued (an ACL,
        // a slot moved) discards it all (EXECABORT), and the attempt is tried again or
        // fails whole. `WAIT` stays outside: inside MULTI it does not block.
        pipe.cmd("MULTI");
        let mut in_cmd = usize::MAX;
        for put in &items {
            let payload = &put.value;
            if in_cmd.saturating_add(payload.len()) > HSET_BYTES {
                pipe.cmd("HSET").arg(&key);
                in_cmd = 0;
            }
            in_cmd += payload.len();
            let trailer = layout::trailer(&self.prefix, put.id, put.generation, payload, put.flags);
            pipe.arg(field(put.id, put.generation))
                .arg(Framed { payload, trailer });
        }
        pipe.cmd("PEXPIRE")
            .arg(&key)
            .arg(self.cfg.key_ttl.as_millis() as u64);
        pipe.cmd("EXEC");
        if self.replicas_to_wait > 0 {
            pipe.cmd("WAIT")
                .arg(self.replicas_to_wait)
                .arg(self.cfg.wait_timeout.as_millis() as u64);
        }
        // the pipeline holds the values now: the payloads go (half the memory in flight)
        let raw: usize = items.iter().map(|p| p.raw).sum();
        let stored: usize = items.iter().map(|p| p.value.len()).sum();
        let items: Vec<(u64, u64)> = items.into_iter().map(|p| (p.id, p.generation)).collect();
        let mut result = self
            .run(
                self.write_conn(group),
                &pipe,
                (self.replicas_to_wait > 0).then_some(slot),
            )
            .await;
        if let Ok(values) = &result {
            if self.replicas_to_wait > 0 {
                let acked = match values.last() {
                    Some(Value::Int(n)) => *n,
                    other => {
                        return Err(RemoteError::Server(format!("WAIT answered {other:?}")));
                    }
                };
                if acked < self.replicas_to_wait as i64 {
                    result = Err(RemoteError::NotReplicated {
                        acked: acked.max(0) as u32,
                        wanted: self.replicas_to_wait,
                    });
                }
            }
        }
        let mut garbage = Vec::new();
        {
            let mut live = self.live.lock().expect("live set");
            for (id, generation) in &items {
                if result.is_ok() {
                    if let Some(old) = live.acknowledged(*id, *generation) {
                        garbage.push(field(*id, old));
                    }
                } else {
                    // the fields may be on the primary: drop them, and let close delete the key
                    live.write_failed(*id);
                    garbage.push(field(*id, *generation));
                }
            }
        }
        if result.is_ok() {
            Counters::add(&self.counters.writes, items.len() as u64);
            Counters::add(&self.counters.bytes_out, raw as u64);
            Counters::add(&self.counters.stored_bytes_out, stored as u64);
        }
        if !garbage.is_empty() {
            self.queue_hdel([(group, garbage)]);
        }
        result.map(|_| ())
    }

    /// Queues fields for deletion in the background (errors counted; the TTL is the
    /// backstop); starts the task that sends them unless one runs.
    fn queue_hdel(self: &Arc<Self>, fields: impl IntoIterator<Item = (u64, Vec<String>)>) {
        let mut q = self.deletes.lock().expect("deletes");
        for (group, mut f) in fields {
            q.groups.entry(group).or_default().append(&mut f);
        }
        if q.draining || q.groups.is_empty() {
            return;
        }
        // counted in flight while it runs: `quiesce` waits for the deletes
        let Some(guard) = InFlight::enter(self) else {
            return; // closed: `close` unlinks the queued groups' keys
        };
        q.draining = true;
        let shared = self.clone();
        self.runtime.spawn(async move {
            let _guard = guard;
            shared.drain_deletes().await;
        });
    }

    /// Sends queued deletes, a round at a time, until none is left or the store closes.
    async fn drain_deletes(&self) {
        loop {
            let round = {
                let mut q = self.deletes.lock().expect("deletes");
                if q.groups.is_empty() || self.closed.load(Ordering::SeqCst) {
                    q.draining = false;
                    return;
                }
                std::mem::take(&mut q.groups)
            };
            stream::iter(round)
                .map(|(group, fields)| async move {
                    // once the store closes, what is left goes back to the queue, whose
                    // groups `close` unlinks
                    let requeue = |fields: Vec<String>| {
                        let mut q = self.deletes.lock().expect("deletes");
                        q.groups.entry(group).or_default().extend(fields);
                    };
                    if self.closed.load(Ordering::SeqCst) {
                        return requeue(fields);
                    }
                    let mut pipe = redis::pipe();
                    pipe.cmd("HDEL")
                        .arg(self.prefix.group_key(group))
                        .arg(&fields);
                    Counters::add(&self.counters.delete_requests, 1);
                    if self.run(&self.background, &pipe, None).await.is_err() {
                        Counters::add(&self.counters.delete_errors, 1);
                        if self.closed.load(Ordering::SeqCst) {
                            requeue(fields);
                        }
                    }
                })
                .buffer_unordered(BACKGROUND_CONCURRENCY)
                .collect::<Vec<()>>()
                .await;
        }
    }

    /// Reads several ids: one `HMGET` per group, all groups at once; one result per id, in order.
    async fn get_batch(&self, ids: &[u64]) -> Vec<Result<Vec<u8>, RemoteError>> {
        let started = Instant::now();
        let mut results: Vec<Option<Result<Vec<u8>, RemoteError>>> = vec![None; ids.len()];
        // by (source, group): each wanted id's (position in `ids`, id, generation)
        type Wanted = Vec<(usize, u64, u64)>;
        let mut by_group: BTreeMap<(usize, u64), Wanted> = BTreeMap::new();
        {
            let live = self.live.lock().expect("live set");
            for (at, &id) in ids.iter().enumerate() {
                match self.resolve(&live, id) {
                    Some((source, generation)) => by_group
                        .entry((source, group_of(id)))
                        .or_default()
                        .push((at, id, generation)),
                    None => results[at] = Some(Err(RemoteError::NotStored { id })),
                }
            }
        }
        let groups = futures_util::future::join_all(by_group.into_iter().map(
            |((source, group), wanted)| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("HMGET")
                    .arg(self.prefix_of(source).group_key(group));
                for (_, id, generation) in &wanted {
                    pipe.arg(field(*id, *generation));
                }
                (source, wanted, self.run(&self.reads, &pipe, None).await)
            },
        ))
        .await;
        for (source, wanted, reply) in groups {
            let values = match reply {
                Ok(mut values) => match values.pop() {
                    Some(Value::Array(values)) if values.len() == wanted.len() => Ok(values),
                    other => Err(RemoteError::Server(format!("HMGET answered {other:?}"))),
                },
                Err(e) => Err(e),
            };
            match values {
                Ok(values) => {
                    for ((at, id, generation), value) in wanted.into_iter().zip(values) {
                        results[at] = Some(self.open_value(source, id, generation, value));
                    }
                }
                Err(e) => {
                    for (at, ..) in wanted {
                        results[at] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let c = &self.counters;
        let results: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("every id answered"))
            .collect();
        for r in &results {
            match r {
                Ok(payload) => {
                    Counters::add(&c.reads, 1);
                    Counters::add(&c.bytes_in, payload.len() as u64);
                }
                Err(e) => {
                    Counters::add(&c.read_errors, 1);
                    match e {
                        RemoteError::Lost { .. } => Counters::add(&c.lost, 1),
                        RemoteError::Corrupt { .. } => Counters::add(&c.corrupt, 1),
                        _ => {}
                    }
                }
            }
        }
        if ids.len() == 1 && results[0].is_ok() {
            c.get_latency
                .lock()
                .expect("latency")
                .record(started.elapsed());
        }
        results
    }

    fn open_value(
        &self,
        source: usize,
        id: u64,
        generation: u64,
        value: Value,
    ) -> Result<Vec<u8>, RemoteError> {
        match value {
            Value::BulkString(bytes) => layout::open(self.prefix_of(source), id, generation, bytes),
            Value::Nil => Err(RemoteError::Lost {
                id,
                why: "its field is missing: every copy lost, expired, or deleted",
            }),
            other => Err(RemoteError::Corrupt {
                id,
                why: format!("not a string value: {other:?}"),
            }),
        }
    }

    /// Forgets the ids and deletes their fields in the background.
    fn delete_batch(self: &Arc<Self>, ids: &[u64]) {
        let mut by_group: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        {
            let mut live = self.live.lock().expect("live set");
            for &id in ids {
                if let Some(generation) = live.remove(id) {
                    by_group
                        .entry(group_of(id))
                        .or_default()
                        .push(field(id, generation));
                }
            }
        }
        let n: usize = by_group.values().map(Vec::len).sum();
        Counters::add(&self.counters.deletes, n as u64);
        self.queue_hdel(by_group);
    }

    /// `UNLINK`s each key (64 at a time); returns how many were unlinked.
    async fn unlink_each(&self, keys: impl IntoIterator<Item = String>) -> u64 {
        stream::iter(keys)
            .map(|key| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("UNLINK").arg(key);
                u64::from(self.run(&self.background, &pipe, None).await.is_ok())
            })
            .buffer_unordered(BACKGROUND_CONCURRENCY)
            .fold(0, |n, k| async move { n + k })
            .await
    }

    /// `UNLINK`s a prefix's meta keys (one hash tag: one request).
    async fn unlink_meta(&self, meta: &[String; 5]) {
        let mut pipe = redis::pipe();
        pipe.cmd("UNLINK").arg(&meta[..]);
        let _ = self.run(&self.background, &pipe, None).await;
    }

    /// Runs a script of [`crate::lineage`] on `keys` with `args` (the TTL first); its
    /// integer answer.
    async fn script(&self, script: &str, keys: &[String], args: Vec<String>) -> Option<i64> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(self.cfg.key_ttl.as_millis() as u64)
            .arg(args);
        match self.run(&self.background, &pipe, None).await.ok()?.pop() {
            Some(Value::Int(n)) => Some(n),
            _ => None,
        }
    }

    /// The owner closes: the groups `left` go to the live children `tokens`. Returns how
    /// many readers remain (`None`: not known; the keys then expire).
    async fn hand_over(&self, meta: &[String; 5], tokens: &[u64], left: &[String]) -> Option<i64> {
        let mut args: Vec<String> = vec![tokens.len().to_string()];
        args.extend(tokens.iter().map(u64::to_string));
        args.extend(left.iter().cloned());
        self.script(lineage::CLOSE, &meta[..4], args).await
    }

    /// `UNLINK`s every group key of `prefix` listed in the set `list` (only keys of that
    /// prefix), then the prefix's meta keys.
    async fn unlink_listed(&self, prefix: &Prefix, list: &str) {
        let mut pipe = redis::pipe();
        pipe.cmd("SMEMBERS").arg(list);
        let keys: Vec<String> = match self.run(&self.background, &pipe, None).await {
            Ok(mut v) => match v.pop() {
                Some(Value::Array(keys)) | Some(Value::Set(keys)) => keys
                    .into_iter()
                    .filter_map(|k| redis::from_redis_value::<String>(k).ok())
                    .collect(),
                _ => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        let own = format!("uswap:{{{}.", prefix.as_hex());
        self.unlink_each(keys.into_iter().filter(|k| k.starts_with(&own)))
            .await;
        self.unlink_meta(&lineage::meta_keys(prefix)).await;
    }

    /// A forked child of this store is gone with its descendants: what its store listed.
    async fn delete_registered(&self, prefix: &Prefix) {
        self.unlink_listed(prefix, &lineage::meta_keys(prefix)[4])
            .await;
    }

    /// This process is done with the values of ancestor `prefix`; its live children
    /// (`tokens`) are not. The last reader after the owner closed deletes what is left.
    async fn leave(&self, prefix: &Prefix, tokens: &[u64]) {
        let Some(me) = self.lineage.token else {
            return;
        };
        let meta = lineage::meta_keys(prefix);
        let mut args = vec![me.to_string()];
        args.extend(tokens.iter().map(u64::to_string));
        if self.script(lineage::LEAVE, &meta[..3], args).await == Some(1) {
            self.unlink_listed(prefix, &meta[3]).await;
        }
    }

    /// Sets the TTL of every group holding a live id again.
    async fn refresh_ttl(&self) -> Result<(), RemoteError> {
        let groups = self.live.lock().expect("live set").live_groups();
        let ttl_ms = self.cfg.key_ttl.as_millis() as u64;
        let failed = stream::iter(groups)
            .map(|group| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("PEXPIRE")
                    .arg(self.prefix.group_key(group))
                    .arg(ttl_ms);
                match self.run(&self.background, &pipe, None).await.as_deref() {
                    Ok([Value::Int(1)]) => {
                        Counters::add(&self.counters.ttl_refreshes, 1);
                        None
                    }
                    // the key is gone: its values are lost (reads will say so)
                    Ok(_) => Some(RemoteError::Lost {
                        id: group * layout::GROUP_IDS,
                        why: "its group's key is gone",
                    }),
                    Err(e) => Some(e.clone()),
                }
            })
            .buffer_unordered(BACKGROUND_CONCURRENCY)
            .filter_map(|r| async move { r })
            .collect::<Vec<_>>()
            .await;
        Counters::add(&self.counters.ttl_refresh_errors, failed.len() as u64);
        // The ancestors' groups this store reads, and the meta keys of its prefix and
        // theirs (a missing key is no error here: an ancestor freed those values, or no
        // meta key was ever made).
        let mut others: Vec<String> = lineage::meta_keys(&self.prefix).into();
        for a in &self.lineage.ancestors {
            others.extend(
                a.live
                    .live_groups()
                    .into_iter()
                    .map(|g| a.prefix.group_key(g)),
            );
            others.extend(lineage::meta_keys(&a.prefix));
        }
        stream::iter(others)
            .map(|key| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("PEXPIRE").arg(key).arg(ttl_ms);
                let _ = self.run(&self.background, &pipe, None).await;
            })
            .buffer_unordered(BACKGROUND_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        match failed.into_iter().next() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// See `RemoteStore::on_runtime_thread_start`.
static THREAD_START: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

impl RemoteStore {
    /// Connects to the cluster: probes the seeds (a clear error when none answers, when one is
    /// not a cluster node, when the cluster does not serve, or when the credentials are
    /// refused), reads its layout (for `replicas_to_wait`), opens the connections, and makes
    /// the pool's random key prefix. Blocks for at most about `op_timeout` per seed.
    pub fn connect(cfg: RemoteConfig) -> Result<RemoteStore, RemoteError> {
        RemoteStore::connect_with(cfg, Prefix::random()?, Lineage::default())
    }

    /// In a forked child: a store of its own (new connections, runtime and prefix) that
    /// also reads the values its ancestors held at the fork (see [`crate::lineage`]).
    pub fn connect_child(inheritance: Inheritance) -> Result<RemoteStore, RemoteError> {
        let lineage = Lineage {
            ancestors: inheritance.ancestors,
            token: Some(inheritance.token),
        };
        RemoteStore::connect_with(inheritance.cfg, inheritance.prefix, lineage)
    }

    /// Just before a fork (no request of this store may start until it returns): what the
    /// child needs to read this store's values and its ancestors' ([`Self::connect_child`]),
    /// and a token naming the child ([`Inheritance::token`]).
    pub fn fork_inheritance(&self) -> Result<Inheritance, RemoteError> {
        let mut token = [0u8; 8];
        getrandom::fill(&mut token)
            .map_err(|e| RemoteError::Config(format!("no OS randomness for a fork token: {e}")))?;
        let mut ancestors = self.shared.lineage.ancestors.clone();
        ancestors.push(Ancestor {
            prefix: self.shared.prefix.clone(),
            live: Arc::new(self.shared.live.lock().expect("live set").clone()),
        });
        Ok(Inheritance {
            cfg: self.shared.cfg.clone(),
            ancestors,
            token: u64::from_le_bytes(token),
            prefix: Prefix::random()?,
        })
    }

    /// A child forked with `inheritance` and all its descendants are gone: delete every key
    /// the child's store wrote and did not delete itself (it ended without closing: `_exit`,
    /// exec, a kill), in the background. Nobody can read them any more.
    pub fn reap_child(&self, inheritance_prefix: &Prefix) {
        let Some(guard) = InFlight::enter(&self.shared) else {
            return;
        };
        let shared = self.shared.clone();
        let prefix = inheritance_prefix.clone();
        self.shared.runtime.spawn(async move {
            let _guard = guard;
            shared.delete_registered(&prefix).await;
        });
    }

    /// Run `hook` first on every thread of every store's runtime (workers and blocking
    /// threads), for the process's life: the engine marks them as its own threads, whose
    /// allocations come from its heap. Only the first call counts.
    pub fn on_runtime_thread_start(hook: fn()) {
        let _ = THREAD_START.set(hook);
    }

    fn connect_with(
        cfg: RemoteConfig,
        prefix: Prefix,
        lineage: Lineage,
    ) -> Result<RemoteStore, RemoteError> {
        cfg.validate()?;
        let addrs = cfg.node_addresses()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.runtime_threads)
            .thread_name("uswap-remote")
            .on_thread_start(|| {
                if let Some(hook) = THREAD_START.get() {
                    hook();
                }
            })
            .enable_all()
            .build()
            .map_err(|e| {
                RemoteError::Config(format!("cannot start the remote tier's runtime: {e}"))
            })?;
        let shared = runtime.block_on(connect_shared(
            cfg,
            addrs,
            prefix,
            lineage,
            runtime.handle().clone(),
        ))?;
        let shared = Arc::new(shared);
        let background = vec![
            runtime.spawn(refresh_loop(Arc::downgrade(&shared))),
            runtime.spawn(topology_loop(Arc::downgrade(&shared))),
        ];
        Ok(RemoteStore {
            shared,
            runtime: Some(runtime),
            background,
        })
    }

    /// A client whose completions wake `eventfd` (duplicated here: the caller keeps its own fd
    /// and may close it; `None` for a client polled without an eventfd).
    pub fn client(&self, eventfd: Option<BorrowedFd<'_>>) -> Result<RemoteClient, RemoteError> {
        let queue = CompletionQueue::new(eventfd)
            .map_err(|e| RemoteError::Config(format!("cannot duplicate the eventfd: {e}")))?;
        Ok(RemoteClient {
            shared: self.shared.clone(),
            queue: Arc::new(queue),
        })
    }

    /// This store's number, unique in the process (to tell stores apart in caches).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// `WAIT numreplicas` in use.
    pub fn replicas_to_wait(&self) -> u32 {
        self.shared.replicas_to_wait
    }

    /// The settings in use.
    pub fn config(&self) -> &RemoteConfig {
        &self.shared.cfg
    }

    /// The pool's private key prefix (32 hex digits). Keep it private: it is what keeps
    /// other pools from reading this pool's values.
    pub fn prefix_hex(&self) -> &str {
        self.shared.prefix.as_hex()
    }

    /// Where `id`'s current value lives, if the store holds one.
    pub fn location(&self, id: u64) -> Option<Location> {
        let generation = self.shared.live.lock().expect("live set").generation(id)?;
        Some(Location {
            key: self.shared.prefix.group_key(group_of(id)),
            field: field(id, generation),
        })
    }

    /// The counters now.
    pub fn counters(&self) -> RemoteCounters {
        let live = self.shared.live.lock().expect("live set").live_ids();
        self.shared.counters.snapshot(live)
    }

    /// Forgets the ids and deletes their values in the background (errors are counted).
    pub fn delete_batch(&self, ids: &[u64]) {
        if !self.shared.closed.load(Ordering::Acquire) {
            self.shared.delete_batch(ids);
        }
    }

    /// Blocking write of a batch (tests, tools): the same as [`RemoteClient::put_batch`].
    pub fn put_batch_blocking(&self, items: Vec<(u64, Vec<u8>)>) -> Result<(), RemoteError> {
        self.block_on(|s| async move { s.put_batch(items).await })
    }

    /// Blocking read of one id.
    pub fn get_blocking(&self, id: u64) -> Result<Vec<u8>, RemoteError> {
        self.get_batch_blocking(&[id]).pop().expect("one result")
    }

    /// Blocking read of several ids: one result per id, in order.
    pub fn get_batch_blocking(&self, ids: &[u64]) -> Vec<Result<Vec<u8>, RemoteError>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return ids.iter().map(|_| Err(RemoteError::Closed)).collect();
        }
        let ids = ids.to_vec();
        let shared = self.shared.clone();
        self.shared
            .runtime
            .block_on(async move { shared.get_batch(&ids).await })
    }

    /// Refreshes the TTL of every live group now (the store also does it every `key_ttl / 4`).
    pub fn refresh_ttl_blocking(&self) -> Result<(), RemoteError> {
        self.block_on(|s| async move { s.refresh_ttl().await })
    }

    /// Waits until every background request (deletes, cleanup of failed writes) is done.
    pub fn quiesce(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shared.in_flight.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    fn block_on<F, Fut>(&self, f: F) -> Result<(), RemoteError>
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: std::future::Future<Output = Result<(), RemoteError>>,
    {
        let Some(_guard) = InFlight::enter(&self.shared) else {
            return Err(RemoteError::Closed);
        };
        self.shared.runtime.block_on(f(self.shared.clone()))
    }

    /// Deletes every key of the pool (one `UNLINK` per group key it may have written), after
    /// the requests in flight finish (for at most `retry_for + op_timeout`), and stops the
    /// runtime. Clients of a closed store complete every request with [`RemoteError::Closed`].
    pub fn close(mut self) -> Result<CloseReport, RemoteError> {
        self.close_inner(&[])
    }

    /// As [`Self::close`], for a process whose forked children may still read its values:
    /// the groups holding an id of `children` are left to them (the last of them to finish
    /// deletes them), the rest are deleted; and this store leaves the values it inherited
    /// to its live children in turn (see [`crate::lineage`]).
    pub fn close_with(mut self, children: &[ChildHold]) -> Result<CloseReport, RemoteError> {
        self.close_inner(children)
    }

    fn close_inner(&mut self, children: &[ChildHold]) -> Result<CloseReport, RemoteError> {
        let Some(runtime) = self.runtime.take() else {
            return Ok(CloseReport::default());
        };
        let shared = self.shared.clone();
        shared.closed.store(true, Ordering::SeqCst);
        for task in self.background.drain(..) {
            task.abort();
        }
        self.quiesce(shared.cfg.retry_for + shared.cfg.op_timeout);
        // every group whose key may exist: live ones, and ones whose last fields wait in the
        // delete queue (their UNLINK replaces the HDEL)
        let mut groups = shared.live.lock().expect("live set").drain_groups();
        groups.extend(
            std::mem::take(&mut shared.deletes.lock().expect("deletes").groups).into_keys(),
        );
        groups.sort_unstable();
        groups.dedup();
        let held: HashSet<u64> = children
            .iter()
            .flat_map(|c| c.ids.iter().map(|&id| group_of(id)))
            .collect();
        let (mut left, groups): (Vec<u64>, Vec<u64>) =
            groups.into_iter().partition(|g| held.contains(g));
        let tokens: Vec<u64> = children.iter().map(|c| c.token).collect();
        // one UNLINK per group, 64 at a time; the whole close bounded by retry_for + op_timeout
        // (a dead cluster must not hold the exit: the TTL removes what is left)
        let deleted = std::sync::atomic::AtomicU64::new(0);
        let budget = shared.cfg.retry_for + shared.cfg.op_timeout;
        let mut all = groups.len();
        let _ = runtime.block_on(async {
            tokio::time::timeout(budget, async {
                let keys = groups.iter().map(|&g| shared.prefix.group_key(g));
                deleted.fetch_add(shared.unlink_each(keys).await, Ordering::Relaxed);
                let meta = lineage::meta_keys(&shared.prefix);
                if !left.is_empty() {
                    let keys: Vec<String> =
                        left.iter().map(|&g| shared.prefix.group_key(g)).collect();
                    if shared.hand_over(&meta, &tokens, &keys).await == Some(0) {
                        // the children finished meanwhile
                        all += left.len();
                        left.clear();
                        deleted.fetch_add(shared.unlink_each(keys).await, Ordering::Relaxed);
                        shared.unlink_meta(&meta).await;
                    }
                } else {
                    shared.unlink_meta(&meta).await;
                }
                for a in &shared.lineage.ancestors {
                    shared.leave(&a.prefix, &tokens).await;
                }
            })
            .await
        });
        let deleted = deleted.load(Ordering::Relaxed);
        let report = CloseReport {
            groups_deleted: deleted,
            groups_failed: all as u64 - deleted,
            groups_left: left.len() as u64,
        };
        runtime.shutdown_timeout(Duration::from_secs(1));
        if report.groups_failed > 0 {
            return Err(RemoteError::Unavailable {
                waited: budget,
                attempts: 0,
                last: format!(
                    "{} of {} group keys not deleted at close (they expire within key_ttl)",
                    report.groups_failed, all
                ),
            });
        }
        Ok(report)
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        let _ = self.close_inner(&[]);
    }
}

impl RemoteClient {
    /// Writes a batch of `(id, payload)`; completes `token` with `Ok(None)` once every value
    /// is on its primary and `replicas_to_wait` replicas, or with an error (then none of the
    /// batch counts as written; some values may exist and are cleaned up).
    pub fn put_batch(&self, token: u64, items: Vec<(u64, Vec<u8>)>) {
        self.spawn(token, move |s| async move {
            s.put_batch(items).await.map(|()| None)
        });
    }

    /// Reads one id; completes `token` with `Ok(Some(payload))`, exact, or an error.
    pub fn get(&self, token: u64, id: u64) {
        self.spawn(token, move |s| async move {
            s.get_batch(&[id])
                .await
                .pop()
                .expect("one result")
                .map(Some)
        });
    }

    /// Reads several `(token, id)`: one `HMGET` per group; one completion per token.
    pub fn get_batch(&self, requests: Vec<(u64, u64)>) {
        let owed = Owed {
            queue: self.queue.clone(),
            tokens: requests.iter().map(|&(token, _)| token).collect(),
        };
        let Some(guard) = InFlight::enter(&self.shared) else {
            return; // owed completes them as Closed
        };
        let shared = self.shared.clone();
        self.shared.runtime.spawn(async move {
            let _guard = guard;
            let ids: Vec<u64> = requests.iter().map(|&(_, id)| id).collect();
            let results = shared.get_batch(&ids).await;
            owed.pay(results.into_iter().map(|r| r.map(Some)));
        });
    }

    /// Forgets the ids and deletes their values in the background (no completion; errors are
    /// counted). Do not delete an id while a write of it is in flight.
    pub fn delete_batch(&self, ids: &[u64]) {
        if !self.shared.closed.load(Ordering::Acquire) {
            self.shared.delete_batch(ids);
        }
    }

    /// Moves the completions that arrived into `out` (appended); returns how many. Never
    /// blocks. Drain the eventfd (read its counter) before calling, so a completion arriving
    /// meanwhile wakes it again.
    pub fn poll_completions(&self, out: &mut Vec<Completion>) -> usize {
        self.queue.drain_into(out)
    }

    /// Blocking convenience: waits up to `timeout` for at least one completion.
    pub fn wait_completions(&self, out: &mut Vec<Completion>, timeout: Duration) -> usize {
        self.queue.wait_into(out, Instant::now() + timeout)
    }

    /// The counters of the store.
    pub fn counters(&self) -> RemoteCounters {
        let live = self.shared.live.lock().expect("live set").live_ids();
        self.shared.counters.snapshot(live)
    }

    fn spawn<F, Fut>(&self, token: u64, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Option<Vec<u8>>, RemoteError>> + Send + 'static,
    {
        let owed = Owed {
            queue: self.queue.clone(),
            tokens: vec![token],
        };
        let Some(guard) = InFlight::enter(&self.shared) else {
            return; // owed completes it as Closed
        };
        let shared = self.shared.clone();
        self.shared.runtime.spawn(async move {
            let _guard = guard;
            owed.pay([f(shared).await]);
        });
    }
}

/// Every `TOPOLOGY_PERIOD`, the cluster's layout again; stops with the store.
async fn topology_loop(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(TOPOLOGY_PERIOD).await;
        let Some(s) = shared.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let layout = s.fetch_layout().await;
        if let Some(layout) = layout {
            s.update_layout(layout);
        }
    }
}

/// Every `key_ttl / 4`, the TTL of every live group again; stops with the store.
async fn refresh_loop(shared: std::sync::Weak<Shared>) {
    loop {
        let period = match shared.upgrade() {
            Some(s) => s.cfg.key_ttl / 4,
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(s) = shared.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let _ = s.refresh_ttl().await;
    }
}

/// What a node says about the cluster (`CLUSTER NODES`).
struct Layout {
    /// live primaries serving slots
    primaries: HashSet<String>,
    /// the fewest healthy replicas any shard has
    min_replicas: u32,
    /// per slot: healthy replicas of its live primary; `NO_PRIMARY` when no live primary
    /// serves it (failover pending, or the shard is gone)
    slot_replicas: Vec<u8>,
    /// per slot: its live primary's address
    routes: Routes,
}

/// Which primary serves each cluster slot.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// per slot: an index into `nodes`, or `NO_NODE`
    pub slot_node: Vec<u16>,
    /// the primaries' addresses as the cluster gives them (`ip:port`)
    pub nodes: Vec<String>,
}

pub(crate) const NO_NODE: u16 = u16::MAX;

impl Routes {
    /// The address of the primary serving `slot`.
    pub fn primary(&self, slot: u16) -> Option<&str> {
        let n = *self.slot_node.get(slot as usize)?;
        self.nodes.get(n as usize).map(String::as_str)
    }
}

const SLOTS: usize = 16384;
const NO_PRIMARY: u8 = u8::MAX;

async fn connect_shared(
    cfg: RemoteConfig,
    addrs: Vec<(String, u16)>,
    prefix: Prefix,
    lineage: Lineage,
    runtime: tokio::runtime::Handle,
) -> Result<Shared, RemoteError> {
    let scheme = if cfg.tls { "rediss" } else { "redis" };
    let urls: Vec<String> = addrs
        .iter()
        .map(|(h, p)| format!("{scheme}://{h}:{p}"))
        .collect();
    let layout = probe_seeds(&cfg, &urls).await?;
    let replicas_to_wait = match cfg.replicas_to_wait {
        None => layout.min_replicas.min(1),
        Some(n) if n > layout.min_replicas => {
            return Err(RemoteError::Config(format!(
                "replicas_to_wait {n} but a shard of the cluster has only {} replica(s): every write would fail",
                layout.min_replicas
            )))
        }
        Some(n) => n,
    };

    let mut builder = ClusterClientBuilder::new(urls.clone())
        .retries(0) // the store retries itself (bounded by retry_for, counted)
        .connection_timeout(cfg.op_timeout)
        .response_timeout(cfg.op_timeout);
    if let Some(user) = &cfg.username {
        builder = builder.username(user);
    }
    if let Some(password) = &cfg.password {
        builder = builder.password(password);
    }
    #[cfg(feature = "tls")]
    if let Some(ca) = tls_ca(&cfg)? {
        builder = builder.certs(ca);
    }
    let client = builder
        .build()
        .map_err(|e| RemoteError::Config(format!("cluster client: {e}")))?;
    let open = || Conn::open(client.clone(), cfg.op_timeout * 2);
    let reads = open().await?;
    let background = open().await?;
    let mut writes = Vec::with_capacity(cfg.write_connections);
    for _ in 0..cfg.write_connections {
        writes.push(open().await?);
    }
    static STORES: AtomicUsize = AtomicUsize::new(0);
    Ok(Shared {
        id: STORES.fetch_add(1, Ordering::Relaxed) as u64,
        cfg,
        prefix,
        replicas_to_wait,
        runtime,
        reads,
        writes,
        background,
        live: Mutex::new(LiveSet::default()),
        lineage,
        listed: Mutex::new(HashSet::new()),
        counters: Counters::default(),
        primaries: Mutex::new(layout.primaries),
        slot_replicas: Mutex::new(Arc::new(layout.slot_replicas)),
        routes: Mutex::new(Arc::new(layout.routes)),
        closed: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        deletes: Mutex::new(Deletes::default()),
        poor_run: AtomicU32::new(0),
    })
}

/// The CA certificate to trust (instead of the system's roots), when the settings name one.
#[cfg(feature = "tls")]
fn tls_ca(cfg: &RemoteConfig) -> Result<Option<redis::TlsCertificates>, RemoteError> {
    let Some(path) = &cfg.tls_ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path)
        .map_err(|e| RemoteError::Config(format!("tls_ca_file {}: {e}", path.display())))?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// A client for one node (the connect-time probe).
fn open_client(
    cfg: &RemoteConfig,
    url: &str,
    info: redis::ConnectionInfo,
) -> Result<redis::Client, RemoteError> {
    let bad = |e: redis::RedisError| RemoteError::Config(format!("node {url}: {e}"));
    #[cfg(feature = "tls")]
    if let Some(ca) = tls_ca(cfg)? {
        return redis::Client::build_with_tls(info, ca).map_err(bad);
    }
    let _ = cfg;
    redis::Client::open(info).map_err(bad)
}

/// Asks the seeds, in order, for `CLUSTER INFO` and `CLUSTER NODES`; the first that answers
/// decides. Distinguishes unreachable, refused credentials, not a cluster, and not serving.
async fn probe_seeds(cfg: &RemoteConfig, urls: &[String]) -> Result<Layout, RemoteError> {
    let mut causes = Vec::new();
    for url in urls {
        let mut info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| RemoteError::Config(format!("node {url}: {e}")))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &cfg.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &cfg.password {
            settings = settings.set_password(password);
        }
        info = info.set_redis_settings(settings);
        let client = open_client(cfg, url, info)?;
        let conn_cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.op_timeout))
            .set_response_timeout(Some(cfg.op_timeout));
        let attempt = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&conn_cfg)
                .await?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await?;
            Ok::<_, RedisError>((info, nodes))
        };
        match tokio::time::timeout(cfg.op_timeout * 2, attempt).await {
            Err(_) => causes.push(format!("{url}: timed out")),
            Ok(Ok((info, nodes))) => {
                let state = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("cluster_state:"))
                    .unwrap_or("unknown")
                    .to_string();
                if state != "ok" {
                    return Err(RemoteError::ClusterDown {
                        node: url.clone(),
                        state,
                    });
                }
                return parse_nodes(&nodes).ok_or_else(|| {
                    RemoteError::Server(format!("{url}: unreadable CLUSTER NODES answer"))
                });
            }
            Ok(Err(e)) => {
                let text = e.to_string();
                if text.contains("cluster support disabled") {
                    return Err(RemoteError::NotACluster { node: url.clone() });
                }
                if e.kind() == ErrorKind::AuthenticationFailed
                    || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
                    || text.contains("NOAUTH")
                    || text.contains("WRONGPASS")
                    || text.contains("NOPERM")
                {
                    return Err(RemoteError::Denied {
                        node: url.clone(),
                        cause: text,
                    });
                }
                causes.push(format!("{url}: {text}"));
            }
        }
    }
    Err(RemoteError::Unreachable {
        nodes: urls.join(","),
        cause: causes.join("; "),
    })
}

/// Primaries serving slots and the fewest healthy replicas any of them has.
fn parse_nodes(nodes: &str) -> Option<Layout> {
    struct Node<'a> {
        id: &'a str,
        addr: String,
        primary: bool,
        failed: bool,
        primary_of: &'a str,
        slots: Vec<(usize, usize)>,
    }
    let parsed: Vec<Node> = nodes
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split(['@', ',']).next()?.to_string();
            Some(Node {
                id: f[0],
                addr,
                primary: f[2].split(',').any(|x| x == "master"),
                failed: f[2]
                    .split(',')
                    .any(|x| x == "fail" || x == "fail?" || x == "noaddr"),
                primary_of: f[3],
                slots: f[8..]
                    .iter()
                    .filter(|r| !r.starts_with('[')) // slots being migrated
                    .map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                        (a <= b && b < SLOTS).then_some((a, b))
                    })
                    .collect::<Option<_>>()?,
            })
        })
        .collect::<Option<_>>()?;
    let serving: Vec<&Node> = parsed
        .iter()
        .filter(|n| n.primary && !n.slots.is_empty() && !n.failed)
        .collect();
    if serving.is_empty() {
        return None;
    }
    let mut slot_replicas = vec![NO_PRIMARY; SLOTS];
    let mut routes = Routes {
        slot_node: vec![NO_NODE; SLOTS],
        nodes: Vec::with_capacity(serving.len()),
    };
    let mut min_replicas = u32::MAX;
    for p in &serving {
        let node = routes.nodes.len() as u16;
        routes.nodes.push(p.addr.clone());
        for &(a, b) in &p.slots {
            routes.slot_node[a..=b].fill(node);
        }
        let replicas = parsed
            .iter()
            .filter(|r| !r.primary && !r.failed && r.primary_of == p.id)
            .count() as u32;
        min_replicas = min_replicas.min(replicas);
        for &(a, b) in &p.slots {
            slot_replicas[a..=b].fill(replicas.min(NO_PRIMARY as u32 - 1) as u8);
        }
    }
    Some(Layout {
        primaries: serving.iter().map(|n| n.addr.clone()).collect(),
        min_replicas,
        slot_replicas,
        routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_gives_primaries_and_replicas() {
        let nodes = "\
a1 127.0.0.1:30000@40000 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:30001@40001 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:30002@40002 master - 0 0 3 connected 10923-16383
b1 127.0.0.1:30003@40003 slave a1 0 0 1 connected
b2 127.0.0.1:30004@40004 slave a2 0 0 2 connected
b3 127.0.0.1:30005@40005 slave,fail a3 0 0 3 disconnected
";
        let layout = parse_nodes(nodes).unwrap();
        assert_eq!(layout.primaries.len(), 3);
        assert!(layout.primaries.contains("127.0.0.1:30001"));
        assert_eq!(layout.min_replicas, 0, "a3's only replica failed");
        assert_eq!(layout.slot_replicas[0], 1);
        assert_eq!(layout.slot_replicas[10922], 1);
        assert_eq!(layout.slot_replicas[10923], 0);
        assert_eq!(layout.routes.primary(0), Some("127.0.0.1:30000"));
        assert_eq!(layout.routes.primary(10923), Some("127.0.0.1:30002"));
        let gone = nodes.replace(
            "myself,master - 0 0 1 connected 0-5460",
            "master,fail - 0 0 1 disconnected 0-5460",
        );
        let layout = parse_nodes(&gone).unwrap();
        assert_eq!(layout.slot_replicas[0], NO_PRIMARY);
        assert_eq!(
            layout.routes.primary(0),
            None,
            "no live primary serves slot 0"
        );
        assert_eq!(layout.primaries.len(), 2);
        let healthy = nodes.replace(
            "slave,fail a3 0 0 3 disconnected",
            "slave a3 0 0 3 connected",
        );
        assert_eq!(parse_nodes(&healthy).unwrap().min_replicas, 1);
        assert!(parse_nodes("garbage").is_none());
    }
}
