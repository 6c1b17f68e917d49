//! `--swap-file`, `$TMPDIR` and the default swap place as a user meets them: what is
//! refused (with what message and exit status), and where the report says the swap
//! went. Needs root (userfaultfd, mounts).

#[path = "../../uswap/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Output};
use support::{Mount, TempDir};

fn scratch() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn uswap(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uswap"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run uswap")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    let o = text(&out.stdout);
    let last = o.lines().last().unwrap_or("");
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {last:?}\nstderr: {}", text(&out.stderr)))
}

const SMALL: [&str; 6] = ["--size", "16M", "--budget", "8M", "--json", "--threads=1"];

/// A tmpfs given as the swap place is refused, by name, as a usage error; the same
/// tmpfs as $TMPDIR is skipped for the next default place, and the report says so.
#[test]
fn tmpfs_is_refused_and_a_tmpfs_tmpdir_skipped() {
    let tmpfs = Mount::virtual_fs(scratch(), "tmpfs", "size=64m");
    let t = tmpfs.path().to_str().unwrap();
    let new = format!("{t}/swap");
    for place in [t, new.as_str()] {
        let out = uswap(&["bench", "--size", "16M", "--swap-file", place], &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{place}: {err}");
        assert!(
            err.contains(place) && err.contains("tmpfs") && err.contains("RAM"),
            "{place}: unclear message: {err}"
        );
    }
    let mut args = vec!["bench"];
    args.extend(SMALL);
    let out = uswap(&args, &[("TMPDIR", t)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let swap = json(&out)["swap"].as_str().unwrap_or("").to_string();
    assert!(
        !swap.contains(&format!("file in {t}")) && swap.contains(t) && swap.contains("tmpfs"),
        "the report does not say that $TMPDIR was skipped: {swap:?}"
    );
    assert!(tmpfs.dir.entries().is_empty());
}

/// The default place (no --swap-file, $TMPDIR on a disk) is named in the report, in the
/// table and in the JSON (`uswap run --stats`: tests/run.rs).
#[test]
fn the_report_says_where_the_swap_is() {
    let dir = TempDir::new(scratch(), "report-place");
    let d = dir.path().to_str().unwrap();
    let mut args = vec!["bench"];
    args.extend(SMALL);
    let out = uswap(&args, &[("TMPDIR", d)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let swap = json(&out)["swap"].as_str().unwrap_or("").to_string();
    assert!(
        swap.starts_with(&format!("an unnamed file in {d}")),
        "{swap:?}"
    );
    let out = uswap(
        &["bench", "--size", "16M", "--budget", "8M"],
        &[("TMPDIR", d)],
    );
    let table = text(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.trim_start().starts_with("swap ") && l.contains(d)),
        "no swap line in:\n{table}"
    );
}

/// Bad places and sizes are usage errors (exit 2, as `--help` says; they exited 1) with
/// a message that names the input and says what is wrong (not a bare errno: "No space
/// left on device" for --swap-size 0, "Is a directory" for a missing directory, "File
/// exists" for a dangling symlink).
#[test]
fn bad_places_and_sizes_say_what_is_wrong_and_exit_2() {
    let dir = TempDir::new(scratch(), "bad-places");
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink("/nonexistent-target", &dangling).unwrap();
    let dangling = dangling.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--swap-size", "0"], &["--swap-size", "too small", "2M"]),
        (&["--swap-size", "1M"], &["--swap-size", "too small"]),
        (
            &["--swap-file", "/nonexistent-dir/"],
            &["/nonexistent-dir/", "no such directory"],
        ),
        (
            &["--swap-file", "/nonexistent-dir/swap"],
            &[
                "/nonexistent-dir/swap",
                "directory /nonexistent-dir does not exist",
            ],
        ),
        (
            &["--swap-file", dangling],
            &[dangling, "symlink to /nonexistent-target"],
        ),
        (
            &["--swap-file", "/dev/null"],
            &["/dev/null", "not a directory"],
        ),
        (&["--budget", "0"], &["budget of 0 bytes is too small"]),
        (&["--budget", "100T"], &["larger than this machine's RAM"]),
        (&["--size", "64M", "--swap-size", "4M"], &["--swap-size"]),
    ];
    for (args, want) in cases {
        let mut a = vec!["bench", "--size", "16M"];
        if args.contains(&"--size") {
            a.truncate(1);
        }
        a.extend_from_slice(args);
        let out = uswap(&a, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        for w in *want {
            assert!(err.contains(w), "{args:?}: {w:?} missing from: {err}");
        }
        for bare in ["No space left", "Is a directory", "File exists"] {
            assert!(!err.contains(bare), "{args:?}: {err}");
        }
    }
}
