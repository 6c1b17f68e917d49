//! Shared by the test files: the `uswap` binary, `libuswap_preload.so` built next to it,
//! C programs from tests/progs compiled once per test process.

// Each test file uses some of these.
#![allow(dead_code)]

#[path = "../../../uswap/tests/support/mod.rs"]
pub mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

#[path = "../../../uswap/tests/support/cluster.rs"]
mod cluster;
#[allow(unused_imports)] // each test binary uses its own part
pub use cluster::{run_with_deadline, Cluster};
