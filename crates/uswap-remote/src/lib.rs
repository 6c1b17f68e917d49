//! uswap's remote tier: pages (4 KiB, or whole 2 MiB units, compressed or not) stored as values
//! in a **Redis Cluster** (or Valkey), private to the pool, replicated before a write counts,
//! checksummed, and cleaned up.
//!
//! # API (what the engine calls)
//!
//! ```no_run
//! use uswap_remote::{RemoteConfig, RemoteStore, Completion};
//! # fn main() -> Result<(), uswap_remote::RemoteError> {
//! let mut cfg = RemoteConfig::from_list("redis://127.0.0.1:30000,127.0.0.1:30001")?;
//! cfg.password = None; // AUTH/ACL: cfg.username, cfg.password; TLS: cfg.tls or rediss://
//! let store = RemoteStore::connect(cfg)?;      // clear error: unreachable / not a cluster / down / denied
//! let client = store.client(None)?;            // one per engine thread; Some(eventfd) to be woken
//! client.put_batch(1, vec![(7, vec![0xab; 4096]), (8, vec![0xcd; 4096])]);
//! client.get(2, 7);
//! client.delete_batch(&[8]);
//! let mut done: Vec<Completion> = Vec::new();
//! while done.len() < 2 {
//!     client.wait_completions(&mut done, std::time::Duration::from_secs(5)); // or poll_completions
//! }
//! store.close()?;                              // deletes every key of the pool
//! # Ok(()) }
//! ```
//!
//! - [`RemoteStore::connect`] probes the seeds and opens the connections; it blocks (at most
//!   about `op_timeout` per seed). Errors: [`RemoteError::Unreachable`] (no seed answers),
//!   [`RemoteError::NotACluster`], [`RemoteError::ClusterDown`], [`RemoteError::Denied`],
//!   [`RemoteError::Config`]. The engine falls back to the file tier on these, or refuses a
//!   remote-only pool with the error's message.
//! - [`RemoteStore::client`]`(Some(eventfd))` gives a [`RemoteClient`] for one engine thread.
//!   Its requests never block (they are handed to the store's runtime); each ends with one
//!   [`Completion`] `{ token, result }` pushed to that client's queue, and the eventfd is
//!   written (+1), so a thread sleeping in io_uring on a poll of the eventfd wakes. Drain with
//!   [`RemoteClient::poll_completions`] (read the eventfd first, then poll).
//! - [`RemoteClient::put_batch`]`(token, Vec<(id, payload)>)`: `Ok(None)` once every value is
//!   on its primary **and** `replicas_to_wait` replicas (`WAIT`); `Err(NotReplicated)` when
//!   the replicas did not confirm within `wait_timeout`, `Err(Unavailable)` after `retry_for`
//!   of failover or network trouble. On an error none of the batch counts as written: keep
//!   the pages or write them elsewhere. Ids are the engine's swap slots (any u64; dense ids
//!   share keys, see below). Do not delete or read an id while a write of it is in flight.
//! - [`RemoteClient::get`]`(token, id)` / [`RemoteClient::get_batch`]`(Vec<(token, id)>)`:
//!   `Ok(Some(payload))`, byte-exact, or `Err(Lost)` (the value is gone: every copy lost, or
//!   only an older write survived), `Err(Corrupt)` (fails the checks), `Err(Unavailable)`,
//!   `Err(NotStored)` (no acknowledged write of that id). Never zeros, never another page's
//!   bytes. The engine poisons a page on `Lost`/`Corrupt` ([`RemoteError::is_data_loss`]).
//! - [`RemoteClient::delete_batch`]`(&ids)` (also on the store): forgets the ids at once and
//!   deletes their values in the background; failures are counted, the TTL is the backstop.
//! - TTL: every key expires after `key_ttl`; the store refreshes the TTL of every live key
//!   every `key_ttl / 4` in the background ([`RemoteStore::refresh_ttl_blocking`] forces one).
//!   A killed process leaves nothing behind after `key_ttl`.
//! - [`RemoteStore::close`] (and `Drop`) waits for requests in flight, deletes every key of
//!   the pool (one `UNLINK` per group key it wrote), and stops the runtime; later requests of
//!   its clients complete with [`RemoteError::Closed`].
//! - [`RemoteStore::counters`]: reads, writes, bytes in/out, retries, redirects, failovers
//!   seen, connection losses, lost, corrupt, TTL refreshes, latency percentiles.
//! - Blocking conveniences for tests and tools: `put_batch_blocking`, `get_blocking`,
//!   `get_batch_blocking`, `refresh_ttl_blocking`, `quiesce`.
//!
//! # Plugging it into the engine (what the tier expects)
//!
//! - Start: `RemoteStore::connect(cfg)`; on an error fall back to the file tier, or refuse a
//!   remote-only pool with the error's message. One store per pool (its prefix is the
//!   pool's); `store.client(Some(eventfd))` once per engine thread that submits.
//! - Reclaim: evicted pages (4 KiB, or a whole 2 MiB unit, compressed or not: any size) go
//!   out as `put_batch(token, vec![(slot, bytes), ...])`; many pages per call (one round
//!   trip per group of 512 slots). `Ok(None)`: the slots hold the pages. `Err(_)`: they do
//!   not; keep the pages or write them to another tier. Give a 2 MiB unit the id of its
//!   first 4 KiB slot (ids 512 apart: one group, one key per unit).
//! - Fault: `get(token, slot)`; the fault thread sleeps in io_uring on a poll of its eventfd
//!   (`IORING_OP_POLL_ADD` or a read of it), then `poll_completions`. `Ok(Some(bytes))`:
//!   the exact bytes written (decompress if the tier compressed). `Lost`/`Corrupt`:
//!   `UFFDIO_POISON` the page, count it, say it once on stderr. `Unavailable`: the cluster
//!   did not answer for `retry_for`; poisoning is the only way not to hang the program.
//! - Free: `delete_batch(&slots)` when slots are freed (it forgets them at once; the
//!   server-side delete follows in the background). Never delete or read a slot while a
//!   write of it is in flight.
//! - Exit: `store.close()` (or drop it; not from inside a tokio runtime: it blocks on its
//!   own runtime to delete the keys).
//! - Counters: `store.counters()` for the remote lines of the pool's counters.
//! - Memory: the store keeps 8 bytes per live slot (its generation), in arrays of 512 per
//!   group touched (4 KiB per group, so dense ids are cheap and scattered ones are not).
//!
//! # Design
//!
//! **Runtime.** The store owns a small tokio runtime (`runtime_threads`, default 2) and
//! redis-rs's async cluster client on it. Engine threads touch the network only for direct
//! reads (below): any other request
//! is a task spawned onto the runtime (a push onto its queue), its completion a push onto the
//! client's queue plus an eventfd write. One async runtime multiplexes every request in flight
//! over one connection per node (redis-rs pipelines concurrent requests on it), which is what
//! a remote page store needs: many small reads in flight with low latency, and big pipelined
//! writes, without a thread per request. A runtime of our own (rather than the caller's)
//! keeps the engine free of async code and of tokio.
//!
//! **Direct reads.** [`RemoteClient::direct`] gives an engine thread a [`DirectReads`]: reads
//! sent by the thread itself on non-blocking connections of its own to the primaries, whose
//! sockets it polls in its own io_uring, so that a read costs one wake-up (the reply's)
//! instead of two hand-offs through the runtime. It answers only with values that pass the
//! checks and hands everything else to the runtime ([`DirectReads`] and `direct.rs` say how).
//! [`DirectReads::get_blocking`] waits on the calling thread (faults served in the faulting
//! thread). Off with TLS, or with `direct_reads: false`.
//!
//! **Connections.** `WAIT` blocks the connection it runs on until the replicas answer, so
//! reads get their own cluster connection (a fault never queues behind a write's `WAIT`),
//! writes use `write_connections` connections (a group always the same one, so its writes
//! stay in order), and deletes / TTL refresh / close use another.
//!
//! **Keys and values.** See [`layout`]: one hash per group of 512 ids under a 128-bit random
//! prefix; a 32-byte trailer (magic, version, id, generation, length, crc32c seeded with the
//! prefix) after every payload; the generation in the field name. A write of a batch is one
//! pipeline per group: `MULTI`, `HSET key f1 v1 f2 v2 ...`, `PEXPIRE key ttl`, `EXEC` (a key never
//! lands without its expiry), `WAIT n timeout`.
//!
//! **Retries.** redis-rs's own retries are off; every request runs under the store's loop:
//! each attempt bounded by `op_timeout`, transient failures (MOVED/ASK, connection lost or
//! refused, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, LOADING, READONLY, timeouts) retried with
//! backoff (2 ms doubling to 200 ms) until `retry_for`, and counted; a MOVED to a node that was
//! not a primary counts as a failover seen. Writes are idempotent (same field, same bytes),
//! so retrying one that had already landed is harmless.

#![deny(missing_docs)]

mod completion;
mod config;
mod conn;
mod counters;
mod direct;
mod error;
pub mod layout;
mod lineage;
mod live;
mod store;

pub use completion::Completion;
pub use config::RemoteConfig;
pub use counters::{LatencySummary, RemoteCounters};
pub use direct::DirectReads;
pub use error::RemoteError;
pub use lineage::{ChildHold, Inheritance};
pub use store::{CloseReport, Location, RemoteClient, RemoteStore};
