//! With the `bundle-preload` feature (turned on by maturin, python/pyproject.toml):
//! build `libuswap_preload.so` (crates/uswap-preload) and hand its path to the crate,
//! which embeds it, so that `python -m uswap run` works from the installed wheel alone.
//!
//! It runs a second cargo on the same workspace with its own target directory (the
//! outer cargo holds a lock on the usual one) under OUT_DIR, stripped of debug info;
//! or, with `USWAP_PRELOAD_SO=PATH`, embeds that library, built already.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BUNDLE_PRELOAD").is_none() {
        return;
    }
    // A library built already (scripts/test.sh passes the workspace's own, built just
    // before): embedded as it is, instead of a third build of the engine's crates.
    println!("cargo:rerun-if-env-changed=USWAP_PRELOAD_SO");
    if let Some(given) = std::env::var_os("USWAP_PRELOAD_SO").filter(|p| !p.is_empty()) {
        // Absolute: `include_bytes!` would read a relative path from src/.
        let given = std::fs::canonicalize(&given).unwrap_or_else(|e| {
            panic!("USWAP_PRELOAD_SO={}: {e}", PathBuf::from(&given).display())
        });
        assert!(
            given.is_file(),
            "USWAP_PRELOAD_SO={} is not a file: build it first (cargo build --release -p \
             uswap-preload), or unset USWAP_PRELOAD_SO to have it built here",
            given.display()
        );
        println!("cargo:rerun-if-changed={}", given.display());
        println!("cargo:rustc-env=USWAP_PRELOAD_SO={}", given.display());
        println!(
            "cargo:warning=embedding {} (USWAP_PRELOAD_SO)",
            given.display()
        );
        return;
    }
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir.join("../..");
    for dep in ["crates/uswap/src", "crates/uswap-preload/src", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dep).display());
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let target_dir = out_dir.join("preload-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--locked")
        .args(["-p", "uswap-preload"])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        // Lints and wrappers meant for the outer build (clippy) do not apply here.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR");
    let target = std::env::var("TARGET").expect("cargo sets it");
    let host = std::env::var("HOST").expect("cargo sets it");
    let mut built = target_dir.clone();
    if target != host {
        cmd.args(["--target", &target]);
        built.push(&target);
    }
    let built = built.join("release/libuswap_preload.so");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build libuswap_preload.so: {e}"));
    assert!(
        status.success(),
        "building libuswap_preload.so failed ({status})"
    );
    assert!(built.is_file(), "{} was not built", built.display());
    println!("cargo:rustc-env=USWAP_PRELOAD_SO={}", built.display());
}
