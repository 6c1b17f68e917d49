//! What can go wrong with the remote tier, one variant per cause the engine handles differently.

use std::time::Duration;

/// An error of the remote tier.
///
/// The engine's reading of the variants:
/// - [`Lost`](RemoteError::Lost) and [`Corrupt`](RemoteError::Corrupt): the page's value is gone
///   or not the page's: poison the page (never map zeros or another page's bytes).
/// - [`Unavailable`](RemoteError::Unavailable): the cluster could not answer within
///   `retry_for` (failover that did not finish, a shard without any live copy, network down).
///   For a read, the engine decides (poison or retry later); for a write, keep the page.
/// - [`NotReplicated`](RemoteError::NotReplicated): the primary took the write but not enough
///   replicas confirmed it within `wait_timeout`: the write does not count; keep the page or
///   write it elsewhere.
/// - The rest are configuration or usage errors.
// the fields are what the messages print
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// Bad settings (an empty node list, a malformed address, tls mixed with redis://, ...).
    #[error("remote tier: bad configuration: {0}")]
    Config(String),

    /// No seed node answered at connect.
    #[error("remote tier: no Redis node reachable at {nodes}: {cause}")]
    Unreachable { nodes: String, cause: String },

    /// A seed answered but it is a standalone Redis, not a cluster.
    #[error("remote tier: {node} is not a Redis Cluster node (cluster support disabled); the remote tier needs Redis Cluster or Valkey in cluster mode")]
    NotACluster { node: String },

    /// The cluster answered at connect but does not serve all its slots.
    #[error("remote tier: cluster at {node} is not serving (cluster_state:{state})")]
    ClusterDown { node: String, state: String },

    /// AUTH/ACL refused the credentials, or the user may not run the commands the tier needs.
    #[error("remote tier: {node} refused access: {cause}")]
    Denied { node: String, cause: String },

    /// The value of this id is gone: its key or field is missing (every copy lost, expired, or
    /// deleted), or it holds an older write of the id than the last acknowledged one.
    #[error("remote tier: value of id {id} is lost ({why})")]
    Lost { id: u64, why: &'static str },

    /// The value under this id's key is not this page's (bad magic, wrong id, wrong length,
    /// checksum mismatch).
    #[error("remote tier: value of id {id} is corrupt ({why})")]
    Corrupt { id: u64, why: String },

    /// The cluster did not answer (or kept redirecting/refusing) for `retry_for`.
    #[error("remote tier: cluster unavailable for {waited:?} ({attempts} attempts): {last}")]
    Unavailable {
        waited: Duration,
        attempts: u32,
        last: String,
    },

    /// The primary took the write but only `acked` of the `wanted` replicas confirmed it.
    #[error(
        "remote tier: write acknowledged by {acked} of {wanted} replicas within the wait timeout"
    )]
    NotReplicated { acked: u32, wanted: u32 },

    /// A server error that retrying cannot fix (out of memory, ACL, unexpected reply).
    #[error("remote tier: server error: {0}")]
    Server(String),

    /// The id was never written through this store (or was deleted): nothing to read.
    #[error("remote tier: id {id} holds no value of this store")]
    NotStored { id: u64 },

    /// The store is closed.
    #[error("remote tier: store is closed")]
    Closed,
}

impl RemoteError {
    /// The page's value is gone or not the page's (the engine poisons the page).
    pub fn is_data_loss(&self) -> bool {
        matches!(self, RemoteError::Lost { .. } | RemoteError::Corrupt { .. })
    }
}
