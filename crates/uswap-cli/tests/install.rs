//! One install: `cargo install --path crates/uswap-cli` into an empty prefix gives a
//! `uswap` whose `run` works with nothing else there, on the PATH or in the
//! environment (the preload library comes inside the binary).

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
fn cargo_install_alone_runs_a_program_under_uswap() {
    let profile_dir = common::uswap_exe().parent().expect("profile dir");
    let root = support::TempDir::new(&common::tmpdir(), "install-root");
    // The test build's build directory (cargo's intermediate artifacts): cargo install
    // then reuses what the tests built, the embedded library's build too, instead of
    // building it all again (a fresh target directory: minutes more on 2 vCPUs). Its
    // final artifacts go to a directory of their own, so that the `uswap` of the tests
    // is not replaced by this build (resolved for uswap-cli alone).
    let target = profile_dir.parent().expect("target dir");
    let mut cmd = support::cargo();
    cmd.args(["install", "--quiet", "--locked", "--offline", "--path"])
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg("--root")
        .arg(root.path())
        .arg("--target-dir")
        .arg(target.join("install-test"))
        .env("CARGO_BUILD_BUILD_DIR", target);
    if profile_dir.file_name().is_some_and(|n| n == "debug") {
        cmd.arg("--debug");
    }
    let started = std::time::Instant::now();
    let out = common::run_with_deadline(cmd, 1200);
    assert!(
        out.status.success(),
        "cargo install failed: {}",
        text(&out.stderr)
    );
    eprintln!(
        "cargo install took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let bin = root.path().join("bin");
    let installed: Vec<String> = std::fs::read_dir(&bin)
        .expect("bin/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(installed, ["uswap"], "{}", bin.display());
    assert!(!root.path().join("lib").exists());

    // env -i PATH=/usr/bin:/bin
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
}
