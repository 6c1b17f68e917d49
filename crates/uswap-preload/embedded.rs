//! For the build scripts of the crates that carry `libuswap_preload.so` inside them
//! (crates/uswap-cli: the `uswap` binary; crates/uswap-py: the Python module), so that
//! one installed file is enough for `uswap run`. Included with `#[path]`; not part of
//! the library.
//!
//! Cargo has no stable way for a crate to depend on another crate's cdylib (artifact
//! dependencies are unstable), so this runs a second cargo on the same workspace to
//! build it, release and without debug info. That cargo gets a target directory of its
//! own, because the outer cargo holds the lock of its build directory for as long as
//! the build script runs; the directory sits next to the outer profile directories
//! (`target/uswap-preload-embed`), so that the debug, release and clippy builds of both
//! crates share one build of the engine there instead of one each.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable: a `libuswap_preload.so` built already, embedded as it is
/// instead of building one (scripts/test.sh passes the workspace's own).
pub const GIVEN: &str = "USWAP_PRELOAD_SO";

/// The path of the library to embed, built if need be; also tells cargo when to run
/// the build script again. Panics (fails the build) with the reason.
pub fn preload_library() -> PathBuf {
    println!("cargo:rerun-if-env-changed={GIVEN}");
    if let Some(given) = std::env::var_os(GIVEN).filter(|p| !p.is_empty()) {
        // Absolute: `include_bytes!` would read a relative path from src/.
        let given = std::fs::canonicalize(&given)
            .unwrap_or_else(|e| panic!("{GIVEN}={}: {e}", Path::new(&given).display()));
        assert!(
            given.is_file(),
            "{GIVEN}={} is not a file: build it first (cargo build --release -p \
             uswap-preload), or unset {GIVEN} to have it built here",
            given.display()
        );
        println!("cargo:rerun-if-changed={}", given.display());
        println!("cargo:warning=embedding {} ({GIVEN})", given.display());
        return given;
    }
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir.join("../..");
    // The library's sources: the crates it is built from (a directory is scanned whole),
    // the manifests and the lock file. A run with nothing changed there costs a no-op cargo.
    for dep in [
        "crates/uswap",
        "crates/uswap-zpool",
        "crates/uswap-remote",
        "crates/uswap-preload",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dep).display());
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let target_dir = shared_target_dir(&out_dir).unwrap_or_else(|| out_dir.join("preload-target"));
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
        // Its intermediate artifacts too (cargo 1.91+ may keep them apart: build.build-dir),
        // else an outer build directory set by config or environment would be the
        // inner cargo's as well, and one build's library would replace the other's.
        .env("CARGO_BUILD_BUILD_DIR", &target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    // What cargo sets for this build script describes the outer build, not this one:
    // inherited, lints and wrappers meant for the outer build (clippy) would apply here,
    // and variables such as CARGO_MANIFEST_DIR read as changed between runs, so that
    // the inner cargo rebuilds `ring` and everything above it. The jobserver
    // (CARGO_MAKEFLAGS) stays: the inner build shares the outer one's job slots.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let outer = k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("DEP_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_DIR",
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_RUSTC_CURRENT_DIR",
                "RUSTC_WORKSPACE_WRAPPER",
                "OUT_DIR",
                "TARGET",
                "HOST",
                "NUM_JOBS",
                "OPT_LEVEL",
                "PROFILE",
                "DEBUG",
            ]
            .contains(&k.as_ref());
        if outer {
            cmd.env_remove(k.as_ref());
        }
    }
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
    built
}

/// `<target>/uswap-preload-embed` for an OUT_DIR of cargo's usual layout,
/// `<target>/<profile>/build/<crate>-<hash>/out`; None for another layout.
fn shared_target_dir(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir.ancestors().nth(2)?;
    if build.file_name()? != "build" {
        return None;
    }
    let target = build.parent()?.parent()?;
    Some(target.join("uswap-preload-embed"))
}
