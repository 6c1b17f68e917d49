//! Swap readahead windows, mirroring the kernel's `mm/swap_state.c`.
//!
//! Three pieces:
//!
//! - [`swapin_nr_pages`]: the kernel's `__swapin_nr_pages()`, the core rule that
//!   turns "was the last fault adjacent?" and "how many readahead pages were hit
//!   since the last window?" into a window size. Copied exactly, including the
//!   "don't shrink readahead too fast" floor of half the previous window.
//! - [`VmaReadahead`]: per-region readahead around the faulting *virtual* page
//!   (seed 004, the kernel's `swap_vma_ra_win()` / `swap_ra_info()`), with the
//!   window placed forward, backward or centred on the fault depending on the
//!   direction of the last two faults, and clipped to the region and to the
//!   2 MiB unit (kernel: PMD) containing the fault.
//! - [`ClusterReadahead`]: the pre-seed-004 policy: neighbouring swap *slots*
//!   around the faulting slot, sized from ONE global hit count (kernel
//!   `swapin_nr_pages()` + `swap_cluster_readahead()`). Kept for comparison:
//!   seed 004 shows a random workload next to a sequential one confuses it.
//!
//! Beyond the kernel, [`AdaptiveCap`] raises a region's window cap while it
//! streams, up to a whole 2 MiB unit; see its docs for the exact rule.
//!
//! # How a fault handler drives [`VmaReadahead`] (kernel `do_swap_page`)
//!
//! - page found in the swap cache: call [`VmaReadahead::cache_hit`] with whether
//!   it was brought in by readahead and not yet used (kernel
//!   `lookup_swap_cache()`: records the fault address, `hits += 1` if the page
//!   had `PG_readahead`); no new window.
//! - page not cached: call [`VmaReadahead::window`] (or
//!   [`VmaReadahead::window_adaptive`]) and read the swapped pages of the window;
//!   mark those other than the fault page as readahead. Computing a window resets
//!   the hit count to 0.
//!
//! Page indices are region-relative; the 2 MiB clipping assumes regions start
//! 2 MiB aligned (they do: regions are made of 2 MiB units).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Pages in a 2 MiB unit (kernel: pages per PMD); windows never cross one.
const UNIT_PAGES: u64 = 512;

/// The kernel's `__swapin_nr_pages()`: readahead window size in pages.
///
/// `prev` / `cur` are the previous and current fault positions (page or slot),
/// `hits` the readahead pages hit since the previous window, `max_pages` the cap
/// and `prev_win` the previous window. Arithmetic is the kernel's: `prev ± 1`
/// wraps (unsigned long), and the result can exceed `max_pages` when half the
/// previous window does (the kernel's "don't shrink readahead too fast" floor).
/// With `max_pages == 0` and `prev_win < 2` it returns 0; callers treat a cap
/// below 2 as "no readahead", as the kernel does before calling it.
pub fn swapin_nr_pages(prev: u64, cur: u64, hits: u32, max_pages: u32, prev_win: u32) -> u32 {
    let mut pages = hits.saturating_add(2);
    if pages == 2 {
        // No hits: only an adjacent fault earns a 2-page window.
        if cur != prev.wrapping_add(1) && cur != prev.wrapping_sub(1) {
            pages = 1;
        }
    } else {
        let mut roundup: u32 = 4;
        while roundup < pages {
            match roundup.checked_mul(2) {
                Some(r) => roundup = r,
                None => {
                    roundup = u32::MAX;
                    break;
                }
            }
        }
        pages = roundup;
    }
    if pages > max_pages {
        pages = max_pages;
    }
    // Don't shrink readahead too fast.
    let last_ra = prev_win / 2;
    if pages < last_ra {
        pages = last_ra;
    }
    pages
}

/// A readahead window of page indices, `[start, end)`; always contains the fault page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaWindow {
    /// First page of the window.
    pub start: u64,
    /// One past the last page of the window.
    pub end: u64,
}

impl RaWindow {
    /// Pages in the window.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the window is empty (never, for windows made here).
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Whether `page` is in the window.
    pub fn contains(&self, page: u64) -> bool {
        (self.start..self.end).contains(&page)
    }

    fn single(page: u64) -> Self {
        RaWindow {
            start: page,
            end: page.saturating_add(1),
        }
    }
}

/// Where a window was placed relative to the fault page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaDirection {
    /// The fault follows the previous one (`page == prev + 1`): `[page, page + win)`.
    Forward,
    /// The fault precedes the previous one (`page + 1 == prev`): `[page - win + 1, page + 1)`.
    Backward,
    /// Anything else: `(win - 1) / 2` pages before the fault, the rest after.
    Centred,
}

/// Per-region VMA readahead state: prev fault page, prev window, hits since. Behind the caller's lock.
///
/// The kernel packs the same three values into `vma->swap_readahead_info`. Two
/// deliberate differences: the initial state has *no* previous fault (the kernel
/// starts at address 0, which for region-relative pages would make a first
/// fault on page 1 look sequential), and hits are not capped at the kernel's
/// 6-bit field (63), so that windows above 64 pages ([`AdaptiveCap`]) can grow.
#[derive(Debug, Default, Clone)]
pub struct VmaReadahead {
    /// Page of the last fault (window computed or swap-cache hit).
    prev: Option<u64>,
    /// Last computed window size, before clipping (kernel `SWAP_RA_WIN`).
    win: u32,
    /// Readahead pages hit since the last window (kernel `SWAP_RA_HITS`).
    hits: u32,
    /// Length of the last window after clipping: what was actually read.
    last_len: u32,
    /// Placement of the last window (`None` when it was the fault page alone).
    last_dir: Option<RaDirection>,
}

impl VmaReadahead {
    /// Window for a fault on `page` in a region of `region_pages` pages, clipped to the region and to the
    /// 512-page (2 MiB) unit containing `page`; `max_pages` is the cap (kernel: 1 << page-cluster = 8).
    ///
    /// With `max_pages <= 1` this is the fault page alone and the state is left
    /// untouched, as in the kernel. Otherwise the state becomes (this page, this
    /// window, 0 hits).
    pub fn window(&mut self, page: u64, region_pages: u64, max_pages: u32) -> RaWindow {
        debug_assert!(
            page < region_pages,
            "fault page {page} outside region of {region_pages} pages"
        );
        if max_pages <= 1 {
            return RaWindow::single(page);
        }
        // "No previous fault" must look non-adjacent: `page` is neither `page ± 1`.
        let prev = self.prev.unwrap_or(page);
        let win = swapin_nr_pages(prev, page, self.hits, max_pages, self.win);
        let forward = self.prev.is_some() && prev.checked_add(1) == Some(page);
        let backward = self.prev.is_some() && page.checked_add(1) == Some(prev);
        self.prev = Some(page);
        self.win = win;
        self.hits = 0;
        if win <= 1 {
            self.last_len = 1;
            self.last_dir = None;
            return RaWindow::single(page);
        }
        let w = u64::from(win);
        // Saturate instead of wrapping near page 0 / u64::MAX; the clip below
        // then gives what the kernel means.
        let (lpfn, rpfn, dir) = if forward {
            (page, page.saturating_add(w), RaDirection::Forward)
        } else if backward {
            (
                page.saturating_add(1).saturating_sub(w),
                page.saturating_add(1),
                RaDirection::Backward,
            )
        } else {
            let left = (w - 1) / 2;
            (
                page.saturating_sub(left),
                page.saturating_add(w - left),
                RaDirection::Centred,
            )
        };
        let unit_start = page & !(UNIT_PAGES - 1);
        let unit_end = unit_start.saturating_add(UNIT_PAGES);
        let start = lpfn.max(unit_start).min(page);
        let end = rpfn
            .min(region_pages)
            .min(unit_end)
            .max(page.saturating_add(1));
        let w = RaWindow { start, end };
        self.last_len = u32::try_from(w.len()).unwrap_or(u32::MAX);
        self.last_dir = Some(dir);
        w
    }

    /// Like [`window`](Self::window) with the cap taken from `cap`, after first
    /// telling `cap` how the previous window fared (its length, the hits since,
    /// and its direction).
    pub fn window_adaptive(
        &mut self,
        page: u64,
        region_pages: u64,
        cap: &mut AdaptiveCap,
    ) -> RaWindow {
        if self.last_len > 1 {
            let ra = self.last_len - 1;
            cap.observe_directed(self.last_len, self.hits.min(ra), self.last_dir);
        }
        self.window(page, region_pages, cap.cap())
    }

    /// A readahead page was hit (found in the swap cache, not yet used).
    /// Prefer [`cache_hit`](Self::cache_hit), which also records the fault page.
    pub fn hit(&mut self) {
        self.hits = self.hits.saturating_add(1);
    }

    /// A fault on `page` found it in the swap cache (kernel `lookup_swap_cache()`):
    /// the fault position moves to `page` (so a stream served from readahead still
    /// looks sequential at its next miss) and, if the page was brought in by
    /// readahead, it counts as a hit. The window size is kept.
    pub fn cache_hit(&mut self, page: u64, readahead: bool) {
        self.prev = Some(page);
        if readahead {
            self.hit();
        }
    }

    /// Readahead hits since the last window.
    pub fn hits(&self) -> u32 {
        self.hits
    }

    /// The last computed window size (before clipping); 0 before the first.
    pub fn prev_win(&self) -> u32 {
        self.win
    }

    /// Placement of the last window; `None` before the first or when it was
    /// the fault page alone.
    pub fn last_direction(&self) -> Option<RaDirection> {
        self.last_dir
    }
}

/// `prev_offset` before any fault: chosen so that neither `prev + 1` nor `prev - 1`
/// is a real slot (the kernel's static 0 makes a first fault on slot 1 look sequential).
const NO_PREV: u64 = u64::MAX - 1;

/// The old global policy (pre seed 004): readahead of neighbouring swap slots with ONE global hit count.
/// Window from swapin_nr_pages(prev_slot, slot, hits, max, prev_win); slots [slot & !(win-1), (slot | (win-1)) + 1)
/// clipped to capacity (kernel swap_cluster_readahead). Thread-safe (atomics).
///
/// As in the kernel, the previous offset is only updated by windows computed
/// with no hits, and the hit count is taken and zeroed atomically. A window
/// size that is not a power of two (a cap that is not) is rounded down to one
/// for the alignment mask. The kernel skips slot 0 (its swap header); slots here
/// have no header, so slot 0 is fair game.
#[derive(Debug)]
pub struct ClusterReadahead {
    /// Slot of the last fault that computed a window with no hits (kernel `prev_offset`).
    prev_offset: AtomicU64,
    /// Last window size (kernel `last_readahead_pages`).
    last_pages: AtomicU32,
    /// Readahead hits since the last window, all regions together (kernel `swapin_readahead_hits`).
    hits: AtomicU32,
}

impl Default for ClusterReadahead {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterReadahead {
    /// Fresh state: no previous fault, no hits.
    pub fn new() -> Self {
        ClusterReadahead {
            prev_offset: AtomicU64::new(NO_PREV),
            last_pages: AtomicU32::new(0),
            hits: AtomicU32::new(0),
        }
    }

    /// Slots `[start, end)` to read for a fault on `slot` in a swap area of
    /// `capacity` slots; always contains `slot`. `max_pages <= 1` gives the slot
    /// alone and leaves the state untouched, as in the kernel.
    pub fn window(&self, slot: u64, capacity: u64, max_pages: u32) -> (u64, u64) {
        let single = (slot, slot.saturating_add(1));
        if max_pages <= 1 {
            return single;
        }
        // Races between concurrent faults are tolerated as in the kernel (it
        // uses plain READ_ONCE/WRITE_ONCE and atomic_xchg the same way).
        let hits = self.hits.swap(0, Ordering::AcqRel);
        let prev = self.prev_offset.load(Ordering::Relaxed);
        let pages = swapin_nr_pages(
            prev,
            slot,
            hits,
            max_pages,
            self.last_pages.load(Ordering::Relaxed),
        );
        if hits == 0 {
            self.prev_offset.store(slot, Ordering::Relaxed);
        }
        self.last_pages.store(pages, Ordering::Relaxed);
        if pages <= 1 {
            return single;
        }
        let win = 1u64 << pages.ilog2();
        let mask = win - 1;
        let start = slot & !mask;
        let end = (slot | mask)
            .saturating_add(1)
            .min(capacity)
            .max(slot.saturating_add(1));
        (start, end)
    }

    /// A readahead page was hit (from any region).
    pub fn hit(&self) {
        // Saturating: a wrapped count would look like a fresh start.
        let _ = self
            .hits
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |h| h.checked_add(1));
    }
}

/// Windows fully hit in a row, in one direction, before the cap doubles.
pub const STREAM_CONFIRM_WINDOWS: u32 = 3;

/// Beyond the kernel: a confirmed stream (several consecutive windows fully hit, moving in one direction)
/// raises the cap for this region by doubling, up to 512 pages (a whole 2 MiB unit); when hits in the last
/// window fall below half, halve the cap back toward the base.
///
/// The exact rule, per observed window of `window_len` pages (the fault page plus
/// `ra = window_len - 1` readahead pages) with `hits` of those hit (clamped to `ra`):
///
/// 1. `ra == 0`: nothing was read ahead, nothing learned; no change.
/// 2. `hits == ra` (fully hit): if the window was [`RaDirection::Centred`], or its
///    direction differs from the streak's, the streak restarts (at 0 for centred,
///    at 1 in the new direction); otherwise the streak grows by one. A window
///    observed without a direction ([`observe`](Self::observe)) continues the streak.
///    When the streak reaches [`STREAM_CONFIRM_WINDOWS`] the cap doubles (up to
///    `max`) and the streak restarts at 0, so every doubling is confirmed afresh
///    at the new size.
/// 3. `2 * hits < ra` (less than half hit): the cap halves (not below `base`) and
///    the streak restarts.
/// 4. otherwise (at least half, not all): the streak restarts; the cap stays.
#[derive(Debug, Clone)]
pub struct AdaptiveCap {
    /// Cap when not streaming (kernel: `1 << page-cluster`).
    base: u32,
    /// Highest cap: at most a 2 MiB unit.
    max: u32,
    /// Current cap, in `[base, max]`.
    cap: u32,
    /// Fully hit windows in a row since the last change of cap.
    streak: u32,
    /// Direction of the current streak, when known.
    dir: Option<RaDirection>,
}

impl AdaptiveCap {
    /// A cap starting at `base` (at least 1) that can grow to `max` (clamped to
    /// `[base, 512]`).
    pub fn new(base: u32, max: u32) -> Self {
        let base = base.clamp(1, UNIT_PAGES as u32);
        let max = max.clamp(base, UNIT_PAGES as u32);
        AdaptiveCap {
            base,
            max,
            cap: base,
            streak: 0,
            dir: None,
        }
    }

    /// The current cap, to pass as `max_pages`.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Account for one window without direction information (see the type's rule).
    pub fn observe(&mut self, window_len: u32, hits_in_window: u32) {
        self.observe_directed(window_len, hits_in_window, None);
    }

    /// Account for one window placed in direction `dir` (see the type's rule).
    pub fn observe_directed(
        &mut self,
        window_len: u32,
        hits_in_window: u32,
        dir: Option<RaDirection>,
    ) {
        let ra = window_len.saturating_sub(1);
        if ra == 0 {
            return;
        }
        let hits = hits_in_window.min(ra);
        if hits == ra {
            match dir {
                Some(RaDirection::Centred) => {
                    self.streak = 0;
                    self.dir = None;
                }
                Some(d) if self.dir.is_some_and(|cur| cur != d) => {
                    self.streak = 1;
                    self.dir = Some(d);
                }
                _ => {
                    self.streak += 1;
                    if dir.is_some() {
                        self.dir = dir;
                    }
                }
            }
            if self.streak >= STREAM_CONFIRM_WINDOWS && self.cap < self.max {
                self.cap = self.cap.saturating_mul(2).min(self.max);
                self.streak = 0;
            }
        } else if hits.saturating_mul(2) < ra {
            self.cap = (self.cap / 2).max(self.base);
            self.streak = 0;
            self.dir = None;
        } else {
            self.streak = 0;
            self.dir = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: u64, end: u64) -> RaWindow {
        RaWindow { start, end }
    }

    #[test]
    fn nr_pages_rules() {
        // No hits, adjacent either way: pages = 0 + 2 = 2.
        assert_eq!(swapin_nr_pages(10, 11, 0, 8, 0), 2);
        assert_eq!(swapin_nr_pages(10, 9, 0, 8, 0), 2);
        // No hits, not adjacent: 1.
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 0), 1);
        assert_eq!(swapin_nr_pages(10, 10, 0, 8, 0), 1);
        // hits=1: 3 rounds up to 4; hits=2: 4 stays 4; hits=3: 5 -> 8; hits=5: 7 -> 8.
        assert_eq!(swapin_nr_pages(10, 50, 1, 8, 0), 4);
        assert_eq!(swapin_nr_pages(10, 50, 2, 8, 0), 4);
        assert_eq!(swapin_nr_pages(10, 50, 3, 8, 0), 8);
        assert_eq!(swapin_nr_pages(10, 50, 5, 8, 0), 8);
        // hits=7: 9 -> 16, capped at max 8. hits=30: 32 -> cap 8; with cap 64 -> 32.
        assert_eq!(swapin_nr_pages(10, 11, 7, 8, 0), 8);
        assert_eq!(swapin_nr_pages(0, 1, 30, 8, 0), 8);
        assert_eq!(swapin_nr_pages(0, 1, 30, 64, 0), 32);
        // Shrink limit: prev_win 8, no hits, non-adjacent: 1 < 8/2 -> 4, not 1.
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 8), 4);
        // prev_win 3 -> floor 1; prev_win 2 -> floor 1.
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 3), 1);
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 2), 1);
        // The floor wins over the cap: prev_win 32, max 8 -> 16 (kernel order of min/max).
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 32), 16);
        // Kernel unsigned wrap: prev 0, cur u64::MAX is "prev - 1".
        assert_eq!(swapin_nr_pages(0, u64::MAX, 0, 8, 0), 2);
    }

    #[test]
    fn vma_forward_stream() {
        let mut ra = VmaReadahead::default();
        let r = 4096;
        // Fault 0: no previous fault, no hits -> 1 page.
        assert_eq!(ra.window(0, r, 8), w(0, 1));
        // Fault 1: adjacent to 0, 0 hits -> 2, forward [1, 3).
        assert_eq!(ra.window(1, r, 8), w(1, 3));
        assert_eq!(ra.last_direction(), Some(RaDirection::Forward));
        // Page 2 comes from readahead: 1 hit, prev = 2.
        ra.cache_hit(2, true);
        // Fault 3: hits 1 -> 3 -> 4, forward [3, 7).
        assert_eq!(ra.window(3, r, 8), w(3, 7));
        assert_eq!(ra.hits(), 0, "hits reset by a new window");
        for p in 4..=6 {
            ra.cache_hit(p, true);
        }
        // Fault 7: hits 3 -> 5 -> 8, [7, 15).
        assert_eq!(ra.window(7, r, 8), w(7, 15));
        for p in 8..=14 {
            ra.cache_hit(p, true);
        }
        // Fault 15: hits 7 -> 9 -> 16 -> cap 8, [15, 23); and again [23, 31).
        assert_eq!(ra.window(15, r, 8), w(15, 23));
        for p in 16..=22 {
            ra.cache_hit(p, true);
        }
        assert_eq!(ra.window(23, r, 8), w(23, 31));
        assert_eq!(ra.prev_win(), 8);

        // Shrink limit: a far fault with no hits after a window of 8 -> 8/2 = 4,
        // centred with left = (4-1)/2 = 1: [1999, 2003).
        assert_eq!(ra.window(2000, r, 8), w(1999, 2003));
        assert_eq!(ra.last_direction(), Some(RaDirection::Centred));
        // Then 4/2 = 2, left = (2-1)/2 = 0: [3000, 3002); then 2/2 = 1: alone.
        assert_eq!(ra.window(3000, r, 8), w(3000, 3002));
        assert_eq!(ra.window(100, r, 8), w(100, 101));
        assert_eq!(ra.last_direction(), None);
    }

    #[test]
    fn vma_backward_stream() {
        let mut ra = VmaReadahead::default();
        let r = 4096;
        assert_eq!(ra.window(1000, r, 8), w(1000, 1001));
        // Fault 999: prev 1000 = 999 + 1 -> backward, 0 hits -> 2: [999-2+1, 1000) = [998, 1000).
        assert_eq!(ra.window(999, r, 8), w(998, 1000));
        assert_eq!(ra.last_direction(), Some(RaDirection::Backward));
        ra.cache_hit(998, true);
        // Fault 997: prev 998, hits 1 -> 4: [997-4+1, 998) = [994, 998).
        assert_eq!(ra.window(997, r, 8), w(994, 998));
        for p in [996, 995, 994] {
            ra.cache_hit(p, true);
        }
        // Fault 993: hits 3 -> 8: [993-8+1, 994) = [986, 994).
        assert_eq!(ra.window(993, r, 8), w(986, 994));
    }

    #[test]
    fn vma_random_faults_get_one_page() {
        let mut ra = VmaReadahead::default();
        // Never adjacent, never a hit: 0 + 2 = 2 -> 1; floor 1/2 = 0.
        for p in [100, 3000, 57, 2000, 58 + 1000, 7] {
            assert_eq!(ra.window(p, 4096, 8), w(p, p + 1));
        }
        // A first fault on page 1 is not "after page 0": no previous fault.
        let mut ra = VmaReadahead::default();
        assert_eq!(ra.window(1, 4096, 8), w(1, 2));
    }

    #[test]
    fn vma_hit_without_position_counts() {
        // hit() only counts: fault 10, then 3 hits reported without positions,
        // then fault 30 (not adjacent): hits 3 -> 5 -> 8, centred left 3: [27, 35).
        let mut ra = VmaReadahead::default();
        assert_eq!(ra.window(10, 4096, 8), w(10, 11));
        ra.hit();
        ra.hit();
        ra.hit();
        assert_eq!(ra.window(30, 4096, 8), w(27, 35));
        // A cache hit on a page not brought by readahead moves the position only:
        // fault 31 after cache_hit(30, false): adjacent, 0 hits -> 2, but floor 8/2 = 4:
        // forward [31, 35).
        ra.cache_hit(30, false);
        assert_eq!(ra.hits(), 0);
        assert_eq!(ra.window(31, 4096, 8), w(31, 35));
    }

    #[test]
    fn vma_clip_region_end() {
        let mut ra = VmaReadahead::default();
        let r = 20;
        // Same stream as vma_forward_stream, region of 20 pages.
        assert_eq!(ra.window(0, r, 8), w(0, 1));
        assert_eq!(ra.window(1, r, 8), w(1, 3));
        ra.cache_hit(2, true);
        assert_eq!(ra.window(3, r, 8), w(3, 7));
        for p in 4..=6 {
            ra.cache_hit(p, true);
        }
        assert_eq!(ra.window(7, r, 8), w(7, 15));
        for p in 8..=14 {
            ra.cache_hit(p, true);
        }
        // Fault 15: [15, 23) clipped to the region end 20.
        assert_eq!(ra.window(15, r, 8), w(15, 20));
        // Fault 19 (not adjacent to 15), 0 hits: floor 8/2 = 4, centred left 1:
        // [18, 22) clipped to [18, 20).
        assert_eq!(ra.window(19, r, 8), w(18, 20));
    }

    #[test]
    fn vma_clip_unit_boundary() {
        let mut ra = VmaReadahead::default();
        let r = 4096;
        // Forward stream approaching page 512 (a 2 MiB boundary).
        assert_eq!(ra.window(500, r, 8), w(500, 501));
        assert_eq!(ra.window(501, r, 8), w(501, 503));
        ra.cache_hit(502, true);
        assert_eq!(ra.window(503, r, 8), w(503, 507));
        for p in 504..=506 {
            ra.cache_hit(p, true);
        }
        // Fault 507: 8 -> [507, 515), clipped to the unit end 512.
        assert_eq!(ra.window(507, r, 8), w(507, 512));

        // Backward stream crossing down into page 512 from above.
        let mut ra = VmaReadahead::default();
        assert_eq!(ra.window(515, r, 8), w(515, 516));
        // Fault 514: backward 2: [513, 515).
        assert_eq!(ra.window(514, r, 8), w(513, 515));
        ra.cache_hit(513, true);
        // Fault 512: prev 513 -> backward, hits 1 -> 4: [509, 513) clipped to unit start 512.
        assert_eq!(ra.window(512, r, 8), w(512, 513));

        // Centred at page 0: left (4-1)/2 = 1 would start at -1; saturates: [0, 3).
        let mut ra = VmaReadahead::default();
        ra.window(300, r, 8);
        ra.hit();
        // Fault 0: hits 1 -> 4, not adjacent -> centred [0-1, 0+4-1) -> [0, 3).
        assert_eq!(ra.window(0, r, 8), w(0, 3));
    }

    #[test]
    fn vma_cap_of_one_is_off() {
        let mut ra = VmaReadahead::default();
        ra.window(5, 100, 8);
        assert_eq!(ra.window(6, 100, 1), w(6, 7));
        // State untouched: a fault on 6 with cap 8 is still "after 5" -> 2: [6, 8).
        assert_eq!(ra.window(6, 100, 8), w(6, 8));
    }

    #[test]
    fn adaptive_cap_grow_and_shrink() {
        let mut c = AdaptiveCap::new(8, 512);
        assert_eq!(c.cap(), 8);
        // Two fully hit windows of 8 (7 readahead pages, 7 hits): not yet.
        c.observe(8, 7);
        c.observe(8, 7);
        assert_eq!(c.cap(), 8);
        // Third: 3 in a row -> 16.
        c.observe(8, 7);
        assert_eq!(c.cap(), 16);
        // A window of 1 teaches nothing and does not break the streak.
        c.observe(16, 15);
        c.observe(1, 0);
        c.observe(16, 15);
        c.observe(16, 15);
        assert_eq!(c.cap(), 32);
        // 10 of 31 hit: 20 < 31 -> halve to 16.
        c.observe(32, 10);
        assert_eq!(c.cap(), 16);
        // 8 of 15: 16 >= 15, not full: stays 16, streak reset.
        c.observe(16, 15);
        c.observe(16, 15);
        c.observe(16, 8);
        c.observe(16, 15);
        assert_eq!(c.cap(), 16, "streak restarted by the partly hit window");
        // 3 of 15 -> 8; 0 of 7 -> stays at base 8.
        c.observe(16, 3);
        assert_eq!(c.cap(), 8);
        c.observe(8, 0);
        assert_eq!(c.cap(), 8);
        // Up to the max, never beyond: 8 -> 16 -> ... -> 512 takes 6 doublings of 3 windows.
        for _ in 0..100 {
            let cap = c.cap();
            c.observe(cap, cap - 1);
        }
        assert_eq!(c.cap(), 512);
        // max above 512 is clamped.
        assert_eq!(AdaptiveCap::new(8, 4096).max, 512);
    }

    #[test]
    fn adaptive_cap_direction() {
        let mut c = AdaptiveCap::new(8, 64);
        let f = Some(RaDirection::Forward);
        let b = Some(RaDirection::Backward);
        c.observe_directed(8, 7, f);
        c.observe_directed(8, 7, f);
        // Direction change: streak restarts at 1 (backward).
        c.observe_directed(8, 7, b);
        assert_eq!(c.cap(), 8);
        c.observe_directed(8, 7, b);
        c.observe_directed(8, 7, b);
        assert_eq!(c.cap(), 16);
        // A fully hit centred window is not a stream: streak to 0.
        c.observe_directed(16, 15, f);
        c.observe_directed(16, 15, f);
        c.observe_directed(16, 15, Some(RaDirection::Centred));
        c.observe_directed(16, 15, f);
        assert_eq!(c.cap(), 16);
        c.observe_directed(16, 15, f);
        c.observe_directed(16, 15, f);
        assert_eq!(c.cap(), 32);
    }

    #[test]
    fn vma_window_adaptive_stream() {
        // Forward stream, every readahead page hit, cap from 8 (max 512).
        let mut ra = VmaReadahead::default();
        let mut cap = AdaptiveCap::new(8, 512);
        let r = 4096;
        let mut got = Vec::new();
        let mut caps = Vec::new();
        let mut p = 0;
        while got.len() < 8 {
            let win = ra.window_adaptive(p, r, &mut cap);
            got.push(win);
            caps.push(cap.cap());
            for q in win.start + 1..win.end {
                ra.cache_hit(q, true);
            }
            p = win.end;
        }
        // By hand (the forward stream above, then):
        // [15,31): windows 2, 4, 8 were full -> cap 16; hits 7 -> 16.
        // [31,47), [47,63): 16 each (hits 15 -> 32, cap 16).
        // [63,95): third full 16 -> cap 32; hits 15 -> 17 -> 32.
        assert_eq!(
            got,
            vec![
                w(0, 1),
                w(1, 3),
                w(3, 7),
                w(7, 15),
                w(15, 31),
                w(31, 47),
                w(47, 63),
                w(63, 95)
            ]
        );
        assert_eq!(caps, vec![8, 8, 8, 8, 16, 16, 16, 32]);
    }

    #[test]
    fn cluster_readahead_alignment() {
        let ra = ClusterReadahead::new();
        // Slot 100, nothing before: 1 -> (100, 101). prev = 100, last = 1.
        assert_eq!(ra.window(100, 1024, 8), (100, 101));
        // Slot 101: adjacent, 0 hits -> 2, mask 1: [100, 102). prev = 101, last = 2.
        assert_eq!(ra.window(101, 1024, 8), (100, 102));
        // One hit; slot 102: 3 -> 4, mask 3: [100, 104). prev stays 101 (hits != 0), last 4.
        ra.hit();
        assert_eq!(ra.window(102, 1024, 8), (100, 104));
        // 3 hits; slot 205: 5 -> 8, mask 7: [200, 208). prev stays 101, last 8.
        for _ in 0..3 {
            ra.hit();
        }
        assert_eq!(ra.window(205, 1024, 8), (200, 208));
        // 7 hits; slot 1021, capacity 1023: 9 -> 16 -> 8, mask 7: [1016, 1024) -> capped [1016, 1023).
        for _ in 0..7 {
            ra.hit();
        }
        assert_eq!(ra.window(1021, 1023, 8), (1016, 1023));
        // No hits; slot 102 = prev(101) + 1 -> 2, floor 8/2 = 4, mask 3: [100, 104). prev = 102.
        assert_eq!(ra.window(102, 1024, 8), (100, 104));
        // No hits; slot 600, not adjacent: 1, floor 4/2 = 2 -> mask 1: [600, 602).
        assert_eq!(ra.window(600, 1024, 8), (600, 602));
        // Cap 6 (not a power of two): 3 hits -> 8 -> 6 -> rounded down to 4: slot 13 -> [12, 16).
        for _ in 0..3 {
            ra.hit();
        }
        assert_eq!(ra.window(13, 1024, 6), (12, 16));
        // Cap 1: the slot alone.
        assert_eq!(ra.window(77, 1024, 1), (77, 78));
    }

    #[test]
    fn cluster_readahead_is_shared_between_threads() {
        let ra = std::sync::Arc::new(ClusterReadahead::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let ra = std::sync::Arc::clone(&ra);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        ra.hit();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
        // 4000 global hits -> 4002 -> 4096 -> cap 8; slot 9 -> [8, 16).
        assert_eq!(ra.window(9, 1 << 20, 8), (8, 16));
    }
}
