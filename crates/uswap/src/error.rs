//! Typed errors of the engine. Each variant says what failed and with what input.

use std::path::PathBuf;

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong when building a pool or creating a region.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// userfaultfd could not be opened.
    #[error(
        "userfaultfd is not permitted for this process ({source}). Run as root, or permit it: \
         `sudo sysctl vm.unprivileged_userfaultfd=1`, or give your user access to /dev/userfaultfd \
         (`sudo setfacl -m u:$USER:rw /dev/userfaultfd`)"
    )]
    UffdNotPermitted {
        /// The errno of the last attempt.
        source: std::io::Error,
    },
    /// The kernel lacks a userfaultfd feature the engine needs.
    #[error("the kernel's userfaultfd lacks {feature} (needs Linux 6.8 or later)")]
    UffdFeatureMissing {
        /// Name of the missing feature.
        feature: &'static str,
    },
    /// The swap file could not be created or opened.
    #[error("cannot use swap file {path}: {source}{hint}")]
    SwapFile {
        /// The path that was tried.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
        /// A hint for the user (may be empty).
        hint: String,
    },
    /// The swap place keeps its data in RAM (tmpfs, ramfs, a RAM disk): swapping there
    /// frees no memory.
    #[error(
        "cannot use {path} for swap: it is on {what}, which keeps its data in RAM, so swapping \
         there frees no memory; give --swap-file a directory on a disk (e.g. /var/tmp)"
    )]
    SwapInRam {
        /// The path given.
        path: PathBuf,
        /// What holds it ("tmpfs", "ramfs", "the RAM disk ram0", ...).
        what: String,
    },
    /// No default place ($TMPDIR, /var/tmp, /tmp) can hold the swap file.
    #[error("no place for the swap file: {tried}; give --swap-file a directory on a disk")]
    NoSwapPlace {
        /// Each place tried and why it was not used.
        tried: String,
    },
    /// A fixed swap size below one 2 MiB unit.
    #[error(
        "swap size of {size} bytes is too small: the minimum is {minimum} bytes (one 2 MiB swap \
         unit)"
    )]
    SwapSizeTooSmall {
        /// Size given.
        size: u64,
        /// The smallest size that works.
        minimum: u64,
    },
    /// The remote tier could not be used (bad address list, cluster unreachable or down,
    /// access refused).
    #[error("{what}")]
    Remote {
        /// What the remote store said.
        what: String,
    },
    /// The swap file cannot hold what the pool has been asked to back.
    #[error(
        "swap space exhausted: a region of {requested} bytes needs {needed} bytes of swap, but the \
         swap file holds {capacity} bytes of which {committed} are committed to other regions; \
         give a larger --swap-size"
    )]
    SwapFull {
        /// Region size asked for.
        requested: u64,
        /// Swap bytes the region needs.
        needed: u64,
        /// Swap capacity of the pool.
        capacity: u64,
        /// Swap already committed.
        committed: u64,
    },
    /// The budget is zero or too small to hold one 2 MiB unit plus the engine's metadata.
    #[error("budget of {budget} bytes is too small: uswap needs at least {minimum} bytes ({why})")]
    BudgetTooSmall {
        /// Budget given.
        budget: u64,
        /// Smallest budget that works.
        minimum: u64,
        /// Why that minimum.
        why: String,
    },
    /// The budget exceeds the machine's memory.
    #[error("budget of {budget} bytes is larger than this machine's RAM ({ram} bytes)")]
    BudgetExceedsRam {
        /// Budget given.
        budget: u64,
        /// MemTotal.
        ram: u64,
    },
    /// A setting that cannot be used (`what` says which and why).
    #[error("{what}")]
    InvalidSetting {
        /// The setting, its value and why it was refused.
        what: String,
    },
    /// A size string did not parse.
    #[error("invalid size {input:?}: {reason} (examples: 4k, 256M, 2G)")]
    InvalidSize {
        /// The input.
        input: String,
        /// Why it was refused.
        reason: String,
    },
    /// A region size of zero or one too large for the address space.
    #[error("invalid region size {size}: {reason}")]
    InvalidRegionSize {
        /// Size asked for.
        size: u64,
        /// Why it was refused.
        reason: String,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Sys {
        /// What was attempted.
        op: &'static str,
        /// errno.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn sys(op: &'static str) -> Self {
        Error::Sys {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}
