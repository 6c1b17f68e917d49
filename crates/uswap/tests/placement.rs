//! Where the swap goes: the places `SwapFile::open` accepts and refuses, and what it
//! leaves behind (nothing).

use std::path::Path;
use std::sync::{Arc, Barrier};
use uswap::backend::SwapFile;

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
