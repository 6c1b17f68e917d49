//! A local Redis Cluster (scripts/redis-cluster.sh: 3 primaries + 3 replicas on
//! loopback) for the remote tiers' tests of the engine and of the command, stopped on
//! drop and, through the script's `--owner`, once the test process is gone (a watchdog's
//! abort, a SIGKILL). Included by path from both crates' `common` modules.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A running cluster, stopped on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub ports: Vec<u16>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

/// Run `cmd` in a process group of its own, output captured, killed with its group
/// (and the test failed) past `secs`. The command tests run every program this way.
pub fn run_with_deadline(mut cmd: Command, secs: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // kill(1) the process group of the child this test started.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
            panic!("{cmd:?} did not finish in {secs} s");
        }
    }
}

impl Cluster {
    /// A cluster on free ports from `base_port` (each test its own range) with the
    /// script's default node timeout.
    pub fn start(base_port: u16) -> Cluster {
        Cluster::start_with(base_port, None)
    }

    /// As `start`, with the nodes' failure timeout in ms (shorter: a killed primary is
    /// replaced sooner).
    pub fn start_with(base_port: u16, node_timeout_ms: Option<u32>) -> Cluster {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "uswap-cluster-{}-{}-{base_port}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        // Stopped by this guard even if the start fails half-way.
        let mut c = Cluster {
            dir,
            ports: Vec::new(),
        };
        let mut cmd = Command::new(script());
        cmd.args(["start", "--dir"])
            .arg(&c.dir)
            .args(["--base-port", &base_port.to_string()])
            .args(["--owner", &std::process::id().to_string()]);
        if let Some(ms) = node_timeout_ms {
            cmd.args(["--node-timeout", &ms.to_string()]);
        }
        let out = run_with_deadline(cmd, 120);
        assert!(
            out.status.success(),
            "cannot start a local Redis Cluster (the remote tiers' tests need one: \
             scripts/test.sh installs redis-server): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c.ports = std::fs::read_to_string(c.dir.join("ports"))
            .expect("the script's port list")
            .lines()
            .map(|l| l.trim().parse().expect("a port"))
            .collect();
        c
    }

    /// The seed nodes, as the remote tier's option takes them.
    pub fn nodes(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `redis-cli -p PORT ARGS...`'s output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn primaries(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports
            .iter()
            .copied()
            .filter(|&p| self.cli(p, &["role"]).starts_with("master"))
    }

    /// Keys in the cluster now (primaries only).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .primaries()
            .flat_map(|p| {
                self.cli(p, &["--scan"])
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        keys.retain(|k| !k.is_empty());
        keys
    }

    /// SIGKILL a primary (one that serves slots); its port.
    pub fn kill_a_primary(&self) -> u16 {
        let port = self.primaries().next().expect("a primary");
        let pid = std::fs::read_to_string(self.dir.join(format!("redis-{port}.pid")))
            .expect("pid file")
            .trim()
            .to_string();
        assert!(Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success());
        port
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .status();
    }
}
