//! Settings of a [`RemoteStore`](crate::RemoteStore).

use std::time::Duration;

use crate::RemoteError;

/// How to reach the cluster and how hard to try.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Seed nodes: `redis://host:port`, `rediss://host:port` or `host:port` (the scheme then
    /// follows `tls`). Any one reachable seed is enough; give several so that one dead node does
    /// not stop a start.
    pub nodes: Vec<String>,
    /// ACL user (`AUTH username password`); `None` is the default user.
    pub username: Option<String>,
    /// Password (`requirepass` or the ACL user's).
    pub password: Option<String>,
    /// TLS to every node (`rediss://`). Needs the crate's `tls` feature (on by default).
    pub tls: bool,
    /// PEM file of the CA to trust for TLS instead of the system's roots (a private CA).
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// `WAIT numreplicas`: a write counts once the primary and this many replicas have it.
    /// `None`: 1 when every shard has a replica, else 0. Larger than the smallest shard's
    /// replica count is refused at connect (every write would fail).
    pub replicas_to_wait: Option<u32>,
    /// `WAIT`'s timeout: a write not confirmed by the replicas within it completes as
    /// [`RemoteError::NotReplicated`].
    pub wait_timeout: Duration,
    /// One attempt of one request (connect, response); a slower attempt is retried.
    pub op_timeout: Duration,
    /// How long a request keeps retrying across failover (MOVED/ASK, connection loss,
    /// CLUSTERDOWN, TRYAGAIN) before it completes as [`RemoteError::Unavailable`]. Set it above
    /// the cluster's failover time (about twice `cluster-node-timeout`).
    pub retry_for: Duration,
    /// Expiry of every key; refreshed every `key_ttl / 4` while the store lives, so the keys of
    /// a killed process vanish within about `key_ttl`.
    pub key_ttl: Duration,
    /// Connections for writes (each waits for its `WAIT`s in turn; reads and deletes have
    /// their own connection so a fault never queues behind a `WAIT`).
    pub write_connections: usize,
    /// Worker threads of the store's runtime.
    pub runtime_threads: usize,
    /// Let [`RemoteClient::direct`](crate::RemoteClient::direct) give engine threads reads
    /// on connections of their own (one wake-up per read instead of two hand-offs through
    /// the runtime; the runtime stays the fallback). Off: reads go through the runtime only.
    /// Never with TLS.
    pub direct_reads: bool,
    /// Store values lz4-compressed when that saves at least an eighth (fewer bytes on the
    /// wire, in the cluster's RAM and in its replication; the value's checksum covers the
    /// stored bytes). Off: every value is stored as it is.
    pub compress: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            nodes: Vec::new(),
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            replicas_to_wait: None,
            wait_timeout: Duration::from_millis(1000),
            op_timeout: Duration::from_millis(3000),
            retry_for: Duration::from_secs(30),
            key_ttl: Duration::from_secs(15 * 60),
            write_connections: 2,
            runtime_threads: 2,
            direct_reads: true,
            compress: true,
        }
    }
}

impl std::fmt::Debug for RemoteConfig {
    // never print the password
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("replicas_to_wait", &self.replicas_to_wait)
            .field("wait_timeout", &self.wait_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("retry_for", &self.retry_for)
            .field("key_ttl", &self.key_ttl)
            .field("write_connections", &self.write_connections)
            .field("runtime_threads", &self.runtime_threads)
            .field("direct_reads", &self.direct_reads)
            .field("compress", &self.compress)
            .finish()
    }
}

impl RemoteConfig {
    /// Settings with these seed nodes and the defaults for the rest.
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        RemoteConfig {
            nodes: nodes.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// Parses `redis://host:port[,host:port...]` (the CLI's `--remote` value): a comma-separated
    /// list whose first entry may carry the scheme (`rediss://` turns TLS on) and
    /// `user:password@`, which then apply to every node.
    pub fn from_list(list: &str) -> Result<Self, RemoteError> {
        let mut cfg = RemoteConfig::default();
        let mut rest = list.trim();
        if let Some(r) = rest.strip_prefix("rediss://") {
            cfg.tls = true;
            rest = r;
        } else if let Some(r) = rest.strip_prefix("redis://") {
            rest = r;
        }
        if let Some((cred, r)) = rest.rsplit_once('@') {
            match cred.split_once(':') {
                Some((user, pass)) => {
                    if !user.is_empty() {
                        cfg.username = Some(user.to_string());
                    }
                    cfg.password = Some(pass.to_string());
                }
                None => cfg.password = Some(cred.to_string()),
            }
            rest = r;
        }
        cfg.nodes = rest
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        cfg.node_addresses()?;
        Ok(cfg)
    }

    /// The seed nodes as `(host, port)`, checked against `tls`.
    pub(crate) fn node_addresses(&self) -> Result<Vec<(String, u16)>, RemoteError> {
        if self.nodes.is_empty() {
            return Err(RemoteError::Config("no seed nodes given".into()));
        }
        self.nodes
            .iter()
            .map(|node| {
                let hostport = if let Some(r) = node.strip_prefix("rediss://") {
                    if !self.tls {
                        return Err(RemoteError::Config(format!(
                            "node {node} says rediss:// but tls is off"
                        )));
                    }
                    r
                } else if let Some(r) = node.strip_prefix("redis://") {
                    if self.tls {
                        return Err(RemoteError::Config(format!(
                            "node {node} says redis:// but tls is on"
                        )));
                    }
                    r
                } else if node.contains("://") {
                    return Err(RemoteError::Config(format!(
                        "node {node}: only redis:// and rediss:// are supported"
                    )));
                } else {
                    node.as_str()
                };
                let hostport = hostport.trim_end_matches('/');
                let (host, port) = hostport.rsplit_once(':').ok_or_else(|| {
                    RemoteError::Config(format!("node {node}: expected host:port"))
                })?;
                let port: u16 = port
                    .parse()
                    .map_err(|_| RemoteError::Config(format!("node {node}: bad port {port:?}")))?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() || host.contains('@') || host.contains('/') {
                    return Err(RemoteError::Config(format!(
                        "node {node}: bad host (give credentials in username/password)"
                    )));
                }
                Ok((host.to_string(), port))
            })
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), RemoteError> {
        self.node_addresses()?;
        let positive = [
            ("wait_timeout", self.wait_timeout),
            ("op_timeout", self.op_timeout),
            ("key_ttl", self.key_ttl),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(RemoteError::Config(format!("{name} must be > 0")));
            }
        }
        if self.key_ttl < Duration::from_secs(4) {
            return Err(RemoteError::Config(format!(
                "key_ttl {:?} is too short (at least 4 s: keys are refreshed every key_ttl/4)",
                self.key_ttl
            )));
        }
        if self.wait_timeout >= self.op_timeout {
            return Err(RemoteError::Config(format!(
                "wait_timeout {:?} must be shorter than op_timeout {:?} (a write's attempt includes its WAIT)",
                self.wait_timeout, self.op_timeout
            )));
        }
        if self.write_connections == 0 || self.runtime_threads == 0 {
            return Err(RemoteError::Config(
                "write_connections and runtime_threads must be >= 1".into(),
            ));
        }
        if self.tls_ca_file.is_some() && !self.tls {
            return Err(RemoteError::Config(
                "tls_ca_file given but tls is off".into(),
            ));
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(RemoteError::Config(
                "tls asked for but uswap-remote was built without its `tls` feature".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_parses_scheme_credentials_and_nodes() {
        let cfg = RemoteConfig::from_list("rediss://app:s3cret@h1:7000,h2:7001").unwrap();
        assert!(cfg.tls);
        assert_eq!(cfg.username.as_deref(), Some("app"));
        assert_eq!(cfg.password.as_deref(), Some("s3cret"));
        assert_eq!(cfg.nodes, vec!["h1:7000", "h2:7001"]);
        assert_eq!(
            cfg.node_addresses().unwrap(),
            vec![("h1".to_string(), 7000), ("h2".to_string(), 7001)]
        );
        let cfg = RemoteConfig::from_list("redis://127.0.0.1:30000").unwrap();
        assert!(!cfg.tls && cfg.password.is_none());
    }

    #[test]
    fn bad_nodes_are_clear_errors() {
        for bad in ["", "redis://", "h1", "h1:port", "http://h1:1", "h1:70000"] {
            let err = RemoteConfig::from_list(bad).unwrap_err();
            assert!(matches!(err, RemoteError::Config(_)), "{bad}: {err}");
        }
        let mut cfg = RemoteConfig::new(["redis://h:1"]);
        cfg.tls = true;
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("tls is on"));
    }

    #[test]
    fn timeouts_are_checked() {
        let mut cfg = RemoteConfig::new(["h:1"]);
        assert_eq!(cfg.validate(), Ok(()));
        cfg.wait_timeout = cfg.op_timeout;
        assert!(cfg.validate().is_err());
        let mut cfg = RemoteConfig::new(["h:1"]);
        cfg.key_ttl = Duration::from_secs(1);
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn debug_hides_the_password() {
        let mut cfg = RemoteConfig::new(["h:1"]);
        cfg.password = Some("hunter2".into());
        assert!(!format!("{cfg:?}").contains("hunter2"));
    }
}
