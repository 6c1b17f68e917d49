//! The memory cgroup the process runs in, and the budget's place in it.
//!
//! A pool's pages are anonymous memory charged to the process's memory cgroup, and
//! a uswap pool runs where kernel swap is off (or not allowed to the cgroup): a
//! budget bigger than the room the cgroup leaves ends in the OOM killer. So the
//! engine follows the cgroup (the kernel's memcg reclaim does the same for its
//! own pages): the budget's limit is at most the cgroup's limit less what the
//! process holds outside the engine (its heap, binary, page tables, and other
//! processes in the cgroup), less a margin, read again every [`PERIOD`] by the
//! reclaim thread. A program whose own heap grows makes the engine give room back;
//! room that the program leaves is the engine's to use.
//!
//! `--fill-memcg` ([`limit`] as the budget) asks for all of it: in a container limited
//! to 2 GiB, `uswap run --fill-memcg -- prog` keeps as much of prog's region resident as
//! the 2 GiB leaves, as kernel swap would in that container.
//!
//! The binding cgroup is the one with the tightest limit among the process's cgroup
//! and its ancestors (the kernel charges each); its usage counts everything under it.
//! File pages in its page cache are not "outside": the kernel reclaims them at the
//! limit (a program that reads files would otherwise squeeze the engine to its floor).
//! Not seen: limits above a cgroup namespace's root, and `memory.high` (throttling,
//! not the OOM killer). Several engines in one cgroup (a preloaded program's children)
//! each read the same room; the margin covers a little of that, not all.

use crate::engine::Engine;
use crate::{PAGE_SIZE, UNIT_SIZE};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How often the cgroup's usage is read: by the reclaim thread, and by a fault that
/// needs room when the last reading is older (the reclaim thread may be deep in a pass).
pub(crate) const PERIOD: Duration = Duration::from_millis(5);

/// The engine's limit stays this far under the room it reads: the kernel charges
/// in per-CPU batches, and the program's heap (and the engine's own tables, which grow
/// with what it swaps) grow between two readings and while reclaim catches up. With a
/// 64th of the limit (5 MiB of 320), pmbench's populate ran the cgroup into its limit.
fn margin(limit: u64) -> u64 {
    (limit / 32).max(8 << 20)
}

/// Memory outside the engine counts at its highest recent reading: a drop is given
/// back over a few readings (1/16 per reading: 64% in 16, 80 ms at [`PERIOD`]), not at
/// once, so that a heap that shrinks and grows again does not make the engine fill and
/// evict in turn. Not slower: the engine stops counting pages a moment before the
/// kernel uncharges them (a region freed at exit), and that moment, read as memory
/// outside, held the limit at 47 MiB of 152 for seconds (1/400 per reading).
const OUTSIDE_DECAY: u64 = 16;

/// The binding cgroup's limit, usage and stat files, kept open (a reading is three
/// preads).
pub(crate) struct Follow {
    dir: PathBuf,
    limit: File,
    usage: File,
    stat: File,
    v2: bool,
    /// The cgroup's limit when the pool started, for messages.
    start_limit: u64,
    /// Next reading due (ns since `epoch`); whoever moves it reads.
    next_ns: AtomicU64,
    epoch: Instant,
    /// Memory outside the engine, highest recent reading (bytes).
    outside: AtomicU64,
}

/// The tightest memory-cgroup limit over this process's cgroup and its ancestors, in
/// bytes; `None` when none is below the machine's RAM (no limit to fill).
pub fn limit() -> Option<u64> {
    binding().map(|(_, limit)| limit)
}

impl Follow {
    /// Follow this process's memory cgroup, if one limits it.
    pub(crate) fn open() -> Option<Follow> {
        let (dir, start_limit) = binding()?;
        let v2 = dir.join("memory.current").exists();
        let (l, u) = files(v2);
        Some(Follow {
            limit: File::open(dir.join(l)).ok()?,
            usage: File::open(dir.join(u)).ok()?,
            stat: File::open(dir.join("memory.stat")).ok()?,
            v2,
            dir,
            start_limit,
            next_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            outside: AtomicU64::new(0),
        })
    }

    /// The most the engine may hold now, in bytes, given that it holds `engine` bytes:
    /// the cgroup's limit less its usage outside the engine (at its recent highest),
    /// less the margin. `None` when a file cannot be read (the cgroup went away): the
    /// caller keeps its limit.
    fn room_for_engine(&self, engine: u64) -> Option<u64> {
        let limit = read_limit(&self.limit)?;
        let usage = read_u64(&self.usage)?;
        let file = file_pages_bytes(&self.stat, self.v2).unwrap_or(0);
        let now = usage.saturating_sub(file).saturating_sub(engine);
        let outside = decayed(self.outside.load(Relaxed), now);
        self.outside.store(outside, Relaxed);
        Some(cap(limit, outside, 0))
    }

    /// Whether a reading is due; true for one caller per [`PERIOD`].
    fn due(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let next = self.next_ns.load(Relaxed);
        now >= next
            && self
                .next_ns
                .compare_exchange(next, now + PERIOD.as_nanos() as u64, Relaxed, Relaxed)
                .is_ok()
    }

    /// The cgroup followed, for messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} (limit {} at start)",
            self.dir.display(),
            crate::format_size(self.start_limit)
        )
    }
}

/// Read the cgroup again, if a reading is due, and set the budget's cap to the
/// engine's room in it (at start, then from the reclaim thread's loop and from every
/// fault that reserves room, whichever comes first after [`PERIOD`]). Never below a few
/// units: an engine with no room at all would only fault over its limit.
pub(crate) fn follow(e: &Engine) {
    let Some(f) = e.memcg.as_ref().filter(|f| f.due()) else {
        return;
    };
    let b = &e.budget;
    let (md, md_reserved) = b.metadata_bytes();
    // What the engine holds charged now (not what it reserved and has not touched:
    // counted here, that would be room granted twice until the next reading).
    let engine = b.usage_pages().max(0) as u64 * PAGE_SIZE as u64 + md;
    if let Some(room) = f.room_for_engine(engine) {
        let floor = md + md_reserved + (b.reserve_pages() + FLOOR_PAGES) * PAGE_SIZE as u64;
        b.set_cap(room.max(floor));
        if let Some(c) = &e.tiers.compressed {
            c.follow_limit(b.effective_bytes(), b.bytes());
        }
    }
}

/// The least the cap leaves the engine besides its metadata and reclaim's reserve:
/// the smallest budget's worth of pages (4 units), room for the watermarks below it.
const FLOOR_PAGES: u64 = 4 * UNIT_SIZE as u64 / PAGE_SIZE as u64;

/// How long the reclaim thread may sleep before the next reading: [`PERIOD`] while the
/// cgroup's room is near the budget (within 64 MiB or a quarter), ten times that while
/// the budget is well inside it.
pub(crate) fn sleep_for(e: &Engine) -> Duration {
    let b = &e.budget;
    let near = b.bytes() + (64 << 20).max(b.bytes() / 4);
    if b.cap_bytes() < near {
        PERIOD
    } else {
        PERIOD * 10
    }
}

/// Bytes of file pages (active and inactive) in the cgroup's page cache: reclaimable
/// by the kernel at the limit, so not memory the engine must leave room for.
fn file_pages_bytes(stat: &File, v2: bool) -> Option<u64> {
    // (On the stack of an in-thread fault's signal handler: no allocation, 4 KiB; the
    // file keys come early in v1's and v2's memory.stat.)
    let mut buf = [0u8; 4096];
    let n = stat.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let keys: [&str; 2] = if v2 {
        ["active_file", "inactive_file"]
    } else {
        // hierarchical: the binding cgroup may be an ancestor
        ["total_active_file", "total_inactive_file"]
    };
    Some(
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| keys.contains(k))
            .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
            .sum(),
    )
}

/// Memory outside the engine, read as `now` after `before`: a rise counts at once, a
/// drop by 1/[`OUTSIDE_DECAY`] per reading.
fn decayed(before: u64, now: u64) -> u64 {
    now.max(before - (before - before.min(now)) / OUTSIDE_DECAY)
}

/// The engine's room: `limit` less what the cgroup holds outside the engine (`usage`
/// less the engine's `engine` bytes; the engine counts pages it reserved before they
/// are charged, so this never grants room twice), less the margin.
fn cap(limit: u64, usage: u64, engine: u64) -> u64 {
    let outside = usage.saturating_sub(engine);
    limit.saturating_sub(outside).saturating_sub(margin(limit))
}

/// Limit and usage file names of cgroup v2 (`true`) or v1.
fn files(v2: bool) -> (&'static str, &'static str) {
    if v2 {
        ("memory.max", "memory.current")
    } else {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    }
}

/// The cgroup directory with the tightest limit below RAM, and that limit.
fn binding() -> Option<(PathBuf, u64)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (mount, root, path, v2) = locate(&cgroup, &mountinfo)?;
    let ram = crate::sys::mem::mem_total().unwrap_or(u64::MAX);
    // The process's path inside the hierarchy, relative to the mount's root (a
    // cgroup namespace mounts its own cgroup as "/").
    let rel = Path::new(&path).strip_prefix(&root).ok()?.to_path_buf();
    let mut best: Option<(PathBuf, u64)> = None;
    let mut dir = Path::new(&mount).join(rel);
    let (limit_file, _) = files(v2);
    loop {
        let limit = File::open(dir.join(limit_file))
            .ok()
            .and_then(|f| read_limit(&f));
        if let Some(l) = limit.filter(|&l| l < ram) {
            if best.as_ref().is_none_or(|(_, b)| l < *b) {
                best = Some((dir.clone(), l));
            }
        }
        if dir == Path::new(&mount) || !dir.pop() {
            break;
        }
    }
    best
}

/// From /proc/self/cgroup and /proc/self/mountinfo: the memory hierarchy's mount point,
/// the mount's root inside the hierarchy, the process's cgroup path, and whether it is
/// cgroup v2. A v1 memory controller wins over a v2 mount (hybrid setups keep memory
/// on v1).
fn locate(cgroup: &str, mountinfo: &str) -> Option<(String, String, String, bool)> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctrl.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_string());
        } else if ctrl.is_empty() {
            v2_path = Some(path.to_string());
        }
    }
    let mut v1_mount = None;
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS"
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let (root, point) = (pre[3].to_string(), pre[4].to_string());
        match post[0] {
            "cgroup" if post[2].split(',').any(|o| o == "memory") => v1_mount = Some((point, root)),
            "cgroup2" => v2_mount = Some((point, root)),
            _ => {}
        }
    }
    if let (Some((m, r)), Some(p)) = (v1_mount, v1_path) {
        return Some((m, r, p, false));
    }
    let (m, r) = v2_mount?;
    Some((m, r, v2_path?, true))
}

/// A limit file: bytes (`u64::MAX` for v2's "max": a limit lifted while the pool
/// runs), or `None` for an unreadable file.
fn read_limit(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?.trim();
    match text {
        "max" => Some(u64::MAX),
        t => t.parse().ok(),
    }
}

fn read_u64(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_hierarchy_is_found_on_v1_and_v2() {
        let mountinfo_v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                            40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n";
        let cgroup_v1 = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(
            locate(cgroup_v1, mountinfo_v1),
            Some((
                "/sys/fs/cgroup/memory".into(),
                "/".into(),
                "/a/b".into(),
                false
            ))
        );
        // A v2 mount inside a cgroup namespace: its root is the process's cgroup.
        let mountinfo_v2 = "30 23 0:26 /c /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate("0::/c/d\n", mountinfo_v2),
            Some(("/sys/fs/cgroup".into(), "/c".into(), "/c/d".into(), true))
        );
        assert_eq!(
            locate("0::/\n", "1 0 8:1 / / rw - ext4 /dev/sda rw\n"),
            None
        );
    }

    #[test]
    fn the_engine_gets_what_the_cgroup_leaves_less_a_margin() {
        let mib = 1u64 << 20;
        // 320 MiB cgroup, 300 MiB used of which the engine holds 270: 30 outside.
        assert_eq!(cap(320 * mib, 300 * mib, 270 * mib), 290 * mib - 10 * mib);
        // The program's heap grew by 50 MiB: the engine's room shrinks by as much.
        assert_eq!(cap(320 * mib, 350 * mib, 270 * mib), 240 * mib - 10 * mib);
        // The engine counts pages not charged yet: outside is never negative.
        assert_eq!(cap(320 * mib, 100 * mib, 150 * mib), 320 * mib - 10 * mib);
        // A small cgroup keeps the 8 MiB floor of the margin; a full one leaves 0.
        assert_eq!(cap(64 * mib, 0, 0), 56 * mib);
        assert_eq!(cap(64 * mib, 200 * mib, 0), 0);
    }

    #[test]
    fn memory_outside_the_engine_comes_back_slowly() {
        let mib = 1u64 << 20;
        assert_eq!(decayed(10 * mib, 30 * mib), 30 * mib);
        let mut o = 30 * mib;
        for _ in 0..4 {
            o = decayed(o, 10 * mib);
        }
        // 4 readings (20 ms) give back ~4.5 of 20 MiB; 100 (0.5 s) nearly all.
        assert!(o > 25 * mib && o < 26 * mib, "{o}");
        for _ in 0..100 {
            o = decayed(o, 10 * mib);
        }
        assert!(o < 11 * mib, "{o}");
    }
}
