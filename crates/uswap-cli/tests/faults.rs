//! `uswap bench` on a misbehaving swap device: the fault-injecting FUSE filesystem of
//! `uswap-faultfs`, used the two ways a user could — a new swap file in the mount
//! (`--swap-file MOUNT/swap`: created 0600 and unlinked at once; the directory itself is
//! refused, FUSE here has no O_TMPFILE) and a loop device over its `disk`
//! (`--swap-file /dev/loopN`).
//!
//! The passing tests pin what is right today. The ignored ones assert the behaviour the
//! engine must have once every page it writes carries a checksum (issue 17) and the
//! defects of issue 16 are fixed; each says which defect it waits for. Every run is
//! bounded by a deadline (a hang fails the test, it never blocks the suite). Needs root,
//! userfaultfd, /dev/fuse and loop devices: without them these tests FAIL.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use uswap_faultfs::harness::{run_with_deadline, FaultMount, RunOutcome};
use uswap_faultfs::Kind;

/// A normal run here takes 1-2 s; a run past this is hung.
const DEADLINE: Duration = Duration::from_secs(60);
/// Region and budget of every run: 48 MiB or more of it goes through swap.
const SIZE: &str = "64M";
const BUDGET: &str = "16M";

/// Where the swap goes.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// A new file in the mount (`--swap-file MOUNT/swap`).
    FileInMount,
    /// A loop device over the mount's `disk`.
    LoopDevice,
}

struct Setup {
    fm: FaultMount,
    swap: PathBuf,
}

fn setup(place: Place) -> Setup {
    match place {
        Place::FileInMount => {
            let fm = FaultMount::new(1 << 20);
            let swap = fm.mountpoint().join("swap");
            Setup { fm, swap }
        }
        Place::LoopDevice => {
            let fm = FaultMount::with_loop(128 << 20);
            let swap = fm.loop_device().expect("loop device").to_path_buf();
            Setup { fm, swap }
        }
    }
}

fn bench(workload: &str, swap: &Path) -> RunOutcome {
    bench_with(workload, swap, &[])
}

/// `bench` with more options (`--encrypt`).
fn bench_with(workload: &str, swap: &Path, extra: &[&str]) -> RunOutcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args([
        "bench", workload, "--size", SIZE, "--budget", BUDGET, "--json",
    ])
    .arg("--swap-file")
    .arg(swap)
    .args(extra);
    run_with_deadline(&mut cmd, DEADLINE)
}

/// The JSON report (the last line of stdout), if the bench got that far.
fn report(out: &RunOutcome) -> Option<Value> {
    let last = out.stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    serde_json::from_str(last).ok()
}

fn counter(v: &Value, name: &str) -> Option<u64> {
    v["counters"][name].as_u64()
}

fn hits(fm: &FaultMount, kind: Kind) -> u64 {
    fm.counters().hits(kind)
}

/// What every run must do, fault or not: end (no hang) and never report a verify
/// failure, i.e. never hand the program a wrong byte. When the engine read back bytes
/// the device had lost (`lost-read` events), the run must say so: exit 1 with a message
/// about the poisoned page(s) (not a bare SIGBUS), or, if the bad copy was never used
/// (e.g. read ahead only), finish with verify ok and `swap_csum_fail` counted.
fn assert_no_wrong_byte_accepted(what: &str, out: &RunOutcome, fm: &FaultMount) {
    let ctx = || {
        format!(
            "{what}: {}\n--- faultfs\n{}",
            out.describe(),
            short_status(fm)
        )
    };
    assert!(!out.timed_out, "hung: {}", ctx());
    // The bench says "verify FAILED" for wrong bytes, and also for a page whose bytes
    // the engine reported lost (poisoned: "was lost"); only the first is wrong.
    assert!(
        !out.stderr
            .lines()
            .any(|l| l.contains("verify FAILED") && !l.contains("was lost")),
        "the program was handed wrong bytes: {}",
        ctx()
    );
    // Reads that returned bytes other than those last written: lost ones, or flipped.
    let lost = hits(fm, Kind::LostRead) + hits(fm, Kind::FlipRead);
    if lost == 0 {
        return;
    }
    match (out.code(), report(out)) {
        (Some(0), Some(v)) => {
            assert_eq!(v["verify"], "ok", "{}", ctx());
            assert!(
                counter(&v, "swap_csum_fail").unwrap_or(0) > 0,
                "{lost} reads returned lost bytes, yet no checksum failure was counted: {}",
                ctx()
            );
        }
        (Some(1), _) => {
            let e = out.stderr.to_lowercase();
            assert!(
                e.contains("poison") || e.contains("checksum"),
                "exit 1 without saying which pages were lost: {}",
                ctx()
            );
        }
        _ => panic!(
            "{lost} reads returned lost bytes: want exit 1 naming the poisoned pages, or \
             verify ok with swap_csum_fail counted: {}",
            ctx()
        ),
    }
}

/// The status without the event lines (there may be thousands).
fn short_status(fm: &FaultMount) -> String {
    let s = fm.status();
    let events = s.lines().filter(|l| l.starts_with("event ")).count();
    let mut out: String = s
        .lines()
        .filter(|l| !l.starts_with("event "))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("({events} event lines)\n"));
    out
}

// ---- right today ------------------------------------------------------------------------

#[test]
fn bench_verifies_with_its_swap_on_a_fault_free_fuse_mount() {
    for place in [Place::FileInMount, Place::LoopDevice] {
        for workload in ["swap-w-seq", "seq-read"] {
            let s = setup(place);
            let out = bench(workload, &s.swap);
            let what = format!("{workload} on {place:?}");
            assert_eq!(out.code(), Some(0), "{what}: {}", out.describe());
            let v = report(&out).unwrap_or_else(|| panic!("{what}: no report: {}", out.describe()));
            assert_eq!(v["verify"], "ok", "{what}");
            assert!(
                counter(&v, "pswpout").unwrap() > 0,
                "{what}: nothing swapped"
            );
            // The swap I/O really went through the filesystem's handlers.
            let c = s.fm.counters();
            let swapped = counter(&v, "pswpout").unwrap() * 4096;
            assert!(
                c.write_bytes >= swapped,
                "{what}: {c:?} vs {swapped} bytes swapped out"
            );
            assert!(c.read_bytes > 0, "{what}: {c:?}");
            assert!(s.fm.events().is_empty(), "{what}");
            s.fm.close().unwrap();
        }
    }
}

#[test]
fn the_mount_itself_as_swap_directory_is_refused_with_a_clear_error() {
    // uswap's directory placement is O_TMPFILE, which FUSE here does not have.
    let fm = FaultMount::new(1 << 20);
    let out = bench("swap-w-seq", fm.mountpoint());
    // A swap place that cannot be used is bad input: exit 2.
    assert_eq!(out.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains(&*fm.mountpoint().to_string_lossy())
            && out.stderr.contains("Operation not supported"),
        "{}",
        out.describe()
    );
    fm.close().unwrap();
}

#[test]
fn failed_swap_writes_are_retried_elsewhere() {
    // A failing 1 MiB a few MiB in: the engine writes there early in every run.
    for place in [Place::FileInMount, Place::LoopDevice] {
        for workload in ["swap-w-seq", "seq-read"] {
            let s = setup(place);
            s.fm.control("fail-write 8M 1M").unwrap();
            let out = bench(workload, &s.swap);
            let what = format!("{workload} on {place:?}");
            assert!(
                hits(&s.fm, Kind::FailWrite) > 0,
                "{what}: the fault was never hit"
            );
            assert_eq!(out.code(), Some(0), "{what}: {}", out.describe());
            let v = report(&out).expect("report");
            assert_eq!(v["verify"], "ok", "{what}");
            assert!(counter(&v, "io_errors").unwrap() > 0, "{what}: {v}");
            assert_no_wrong_byte_accepted(&what, &out, &s.fm);
            s.fm.close().unwrap();
        }
    }
}

#[test]
fn failed_swap_reads_never_pass_verify() {
    // Every swap-in fails: the program cannot get its data back, and must not be told
    // otherwise (today: SIGBUS on exactly the failed pages).
    for place in [Place::FileInMount, Place::LoopDevice] {
        let s = setup(place);
        s.fm.control("fail-read all").unwrap();
        let out = bench("seq-read", &s.swap);
        let what = format!("seq-read on {place:?}");
        assert!(
            hits(&s.fm, Kind::FailRead) > 0,
            "{what}: no read was failed"
        );
        assert!(!out.timed_out, "{what}: hung: {}", out.describe());
        assert_ne!(out.code(), Some(0), "{what}: {}", out.describe());
        assert!(
            !out.stdout.contains("\"verify\":\"ok\""),
            "{what}: {}",
            out.describe()
        );
        s.fm.close().unwrap();
    }
}

// ---- waiting for fixes ----------------------------------------------------------------

#[test]
fn failed_swap_reads_are_reported_by_the_bench() {
    for place in [Place::FileInMount, Place::LoopDevice] {
        let s = setup(place);
        s.fm.control("fail-read all").unwrap();
        let out = bench("seq-read", &s.swap);
        let what = format!("seq-read on {place:?}");
        assert_eq!(
            out.signal(),
            None,
            "{what}: killed by a signal: {}",
            out.describe()
        );
        assert_eq!(out.code(), Some(1), "{what}: {}", out.describe());
        assert!(
            out.stderr.contains("page") && out.stderr.contains("Input/output error"),
            "{what}: want the page and the I/O error named: {}",
            out.describe()
        );
        s.fm.close().unwrap();
    }
}

/// A silent fault of `rule` under `workload`: the engine reads back lost bytes, and must
/// not accept them.
fn silent_fault_is_caught(rule: &str, workload: &str, place: Place) {
    silent_fault_is_caught_with(rule, workload, place, &[]);
}

/// `silent_fault_is_caught` with more bench options (`--encrypt`: the tag catches it).
fn silent_fault_is_caught_with(rule: &str, workload: &str, place: Place, extra: &[&str]) {
    let s = setup(place);
    s.fm.control(rule).unwrap();
    let out = bench_with(workload, &s.swap, extra);
    let what = format!("{workload} {extra:?} on {place:?} with {rule:?}");
    // The scenario is meaningful only if lost bytes were read back.
    assert!(
        hits(&s.fm, Kind::LostRead) + hits(&s.fm, Kind::FlipRead) > 0,
        "{what}: no lost bytes were read back: {}\n{}",
        out.describe(),
        short_status(&s.fm)
    );
    assert_no_wrong_byte_accepted(&what, &out, &s.fm);
    if rule.starts_with("flip-read") {
        // Every read of the range is flipped, the retry too: the page is lost.
        assert_ne!(
            out.code(),
            Some(0),
            "{what}: every read of the range is flipped: {}",
            out.describe()
        );
    }
    s.fm.close().unwrap();
}

#[test]
fn dropped_swap_writes_are_caught() {
    for workload in ["swap-w-seq", "seq-read"] {
        silent_fault_is_caught("drop-write 8M 1M", workload, Place::FileInMount);
        silent_fault_is_caught("drop-write 8M 1M", workload, Place::LoopDevice);
    }
}

#[test]
fn torn_swap_writes_are_caught() {
    for workload in ["swap-w-seq", "seq-read"] {
        silent_fault_is_caught("tear-write 8M 1M keep=4k", workload, Place::LoopDevice);
        silent_fault_is_caught("tear-write 8M 1M keep=4k", workload, Place::FileInMount);
    }
}

#[test]
fn bytes_flipped_on_write_are_caught() {
    for workload in ["swap-w-seq", "seq-read"] {
        silent_fault_is_caught("flip-write 8M 1M xor=0x01", workload, Place::FileInMount);
        silent_fault_is_caught("flip-write 8M 1M xor=0x01", workload, Place::LoopDevice);
    }
}

#[test]
fn bytes_flipped_on_read_are_caught() {
    for workload in ["swap-w-seq", "seq-read"] {
        silent_fault_is_caught("flip-read 8M 1M xor=0x01", workload, Place::LoopDevice);
        silent_fault_is_caught("flip-read 8M 1M xor=0x01", workload, Place::FileInMount);
    }
}

/// With `--encrypt` the tag is the checksum: every silent fault is caught by it.
#[test]
fn silent_faults_are_caught_with_encryption() {
    for rule in [
        "drop-write 8M 1M",
        "tear-write 8M 1M keep=4k",
        "flip-write 8M 1M xor=0x01",
        "flip-read 8M 1M xor=0x01",
    ] {
        for workload in ["swap-w-seq", "seq-read"] {
            silent_fault_is_caught_with(rule, workload, Place::LoopDevice, &["--encrypt"]);
        }
    }
}

#[test]
fn encrypted_bench_verifies_and_a_read_flipped_once_is_retried() {
    for workload in ["swap-w-seq", "seq-read"] {
        for unit in ["4k", "2m"] {
            let s = setup(Place::LoopDevice);
            let out = bench_with(workload, &s.swap, &["--encrypt", "--unit", unit]);
            let what = format!("{workload} --unit {unit} --encrypt");
            assert_eq!(out.code(), Some(0), "{what}: {}", out.describe());
            let v = report(&out).unwrap_or_else(|| panic!("{what}: no report: {}", out.describe()));
            assert_eq!(v["verify"], "ok", "{what}");
            assert!(
                counter(&v, "pswpout").unwrap() > 0,
                "{what}: nothing swapped"
            );
            assert_eq!(counter(&v, "swap_csum_fail"), Some(0), "{what}: {v}");
            s.fm.close().unwrap();
        }
    }
    let s = setup(Place::LoopDevice);
    s.fm.control("flip-read 8M 1M xor=0x01 count=1").unwrap();
    let out = bench_with("seq-read", &s.swap, &["--encrypt"]);
    assert_eq!(hits(&s.fm, Kind::FlipRead), 1, "{}", out.describe());
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    let v = report(&out).expect("report");
    assert_eq!(v["verify"], "ok");
    assert!(counter(&v, "swap_csum_fail").unwrap_or(0) >= 1, "{v}");
    s.fm.close().unwrap();
}

#[test]
fn a_read_flipped_once_is_retried_and_passes() {
    // One read in the range comes back flipped, its retry is clean: the engine retries
    // once on a checksum mismatch, so the run passes and counts the mismatch.
    for place in [Place::FileInMount, Place::LoopDevice] {
        let s = setup(place);
        s.fm.control("flip-read 8M 1M xor=0x01 count=1").unwrap();
        let out = bench("seq-read", &s.swap);
        let what = format!("seq-read on {place:?}");
        assert_eq!(hits(&s.fm, Kind::FlipRead), 1, "{what}: {}", out.describe());
        assert_eq!(out.code(), Some(0), "{what}: {}", out.describe());
        let v = report(&out).expect("report");
        assert_eq!(v["verify"], "ok", "{what}");
        assert!(
            counter(&v, "swap_csum_fail").unwrap_or(0) >= 1,
            "{what}: {v}"
        );
        s.fm.close().unwrap();
    }
}

#[test]
fn swap_w_seq_never_says_verify_ok_over_lost_data() {
    // The first write into [4M, 5M) is dropped (pass 1); pass 2 swaps those pages in
    // before overwriting them, reading the lost bytes. Today the bench overwrites them
    // unchecked and says verify ok.
    for place in [Place::LoopDevice, Place::FileInMount] {
        let s = setup(place);
        s.fm.control("drop-write 4M 1M count=1").unwrap();
        let out = bench("swap-w-seq", &s.swap);
        let what = format!("swap-w-seq on {place:?}");
        assert!(
            hits(&s.fm, Kind::DropWrite) == 1,
            "{what}: {}",
            short_status(&s.fm)
        );
        assert!(
            hits(&s.fm, Kind::LostRead) > 0,
            "{what}: lost bytes never read back"
        );
        assert_no_wrong_byte_accepted(&what, &out, &s.fm);
        s.fm.close().unwrap();
    }
}

#[test]
fn bytes_corrupted_while_the_program_runs_are_caught() {
    // Flip one byte every 5 ms at pseudo-random places of the first 48 MiB of the swap
    // file while seq-read reads its data back, pass after pass.
    let s = setup(Place::FileInMount);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let corrupted = std::thread::scope(|scope| {
        let corrupter = scope.spawn(|| {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D;
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.fm.control(&format!("corrupt {} 1", x % (48 << 20)))
                    .unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        });
        let out = bench("seq-read", &s.swap);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = corrupter.join().unwrap();
        assert_no_wrong_byte_accepted("seq-read under corruption", &out, &s.fm);
        n
    });
    assert!(corrupted > 0);
    s.fm.close().unwrap();
}

/// Issue 16 item 2: a swap place whose writes all fail. The engine keeps its promise
/// (runs over budget, says so once) or stops with a clear error; it never spins.
fn all_writes_failing_ends(place: Place) {
    let s = setup(place);
    s.fm.control("fail-write all").unwrap();
    let out = bench("swap-w-seq", &s.swap);
    let what = format!("swap-w-seq on {place:?} with every write failing");
    assert!(hits(&s.fm, Kind::FailWrite) > 0, "{what}: never hit");
    assert!(
        !out.timed_out,
        "{what}: did not end within {DEADLINE:?}: {}",
        out.describe()
    );
    match out.code() {
        Some(0) => {
            assert_eq!(report(&out).expect("report")["verify"], "ok");
            assert!(
                out.stderr.contains("over budget"),
                "{what}: {}",
                out.describe()
            );
        }
        Some(1) => assert!(out.stderr.contains("error"), "{what}: {}", out.describe()),
        _ => panic!("{what}: {}", out.describe()),
    }
    s.fm.close().unwrap();
}

#[test]
fn a_loop_device_whose_writes_all_fail_does_not_spin() {
    all_writes_failing_ends(Place::LoopDevice);
}

#[test]
fn a_swap_file_whose_writes_all_fail_does_not_spin() {
    all_writes_failing_ends(Place::FileInMount);
}
