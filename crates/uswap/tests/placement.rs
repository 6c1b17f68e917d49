//! Where the swap goes: the places `SwapFile::open` accepts and refuses, and what it
//! leaves behind (nothing).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use uswap::backend::SwapFile;

const MIB: u64 = 1 << 20;

/// A fresh directory on the disk that holds the build (never a tmpfs), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("placement-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Many threads open the same new path at once, round after round: every open succeeds
/// (before, create-then-unlink let one see the other's file: "File exists") and the name
/// never appears.
#[test]
fn the_same_new_path_opened_at_once_never_collides() {
    let dir = TempDir::new("same-path");
    let path = Arc::new(dir.0.join("swap"));
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
