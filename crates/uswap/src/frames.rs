//! Swap-cache frames: the pages where a page's bytes live while they are out of
//! their region — evicted and waiting for their write, written and kept as a clean
//! copy (the second chance), or being read in.
//!
//! Frames come from two arenas that the pool maps once and keeps for its lifetime:
//! 4 KiB frames (never THP-backed, so a 4 KiB read allocates 4 KiB) and 2 MiB frames
//! (THP-backed, for units swapped whole under `--unit 2m`: a unit is evicted into one
//! with a single UFFDIO_MOVE of its PMD and swapped in the same way). Both arenas are
//! registered with the pool's userfaultfd in write-protect mode only: UFFDIO_MOVE
//! needs a registered destination, and an engine thread touching a frame must take
//! an ordinary kernel fault, never a userfaultfd one (which only the engine's own
//! fault thread could serve).
//!
//! A frame belongs to one swap-cache entry at a time and is given back only when
//! that entry ends, after its I/O completed. So a page discarded and written again
//! while its old copy is still being written or read gets a new frame: the old
//! I/O never touches the new copy (the shadow-page design this replaces put every
//! copy of region page *i* at shadow page *i*, and lost data exactly there), and no
//! request ever points at memory that a region unmap could hand to a new mapping.
//!
//! A few 4 KiB frames whose copies a fault has just mapped are kept populated (`warm`)
//! for the next read or decompression, which overwrites a frame whole (every other
//! frame is zapped by whoever gives it back: `Frames::free_mapped`): a frame zapped
//! when given back costs a `process_madvise` (with a TLB flush across the process's
//! vCPUs) and, at its next use, a kernel fault that allocates, zeroes and charges a
//! page, on the path of every swap-in. For a 2 MiB frame that fault zeroes a THP: on
//! this VM, whose freed memory goes back to the host, a quarter of the fault thread's
//! samples in swap-w-seq 2m (compressed+file) were that zeroing, twice its
//! decompression's. Eviction gives a populated 2 MiB frame back for every unit it
//! compresses or writes, and a unit swapped in takes one, so a stream recycles them.
//! Warm frames are never handed out as a UFFDIO_MOVE destination (eviction) or as a
//! first touch's zeroed page, which must be empty. Their memory is charged to the
//! budget as metadata, full or not: the 4 KiB stash for the pool's life, the 2 MiB
//! stash as it grows. It grows by one frame whenever a unit had to be decoded into an
//! empty frame since the reclaim thread last looked, while that fits under the high
//! watermark (a stream settles at about one reclaim pass's worth of units, which
//! reclaim gives back at once and faults take one by one), up to a sixteenth of the
//! budget; it is emptied, and its charge given back, once no unit was swapped in for a
//! second (`tune_warm_units`).

use crate::engine::Engine;
use crate::error::Result;
use crate::sys::mem::{map_aligned, unmap, Zapper};
use crate::sys::uffd::{Uffd, REGISTER_WP};
use crate::{PAGE_SIZE, UNIT_PAGES, UNIT_SIZE};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Free/used bits of an arena's frames, with a next-fit hint.
struct Bitmap {
    /// Bit set: frame in use.
    words: Vec<u64>,
    frames: usize,
    free: usize,
    hint: usize,
}

impl Bitmap {
    fn new(frames: usize) -> Bitmap {
        let mut words = vec![0u64; frames.div_ceil(64)];
        // Bits past the end are permanently used.
        if !frames.is_multiple_of(64) {
            *words.last_mut().expect("at least one word") = !0u64 << (frames % 64);
        }
        Bitmap {
            words,
            frames,
            free: frames,
            hint: 0,
        }
    }

    fn is_used(&self, i: usize) -> bool {
        self.words[i / 64] >> (i % 64) & 1 == 1
    }

    fn set(&mut self, i: usize, used: bool) {
        if used {
            self.words[i / 64] |= 1 << (i % 64);
        } else {
            self.words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// The first run of free frames at or after the hint (wrapping), at most `n`
    /// long, marked used: `(first, len)`.
    fn alloc_run(&mut self, n: usize) -> Option<(usize, usize)> {
        if self.free == 0 || n == 0 {
            return None;
        }
        let nwords = self.words.len();
        let start_word = (self.hint / 64) % nwords;
        for k in 0..=nwords {
            let w = (start_word + k) % nwords;
            if self.words[w] == !0 {
                continue;
            }
            let bit = (!self.words[w]).trailing_zeros() as usize;
            let first = w * 64 + bit;
            if first >= self.frames {
                continue;
            }
            let mut len = 0;
            while len < n && first + len < self.frames && !self.is_used(first + len) {
                self.set(first + len, true);
                len += 1;
            }
            self.free -= len;
            self.hint = first + len;
            return Some((first, len));
        }
        None
    }

    /// Mark frames free; returns how many were free already (freed twice: a bug).
    fn release(&mut self, first: usize, len: usize) -> usize {
        let mut twice = 0;
        for i in first..first + len {
            if self.is_used(i) {
                self.set(i, false);
                self.free += 1;
            } else {
                twice += 1;
            }
        }
        twice
    }
}

/// One arena: `frames` frames of `frame_size` bytes from `base`.
struct Arena {
    base: usize,
    frame_size: usize,
    frames: usize,
    map: Mutex<Bitmap>,
}

impl Arena {
    fn new(frames: usize, frame_size: usize, huge: bool) -> Result<Arena> {
        let base = map_aligned(frames * frame_size, huge)?;
        Ok(Arena {
            base,
            frame_size,
            frames,
            map: Mutex::new(Bitmap::new(frames)),
        })
    }

    fn len(&self) -> usize {
        self.frames * self.frame_size
    }

    fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.len()
    }

    fn index(&self, addr: usize) -> usize {
        (addr - self.base) / self.frame_size
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Bitmap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        unmap(self.base, self.len());
    }
}

/// Who took a frame: a frame held with no region alive is a leak, and the report
/// names where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Site {
    SwapIn = 1,
    Readahead,
    InThread,
    UnitRead,
    Compressed,
    Evict,
    FirstTouch,
    /// Retagged: an evicted page kept as a clean copy.
    EvictClean,
    /// Retagged: a page being written.
    Writing,
    /// Retagged: a written page kept as a clean copy.
    Written,
    /// Retagged: a copy whose mapping failed, put back as clean.
    Unmapped,
    /// Given back and kept populated for the next read (`Frames::warm`).
    Warm,
}

impl Site {
    const ALL: [Site; 12] = [
        Site::SwapIn,
        Site::Readahead,
        Site::InThread,
        Site::UnitRead,
        Site::Compressed,
        Site::Evict,
        Site::FirstTouch,
        Site::EvictClean,
        Site::Writing,
        Site::Written,
        Site::Unmapped,
        Site::Warm,
    ];
}

/// The pool's frames.
pub(crate) struct Frames {
    small: Arena,
    huge: Arena,
    /// Pages of each 2 MiB frame still owned by a cache entry; the frame goes back
    /// (and is zapped whole: zapping part would split its THP) when none is.
    huge_live: Box<[AtomicU16]>,
    /// Frames handed out now (4 KiB units), for diagnostics.
    in_use: AtomicU64,
    /// Frames given back while free (an engine bug; `check_invariants` reports it).
    pub(crate) double_frees: AtomicU64,
    /// Who took each 4 KiB frame and each 2 MiB frame (`Site`), for diagnostics.
    small_site: Box<[AtomicU8]>,
    huge_site: Box<[AtomicU8]>,
    /// 4 KiB frames given back but kept populated, marked used in the bitmap (so
    /// `alloc` never hands them to eviction) and tagged `Site::Warm`; at most
    /// `warm_cap`.
    warm: Mutex<Vec<usize>>,
    warm_cap: usize,
    /// 2 MiB frames given back but kept populated, the same way (indices, tagged
    /// `Site::Warm`); at most `warm_huge_cap`, which changes only under this lock.
    warm_huge: Mutex<Vec<usize>>,
    warm_huge_cap: AtomicUsize,
    /// Most `warm_huge_cap` may grow to.
    warm_huge_max: usize,
    /// Units decoded into an empty 2 MiB frame (no warm one), and how many of those
    /// `tune_warm_units` has seen.
    huge_fill_misses: AtomicU64,
    huge_fill_misses_seen: AtomicU64,
    /// Frames taken for a unit read or decode from the stash, since the pool started.
    huge_recycled: AtomicU64,
    /// 2 MiB frames some of whose pages were moved out one by one (their PMD split):
    /// zapped when given back, not kept (a unit read into one would map as 4 KiB
    /// pages, not a THP).
    huge_split: Box<[std::sync::atomic::AtomicBool]>,
    /// When a 2 MiB frame was last taken to fill (ns since `epoch`).
    last_huge_fill_ns: AtomicU64,
    epoch: std::time::Instant,
}

/// A number of warm frames set by `var` (to compare), at most `max`; else `default`.
fn warm_setting(var: &str, max: usize, default: usize) -> usize {
    match std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) => n.min(max),
        None => default,
    }
}

/// Warm frames per budget: one per 512 pages of budget (2 MiB), 4 to 64 (256 KiB).
/// `USWAP_WARM_FRAMES=N` sets the number (0: none, every frame zapped when given
/// back), to compare.
fn warm_capacity(budget_pages: usize) -> usize {
    warm_setting(
        "USWAP_WARM_FRAMES",
        1024,
        default_warm_capacity(budget_pages),
    )
}

fn default_warm_capacity(budget_pages: usize) -> usize {
    (budget_pages / UNIT_PAGES).clamp(4, 64)
}

/// Most warm 2 MiB frames: one per 32 MiB of budget (a sixteenth of it), at most 16.
/// `USWAP_WARM_UNITS=N` sets it (0: every 2 MiB frame zapped when given back), to
/// compare.
fn warm_huge_capacity(budget_pages: usize) -> usize {
    warm_setting(
        "USWAP_WARM_UNITS",
        16,
        default_warm_huge_capacity(budget_pages),
    )
}

fn default_warm_huge_capacity(budget_pages: usize) -> usize {
    (budget_pages / (16 * UNIT_PAGES)).min(16)
}

impl Frames {
    /// Arenas for a pool of `budget` bytes: every page it may hold can sit in a
    /// frame, plus slack for the moments it runs over (virtual space only: nothing
    /// is touched until used).
    pub(crate) fn new(budget: u64) -> Result<Frames> {
        let pages = (budget / PAGE_SIZE as u64) as usize;
        Frames::with_warm(budget, warm_capacity(pages), warm_huge_capacity(pages))
    }

    /// [`Frames::new`] with `warm_cap` warm 4 KiB frames and up to `warm_huge_max`
    /// 2 MiB ones.
    fn with_warm(budget: u64, warm_cap: usize, warm_huge_max: usize) -> Result<Frames> {
        let pages = (budget / PAGE_SIZE as u64) as usize;
        let small = Arena::new(pages + 4 * UNIT_PAGES, PAGE_SIZE, false)?;
        let units = pages / UNIT_PAGES + 4;
        let huge = Arena::new(units, UNIT_SIZE, true)?;
        Ok(Frames {
            small,
            huge,
            huge_live: (0..units).map(|_| AtomicU16::new(0)).collect(),
            in_use: AtomicU64::new(0),
            double_frees: AtomicU64::new(0),
            small_site: (0..pages + 4 * UNIT_PAGES)
                .map(|_| AtomicU8::new(0))
                .collect(),
            huge_site: (0..units).map(|_| AtomicU8::new(0)).collect(),
            // never grown: a fault in a signal handler gives frames back here
            warm: Mutex::new(Vec::with_capacity(warm_cap)),
            warm_cap,
            warm_huge: Mutex::new(Vec::new()),
            warm_huge_cap: AtomicUsize::new(0),
            warm_huge_max,
            huge_fill_misses: AtomicU64::new(0),
            huge_fill_misses_seen: AtomicU64::new(0),
            huge_recycled: AtomicU64::new(0),
            huge_split: (0..units)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            last_huge_fill_ns: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        })
    }

    /// Bytes the warm 4 KiB frames may hold: charged to the budget for the pool's life.
    pub(crate) fn warm_bytes(&self) -> u64 {
        (self.warm_cap * PAGE_SIZE) as u64
    }

    /// Units read or decoded into a warm 2 MiB frame since the pool started.
    pub(crate) fn huge_recycled(&self) -> u64 {
        self.huge_recycled.load(Relaxed)
    }

    /// One 4 KiB frame for a read or a decompression, which must overwrite it whole
    /// before anything reads it: a warm one (populated, with stale bytes) if any.
    pub(crate) fn alloc_to_fill(&self, site: Site) -> Option<usize> {
        let warm = self.warm_list().pop();
        if let Some(a) = warm {
            self.small_site[self.small.index(a)].store(site as u8, Relaxed);
            self.in_use.fetch_add(1, Relaxed);
            return Some(a);
        }
        self.alloc_one(site)
    }

    /// Whether 4 KiB frame `i` is kept warm (given back).
    fn is_warm(&self, i: usize) -> bool {
        self.small_site[i].load(Relaxed) == Site::Warm as u8
    }

    fn warm_list(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn warm_huge_list(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.warm_huge.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register both arenas with `uffd` (write-protect mode: MOVE may target them,
    /// their own faults stay ordinary).
    pub(crate) fn register(&self, uffd: &Uffd) -> std::io::Result<()> {
        uffd.register(self.small.base, self.small.len(), REGISTER_WP)?;
        uffd.register(self.huge.base, self.huge.len(), REGISTER_WP)
    }

    /// Up to `n` 4 KiB frames as runs of consecutive frames, appended to `out` as
    /// `(addr, pages)`; returns how many (fewer only when the arena is exhausted).
    pub(crate) fn alloc(&self, n: usize, out: &mut Vec<(usize, usize)>, site: Site) -> usize {
        let mut got = 0;
        let mut m = self.small.map();
        while got < n {
            let Some((first, len)) = m.alloc_run(n - got) else {
                break;
            };
            for i in first..first + len {
                self.small_site[i].store(site as u8, Relaxed);
            }
            out.push((self.small.base + first * PAGE_SIZE, len));
            got += len;
        }
        self.in_use.fetch_add(got as u64, Relaxed);
        got
    }

    /// One 4 KiB frame. Allocates no memory of the process: an in-thread fault takes
    /// one, in a program's signal handler that may have interrupted malloc itself.
    pub(crate) fn alloc_one(&self, site: Site) -> Option<usize> {
        let (first, _) = self.small.map().alloc_run(1)?;
        self.small_site[first].store(site as u8, Relaxed);
        self.in_use.fetch_add(1, Relaxed);
        Some(self.small.base + first * PAGE_SIZE)
    }

    /// One 2 MiB frame (THP-backed once populated) for a whole unit; all its pages
    /// count as owned until given back with [`Frames::free`].
    pub(crate) fn alloc_huge(&self, site: Site) -> Option<usize> {
        let (i, _) = self.huge.map().alloc_run(1)?;
        self.huge_split[i].store(false, Relaxed);
        self.huge_site[i].store(site as u8, Relaxed);
        self.huge_live[i].store(UNIT_PAGES as u16, Relaxed);
        self.in_use.fetch_add(UNIT_PAGES as u64, Relaxed);
        Some(self.huge.base + i * UNIT_SIZE)
    }

    /// One 2 MiB frame for a read or a decompression that overwrites it whole before
    /// anything reads it: a warm one (populated, with stale bytes) if any, else an
    /// empty one.
    pub(crate) fn alloc_huge_to_fill(&self, site: Site) -> Option<usize> {
        self.take_warm_huge(site).or_else(|| {
            self.huge_fill_misses.fetch_add(1, Relaxed);
            self.alloc_huge(site)
        })
    }

    /// A warm 2 MiB frame (stale bytes, to be overwritten whole), if one is kept.
    pub(crate) fn take_warm_huge(&self, site: Site) -> Option<usize> {
        self.last_huge_fill_ns
            .store(self.epoch.elapsed().as_nanos() as u64, Relaxed);
        let i = self.warm_huge_list().pop()?;
        self.huge_recycled.fetch_add(1, Relaxed);
        self.huge_split[i].store(false, Relaxed);
        self.huge_site[i].store(site as u8, Relaxed);
        self.huge_live[i].store(UNIT_PAGES as u16, Relaxed);
        self.in_use.fetch_add(UNIT_PAGES as u64, Relaxed);
        Some(self.huge.base + i * UNIT_SIZE)
    }

    /// Whether `addr` is a page of a 2 MiB frame.
    pub(crate) fn is_huge(&self, addr: usize) -> bool {
        self.huge.contains(addr)
    }

    /// Which 2 MiB frame `addr` is a page of, if any.
    pub(crate) fn huge_index(&self, addr: usize) -> Option<usize> {
        self.huge.contains(addr).then(|| self.huge.index(addr))
    }

    /// Pages of the 2 MiB frame of `addr` still held (0 for a 4 KiB frame).
    pub(crate) fn huge_live(&self, addr: usize) -> u16 {
        if self.huge.contains(addr) {
            self.huge_live[self.huge.index(addr)].load(Relaxed)
        } else {
            0
        }
    }

    /// Give back the frames of `pages` (addresses of 4 KiB pages, each owned by the
    /// caller), zapped first, so that a frame `alloc` hands out again is empty
    /// (UFFDIO_MOVE refuses a destination that is not). A page of a 2 MiB frame gives
    /// back only its share: the frame goes when its last page does (kept warm for the
    /// next unit fill while that stash has room).
    pub(crate) fn free(&self, zapper: &Zapper, pages: &[usize]) {
        self.give_back(zapper, pages, false);
    }

    /// [`Frames::free`] for frames whose copies a fault has just mapped into their
    /// region: a 4 KiB one stays warm for the next read or decompression while the
    /// stash has room, so that fills recycle their own frames one for one. Only these
    /// do: when eviction's frames refilled the stash too, the faulting thread found it
    /// full as it gave its frame back and zapped it there, a `process_madvise` with a
    /// TLB flush on every swap-in (pmbench 4k `compressed+file` in the faulting
    /// thread: 5% of its samples; docs/benchmarks.md, 2026-11-28). Every other frame is
    /// zapped by whoever gives it back, in its batch.
    pub(crate) fn free_mapped(&self, zapper: &Zapper, pages: &[usize]) {
        self.give_back(zapper, pages, true);
    }

    fn give_back(&self, zapper: &Zapper, pages: &[usize], keep_warm: bool) {
        if let &[a] = pages {
            if self.small.contains(a) {
                self.give_back_small(a, keep_warm);
                return;
            }
        }
        let mut zap: Vec<(usize, usize)> = Vec::new();
        let mut small: Vec<usize> = Vec::new();
        let mut huge: Vec<usize> = Vec::new();
        let mut warm = (keep_warm && self.warm_cap > 0).then(|| self.warm_list());
        for &a in pages {
            if self.small.contains(a) {
                let i = self.small.index(a);
                // Given back twice (kept warm, or free in the bitmap): kept warm it
                // could go to a read and to eviction at once; zapped, it could take a
                // page just moved into it by its next owner.
                if self.is_warm(i) || !self.small.map().is_used(i) {
                    self.double_frees.fetch_add(1, Relaxed);
                    continue;
                }
                if let Some(w) = warm.as_mut().filter(|w| w.len() < self.warm_cap) {
                    self.small_site[i].store(Site::Warm as u8, Relaxed);
                    w.push(a);
                    continue;
                }
                match zap.last_mut() {
                    Some(last) if last.0 + last.1 == a && !self.huge.contains(last.0) => {
                        last.1 += PAGE_SIZE
                    }
                    _ => zap.push((a, PAGE_SIZE)),
                }
                small.push(i);
                continue;
            }
            if self.huge.contains(a) {
                let i = self.huge.index(a);
                if self.huge_site[i].load(Relaxed) == Site::Warm as u8 {
                    self.double_frees.fetch_add(1, Relaxed);
                    continue;
                }
                let before = self.huge_live[i].fetch_sub(1, Relaxed);
                debug_assert!(before > 0, "2 MiB frame {i} freed past empty");
                if before == 1 {
                    let mut w = self.warm_huge_list();
                    let split = self.huge_split[i].swap(false, Relaxed);
                    if !split
                        && w.len() < self.warm_huge_cap.load(Relaxed)
                        && self.huge.map().is_used(i)
                    {
                        self.huge_site[i].store(Site::Warm as u8, Relaxed);
                        w.push(i);
                        continue;
                    }
                    drop(w);
                    zap.push((self.huge.base + i * UNIT_SIZE, UNIT_SIZE));
                    huge.push(i);
                }
            }
        }
        drop(warm);
        zapper.zap(&zap);
        if !small.is_empty() {
            let mut m = self.small.map();
            let twice: usize = small.iter().map(|&i| m.release(i, 1)).sum();
            self.double_frees.fetch_add(twice as u64, Relaxed);
        }
        if !huge.is_empty() {
            let mut m = self.huge.map();
            let twice: usize = huge.iter().map(|&i| m.release(i, 1)).sum();
            self.double_frees.fetch_add(twice as u64, Relaxed);
        }
        self.in_use.fetch_sub(pages.len() as u64, Relaxed);
    }

    /// [`Frames::give_back`] of one 4 KiB frame, allocating no memory of the process:
    /// an in-thread fault gives its frame back, in a program's signal handler that may
    /// have interrupted malloc.
    fn give_back_small(&self, a: usize, keep_warm: bool) {
        let i = self.small.index(a);
        // as in `give_back`: given back twice
        if self.is_warm(i) || !self.small.map().is_used(i) {
            self.double_frees.fetch_add(1, Relaxed);
        } else if !(keep_warm && self.warm_cap > 0 && self.keep_warm(i, a)) {
            crate::sys::mem::zap_now(a, PAGE_SIZE);
            let twice = self.small.map().release(i, 1);
            self.double_frees.fetch_add(twice as u64, Relaxed);
        }
        self.in_use.fetch_sub(1, Relaxed);
    }

    /// Keeps 4 KiB frame `i` (at `a`) warm if the stash has room (its capacity is made
    /// ahead: no allocation).
    fn keep_warm(&self, i: usize, a: usize) -> bool {
        let mut w = self.warm_list();
        if w.len() >= self.warm_cap {
            return false;
        }
        self.small_site[i].store(Site::Warm as u8, Relaxed);
        w.push(a);
        true
    }

    /// Let the 2 MiB stash hold one more frame (its charge made by the caller).
    /// `charge` (made under the stash's lock, so that an emptying cannot give back a
    /// charge not made yet) says whether it could be made.
    fn grow_warm_huge(&self, charge: impl FnOnce() -> bool) -> bool {
        let _w = self.warm_huge_list();
        let cap = self.warm_huge_cap.load(Relaxed);
        if cap >= self.warm_huge_max || !charge() {
            return false;
        }
        self.warm_huge_cap.store(cap + 1, Relaxed);
        true
    }

    /// Empty the 2 MiB stash and let it hold none: its frames are zapped and go back
    /// to the bitmap, then `release` gives back the charge of as many frames as it was
    /// allowed (under the stash's lock, after the zap).
    fn shrink_warm_huge(&self, zapper: &Zapper, release: impl FnOnce(usize)) -> usize {
        let mut w = self.warm_huge_list();
        let cap = self.warm_huge_cap.swap(0, Relaxed);
        let zap: Vec<(usize, usize)> = w
            .iter()
            .map(|&i| (self.huge.base + i * UNIT_SIZE, UNIT_SIZE))
            .collect();
        zapper.zap(&zap);
        let mut m = self.huge.map();
        for i in w.drain(..) {
            m.release(i, 1);
        }
        drop(m);
        release(cap);
        cap
    }

    /// No 2 MiB frame was taken to fill for a second.
    fn huge_fills_idle(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now.saturating_sub(self.last_huge_fill_ns.load(Relaxed)) > 1_000_000_000
    }

    /// Give back pages of a 2 MiB frame that were moved out one by one (the frame's PMD
    /// is split): as [`Frames::free`], and the frame is zapped with its last page,
    /// never kept warm.
    pub(crate) fn free_moved_from_huge(&self, zapper: &Zapper, pages: &[usize]) {
        for &a in pages {
            if let Some(i) = self.huge_index(a) {
                self.huge_split[i].store(true, Relaxed);
            }
        }
        self.free(zapper, pages);
    }

    /// Give back a whole 2 MiB frame whose pages were all moved out (nothing to zap).
    pub(crate) fn free_moved_huge(&self, addr: usize) {
        let i = self.huge.index(addr);
        if self.huge_site[i].load(Relaxed) == Site::Warm as u8 {
            // Given back already and kept warm: a double free, left warm.
            self.double_frees.fetch_add(1, Relaxed);
            return;
        }
        let live = self.huge_live[i].swap(0, Relaxed);
        let twice = self.huge.map().release(i, 1);
        self.double_frees.fetch_add(twice as u64, Relaxed);
        self.in_use.fetch_sub(live as u64, Relaxed);
    }

    /// Give back 4 KiB frames whose pages were moved out (nothing to zap).
    pub(crate) fn free_moved(&self, addr: usize, pages: usize) {
        let first = self.small.index(addr);
        let mut m = self.small.map();
        // A frame kept warm was given back already: a double free, left warm.
        let twice: usize = (first..first + pages)
            .map(|i| if self.is_warm(i) { 1 } else { m.release(i, 1) })
            .sum();
        self.double_frees.fetch_add(twice as u64, Relaxed);
        self.in_use.fetch_sub(pages as u64, Relaxed);
    }

    /// The bytes of a frame page the caller owns, with no I/O in flight on it.
    pub(crate) fn page(&self, addr: usize) -> &[u8] {
        assert!(self.small.contains(addr) || self.huge.contains(addr));
        // SAFETY: the arenas stay mapped as long as `self`; a frame page not yet
        // populated reads as zeros through an ordinary kernel fault (the arenas are
        // registered for write-protect faults only, never missing ones); the caller
        // owns the page and no I/O writes it meanwhile.
        unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) }
    }

    /// The bytes of a frame page the caller owns, to write (no I/O in flight on it).
    #[allow(clippy::mut_from_ref)] // frames are handed out to one owner at a time
    pub(crate) fn page_mut(&self, addr: usize) -> &mut [u8] {
        self.span_mut(addr, PAGE_SIZE)
    }

    /// `len` bytes of consecutive frames from `addr`, owned by the caller.
    pub(crate) fn span(&self, addr: usize, len: usize) -> &[u8] {
        self.check_span(addr, len);
        // SAFETY: as in `page`, over frames of one arena that the caller owns.
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
    }

    /// `len` bytes of consecutive frames from `addr`, owned by the caller, to write.
    #[allow(clippy::mut_from_ref)] // frames are handed out to one owner at a time
    pub(crate) fn span_mut(&self, addr: usize, len: usize) -> &mut [u8] {
        self.check_span(addr, len);
        // SAFETY: as in `span`; the caller owns the frames and nobody else (no I/O)
        // reads or writes them meanwhile, so this is the only view.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
    }

    fn check_span(&self, addr: usize, len: usize) {
        let inside = |a: &Arena| a.contains(addr) && a.contains(addr + len - 1);
        assert!(
            inside(&self.small) || inside(&self.huge),
            "not frames: {addr:#x}+{len}"
        );
    }

    /// A frame the caller owns changes hands (diagnostics only).
    pub(crate) fn retag(&self, addr: usize, site: Site) {
        if self.small.contains(addr) {
            self.small_site[self.small.index(addr)].store(site as u8, Relaxed);
        }
    }

    /// Frames handed out now, in 4 KiB pages.
    pub(crate) fn in_use_pages(&self) -> u64 {
        self.in_use.load(Relaxed)
    }

    /// Frames handed out now by who took them: "evict 3, swap-in 1 (4 KiB); unit-read 1
    /// (2 MiB)".
    pub(crate) fn in_use_by_site(&self) -> String {
        let count = |a: &Arena, sites: &[AtomicU8]| -> Vec<String> {
            let m = a.map();
            let mut n = [0u64; 16];
            for i in 0..a.frames {
                // (warm frames are given back, not in use)
                if m.is_used(i) && sites[i].load(Relaxed) != Site::Warm as u8 {
                    n[sites[i].load(Relaxed) as usize & 15] += 1;
                }
            }
            Site::ALL
                .iter()
                .filter(|s| n[**s as usize] > 0)
                .map(|s| format!("{s:?} {}", n[*s as usize]))
                .collect()
        };
        format!(
            "4 KiB frames: [{}], 2 MiB frames: [{}]",
            count(&self.small, &self.small_site).join(", "),
            count(&self.huge, &self.huge_site).join(", ")
        )
    }

    /// After fork, in the child: every frame is free and empty (the child's copies
    /// of the parent's frames are zapped; nothing of the parent's I/O lands here).
    pub(crate) fn reset_after_fork(&self, zapper: &Zapper) {
        zapper.zap(&[
            (self.small.base, self.small.len()),
            (self.huge.base, self.huge.len()),
        ]);
        self.warm_list().clear();
        // (The 2 MiB stash was emptied, and allowed none, before the fork.)
        self.warm_huge_list().clear();
        *self.small.map() = Bitmap::new(self.small.frames);
        *self.huge.map() = Bitmap::new(self.huge.frames);
        for l in self.huge_live.iter() {
            l.store(0, Relaxed);
        }
        self.in_use.store(0, Relaxed);
    }
}

/// Reclaim thread: size the 2 MiB stash (module doc). Grows it by one frame when
/// units were decoded into empty frames since the last look, up to one reclaim pass's
/// worth of units (the watermarks' gap) and two more, and while one more fits under
/// the high watermark with every fault's reservation (its charge lowers the limit
/// first, so that no fault reserves that room meanwhile). Empties it once units stop
/// coming in. Returns pages of room it gave back.
///
/// Measured (swap-w-seq 1 GiB, 256 MiB, 2m, compressed+file, 3 rounds, medians):
/// 618 MB/s with no stash, 637 with 4 frames, 683 with 8 (this rule's size there),
/// 639 with 16.
pub(crate) fn tune_warm_units(e: &Engine) -> i64 {
    let f = &e.frames;
    if f.warm_huge_cap.load(Relaxed) > 0 && f.huge_fills_idle() {
        return drop_warm_units(e);
    }
    let misses = f.huge_fill_misses.load(Relaxed);
    let b = &e.budget;
    let pass_units = ((b.high_pages() - b.low_pages()).max(0) as usize).div_ceil(UNIT_PAGES);
    if f.huge_fill_misses_seen.swap(misses, Relaxed) == misses
        || f.warm_huge_cap.load(Relaxed) >= f.warm_huge_max.min(pass_units + 2)
    {
        return 0;
    }
    f.grow_warm_huge(|| {
        let bytes = UNIT_SIZE as u64;
        e.budget.reserve_metadata(bytes);
        let fits = e.budget.promised_pages() + UNIT_PAGES as i64 <= e.budget.high_pages();
        if fits {
            e.budget.commit_metadata(bytes);
        } else {
            e.budget.cancel_metadata(bytes);
        }
        fits
    });
    0
}

/// Empty the 2 MiB stash and give its charge back (reclaim when no unit is coming in
/// or nothing else makes room, fork). Returns pages of room it gave back.
pub(crate) fn drop_warm_units(e: &Engine) -> i64 {
    let n = e.frames.shrink_warm_huge(&e.zapper, |n| {
        e.budget.release_metadata((n * UNIT_SIZE) as u64)
    });
    (n * UNIT_PAGES) as i64
}

/// Whether the 2 MiB stash may hold frames (the reclaim thread then sleeps at most a
/// second at a time, to empty it once units stop coming in).
pub(crate) fn warm_units_held(e: &Engine) -> bool {
    e.frames.warm_huge_cap.load(Relaxed) > 0
}

/// Whether no unit was swapped in for a second (the 2 MiB stash is not about to serve).
pub(crate) fn warm_units_idle(e: &Engine) -> bool {
    e.frames.warm_huge_cap.load(Relaxed) > 0 && e.frames.huge_fills_idle()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_runs_and_reuse() {
        let mut b = Bitmap::new(130);
        assert_eq!(b.alloc_run(100), Some((0, 100)));
        assert_eq!(b.alloc_run(100), Some((100, 30)));
        assert_eq!(b.alloc_run(1), None);
        b.release(10, 5);
        b.release(120, 2);
        // Next fit from the hint wraps to the first hole.
        assert_eq!(b.alloc_run(8), Some((10, 5)));
        assert_eq!(b.alloc_run(8), Some((120, 2)));
        assert_eq!(b.free, 0);
    }

    /// A frame whose copy a fault mapped, given back, stays populated for the next
    /// read, never for eviction (a UFFDIO_MOVE destination must be empty); every other
    /// frame given back (eviction's, a read's given back unread), and mapped ones past
    /// the stash's room, are zapped; every way of giving a frame back twice is counted.
    #[test]
    fn warm_frames_serve_reads_only() {
        let f = Frames::with_warm(64 << 20, 32, 0).expect("arenas");
        assert_eq!(default_warm_capacity(16384), 32, "one per 2 MiB of budget");
        assert_eq!(f.warm_bytes(), 32 * PAGE_SIZE as u64);
        let z = Zapper::new();
        let a = f.alloc_to_fill(Site::SwapIn).expect("a frame");
        f.page_mut(a).fill(0x5a);
        f.free_mapped(&z, &[a]);
        assert_eq!(f.in_use_pages(), 0);
        assert_eq!(f.in_use_by_site(), "4 KiB frames: [], 2 MiB frames: []");
        // Eviction takes only empty frames: every other frame before this one.
        let mut runs = Vec::new();
        let n = f.small.frames - 1;
        assert_eq!(f.alloc(n + 1, &mut runs, Site::Evict), n);
        assert!(runs
            .iter()
            .all(|&(b, len)| a < b || a >= b + len * PAGE_SIZE));
        // A read gets it back, populated (its bytes are overwritten whole).
        assert_eq!(f.alloc_to_fill(Site::Readahead), Some(a));
        assert!(f.page(a).iter().all(|&b| b == 0x5a));
        f.free_mapped(&z, &[a]);
        f.free_mapped(&z, &[a]);
        assert_eq!(f.double_frees.load(Relaxed), 1);
        f.free(&z, &[a]);
        assert_eq!(
            f.double_frees.load(Relaxed),
            2,
            "a warm frame, given back again"
        );
        f.free_moved(a, 1);
        assert_eq!(f.double_frees.load(Relaxed), 3, "moved out of a warm frame");
        assert_eq!(
            f.warm_list().len(),
            1,
            "still warm, still used in the bitmap"
        );
        assert!(f.page(a).iter().all(|&b| b == 0x5a), "a warm frame zapped");
        // Frames given back any other way are zapped even while the stash has room:
        // eviction's, and a read's given back unread.
        let frames: Vec<usize> = runs
            .iter()
            .flat_map(|&(b, len)| (0..len).map(move |k| b + k * PAGE_SIZE))
            .take(48)
            .collect();
        for &fr in &frames {
            f.page_mut(fr).fill(0xa5);
        }
        f.free(&z, &frames[40..44]);
        for &fr in &frames[44..] {
            f.retag(fr, Site::SwapIn);
        }
        f.free(&z, &frames[44..]);
        assert_eq!(f.warm_list().len(), 1);
        assert_eq!(f.small.map().free, 8);
        for &fr in &frames[40..] {
            assert!(f.page(fr).iter().all(|&b| b == 0), "kept, not zapped");
        }
        // Past its room, mapped frames given back are zapped and go back to the bitmap.
        f.free_mapped(&z, &frames[..40]);
        assert_eq!(f.warm_list().len(), 32);
        assert_eq!(f.small.map().free, 8 + 9);
        for &fr in &frames[31..40] {
            assert!(f.page(fr).iter().all(|&b| b == 0), "not zapped");
        }
        // A frame free in the bitmap given back again is counted, and neither kept
        // warm nor released again.
        f.warm_list().pop();
        f.free_mapped(&z, &frames[39..40]);
        assert_eq!(f.double_frees.load(Relaxed), 4);
        assert_eq!(f.warm_list().len(), 31);
        f.free(&z, &frames[47..]);
        assert_eq!(f.double_frees.load(Relaxed), 5);
        assert_eq!(f.small.map().free, 8 + 9);
        // After a fork the child's frames are all free and empty.
        f.reset_after_fork(&z);
        assert!(f.warm_list().is_empty());
        assert_eq!(f.small.map().free, f.small.frames);
        assert!(f.page(a).iter().all(|&b| b == 0));
        assert!(f.page(frames[0]).iter().all(|&b| b == 0));
    }

    /// A 2 MiB frame given back stays populated for the next unit read or decode only
    /// while the stash has room (none until it grows): eviction and first touch never
    /// get it; a fill takes it with its stale bytes; emptied, it is zapped.
    #[test]
    fn warm_units_serve_fills_only() {
        let f = Frames::with_warm(64 << 20, 0, 2).expect("arenas");
        assert_eq!(default_warm_huge_capacity(65536), 8, "one per 32 MiB");
        assert_eq!(default_warm_huge_capacity(1 << 20), 16, "16 at most");
        assert_eq!(default_warm_huge_capacity(4096), 0, "none under 32 MiB");
        let z = Zapper::new();
        let pages =
            |h: usize| -> Vec<usize> { (0..UNIT_PAGES).map(|i| h + i * PAGE_SIZE).collect() };
        let fill_with = |h: usize, v: u8| f.span_mut(h, UNIT_SIZE).fill(v);
        // No room in the stash yet: a frame given back is zapped and goes back.
        let a = f.alloc_huge(Site::Evict).expect("a frame");
        fill_with(a, 0x5a);
        f.free(&z, &pages(a));
        assert!(f.span(a, UNIT_SIZE).iter().all(|&b| b == 0), "zapped");
        assert_eq!(f.huge.map().free, f.huge.frames);
        // A fill finds none warm: a miss, an empty frame.
        let b = f.alloc_huge_to_fill(Site::UnitRead).expect("a frame");
        assert_eq!(f.huge_fill_misses.load(Relaxed), 1);
        assert!(!f.grow_warm_huge(|| false), "no charge, no room");
        assert!(f.grow_warm_huge(|| true) && f.grow_warm_huge(|| true));
        assert!(!f.grow_warm_huge(|| true), "at most warm_huge_max");
        // Given back page by page, it stays warm with its last page, still used.
        fill_with(b, 0xa5);
        let bp = pages(b);
        f.free(&z, &bp[..100]);
        f.free(&z, &bp[100..]);
        assert_eq!(f.warm_huge_list().len(), 1);
        assert_eq!(f.in_use_by_site(), "4 KiB frames: [], 2 MiB frames: []");
        // Eviction and first touch never get it: every other frame first, then none.
        let mut others = Vec::new();
        while let Some(h) = f.alloc_huge(Site::Evict) {
            assert_ne!(h, b, "a warm frame handed out as a MOVE destination");
            others.push(h);
        }
        assert_eq!(others.len(), f.huge.frames - 1);
        // A fill gets it back, stale bytes and all (to be overwritten whole).
        assert_eq!(f.alloc_huge_to_fill(Site::Compressed), Some(b));
        assert!(f.span(b, UNIT_SIZE).iter().all(|&x| x == 0xa5));
        assert_eq!(f.huge_recycled(), 1);
        // Given back twice: counted, not kept twice.
        f.free(&z, &bp);
        f.free(&z, &bp[..1]);
        f.free_moved_huge(b);
        assert_eq!(f.double_frees.load(Relaxed), 2);
        assert_eq!(f.warm_huge_list().len(), 1);
        // A frame some of whose pages were moved out one by one (split) is not kept.
        let sp = pages(others[2]);
        fill_with(others[2], 0x33);
        f.free_moved_from_huge(&z, &sp[..3]);
        f.free(&z, &sp[3..]);
        assert_eq!(f.warm_huge_list().len(), 1, "a split frame kept warm");
        assert!(
            f.span(others[2], UNIT_SIZE).iter().all(|&x| x == 0),
            "zapped"
        );
        // A second one fills the stash; a third past its room is zapped.
        for &h in &others[..2] {
            fill_with(h, 0x77);
            f.free(&z, &pages(h));
        }
        assert_eq!(f.warm_huge_list().len(), 2);
        assert!(
            f.span(others[1], UNIT_SIZE).iter().all(|&x| x == 0),
            "past its room"
        );
        // Emptied: zapped and free, and allowed none.
        let mut released = 0;
        assert_eq!(f.shrink_warm_huge(&z, |n| released = n), 2);
        assert_eq!(released, 2);
        assert!(f.warm_huge_list().is_empty());
        assert!(f.span(b, UNIT_SIZE).iter().all(|&x| x == 0));
        assert!(f.span(others[0], UNIT_SIZE).iter().all(|&x| x == 0));
        assert_eq!(
            f.huge.map().free,
            4,
            "b, the split one and the two given back"
        );
        let h = f.alloc_huge(Site::Evict).expect("a frame");
        f.free(&z, &pages(h));
        assert!(f.warm_huge_list().is_empty(), "no room once emptied");
    }
}
