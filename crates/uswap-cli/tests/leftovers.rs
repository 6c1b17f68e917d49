//! Nothing is left behind by a `uswap bench` killed with SIGKILL mid-run: its swap file
//! is unnamed (O_TMPFILE), so its space goes with the process. Checked on a filesystem
//! of its own: no name in it, its free space back to what it was, no open descriptor
//! into it anywhere. (`--against` and `--cgroup-limit` after SIGKILL: tests/against.rs;
//! `uswap run`: tests/run.rs.) Needs root (loop mount, userfaultfd).

#[path = "../../uswap/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigkill_of_bench_leaves_no_file_no_space_no_descriptor() {
    let fs = support::Mount::ext4(Path::new(env!("CARGO_TARGET_TMPDIR")), "bench-kill", 256);
    let free = fs.free_bytes();
    let mut child = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(["bench", "pmbench", "--size", "128M", "--budget", "16M"])
        .args(["--duration", "120s", "--swap-file"])
        .arg(fs.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start uswap bench");
    // Running with its swap file grown: the region's 128 MiB are taken on the disk.
    let t0 = Instant::now();
    while fs.free_bytes() + (100 << 20) > free {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the bench did not start"
        );
        assert!(child.try_wait().unwrap().is_none(), "the bench ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(fs.entries().is_empty(), "left behind: {:?}", fs.entries());
    fs.free_space_returns(free);
    let fds = support::fds_into(fs.path());
    assert!(fds.is_empty(), "{fds:?}");
}
