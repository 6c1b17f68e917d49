//! A region's page map: the state of every 4 KiB page (the kernel's page table plus
//! swap entries), kept per 2 MiB unit behind that unit's lock.
//!
//! The region is an anonymous private mapping registered MISSING + WP: what the
//! program touches. A page that is not mapped there is untouched (zeros), swapped
//! (its slot says where its bytes are: a tier, and maybe also a swap-cache frame,
//! see `swap_cache`), or poisoned (its bytes were lost).
//!
//! Lock order: a unit's lock, then a swap-cache shard, then the slot allocator.
//! Every change of a page's state, and every ioctl that maps or unmaps it, happens
//! under its unit's lock.

use crate::readahead::{AdaptiveCap, VmaReadahead};
use crate::slots::Slot;
use crate::stats::EventCounters;
use crate::{PAGE_SIZE, UNIT_PAGES};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// State of one page, packed in a u64: kind in bits 0..2, dirty in bit 3, slot + 1
/// in bits 16..64 (0 = no slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Never written (or clean zeros given back): first touch costs no I/O.
    Untouched,
    /// Mapped in the region. `slot`: a copy on the backend — valid when clean, stale
    /// (kept only under `StaleSlotPolicy::KeepUntilReclaim`) when dirty.
    Resident {
        /// Written since it was mapped (write protection was lifted).
        dirty: bool,
        /// Backend copy, if any.
        slot: Option<Slot>,
    },
    /// Not mapped; the data is in `slot`, and maybe also in the swap cache.
    Swapped(Slot),
    /// The backend lost this page (read error): access raises SIGBUS.
    Poisoned,
}

const KIND_MASK: u64 = 0b111;
const DIRTY: u64 = 1 << 3;

impl PageState {
    /// Pack into a word.
    pub fn pack(self) -> u64 {
        let slot_bits = |s: Option<Slot>| s.map_or(0, |s| (s + 1) << 16);
        match self {
            PageState::Untouched => 0,
            PageState::Resident { dirty, slot } => {
                1 | if dirty { DIRTY } else { 0 } | slot_bits(slot)
            }
            PageState::Swapped(s) => 2 | slot_bits(Some(s)),
            PageState::Poisoned => 3,
        }
    }

    /// Unpack a word written by [`PageState::pack`].
    pub fn unpack(w: u64) -> PageState {
        let slot = match w >> 16 {
            0 => None,
            s => Some(s - 1),
        };
        match w & KIND_MASK {
            0 => PageState::Untouched,
            1 => PageState::Resident {
                dirty: w & DIRTY != 0,
                slot,
            },
            2 => PageState::Swapped(slot.unwrap_or(0)),
            _ => PageState::Poisoned,
        }
    }
}

/// The pages of one 2 MiB unit; guarded by the unit's mutex.
pub struct UnitPages {
    /// Packed [`PageState`] of each page.
    words: Box<[u64; UNIT_PAGES]>,
    /// Pages of this unit mapped in the region.
    pub resident: u32,
    /// Requests in flight of a whole-unit read (2 MiB swap-in); 0 when none.
    pub unit_reads: u32,
    /// Read ahead whole (unit readahead) and not yet faulted on: the first fault
    /// counts it as a readahead hit.
    pub prefetched: bool,
    /// Mapped whole and clean with UFFDIO_MOVE, then write-protected: a thread that
    /// wrote in between went unseen, so a clean eviction checks the pages against
    /// their checksums before it trusts their slots.
    pub clean_by_move: bool,
    /// Resident pages that no tier took at their last eviction (they compress poorly
    /// and no tier is behind the compressed pool): reclaim passes over them, and tries
    /// them again after `kept_interval` evictions of the unit (their bytes may have
    /// changed unseen: a dirty page is not write-protected), twice as many each time
    /// they are refused again. A page loses its mark when it stops being resident.
    kept: [u64; UNIT_PAGES / 64],
    /// Evictions of the unit that passed over kept pages since they were last tried.
    kept_passes: u8,
    /// Evictions between tries (`KEPT_RETRY_MIN` up to `KEPT_RETRY_MAX`).
    kept_interval: u8,
    /// Resident pages the program locked (mlock): reclaim never picks them, and they
    /// are counted in the budget's locked gauge instead of the resident one. Whoever
    /// makes a locked page stop being resident releases its lock first
    /// ([`crate::lock::release`]).
    locked: [u64; UNIT_PAGES / 64],
}

/// See `UnitPages::kept`.
const KEPT_RETRY_MIN: u8 = 8;
const KEPT_RETRY_MAX: u8 = 128;

impl UnitPages {
    /// State of page `i` (0..512) of the unit.
    pub fn get(&self, i: usize) -> PageState {
        PageState::unpack(self.words[i])
    }
    /// Set the state of page `i`.
    pub fn set(&mut self, i: usize, s: PageState) {
        let stays_resident = matches!(s, PageState::Resident { .. })
            && matches!(self.get(i), PageState::Resident { .. });
        if !stays_resident {
            self.kept[i / 64] &= !(1 << (i % 64));
        }
        self.words[i] = s.pack();
    }
    /// Mark resident page `i` as one no tier takes (see `kept`).
    pub(crate) fn keep(&mut self, i: usize) {
        self.kept[i / 64] |= 1 << (i % 64);
    }
    /// Take page `i`'s mark off: a refused store left it swapped, not resident.
    pub(crate) fn unkeep(&mut self, i: usize) {
        self.kept[i / 64] &= !(1 << (i % 64));
    }
    /// Whether page `i` is locked (see `locked`).
    pub(crate) fn is_locked(&self, i: usize) -> bool {
        self.locked[i / 64] & (1 << (i % 64)) != 0
    }
    /// Mark page `i` locked or not; returns whether that changed anything.
    pub(crate) fn set_locked(&mut self, i: usize, on: bool) -> bool {
        let was = self.is_locked(i);
        if on {
            self.locked[i / 64] |= 1 << (i % 64);
        } else {
            self.locked[i / 64] &= !(1 << (i % 64));
        }
        was != on
    }
    /// Whether reclaim passes over page `i` now.
    pub(crate) fn is_kept(&self, i: usize) -> bool {
        self.kept[i / 64] & (1 << (i % 64)) != 0
    }
    /// An eviction of the unit begins: once every `kept_interval`, kept pages are
    /// tried again (their marks go).
    pub(crate) fn eviction_starts(&mut self) {
        if self.kept.iter().all(|&w| w == 0) {
            self.kept_interval = KEPT_RETRY_MIN;
            self.kept_passes = 0;
            return;
        }
        self.kept_passes += 1;
        if self.kept_passes >= self.kept_interval {
            self.kept = [0; UNIT_PAGES / 64];
            self.kept_passes = 0;
            self.kept_interval = self.kept_interval.saturating_mul(2).min(KEPT_RETRY_MAX);
        }
    }
}

/// One 2 MiB unit: its lock and its reclaim hints.
pub struct Unit {
    pages: Mutex<UnitPages>,
    /// A fault hit this unit since reclaim last looked (the second-chance bit; no
    /// accessed bits are readable from user space).
    pub referenced: AtomicBool,
    /// The unit is on the reclaim list.
    pub on_lru: AtomicBool,
    /// Thread holding the lock now (0: none); for diagnostics of lock leaks.
    pub holder: std::sync::atomic::AtomicU64,
}

impl Unit {
    fn new() -> Unit {
        Unit {
            pages: Mutex::new(UnitPages {
                words: Box::new([0; UNIT_PAGES]),
                resident: 0,
                unit_reads: 0,
                prefetched: false,
                clean_by_move: false,
                kept: [0; UNIT_PAGES / 64],
                kept_passes: 0,
                kept_interval: KEPT_RETRY_MIN,
                locked: [0; UNIT_PAGES / 64],
            }),
            referenced: AtomicBool::new(false),
            on_lru: AtomicBool::new(false),
            holder: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Lock the unit's pages.
    pub fn lock(&self) -> UnitGuard<'_> {
        let g = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        self.holder
            .store(tid(), std::sync::atomic::Ordering::Relaxed);
        UnitGuard { g, unit: self }
    }

    /// Lock the unit's pages if nobody holds them.
    pub fn try_lock(&self) -> Option<UnitGuard<'_>> {
        let g = match self.pages.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        self.holder
            .store(tid(), std::sync::atomic::Ordering::Relaxed);
        Some(UnitGuard { g, unit: self })
    }
}

fn tid() -> u64 {
    crate::sys::mem::gettid()
}

/// A locked unit (records its holder, for diagnostics).
pub struct UnitGuard<'a> {
    g: MutexGuard<'a, UnitPages>,
    unit: &'a Unit,
}

impl Drop for UnitGuard<'_> {
    fn drop(&mut self) {
        self.unit
            .holder
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::ops::Deref for UnitGuard<'_> {
    type Target = UnitPages;
    fn deref(&self) -> &UnitPages {
        &self.g
    }
}

impl std::ops::DerefMut for UnitGuard<'_> {
    fn deref_mut(&mut self) -> &mut UnitPages {
        &mut self.g
    }
}

/// Per-region policies resolved from the pool's defaults.
#[derive(Debug, Clone, Copy)]
pub struct RegionPolicy {
    /// Swap unit.
    pub unit: crate::UnitPolicy,
    /// Readahead policy.
    pub readahead: crate::ReadaheadPolicy,
}

/// A region's readahead: the kernel's window state and, beyond the kernel, the cap
/// that a confirmed stream raises.
#[derive(Debug)]
pub struct RaState {
    /// Window rule state.
    pub vma: VmaReadahead,
    /// Stream cap (used when `PoolBuilder::readahead_stream` is on).
    pub cap: AdaptiveCap,
}

/// First-touch fault-around state: sequential first writes map whole runs of zero
/// pages at once, like readahead does for swapped pages.
#[derive(Debug, Default)]
pub struct ZeroAhead {
    /// Last first-touch fault page.
    pub last: u64,
    /// Current window in pages.
    pub win: u32,
}

/// A region's shared state.
pub struct RegionInner {
    /// The userfaultfd the region is registered with: the pool's, or its in-thread
    /// one (faults raise SIGBUS in the faulting thread, see `fault/in_thread.rs`).
    pub(crate) uffd: std::sync::Arc<crate::sys::uffd::Uffd>,
    /// Faults are served in the faulting thread.
    pub in_thread: bool,
    /// Id, unique in the pool.
    pub id: u32,
    /// Start of the region mapping (2 MiB aligned).
    pub base: usize,
    /// Length in bytes (a multiple of 2 MiB).
    pub len: usize,
    /// Policies.
    pub policy: RegionPolicy,
    /// The units.
    pub units: Box<[Unit]>,
    /// VMA readahead state (seed 004), per region.
    pub ra: Mutex<RaState>,
    /// First-touch fault-around state.
    pub zero_ahead: Mutex<ZeroAhead>,
    /// Counters of this region.
    pub counters: EventCounters,
    /// Set when the region is being dropped: completions must not touch its memory.
    pub dead: AtomicBool,
    /// Bytes of metadata charged to the budget for this region.
    pub metadata_bytes: u64,
    /// The unit last swapped in whole (the direction of a stream through whole units).
    pub last_whole_unit: std::sync::atomic::AtomicU64,
    /// Whether whole units pay here (`UnitPolicy::Auto`'s evidence, from faults).
    pub(crate) unit_trend: crate::unit::UnitTrend,
    /// Whether pages swapped in by reads are written next (`fault::WriteTrend`).
    pub(crate) write_trend: crate::fault::WriteTrend,
    /// The page after the last one mapped from the swap cache: a hit there is a
    /// stream, which fault-around serves (`fault/swapin.rs`).
    pub cache_hit_next: std::sync::atomic::AtomicU64,
    /// Fault-around's window: doubles with each hit of a stream, 0 after a random hit.
    pub around_win: std::sync::atomic::AtomicU32,
}

impl RegionInner {
    /// Build the page map for a mapping.
    pub(crate) fn new(
        uffd: std::sync::Arc<crate::sys::uffd::Uffd>,
        in_thread: bool,
        id: u32,
        base: usize,
        len: usize,
        policy: RegionPolicy,
        ra_base: u32,
    ) -> RegionInner {
        let nunits = len / crate::UNIT_SIZE;
        let units: Box<[Unit]> = (0..nunits).map(|_| Unit::new()).collect();
        let metadata_bytes = (nunits * (std::mem::size_of::<Unit>() + 8 * UNIT_PAGES)) as u64;
        RegionInner {
            uffd,
            in_thread,
            id,
            base,
            len,
            policy,
            units,
            ra: Mutex::new(RaState {
                vma: VmaReadahead::default(),
                cap: AdaptiveCap::new(ra_base, UNIT_PAGES as u32),
            }),
            zero_ahead: Mutex::new(ZeroAhead::default()),
            counters: EventCounters::default(),
            dead: AtomicBool::new(false),
            metadata_bytes,
            last_whole_unit: std::sync::atomic::AtomicU64::new(u64::MAX),
            unit_trend: Default::default(),
            write_trend: Default::default(),
            cache_hit_next: std::sync::atomic::AtomicU64::new(u64::MAX),
            around_win: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Pages in the region.
    pub fn pages(&self) -> u64 {
        (self.len / PAGE_SIZE) as u64
    }

    /// Whether `addr` is inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.len
    }

    /// Region address of page `p`.
    pub fn page_addr(&self, p: u64) -> usize {
        self.base + p as usize * PAGE_SIZE
    }

    /// The unit holding page `p`.
    pub fn unit_of(&self, p: u64) -> &Unit {
        &self.units[p as usize / UNIT_PAGES]
    }

    /// Whether the region is being dropped.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_roundtrip() {
        for s in [
            PageState::Untouched,
            PageState::Resident {
                dirty: false,
                slot: None,
            },
            PageState::Resident {
                dirty: true,
                slot: Some(0),
            },
            PageState::Resident {
                dirty: false,
                slot: Some(123456789),
            },
            PageState::Swapped(0),
            PageState::Swapped(1 << 40),
            PageState::Poisoned,
        ] {
            assert_eq!(PageState::unpack(s.pack()), s);
        }
    }

    fn unit_with_kept_page() -> UnitPages {
        let mut u = Unit::new().pages.into_inner().unwrap();
        let resident = PageState::Resident {
            dirty: true,
            slot: None,
        };
        u.set(3, resident);
        u.keep(3);
        u.set(3, resident); // put back after a refused store: still kept
        u
    }

    #[test]
    fn kept_pages_are_retried_ever_less_often_up_to_the_cap() {
        let mut u = unit_with_kept_page();
        // Retried after 8, 16, 32, 64, 128, then every 128 evictions (no overflow).
        for interval in [8u32, 16, 32, 64, 128, 128, 128] {
            for _ in 1..interval {
                u.eviction_starts();
                assert!(u.is_kept(3), "retried before {interval} evictions");
            }
            u.eviction_starts();
            assert!(!u.is_kept(3), "not retried after {interval} evictions");
            u.keep(3); // refused again
        }
    }

    #[test]
    fn a_page_that_stops_being_resident_loses_its_mark() {
        let mut u = unit_with_kept_page();
        u.set(3, PageState::Swapped(7));
        assert!(!u.is_kept(3));
        u.set(
            3,
            PageState::Resident {
                dirty: true,
                slot: None,
            },
        );
        assert!(!u.is_kept(3), "a page faulted back in starts unmarked");
    }
}
