//! One install: the `uswap` binary alone, in an otherwise empty prefix, runs a program
//! under uswap with nothing else there, on the PATH or in the environment (the preload
//! library comes inside the binary).
//!
//! `cargo install --path crates/uswap-cli` installs exactly this binary (bin/uswap, no
//! other file). The test copies the one the tests built instead of running cargo
//! install: with a target directory of its own, that rebuilds the CLI's dependencies
//! and the embedded library's engine (minutes more on 2 vCPUs, each time the sources
//! change); sharing the tests' build directory made each of the two builds rebuild
//! ring and the crates above it after the other (88-154 s per install).

mod common;

use common::support;
use std::path::Path;
use std::process::Command;

/// What a 256 MiB bytearray (4x the budget) holds after a pattern is written to it,
/// every page checked.
const PROGRAM: &str = r#"
import sys
n = 256 << 20
b = bytearray(n)
page = bytes(range(256)) * 16
for i in range(0, n, 4096):
    b[i:i + 4096] = page
    b[i:i + 4] = (i // 4096).to_bytes(4, "little")
bad = sum(1 for i in range(0, n, 4096)
          if b[i:i + 4] != (i // 4096).to_bytes(4, "little") or b[i + 4:i + 4096] != page[4:])
print("pages wrong:", bad)
sys.exit(1 if bad else 0)
"#;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_binary_alone_runs_a_program_under_uswap() {
    let root = support::TempDir::new(&common::tmpdir(), "install-root");
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(common::uswap_exe(), bin.join("uswap")).expect("copy uswap");

    // env -i PATH=/usr/bin:/bin ROOT/bin/uswap run ...
    let mut cmd = Command::new(bin.join("uswap"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir(Path::new("/"))
        .args([
            "run", "--budget", "64M", "--stats", "--", "python3", "-c", PROGRAM,
        ]);
    let out = common::run_with_deadline(cmd, 300);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}{stderr}", text(&out.stdout));
    assert_eq!(text(&out.stdout).trim(), "pages wrong: 0");
    let stats: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("uswap_stats").cloned())
        .collect();
    assert_eq!(stats.len(), 1, "{stderr}");
    let pswpout = stats[0]["counters"]["pswpout"].as_u64().unwrap();
    assert!(pswpout > 0, "nothing swapped: {stderr}");
    // Still nothing but the binary in the prefix.
    let files: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .chain(std::fs::read_dir(&bin).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["bin", "uswap"]);
}
