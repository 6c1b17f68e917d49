//! Where the swap goes: the places `SwapFile::open` accepts and refuses, and what it
//! leaves behind (nothing).

use std::path::Path;
use std::sync::{Arc, Barrier};
use uswap::SwapFile;

const MIB: u64 = 1 << 20;

#[path = "support/mod.rs"]
mod support;
use support::{LoopDev, Mount, TempDir};

fn scratch() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// Many threads open the same new path at once, round after round: every open succeeds
/// (before, create-then-unlink let one see the other's file: "File exists") and the name
/// never appears.
#[test]
fn the_same_new_path_opened_at_once_never_collides() {
    let dir = TempDir::new(scratch(), "same-path");
    let path = Arc::new(dir.path().join("swap"));
    const THREADS: usize = 8;
    const ROUNDS: usize = 300;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                for _ in 0..ROUNDS {
                    barrier.wait();
                    match SwapFile::open(Some(&path), Some(2 * MIB)) {
                        Ok(f) => assert_eq!(f.capacity(), 2 * MIB),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                errors
            })
        })
        .collect();
    let errors: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        errors.is_empty(),
        "{} of {} opens failed, e.g. {}",
        errors.len(),
        THREADS * ROUNDS,
        errors[0]
    );
    assert!(dir.entries().is_empty(), "left behind: {:?}", dir.entries());
}

/// RAM-backed places are refused with the reason (tmpfs has O_DIRECT since Linux 6.6,
/// so they used to be taken, and shared memory grew by everything swapped): a tmpfs,
/// a ramfs, as a directory and as a new path in it, and a loop device over a file on
/// a tmpfs. Nothing is created there.
#[test]
fn ram_backed_places_are_refused() {
    let tmpfs = Mount::virtual_fs(scratch(), "tmpfs", "size=64m");
    let ramfs = Mount::virtual_fs(scratch(), "ramfs", "mode=0700");
    for (m, what) in [(&tmpfs, "tmpfs"), (&ramfs, "ramfs")] {
        for p in [m.path().to_path_buf(), m.path().join("new-swap")] {
            let e = SwapFile::open(Some(&p), None).unwrap_err();
            assert!(
                matches!(e, uswap::Error::SwapInRam { .. }),
                "{}: {e}",
                p.display()
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&p.display().to_string()) && msg.contains(what) && msg.contains("RAM"),
                "unclear: {msg}"
            );
        }
        assert!(m.dir.entries().is_empty(), "{what}: {:?}", m.dir.entries());
    }
    let image = tmpfs.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    let dev = LoopDev::attach(&image);
    let e = SwapFile::open(Some(Path::new(&dev.dev)), None).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, uswap::Error::SwapInRam { .. })
            && msg.contains("loop")
            && msg.contains("tmpfs"),
        "{msg}"
    );
}

/// A disk place says where it is, and is not taken for zram.
#[test]
fn a_disk_place_says_where_it_is() {
    let dir = TempDir::new(scratch(), "place");
    let f = SwapFile::open(Some(dir.path()), None).unwrap();
    let place = f.place();
    assert!(
        place.starts_with(&format!("an unnamed file in {}", dir.path().display())),
        "{place}"
    );
    assert!(f.zram().is_none(), "{place}");
    let f = SwapFile::open(Some(&dir.path().join("new")), None).unwrap();
    assert!(
        f.place().contains(&dir.path().display().to_string()),
        "{}",
        f.place()
    );
}

/// zram is compressed RAM, a legitimate swap device: accepted, and the place says so,
/// as a block device and as the disk under a filesystem.
#[test]
fn zram_is_accepted_and_named() {
    let _lock = support::machine_lock();
    let z = support::Zram::hot_add(64 * MIB);
    let name = format!("zram{}", z.num);
    {
        let f = SwapFile::open(Some(Path::new(&z.dev)), None).unwrap();
        assert_eq!(f.zram(), Some(name.as_str()), "{}", f.place());
        assert!(f.place().contains("compressed RAM"), "{}", f.place());
        assert_eq!(f.capacity(), 64 * MIB);
    }
    support::sh("mkfs.ext4", &["-q", "-F", &z.dev]);
    let dir = TempDir::new(scratch(), "zram-fs");
    support::sh("mount", &[&z.dev, dir.path().to_str().unwrap()]);
    let r = std::panic::catch_unwind(|| {
        let f = SwapFile::open(Some(dir.path()), None).unwrap();
        assert_eq!(f.zram(), Some(name.as_str()), "{}", f.place());
        assert!(f.place().contains("compressed RAM"), "{}", f.place());
    });
    support::sh("umount", &[dir.path().to_str().unwrap()]);
    r.unwrap();
}

/// Make a file of `bytes` preallocated in `dir` (to fill a disk).
fn ballast(dir: &Path, bytes: u64) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::create(dir.join("ballast")).unwrap();
    // SAFETY: fallocate(2) on an fd we own; no memory is passed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    assert_eq!(r, 0, "ballast: {}", std::io::Error::last_os_error());
}

/// The swap file grows by what is asked (rounded to a 2 MiB unit; the steps are the
/// caller's, `SwapFile::grow`), and a growth that cannot fit says what was asked and
/// what was free, and takes nothing (a 16 MiB region on a disk with 20 MiB free once
/// failed: it asked for 64).
#[test]
fn a_nearly_full_disk_grows_by_what_is_needed() {
    let fs = Mount::ext4(scratch(), "nearly-full", 160);
    let f = SwapFile::open_capped(
        Some(fs.path()),
        None,
        uswap::MaxSwap::PercentOfFree(100),
        Some(0),
    )
    .unwrap();
    assert_eq!(f.ensure(2 * MIB).unwrap(), 2 * MIB, "what is asked");
    assert_eq!(
        f.grow(64 * MIB).unwrap(),
        66 * MIB,
        "a step where there is room"
    );
    // Leave 20 MiB free: 80 MiB fits, 120 MiB does not.
    let free = fs.free_bytes();
    ballast(fs.path(), free - 20 * MIB);
    assert_eq!(f.ensure(80 * MIB).unwrap(), 80 * MIB);
    let free = fs.free_bytes();
    let e = f.ensure(120 * MIB).unwrap_err().to_string();
    for want in ["No space left", "40.0 MiB more", "120.0 MiB", "free"] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
    assert!(
        e.contains(&uswap::format_size(free)),
        "free space not said: {e}"
    );
    assert_eq!(f.capacity(), 80 * MIB);
    assert_eq!(fs.free_bytes(), free, "a failed growth kept space");
    drop(f);
    // Through a pool, the case: a 16 MiB region with 20 MiB free.
    std::fs::remove_file(fs.path().join("ballast")).unwrap();
    ballast(fs.path(), fs.free_bytes() - 20 * MIB);
    let pool = uswap::Pool::builder()
        .budget(8 * MIB)
        .swap_file(fs.path())
        .build()
        .unwrap();
    let r = pool.region(16 * MIB).unwrap();
    let words = r.as_words();
    for (i, w) in words.iter().enumerate() {
        w.store(i as u64 ^ 0xA5A5, std::sync::atomic::Ordering::Relaxed);
    }
    for (i, w) in words.iter().enumerate() {
        assert_eq!(
            w.load(std::sync::atomic::Ordering::Relaxed),
            i as u64 ^ 0xA5A5
        );
    }
    assert!(pool.counters().pswpout > 0, "nothing was swapped");
}
