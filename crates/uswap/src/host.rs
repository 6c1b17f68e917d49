//! What this machine lets uswap do, probed the way the engine does it: the checks of
//! `uswap doctor`.

use crate::sys::uffd;
use std::io;

/// What userfaultfd allows this process.
#[derive(Debug)]
pub struct Userfaultfd {
    /// `userfaultfd(2)` for faults in user and kernel mode: what the engine asks for
    /// first (root, CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd = 1).
    pub syscall: io::Result<()>,
    /// `userfaultfd(2)` with UFFD_USER_MODE_ONLY: allowed to anyone on Linux 5.11+, but
    /// not enough for the engine (a program's system calls read and write its memory
    /// in kernel mode, and such a fault would fail with EFAULT).
    pub user_mode_only: io::Result<()>,
    /// `/dev/userfaultfd`: what the engine tries second; its permissions decide.
    pub device: io::Result<()>,
    /// The kernel's features, when any userfaultfd could be had.
    pub features: Option<UffdFeatures>,
}

impl Userfaultfd {
    /// Whether the engine can get the userfaultfd it needs (either way).
    pub fn usable(&self) -> bool {
        self.syscall.is_ok() || self.device.is_ok()
    }
}

/// The userfaultfd features the engine is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UffdFeatures {
    /// UFFDIO_MOVE (Linux 6.8): eviction moves pages out of regions without a copy.
    pub move_pages: bool,
    /// UFFDIO_POISON (Linux 6.6): a page whose swapped copy is lost faults as poisoned.
    pub poison: bool,
    /// Write-protect faults on anonymous memory (Linux 5.7): dirty tracking.
    pub write_protect: bool,
    /// The faulting thread's id in each fault (Linux 4.14).
    pub thread_id: bool,
}

impl UffdFeatures {
    /// Whether the engine has every feature it needs.
    pub fn complete(&self) -> bool {
        self.move_pages && self.poison && self.write_protect && self.thread_id
    }
}

/// Try each way of getting a userfaultfd, and read the kernel's features.
pub fn userfaultfd() -> Userfaultfd {
    let p = uffd::probe();
    Userfaultfd {
        syscall: p.syscall,
        user_mode_only: p.user_mode_only,
        device: p.device,
        features: p.features.map(|f| UffdFeatures {
            move_pages: f & uffd::FEATURE_MOVE != 0,
            poison: f & uffd::FEATURE_POISON != 0,
            write_protect: f & uffd::FEATURE_PAGEFAULT_FLAG_WP != 0,
            thread_id: f & uffd::FEATURE_THREAD_ID != 0,
        }),
    }
}

/// Set up (and close) an io_uring as each engine thread does; the number of entries
/// it got, or the error.
pub fn io_uring() -> crate::Result<u32> {
    crate::threads::new_ring().map(|r| r.entries())
}
