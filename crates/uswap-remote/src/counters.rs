//! Counters of the remote tier, kept where each event happens.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

#[derive(Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub stored_bytes_out: AtomicU64,
    pub write_errors: AtomicU64,
    pub not_replicated: AtomicU64,
    pub read_errors: AtomicU64,
    pub lost: AtomicU64,
    pub corrupt: AtomicU64,
    pub retries: AtomicU64,
    pub redirects: AtomicU64,
    pub failovers_seen: AtomicU64,
    pub connection_losses: AtomicU64,
    pub cluster_down: AtomicU64,
    pub timeouts: AtomicU64,
    pub reconnects: AtomicU64,
    pub direct_reads: AtomicU64,
    pub direct_handed_on: AtomicU64,
    pub deletes: AtomicU64,
    pub delete_requests: AtomicU64,
    pub delete_errors: AtomicU64,
    pub ttl_refreshes: AtomicU64,
    pub ttl_refresh_errors: AtomicU64,
    /// guarded: round trips of single reads (µs)
    pub get_latency: Mutex<Latency>,
    /// guarded: round trips of write batches (µs), `WAIT` included
    pub put_latency: Mutex<Latency>,
}

pub(crate) struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        // 1 µs .. 1 h, 3 significant digits
        Latency(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"))
    }
}

impl Latency {
    pub fn record(&mut self, d: Duration) {
        self.0.saturating_record(d.as_micros().max(1) as u64);
    }

    fn summary(&self) -> LatencySummary {
        let h = &self.0;
        LatencySummary {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// Percentiles of a round-trip latency, in µs (all 0 when nothing was measured).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Requests measured.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest.
    pub max_us: u64,
}

/// A snapshot of the remote tier's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteCounters {
    /// Values read and verified.
    pub reads: u64,
    /// Values written and acknowledged (primary + `replicas_to_wait` replicas).
    pub writes: u64,
    /// Payload bytes read (trailers not counted).
    pub bytes_in: u64,
    /// Payload bytes written and acknowledged (as the engine gave them).
    pub bytes_out: u64,
    /// ... as stored in the cluster: compressed where lz4 paid (trailers not counted).
    pub stored_bytes_out: u64,
    /// Write batches that completed with an error (the caller keeps those pages).
    pub write_errors: u64,
    /// ... of which: the replicas did not confirm in time.
    pub not_replicated: u64,
    /// Reads that completed with an error (any kind, lost and corrupt included).
    pub read_errors: u64,
    /// Reads whose value was gone or an older write.
    pub lost: u64,
    /// Reads whose value failed the checks.
    pub corrupt: u64,
    /// Attempts repeated after a transient error.
    pub retries: u64,
    /// MOVED/ASK answers.
    pub redirects: u64,
    /// MOVED answers naming a node that was not a primary before (a replica promoted).
    pub failovers_seen: u64,
    /// Attempts that failed on a broken or refused connection.
    pub connection_losses: u64,
    /// CLUSTERDOWN/TRYAGAIN/MASTERDOWN/LOADING answers.
    pub cluster_down: u64,
    /// Attempts that ran past `op_timeout`.
    pub timeouts: u64,
    /// Connections replaced after answering nothing twice in a row.
    pub reconnects: u64,
    /// Values read by an engine thread on its own connection (`RemoteClient::direct`).
    pub direct_reads: u64,
    /// Reads the direct path handed to the store's async path (no route or connection
    /// yet, a redirect or another error reply, a missing or damaged value, a timeout).
    pub direct_handed_on: u64,
    /// Ids deleted.
    pub deletes: u64,
    /// `HDEL` requests that carried them (deletes queue and go out a group at a time).
    pub delete_requests: u64,
    /// Delete requests that failed (their keys expire with the TTL).
    pub delete_errors: u64,
    /// Group keys whose TTL was refreshed.
    pub ttl_refreshes: u64,
    /// TTL refreshes that failed.
    pub ttl_refresh_errors: u64,
    /// Ids holding a value now.
    pub live_ids: u64,
    /// Single reads, request to completion.
    pub get_latency: LatencySummary,
    /// Write batches, request to completion.
    pub put_latency: LatencySummary,
}

impl Counters {
    pub fn snapshot(&self, live_ids: u64) -> RemoteCounters {
        let l = |a: &AtomicU64| a.load(Relaxed);
        RemoteCounters {
            reads: l(&self.reads),
            writes: l(&self.writes),
            bytes_in: l(&self.bytes_in),
            bytes_out: l(&self.bytes_out),
            stored_bytes_out: l(&self.stored_bytes_out),
            write_errors: l(&self.write_errors),
            not_replicated: l(&self.not_replicated),
            read_errors: l(&self.read_errors),
            lost: l(&self.lost),
            corrupt: l(&self.corrupt),
            retries: l(&self.retries),
            redirects: l(&self.redirects),
            failovers_seen: l(&self.failovers_seen),
            connection_losses: l(&self.connection_losses),
            cluster_down: l(&self.cluster_down),
            timeouts: l(&self.timeouts),
            reconnects: l(&self.reconnects),
            direct_reads: l(&self.direct_reads),
            direct_handed_on: l(&self.direct_handed_on),
            deletes: l(&self.deletes),
            delete_requests: l(&self.delete_requests),
            delete_errors: l(&self.delete_errors),
            ttl_refreshes: l(&self.ttl_refreshes),
            ttl_refresh_errors: l(&self.ttl_refresh_errors),
            live_ids,
            get_latency: self.get_latency.lock().expect("latency").summary(),
            put_latency: self.put_latency.lock().expect("latency").summary(),
        }
    }

    pub fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Relaxed);
    }
}
