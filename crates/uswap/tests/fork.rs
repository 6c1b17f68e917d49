//! fork(2): parent and child each see their own copy-on-write view of a region,
//! including pages swapped out at the moment of fork (never a silent zero page).
//! Alone in its test binary: fork in a process with other test threads is unsafe.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use uswap::{Pool, RegionOptions, UnitPolicy};

const MIB: u64 = 1 << 20;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fill(words: &[AtomicU64], offset: usize, seed: u64) {
    for (i, w) in words.iter().enumerate() {
        w.store(mix(seed ^ (offset + i) as u64), Relaxed);
    }
}

/// First mismatching word, if any.
fn find_bad(words: &[AtomicU64], offset: usize, seed: u64) -> Option<usize> {
    words
        .iter()
        .enumerate()
        .find(|(i, w)| w.load(Relaxed) != mix(seed ^ (offset + i) as u64))
        .map(|(i, _)| offset + i)
}

fn run(unit: UnitPolicy) {
    let p = Pool::builder().budget(16 * MIB).build().unwrap();
    let r = p
        .region_with(
            64 * MIB,
            RegionOptions {
                unit: Some(unit),
                ..Default::default()
            },
        )
        .unwrap();
    let words = r.as_words();
    let half = words.len() / 2;
    fill(words, 0, 1);
    assert!(p.counters().pswpout > 0, "nothing swapped out before fork");

    uswap::prepare_fork();
    // SAFETY: fork; the child only runs uswap and this function's checks, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        uswap::after_fork_child();
        let mut code = 0;
        if let Some(i) = find_bad(words, 0, 1) {
            eprintln!("child: pre-fork data wrong at word {i}");
            code = 1;
        }
        fill(&words[..half], 0, 2);
        if let Some(i) = find_bad(&words[..half], 0, 2) {
            eprintln!("child: own writes wrong at word {i}");
            code = 1;
        }
        if let Some(i) = find_bad(&words[half..], half, 1) {
            eprintln!("child: untouched half wrong at word {i}");
            code = 1;
        }
        // SAFETY: leave without running the parent's test harness teardown.
        unsafe { libc::_exit(code) };
    }
    uswap::after_fork_parent();
    // The parent writes the other half meanwhile and must not see the child's writes.
    fill(&words[half..], half, 3);
    assert_eq!(
        find_bad(&words[..half], 0, 1),
        None,
        "parent sees changed pre-fork data"
    );
    assert_eq!(
        find_bad(&words[half..], half, 3),
        None,
        "parent's own writes wrong"
    );
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
    // And once more after the child is gone (its swap is frozen, still readable).
    assert_eq!(find_bad(&words[..half], 0, 1), None);
    assert_eq!(find_bad(&words[half..], half, 3), None);
}

/// Units first touched after a fork, by both sides, with spare zeroed THPs in play
/// (the budget keeps two): each side gets zeros, then its own data.
#[test]
fn first_touch_after_fork_is_zero_and_private() {
    let p = Pool::builder().budget(128 * MIB).build().unwrap();
    let r = p
        .region_with(
            64 * MIB,
            RegionOptions {
                unit: Some(UnitPolicy::Huge),
                ..Default::default()
            },
        )
        .unwrap();
    let words = r.as_words();
    let half = words.len() / 2;
    // First touches before the fork: the reclaim thread starts making spares.
    fill(&words[..half], 0, 4);
    std::thread::sleep(std::time::Duration::from_millis(50));
    uswap::prepare_fork();
    // SAFETY: fork; the child only runs uswap and this function's checks, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    let (seed, who) = if pid == 0 {
        (5, "child")
    } else {
        (6, "parent")
    };
    if pid == 0 {
        uswap::after_fork_child();
    } else {
        uswap::after_fork_parent();
    }
    let mut bad = Vec::new();
    if let Some(i) = words[half..].iter().position(|w| w.load(Relaxed) != 0) {
        bad.push(format!(
            "{who}: untouched half not zero at word {}",
            half + i
        ));
    }
    fill(&words[half..], half, seed);
    std::thread::sleep(std::time::Duration::from_millis(20));
    if let Some(i) = find_bad(&words[..half], 0, 4) {
        bad.push(format!("{who}: pre-fork half wrong at word {i}"));
    }
    if let Some(i) = find_bad(&words[half..], half, seed) {
        bad.push(format!("{who}: own writes wrong at word {}", half + i));
    }
    if pid == 0 {
        for b in &bad {
            eprintln!("{b}");
        }
        // SAFETY: leave without running the parent's test harness teardown.
        unsafe { libc::_exit(i32::from(!bad.is_empty())) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(bad.is_empty(), "{bad:?}");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
}

#[test]
fn fork_gives_each_side_its_own_copy() {
    run(UnitPolicy::Small);
    run(UnitPolicy::Huge);
}
