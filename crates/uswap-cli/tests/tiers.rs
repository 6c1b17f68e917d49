//! The tier options end to end: `uswap bench` on every tier (the remote ones against a
//! real local Redis Cluster from scripts/redis-cluster.sh, stopped on drop) verifies
//! every byte and reports the tier's counters; `uswap run --tier compressed` runs a C
//! program whose data comes back exact; bad combinations exit 2 with a clear message.
//! Needs userfaultfd (root or vm.unprivileged_userfaultfd=1), `cc`, and redis-server
//! (scripts/test.sh installs it).

mod common;

use common::{cprog, preload, run_with_deadline, uswap_exe, Cluster};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn uswap(args: &[&str]) -> Output {
    let mut cmd = Command::new(uswap_exe());
    cmd.args(args);
    run_with_deadline(cmd, 240)
}

/// `uswap bench swap-w-seq` of 64 MiB under a 16 MiB budget with `extra`: its report.
fn bench(extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "swap-w-seq",
        "--size",
        "64M",
        "--budget",
        "16M",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = uswap(&args);
    assert!(
        out.status.success(),
        "{extra:?}: {:?}\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{extra:?}: not JSON ({e}): {last:?}"));
    assert_eq!(v["verify"], "ok", "{extra:?}: {v}");
    assert!(v["mismatch"].is_null(), "{extra:?}: {v}");
    assert!(
        v["counters"]["peak_used_bytes"].as_u64().unwrap() <= 16 * MIB,
        "{extra:?}: over budget: {v}"
    );
    v
}

fn c(v: &Value, k: &str) -> u64 {
    v["counters"][k]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {k}: {v}"))
}

#[test]
fn bench_verifies_on_every_local_tier() {
    let v = bench(&["--tier", "file", "--data", "random"]);
    assert_eq!(v["tier"], "file");
    assert_eq!(v["data"], "random");
    assert!(
        v["compressor"].is_null() && v["zswap_ratio"].is_null(),
        "{v}"
    );
    assert!(c(&v, "pswpout") > 0 && c(&v, "zswpout") == 0, "{v}");

    // Zero pages leave as zeros (the kernel's zeromap): no tier stores them, neither
    // the compressed pool nor the file, and they read back exact.
    let v = bench(&["--tier", "compressed", "--data", "zeros"]);
    assert_eq!(v["tier"], "compressed");
    assert_eq!(v["compressor"], "lz4");
    assert_eq!(v["compressed_max_pct"], 50);
    assert!(c(&v, "swpout_zero") > 0, "{v}");
    assert_eq!(
        (c(&v, "zswpout"), c(&v, "pswpout")),
        (0, 0),
        "zero pages went to a tier: {v}"
    );

    for (data, compressor) in [("mixed", "lz4"), ("mixed", "lz4:8"), ("text", "zstd:3")] {
        let v = bench(&[
            "--tier",
            "compressed+file",
            "--data",
            data,
            "--compressor",
            compressor,
            "--compressed-max",
            "30",
        ]);
        assert_eq!(v["tier"], "compressed+file");
        assert_eq!(v["data"], data);
        assert_eq!(v["compressor"], compressor);
        assert_eq!(v["compressed_max_pct"], 30);
        assert!(c(&v, "zswpout") > 0 && c(&v, "zswpin") > 0, "{data}: {v}");
        // The ratio is a gauge of what the pool holds when the run ends. Mixed data's
        // zero pages (22%) leave as zeros and no longer lift it: what the pool holds
        // of the rest then lands near 1 (0.90 and 0.94 in two runs), so only text,
        // ~3:1 under zstd, is held to a ratio; mixed must show its zero pages.
        if data == "text" {
            assert!(
                v["zswap_ratio"].as_f64().unwrap() > 1.2,
                "{data} compresses: {v}"
            );
        } else {
            assert!(
                c(&v, "swpout_zero") > 0,
                "{data}: no zero page left as zeros: {v}"
            );
        }
    }
}

#[test]
fn bench_verifies_on_the_remote_tiers() {
    let cluster = Cluster::start(22300);
    let nodes = cluster.nodes();
    for tier in ["remote", "compressed+remote"] {
        let v = bench(&["--tier", tier, "--remote", &nodes, "--data", "mixed"]);
        assert_eq!(v["tier"], tier);
        assert_eq!(v["remote"], nodes.as_str());
        assert!(
            c(&v, "remote_writes") > 0 && c(&v, "remote_reads") > 0,
            "{tier}: {v}"
        );
        assert_eq!(c(&v, "remote_lost"), 0, "{tier}: {v}");
        assert_eq!(c(&v, "poisoned"), 0, "{tier}: {v}");
        if tier == "compressed+remote" {
            assert!(c(&v, "zswpout") > 0, "{v}");
        } else {
            assert!(v["compressor"].is_null(), "{v}");
        }
    }
    // The table names the cluster and its counters.
    let out = uswap(&[
        "bench",
        "swap-w-seq",
        "--size",
        "32M",
        "--budget",
        "16M",
        "--tier",
        "remote",
        "--remote",
        &nodes,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("remote") && table.contains("writes") && table.contains("127.0.0.1"),
        "{table}"
    );
}

#[test]
fn a_cluster_that_is_not_there_is_a_clear_error() {
    let out = uswap(&[
        "bench",
        "swap-w-seq",
        "--size",
        "16M",
        "--tier",
        "remote",
        "--remote",
        "redis://127.0.0.1:1",
    ]);
    let err = text(&out.stderr);
    // Like an unusable swap place: a setting to change (exit 2).
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("remote tier") && err.contains("127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn bad_tier_options_exit_2_with_a_clear_message() {
    let cases: [(&[&str], &str); 8] = [
        (&["--tier", "remote"], "--tier remote needs --remote"),
        (
            &["--tier", "compressed+remote"],
            "--tier compressed+remote needs --remote",
        ),
        (
            &["--remote", "redis://127.0.0.1:7000"],
            "--remote is for the remote tiers",
        ),
        (
            &["--compressor", "zstd"],
            "--compressor is for the compressed tiers",
        ),
        (
            &["--tier", "file", "--compressed-max", "20"],
            "--compressed-max is for the compressed tiers",
        ),
        (
            &["--tier", "compressed", "--compressor", "gzip"],
            "unknown compressor",
        ),
        (&["--tier", "compressed", "--compressed-max", "95"], "95"),
        (&["--tier", "ssd"], "ssd"),
    ];
    for (opts, want) in cases {
        for sub in ["bench", "run"] {
            let mut args = vec![sub];
            args.extend_from_slice(opts);
            if sub == "bench" {
                args.extend(["--memory", "plain", "--size", "4M"]);
            } else {
                args.extend(["--", "true"]);
            }
            let out = uswap(&args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(want), "{args:?}: {err:?} lacks {want:?}");
        }
    }
    let out = uswap(&["bench", "--data", "noise", "--memory", "plain"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("noise"), "{}", text(&out.stderr));
}

#[test]
fn help_teaches_the_tiers() {
    for sub in ["bench", "run"] {
        let out = uswap(&[sub, "--help"]);
        let help = text(&out.stdout);
        for line in [
            "compressed+file    compressed RAM in front of the swap file",
            "remote             a Redis Cluster's RAM",
            "--remote <URLS>",
            "--compressor <NAME>",
            "--compressed-max <PCT>",
        ] {
            assert!(
                help.contains(line),
                "uswap {sub} --help lacks {line:?}:\n{help}"
            );
        }
    }
}

#[test]
fn run_with_the_compressed_tier_keeps_a_c_programs_data() {
    // Built next to the `uswap` binary, where `uswap run` finds it.
    common::preload();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let exe = dir.join(format!("zfill-{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/zfill.c"))
        .status()
        .expect("run cc");
    assert!(st.success(), "cc zfill.c failed");
    let want = run_with_deadline(Command::new(&exe), 120);
    assert!(want.status.success());
    let stats = dir.join(format!("zfill-stats-{}.jsonl", std::process::id()));
    let mut cmd = Command::new(uswap_exe());
    cmd.args(["run", "--budget", "32M", "--tier", "compressed"])
        .arg(format!("--stats={}", stats.display()))
        .arg("--")
        .arg(&exe);
    let out = run_with_deadline(cmd, 240);
    assert!(
        out.status.success(),
        "{:?}\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), text(&want.stdout), "data changed");
    assert!(text(&out.stdout).starts_with("checksum "));
    let line = std::fs::read_to_string(&stats).expect("stats file");
    let _ = std::fs::remove_file(&stats);
    let _ = std::fs::remove_file(&exe);
    let s: Value =
        serde_json::from_str(line.lines().next().expect("a stats line")).expect("JSON stats");
    let s = &s["uswap_stats"];
    assert_eq!(s["active"], true, "{s}");
    assert_eq!(s["tier"], "compressed");
    assert_eq!(s["compressor"], "lz4");
    let c = &s["counters"];
    assert!(c["zswpout"].as_u64().unwrap() > 0, "{s}");
    assert!(c["zswpin"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(c["pswpout"].as_u64().unwrap(), 0, "{s}");
    assert!(c["peak_used_bytes"].as_u64().unwrap() <= 32 * MIB, "{s}");
}

/// Compressed RAM only, with data that does not all fit in the pool's share: pages that
/// cannot go anywhere stay resident over the budget (said once), and the run finishes
/// and verifies. It used to livelock: every fault moved whole units out and back.
#[test]
fn compressed_only_over_its_share_goes_over_budget_and_finishes() {
    for data in ["mixed", "random"] {
        let t = std::time::Instant::now();
        let out = uswap(&[
            "bench",
            "swap-w-seq",
            "--size",
            "32M",
            "--budget",
            "16M",
            "--tier",
            "compressed",
            "--data",
            data,
            "--compressed-max",
            "90",
            "--json",
        ]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "{data}: {:?}\n{stdout}\n{stderr}",
            out.status
        );
        let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{data}: not JSON ({e}): {stdout}"));
        assert_eq!(v["verify"], "ok", "{data}: {v}");
        assert!(
            stderr.contains("going over budget"),
            "{data}: over budget without saying so: {stderr}"
        );
        eprintln!(
            "compressed only, {data}: {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
}

/// Issue 48: programs that fork under `uswap run` on the remote tiers: a child reads
/// the pages it inherited from its parent's keys and evicts its own to keys of its own;
/// one child, then eight at once (each ends by `_exit`, as Redis' BGSAVE child does),
/// then a child that execs.
/// Every byte checked in every process, and no key left once they all ended.
#[test]
fn forked_programs_run_on_the_remote_tiers() {
    let cluster = Cluster::start(22600);
    let nodes = cluster.nodes();
    let fork = cprog("fork");
    let forkn = cprog("forkn");
    let forkexec = cprog("forkexec");
    for tier in ["remote", "compressed+remote"] {
        for (prog, args, says) in [
            (&fork, vec![], "fork ok"),
            (&forkn, vec!["64", "8"], "forkn ok"),
            // the child execs: its copy of the pool goes, the program it runs starts its own
            (&forkexec, vec![], "child exit 3"),
        ] {
            let mut cmd = Command::new(uswap_exe());
            cmd.env("USWAP_PRELOAD", preload())
                .args(["run", "--budget", "32M", "--tier", tier, "--remote", &nodes])
                .arg("--")
                .arg(prog)
                .args(&args);
            let out = run_with_deadline(cmd, 240);
            let (o, e) = (text(&out.stdout), text(&out.stderr));
            assert!(
                out.status.success() && o.contains(says),
                "{tier} {}: {:?}\nstdout: {o}\nstderr: {e}",
                prog.display(),
                out.status
            );
            assert!(
                !e.contains("SIGBUS") && !e.contains("failed"),
                "{tier}: {e}"
            );
            let left = cluster.keys();
            assert!(
                left.is_empty(),
                "{tier} {}: keys left: {left:?}",
                prog.display()
            );
        }
    }
}
