//! One cluster connection of the store, replaced when it stops answering.
//!
//! redis-rs's cluster connection repairs itself after MOVED and lost connections, but after
//! a whole shard died (primary and replicas) we saw one wedge: every request on it timed out
//! while a fresh connection to the same cluster answered at once. So a request that times out
//! twice in a row asks for a fresh connection (built from the seeds, with a fresh slot map);
//! requests already in flight finish on the old one.

use std::sync::{Mutex, RwLock};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use crate::RemoteError;

pub(crate) struct Conn {
    client: ClusterClient,
    /// guarded: the connection in use and its generation (bumped by every rebuild)
    current: RwLock<(u64, ClusterConnection)>,
    /// held while a rebuild runs (one at a time)
    rebuilding: tokio::sync::Mutex<()>,
    /// guarded: the last rebuild's error, for messages
    last_error: Mutex<Option<String>>,
}

impl Conn {
    /// Opens a connection (bounded by `timeout`).
    pub async fn open(client: ClusterClient, timeout: Duration) -> Result<Conn, RemoteError> {
        let conn = connect(&client, timeout).await?;
        Ok(Conn {
            client,
            current: RwLock::new((0, conn)),
            rebuilding: tokio::sync::Mutex::new(()),
            last_error: Mutex::new(None),
        })
    }

    /// The connection in use, with its generation.
    pub fn get(&self) -> (u64, ClusterConnection) {
        let current = self.current.read().expect("connection");
        (current.0, current.1.clone())
    }

    /// Replaces the connection of generation `failed` (unless another request did already).
    /// True when a new connection is in place.
    pub async fn rebuild(&self, failed: u64, timeout: Duration) -> bool {
        let _one_at_a_time = self.rebuilding.lock().await;
        if self.current.read().expect("connection").0 != failed {
            return true;
        }
        match connect(&self.client, timeout).await {
            Ok(conn) => {
                let mut current = self.current.write().expect("connection");
                *current = (failed + 1, conn);
                true
            }
            Err(e) => {
                *self.last_error.lock().expect("last error") = Some(e.to_string());
                false
            }
        }
    }
}

async fn connect(
    client: &ClusterClient,
    timeout: Duration,
) -> Result<ClusterConnection, RemoteError> {
    let unreachable = |cause: String| RemoteError::Unreachable {
        nodes: "the seed nodes".into(),
        cause,
    };
    tokio::time::timeout(timeout, client.get_async_connection())
        .await
        .map_err(|_| unreachable("cluster connection timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))
}
