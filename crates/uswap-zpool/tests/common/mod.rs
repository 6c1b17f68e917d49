//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses some of them

use std::sync::mpsc;
use std::time::Duration;
use uswap_zpool::{Compressor, DataKind, PAGE_SIZE, UNIT_SIZE};

/// lz4, lz4 accelerated, and zstd at the two levels worth using.
pub const COMPRESSORS: [Compressor; 4] = [
    Compressor::Lz4,
    Compressor::Lz4Fast { acceleration: 8 },
    Compressor::Zstd { level: 1 },
    Compressor::Zstd { level: 3 },
];

pub type Page = Box<[u8; PAGE_SIZE]>;
pub type Unit = Box<[u8; UNIT_SIZE]>;

pub fn page(kind: DataKind, seed: u64, i: u64) -> Page {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    kind.fill_page(seed, i, &mut p[..]);
    p
}

pub fn unit_of(bytes: Vec<u8>) -> Unit {
    bytes.into_boxed_slice().try_into().expect("2 MiB")
}

pub fn zero_unit() -> Unit {
    unit_of(vec![0u8; UNIT_SIZE])
}

pub fn unit(kind: DataKind, seed: u64, i: u64) -> Unit {
    let mut u = zero_unit();
    kind.fill(seed, i * 512, &mut u[..]);
    u
}

/// Run `f` on another thread; fail if it does not finish within `secs` (a hang is a
/// failure, not a stuck test run).
pub fn with_deadline<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            worker.join().unwrap();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked: show its panic.
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {secs} s (hang?)"),
    }
}
