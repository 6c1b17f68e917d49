//! End-to-end tests of the `uswap` binary, run the way a user runs it. They use
//! `--memory plain` (ordinary memory) so that they check the command-line layer, the
//! workloads and the report without needing userfaultfd (except the in-thread test,
//! which runs on uswap memory). Every run has a deadline: a hang fails the test.

mod common;

use common::{run_with_deadline, uswap_exe};
use serde_json::Value;
use std::process::{Command, Output};

fn uswap(args: &[&str]) -> Output {
    let mut cmd = Command::new(uswap_exe());
    cmd.args(args);
    run_with_deadline(cmd, 240)
}

fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "last line is not JSON ({e}): {last:?}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn bench_json(workload: &str, extra: &[&str]) -> (Output, Value) {
    let mut args = vec![
        "bench", workload, "--memory", "plain", "--size", "16M", "--json",
    ];
    args.extend_from_slice(extra);
    let out = uswap(&args);
    let v = last_json(&out);
    (out, v)
}

#[test]
fn every_workload_verifies_on_plain_memory() {
    for w in [
        "swap-w-seq",
        "swap-w-rand",
        "pmbench",
        "seq-read",
        "combined",
    ] {
        for threads in ["1", "2"] {
            let (out, v) = bench_json(w, &["--threads", threads, "--duration", "300ms"]);
            assert!(
                out.status.success(),
                "{w}: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(v["verify"], "ok", "{w}");
            assert_eq!(v["workload"], w);
            assert_eq!(v["memory"], "plain");
            assert_eq!(v["size"], 16 << 20);
            assert_eq!(v["threads"].as_u64(), Some(threads.parse().unwrap()));
            assert!(v["elapsed_s"].as_f64().unwrap() > 0.0, "{w}");
            assert!(v["peak_rss_bytes"].as_u64().unwrap() > 16 << 20, "{w}");
            for k in [
                "pswpin",
                "pswpout",
                "swap_ra",
                "swap_ra_hit",
                "thp_swpout",
                "thp_swpout_fallback",
            ] {
                assert!(v["counters"][k].is_u64(), "{w}: counters.{k}");
            }
            let throughput = v["throughput_MBps"].as_f64();
            let accesses = v["accesses_per_s"].as_f64();
            match w {
                "pmbench" => {
                    assert!(throughput.is_none());
                    assert!(accesses.unwrap() > 0.0);
                    for k in ["lat_p50_us", "lat_p90_us", "lat_p99_us", "lat_p999_us"] {
                        assert!(v[k].as_f64().unwrap() >= 0.0, "{k}");
                    }
                }
                "combined" => {
                    assert!(throughput.unwrap() > 0.0);
                    for k in [
                        "lat_avg_us",
                        "lat_p50_us",
                        "lat_p60_us",
                        "lat_p70_us",
                        "lat_p80_us",
                        "lat_p90_us",
                        "lat_p95_us",
                        "lat_p99_us",
                    ] {
                        assert!(v[k].as_f64().is_some(), "{k}");
                    }
                    assert!(v.get("ra_hit_pct_seq").is_some() && v.get("ra_hit_pct_bg").is_some());
                    assert!(v["bg_accesses_per_s"].as_f64().unwrap() > 0.0);
                }
                _ => {
                    assert!(throughput.unwrap() > 0.0, "{w}");
                    assert!(v["lat_p50_us"].is_null(), "{w}");
                }
            }
        }
    }
}

#[test]
fn json_output_is_the_last_line_and_alone_on_stdout() {
    let (out, v) = bench_json("seq-read", &[]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert_eq!(v["unit"], "auto");
    assert_eq!(v["readahead"], "vma");
    assert_eq!(v["budget"], 256 << 20);
}

#[test]
fn human_table_names_the_figures() {
    let out = uswap(&[
        "bench", "seq-read", "--memory", "plain", "--size", "8M", "--unit", "2m",
    ]);
    assert!(out.status.success());
    let t = String::from_utf8_lossy(&out.stdout);
    for k in [
        "workload",
        "seq-read",
        "throughput",
        "verify",
        "ok",
        "peak RSS",
        "pswpout",
        "unit 2m",
    ] {
        assert!(t.contains(k), "{k} missing from:\n{t}");
    }
}

/// A word flipped once the data is in place (after the populate, or swap-w-seq's first
/// pass) fails the run with exit 1 and names the page; where the workload overwrites the
/// page, the overwrite itself catches it (swap-w-seq's second pass used to overwrite it
/// unchecked and report "verify ok").
#[test]
fn a_corrupted_word_fails_loudly_with_exit_1() {
    for (w, phases) in [
        ("swap-w-seq", &["write 2"][..]),
        ("swap-w-rand", &["random write"]),
        // pmbench overwrites only its touched word (not word 5): a read or the final
        // pass finds it.
        ("pmbench", &["pmbench", "verify"]),
        ("seq-read", &["read 1"]),
        ("combined", &["combined"]),
    ] {
        let (out, v) = bench_json(w, &["--duration", "200ms", "--inject-corruption", "77"]);
        assert_eq!(out.status.code(), Some(1), "{w}");
        assert_eq!(v["verify"], "failed", "{w}");
        assert_eq!(v["mismatch"]["page"], 77, "{w}");
        assert_eq!(v["mismatch"]["word"], 5, "{w}");
        let phase = v["mismatch"]["phase"].as_str().unwrap_or("");
        assert!(
            phases.contains(&phase),
            "{w}: caught in {phase:?}, not {phases:?}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("page 77") && err.contains("expected") && err.contains("found"),
            "{w}: {err}"
        );
    }
}

#[test]
fn bad_sizes_and_options_are_usage_errors() {
    let out = uswap(&["bench", "--size", "12Q"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("12Q"), "{err}");
    for args in [
        &["bench", "--budget", "lots"][..],
        &["bench", "--size", "0"],
        &["bench", "nosuch"],
        &["bench", "pmbench", "--read-pct", "120"],
        &["bench", "--duration", "forever"],
        &["bench", "--threads", "0"],
        &["bench", "--unit", "3m"],
        &["bench", "combined", "--bg-size", "0"],
        &["bench", "--no-such-flag"],
        &[],
    ] {
        let out = uswap(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
}

#[test]
fn help_teaches() {
    let out = uswap(&["bench", "--help"]);
    assert!(out.status.success());
    let h = String::from_utf8_lossy(&out.stdout);
    for k in [
        "swap-w-seq",
        "pmbench",
        "combined",
        "--size",
        "[default: 1G]",
        "--budget",
        "[default: 256M]",
        "Examples:",
        "--memory plain",
        "Exit status",
    ] {
        assert!(h.contains(k), "{k} missing from bench --help");
    }
}

/// `--fault-mode in-thread` serves faults in a SIGBUS handler; the bench's own SIGBUS
/// report (lost pages) must not take them: every in-thread fault was reported as page 0
/// lost until the report handler was installed before the pool (the engine chains to it).
#[test]
fn in_thread_faults_are_not_reported_as_lost_pages() {
    for w in ["pmbench", "swap-w-rand", "seq-read"] {
        let out = uswap(&[
            "bench",
            w,
            "--size",
            "64M",
            "--budget",
            "16M",
            "--unit",
            "4k",
            "--duration",
            "1s",
            "--fault-mode",
            "in-thread",
            "--json",
        ]);
        let v = last_json(&out);
        assert_eq!(v["verify"], "ok", "{w}: {v}");
        assert!(
            v["counters"]["majflt"].as_u64().unwrap() > 0,
            "{w}: nothing swapped in: {v}"
        );
    }
}
