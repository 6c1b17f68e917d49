//! Build `examples/fill.c` against `include/uswap.h` and `libuswap.so`, run it: a
//! 256 MiB region under a 64 MiB budget, filled and checksummed twice.
//!
//! `cargo test` does not build this package's cdylib for its own tests, so the test
//! builds it first, with its own profile and target directory (`support::build_cdylibs`). Needs a
//! C compiler (`cc`) and userfaultfd (root or vm.unprivileged_userfaultfd=1).

#[path = "../../uswap/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>, from this test's own path (target/<profile>/deps/c_example-HASH).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn build_lib() -> PathBuf {
    let dir = profile_dir();
    support::build_cdylibs(&dir);
    assert!(dir.join("libuswap.so").is_file());
    dir
}

#[test]
fn c_example_fills_a_region_4x_its_budget() {
    let lib_dir = build_lib();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let exe = out_dir.join(format!("fill-{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/fill.c"))
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-luswap", "-o"])
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let out = Command::new(&exe).output().expect("run fill");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fill failed: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let sums: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("checksum "))
        .expect("checksum line")
        .split(' ')
        .collect();
    assert_eq!(sums.len(), 2);
    assert_eq!(sums[0], sums[1]);
    let field = |name: &str| -> u64 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("pswpin "))
            .expect("counters");
        let mut it = line.split(' ');
        while let Some(k) = it.next() {
            if k == name {
                return it.next().unwrap().parse().unwrap();
            }
        }
        panic!("{name} missing in {line}");
    };
    assert!(field("pswpout") > 0 && field("pswpin") > 0, "{stdout}");
    assert!(field("peak_used_bytes") <= 64 << 20, "{stdout}");
    assert!(
        stdout.contains("zero budget: budget of 0 bytes is too small"),
        "{stdout}"
    );
    // uswap_pool_set_budget: a quarter of the budget, held to it, the bytes the same.
    let quarter = stdout
        .lines()
        .find_map(|l| l.strip_prefix("quarter budget: checksum "))
        .expect("quarter budget line");
    let (sum, held) = quarter.split_once(" held ").expect("held");
    assert_eq!(sum, sums[0], "bytes changed under the smaller budget");
    assert!(held.parse::<u64>().unwrap() <= 16 << 20, "{stdout}");
    assert!(
        stdout.contains("double budget: budget 128.0 MiB: a running pool's budget may go"),
        "{stdout}"
    );
}
