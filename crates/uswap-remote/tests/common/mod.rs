//! A real local Redis Cluster for a test (scripts/redis-cluster.sh), stopped on drop, on panic,
//! and by a watchdog that ends the test process when a test runs past its deadline.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uswap_remote::RemoteConfig;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

fn stop(dir: &Path) {
    let _ = Command::new(script())
        .args(["stop", "--dir"])
        .arg(dir)
        .status();
}

/// One node as `CLUSTER NODES` shows it.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// the primary's id, for a replica
    pub primary_of: Option<String>,
    /// slot ranges served, for a primary
    pub slots: Vec<(u16, u16)>,
}

/// A running cluster; stopped (servers killed, directory removed) on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub ports: Vec<u16>,
    pub password: Option<String>,
    /// TLS only (rediss://), trusting `dir/tls/ca.crt`
    pub tls: bool,
    watchdog: Arc<AtomicBool>,
}

impl Cluster {
    /// Starts a 3+3 cluster on free ports from `base_port` (give each test its own range),
    /// node timeout 1000 ms, and a watchdog: past `deadline` the cluster is stopped and the
    /// test process exits with a failure.
    pub fn start(base_port: u16, deadline: Duration) -> Cluster {
        Cluster::start_with(base_port, deadline, None, false)
    }

    pub fn start_with(
        base_port: u16,
        deadline: Duration,
        password: Option<&str>,
        tls: bool,
    ) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "uswap-remote-test-{}-{}",
            std::process::id(),
            base_port
        ));
        let watchdog = Arc::new(AtomicBool::new(true));
        {
            let armed = watchdog.clone();
            let dir = dir.clone();
            std::thread::spawn(move || {
                let end = Instant::now() + deadline;
                while Instant::now() < end {
                    if !armed.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                if armed.load(Ordering::Acquire) {
                    eprintln!("WATCHDOG: test using cluster {} ran past {deadline:?}; stopping the cluster and failing", dir.display());
                    stop(&dir);
                    std::process::exit(101);
                }
            });
        }
        // a port can be taken between the script's probe and the server's bind (another
        // test, another session): try again a few ports further (each test owns 20)
        let mut tries = Vec::new();
        let out = loop {
            let mut cmd = Command::new(script());
            cmd.args(["start", "--dir"]).arg(&dir).args([
                "--base-port",
                &(base_port + 7 * tries.len() as u16).to_string(),
                "--node-timeout",
                "1000",
                "--owner",
                &std::process::id().to_string(),
            ]);
            if let Some(pw) = password {
                cmd.args(["--password", pw]);
            }
            if tls {
                cmd.arg("--tls");
            }
            let out = cmd.output().expect("run scripts/redis-cluster.sh");
            if out.status.success() {
                break out;
            }
            tries.push(format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
            if tries.len() == 3 {
                watchdog.store(false, Ordering::Release);
                panic!(
                    "cluster did not start (3 tries):\n{}",
                    tries.join("\n---\n")
                );
            }
        };
        let ports = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
            .collect::<Vec<u16>>();
        assert_eq!(
            ports.len(),
            6,
            "six nodes: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        Cluster {
            dir,
            ports,
            password: password.map(str::to_string),
            tls,
            watchdog,
        }
    }

    /// Settings for a store on this cluster, with short timeouts for tests.
    pub fn config(&self) -> RemoteConfig {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let mut cfg = RemoteConfig::new(
            self.ports
                .iter()
                .map(|p| format!("{scheme}://127.0.0.1:{p}")),
        );
        cfg.password = self.password.clone();
        if self.tls {
            cfg.tls = true;
            cfg.tls_ca_file = Some(self.dir.join("tls/ca.crt"));
        }
        cfg.retry_for = Duration::from_secs(15);
        cfg.op_timeout = Duration::from_secs(2);
        cfg.wait_timeout = Duration::from_millis(1000);
        cfg
    }

    /// redis-cli against one node; the answer's text.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        if self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(self.dir.join("tls/ca.crt"));
        }
        if let Some(pw) = &self.password {
            cmd.env("REDISCLI_AUTH", pw);
        }
        let out = cmd.args(args).output().expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// redis-cli with a binary value as the last argument (read from stdin with -x).
    pub fn cli_with_value(&self, port: u16, args: &[&str], value: &[u8]) -> String {
        use std::io::Write;
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-x"]);
        if let Some(pw) = &self.password {
            cmd.env("REDISCLI_AUTH", pw);
        }
        let mut child = cmd
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run redis-cli");
        child.stdin.take().unwrap().write_all(value).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The raw bytes of a hash field (redis-cli --no-raw would escape them; use RESP via a
    /// tiny client instead).
    pub fn hget_raw(&self, port: u16, key: &str, field: &str) -> Option<Vec<u8>> {
        resp_command(
            port,
            self.password.as_deref(),
            &[b"HGET", key.as_bytes(), field.as_bytes()],
        )
    }

    /// Sets a hash field to raw bytes.
    pub fn hset_raw(&self, port: u16, key: &str, field: &str, value: &[u8]) {
        resp_command(
            port,
            self.password.as_deref(),
            &[b"HSET", key.as_bytes(), field.as_bytes(), value],
        );
    }

    /// The nodes as a live node sees them.
    pub fn nodes(&self) -> Vec<Node> {
        let text = self
            .live_ports()
            .into_iter()
            .map(|p| self.cli(p, &["cluster", "nodes"]))
            .find(|t| !t.is_empty())
            .expect("some node answers");
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f[1]
                    .split(['@', ','])
                    .next()
                    .unwrap()
                    .rsplit_once(':')
                    .unwrap()
                    .1
                    .parse()
                    .unwrap();
                let flags: Vec<&str> = f[2].split(',').collect();
                let slots = f[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .map(|s| match s.split_once('-') {
                        Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                        None => (s.parse().unwrap(), s.parse().unwrap()),
                    })
                    .collect();
                Node {
                    id: f[0].to_string(),
                    port,
                    primary: flags.contains(&"master"),
                    failed: flags.iter().any(|x| x.starts_with("fail")),
                    primary_of: (f[3] != "-").then(|| f[3].to_string()),
                    slots,
                }
            })
            .collect()
    }

    /// Ports whose server still runs.
    pub fn live_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| self.pid(p).is_some())
            .collect()
    }

    /// The pid of the server on `port`, if it runs.
    pub fn pid(&self, port: u16) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.dir.join(format!("redis-{port}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(&format!("127.0.0.1:{port}"))
            .then_some(pid)
    }

    /// SIGKILL the server on `port`.
    pub fn kill(&self, port: u16) {
        let pid = self.pid(port).expect("server runs");
        let ok = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -KILL {pid}");
        let end = Instant::now() + Duration::from_secs(5);
        while self.pid(port).is_some() {
            assert!(Instant::now() < end, "server {port} survived SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The slot of a key.
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        self.cli(port, &["cluster", "keyslot", key])
            .parse()
            .expect("CLUSTER KEYSLOT")
    }

    /// The primary (live, not failed) serving `slot`, as this cluster sees it now.
    pub fn primary_of_slot(&self, slot: u16) -> Option<Node> {
        self.nodes().into_iter().find(|n| {
            n.primary && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
        })
    }

    /// Waits until every live node says cluster_state:ok and `check` holds.
    pub fn wait_until(&self, what: &str, timeout: Duration, check: impl Fn(&Cluster) -> bool) {
        let end = Instant::now() + timeout;
        loop {
            if check(self) {
                return;
            }
            assert!(
                Instant::now() < end,
                "cluster: {what} not within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Keys on all live primaries (DBSIZE summed).
    pub fn total_keys(&self) -> u64 {
        self.nodes()
            .iter()
            .filter(|n| n.primary && !n.failed && self.pid(n.port).is_some())
            .map(|n| self.cli(n.port, &["dbsize"]).parse::<u64>().unwrap_or(0))
            .sum()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.watchdog.store(false, Ordering::Release);
        stop(&self.dir);
    }
}

/// One RESP command on a fresh connection; the bulk-string answer (None for nil), or panics
/// on an error answer. Enough for tests that need binary values.
pub fn resp_command(port: u16, password: Option<&str>, args: &[&[u8]]) -> Option<Vec<u8>> {
    use std::io::{BufRead, BufReader, Read, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let send = |w: &mut std::net::TcpStream, args: &[&[u8]]| {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        w.write_all(&buf).unwrap();
    };
    let read = |r: &mut BufReader<std::net::TcpStream>| -> Option<Vec<u8>> {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        match line.as_bytes().first() {
            Some(b'$') => {
                let n: i64 = line[1..].parse().unwrap();
                if n < 0 {
                    return None;
                }
                let mut v = vec![0u8; n as usize + 2];
                r.read_exact(&mut v).unwrap();
                v.truncate(n as usize);
                Some(v)
            }
            Some(b'-') => panic!("redis error: {line}"),
            _ => Some(line.as_bytes()[1..].to_vec()),
        }
    };
    if let Some(pw) = password {
        send(&mut writer, &[b"AUTH", pw.as_bytes()]);
        read(&mut reader);
    }
    send(&mut writer, args);
    read(&mut reader)
}

/// Deterministic page contents: every byte depends on the id and a seed.
pub fn page(id: u64, seed: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ seed.wrapping_mul(0xd1b5_4a32_d192_ed03)
        ^ len as u64;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}
