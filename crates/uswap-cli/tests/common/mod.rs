//! Shared by the test files: the `uswap` binary, `libuswap_preload.so` built next to it,
//! C programs from tests/progs compiled once per test process.

// Each test file uses some of these.
#![allow(dead_code)]

#[path = "../../../uswap/tests/support/mod.rs"]
pub mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn uswap_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_uswap"))
}

/// Build libuswap_preload.so next to the `uswap` binary (once per test process).
pub fn preload() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let profile_dir = uswap_exe().parent().expect("profile dir");
        support::build_cdylibs(profile_dir);
        let lib = profile_dir.join("libuswap_preload.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        lib
    })
}

pub fn tmpdir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("uswap-run-tests");
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// Compile tests/progs/NAME.c (once per test process).
pub fn cprog(name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs")
        .join(format!("{name}.c"));
    let out = tmpdir().join(format!("{name}-{}", std::process::id()));
    if !out.exists() {
        let st = Command::new("cc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("run cc");
        assert!(st.success(), "cc {} failed", src.display());
    }
    out
}

/// Run `cmd` (stdin empty, output captured) with a deadline; kill it and its children
/// and fail on a hang.
pub fn run_with_deadline(mut cmd: Command, secs: u64) -> Output {
    use std::os::unix::process::CommandExt;
    // Own process group, so that a hung forked child is killed with its parent.
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    loop {
        if let Ok(out) = rx.try_recv() {
            return out.expect("wait");
        }
        if Instant::now() > deadline {
            // kill(1) the process group of the child this test started.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
            panic!("{cmd:?} did not finish in {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running cluster, stopped on drop.
pub struct Cluster {
    dir: PathBuf,
    pub ports: Vec<u16>,
}

fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

impl Cluster {
    pub fn start(base_port: u16) -> Cluster {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "uswap-cli-cluster-{}-{base_port}",
            std::process::id()
        ));
        let mut cmd = Command::new(cluster_script());
        cmd.args(["start", "--dir"])
            .arg(&dir)
            .args(["--base-port", &base_port.to_string()])
            .args(["--owner", &std::process::id().to_string()]);
        // Stopped by the guard even if the start fails half-way.
        let mut c = Cluster {
            dir,
            ports: Vec::new(),
        };
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

    pub fn nodes(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Cluster {
    /// Keys in the cluster now (primaries only).
    pub fn keys(&self) -> Vec<String> {
        let cli = |port: u16, args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-p", &port.to_string()])
                .args(args)
                .output()
                .expect("redis-cli");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let mut keys = Vec::new();
        for &port in &self.ports {
            if cli(port, &["role"]).starts_with("master") {
                keys.extend(cli(port, &["--scan"]).lines().map(str::to_string));
            }
        }
        keys.retain(|k| !k.is_empty());
        keys
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(cluster_script())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .status();
    }
}
