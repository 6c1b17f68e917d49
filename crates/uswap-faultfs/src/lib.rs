//! uswap-faultfs: a fault-injecting FUSE filesystem for testing what uswap does when its
//! swap device misbehaves (this kernel has no device-mapper, nbd or ublk; it has FUSE and
//! loop devices).
//!
//! A mount holds:
//! - `disk`: one backing file on a real disk, served with its fixed length;
//! - `control`: the control file (write commands, read the status);
//! - any file created in the mount (data in an unlinked file on the real disk), so the
//!   mount can be a swap *directory*. FUSE here has no `O_TMPFILE` (fuser answers the
//!   kernel's FUSE_TMPFILE with ENOSYS, so open(O_TMPFILE) fails with EOPNOTSUPP): use
//!   uswap's other placement, a new path in the mount (created 0600, unlinked at once
//!   while open), which works.
//!
//! Every file is opened with `FOPEN_DIRECT_IO`: no page cache, each read and write
//! (O_DIRECT, buffered, or a loop device's) reaches the handlers, which apply the rules.
//! The kernel splits large requests into FUSE requests of at most
//! `/proc/sys/fs/fuse/max_pages_limit` pages (1 MiB by default): a 2 MiB write arrives as
//! two requests, and the rules and the event log see those.
//!
//! # The control language
//! One command per line (or `;`-separated), `#` starts a comment. A write to the control
//! file is a batch: all its commands apply, or none (the write fails with EINVAL and the
//! status says why in `last_error`). Numbers are decimal or `0x` hex with an optional
//! binary suffix `k`, `M`, `G`, `T`. `RANGE` is `START LEN` (bytes) or `all`. Rules
//! apply to every data file (`disk` and created files) at those offsets.
//!
//! | command | effect on a request overlapping RANGE |
//! |---|---|
//! | `fail-read RANGE [errno=E] [count=N]` | the read fails (whole request) with E (default EIO) |
//! | `fail-write RANGE [errno=E] [count=N]` | the write fails (whole request, nothing stored) |
//! | `drop-write RANGE [count=N]` | success is reported; the bytes inside RANGE are not stored |
//! | `tear-write RANGE [keep=K] [count=N]` | success is reported; of the request's part inside RANGE only the first K bytes (default 4096) are stored |
//! | `flip-read RANGE [xor=X] [count=N]` | the bytes inside RANGE are returned XORed with X (default 0xff); stored bytes stay |
//! | `flip-write RANGE [xor=X] [count=N]` | the bytes inside RANGE are stored XORed with X |
//! | `corrupt RANGE [xor=X]` | now: the stored bytes of RANGE (of every data file) are XORed with X |
//! | `clear` | remove every rule |
//! | `clear-log` | empty the event log, zero the counters |
//! | `reset` | both |
//!
//! `count=N`: the rule fires for the first N requests it matches, then is spent (e.g.
//! `fail-read 0 4k count=1` fails one read and lets its retry through). Errno names:
//! EIO, ENOSPC, EROFS, ENXIO, ENODEV, EINVAL, EAGAIN, EDQUOT, or a number. A failing rule
//! wins over the others; of drop/tear/flip on one byte, not storing wins over flipping.
//!
//! # The status (reading the control file)
//! ```text
//! rule 1 drop-write 1048576 65536 remaining=unlimited hits=2
//! counters reads=10 read_bytes=40960 writes=64 write_bytes=67108864 events_dropped=0
//! injected drop-write hits=2 bytes=131072
//! last_error unknown command "bogus" ...
//! event 1 drop-write rule=1 file=swap request=1048576 1048576 affected=1048576 65536
//! ```
//! (`injected` lines for every kind; ranges as `START LEN`.) `affected` is exactly the
//! bytes not returned, not stored, or flipped.
//!
//! # Use from tests
//! [`harness::FaultMount`] mounts an instance in a fresh directory (optionally with a
//! loop device over `disk`) in this process and undoes it all on drop, also on panic;
//! the `uswap-faultfs` binary does the same from a shell until it gets a signal.

pub mod fs;
pub mod harness;
pub mod loopdev;
pub mod mount;
pub mod rules;

pub use harness::{run_with_deadline, FaultMount, Options, RunOutcome};
pub use rules::{Counters, Event, Kind, Rule};
