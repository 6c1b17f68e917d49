//! [`Zpool`]: the compressed store — settings, pages, loads, frees, stats, compaction.
//! Units are in `unit.rs`.
//!
//! Every stored object's payload (after the allocator's back-pointer) is
//!
//! ```text
//! [checksum: u32 LE][length | RAW: u16 LE][stored bytes: length]
//! ```
//!
//! where the stored bytes are the compressed data (or, for a unit chunk that does not
//! compress and a page stored with [`Zpool::store_page_raw`], the raw data, with the RAW
//! bit set), and the checksum is over them.

use crate::checksum::checksum;
use crate::compressor::Compressor;
use crate::error::{ConfigError, Error, Reject};
use crate::handle::{Entry, Handle};
use crate::records::{Record, Records};
use crate::same_filled::{fill, same_filled};
use crate::stats::{Counters, ZpoolStats};
use crate::unit::UnitScratch;
use crate::zsmalloc::{ObjPool, ObjRef};
use crate::PAGE_SIZE;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Bytes of the store's header in each object: checksum (4) and length (2).
pub(crate) const STORE_HEADER: usize = 6;
/// Length bit that marks stored bytes as raw (not compressed).
const RAW: u16 = 1 << 15;

/// The default accept threshold: store only what compresses to at most 80% of its size.
/// A page at 80% still saves ~15% after slot rounding and metadata; above that the
/// next tier is the better place.
pub const DEFAULT_MAX_COMPRESSED_PERCENT: u32 = 80;

/// Settings of a [`Zpool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// lz4 (default) or zstd at a level.
    pub compressor: Compressor,
    /// Store a page or unit only if it compresses to at most this percentage of its
    /// size (1..=100); else [`Reject::PoorCompression`]. Default
    /// [`DEFAULT_MAX_COMPRESSED_PERCENT`]. Changeable with
    /// [`Zpool::set_max_compressed_percent`].
    pub max_compressed_percent: u32,
    /// Byte limit for `pool_bytes + metadata_bytes`; a store that would need more
    /// memory is refused with [`Reject::PoolFull`]. Default: none (`u64::MAX`).
    /// Changeable with [`Zpool::set_limit`].
    pub limit_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            compressor: Compressor::Lz4,
            max_compressed_percent: DEFAULT_MAX_COMPRESSED_PERCENT,
            limit_bytes: u64::MAX,
        }
    }
}

fn check_percent(p: u32) -> Result<(), ConfigError> {
    if (1..=100).contains(&p) {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "max_compressed_percent {p} is outside 1..=100"
        )))
    }
}

// The engine's threads share one pool.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Zpool>();
};

/// A pool of compressed pages and units in RAM. `Sync`: share it (`Arc`) between the
/// threads that store, load, free and compact.
pub struct Zpool {
    pub(crate) compressor: Compressor,
    max_percent: AtomicU32,
    pub(crate) objects: ObjPool,
    pub(crate) records: Records,
    /// Scratch buffers for compressing units, reused (one per unit store in flight);
    /// counted in the metadata.
    pub(crate) unit_scratch: Mutex<Vec<UnitScratch>>,
    pub(crate) counters: Counters,
}

thread_local! {
    /// Where a page is compressed before it is copied into its object (per thread:
    /// ~4 KiB, allocated on a thread's first store).
    static PAGE_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Zpool {
    /// A pool with these settings. It holds no backing memory until the first store.
    pub fn new(config: Config) -> Result<Zpool, ConfigError> {
        config.compressor.check().map_err(ConfigError)?;
        check_percent(config.max_compressed_percent)?;
        let objects = ObjPool::new(config.limit_bytes);
        let records = Records::new(&objects.meta);
        Ok(Zpool {
            compressor: config.compressor,
            max_percent: AtomicU32::new(config.max_compressed_percent),
            objects,
            records,
            unit_scratch: Mutex::new(Vec::new()),
            counters: Counters::default(),
        })
    }

    /// The compressor chosen at construction.
    pub fn compressor(&self) -> Compressor {
        self.compressor
    }

    /// Set the byte limit for `pool_bytes + metadata_bytes` (takes effect for the next
    /// store; memory already held stays held).
    pub fn set_limit(&self, bytes: u64) {
        self.objects.arena.set_limit_bytes(bytes);
    }

    /// The byte limit.
    pub fn limit(&self) -> u64 {
        self.objects.arena.limit_bytes()
    }

    /// Set the accept threshold (1..=100 percent).
    pub fn set_max_compressed_percent(&self, percent: u32) -> Result<(), ConfigError> {
        check_percent(percent)?;
        self.max_percent.store(percent, Ordering::Relaxed);
        Ok(())
    }

    /// The accept threshold in percent.
    pub fn max_compressed_percent(&self) -> u32 {
        self.max_percent.load(Ordering::Relaxed)
    }

    /// Most bytes `len` bytes may take stored.
    pub fn max_stored(&self, len: usize) -> usize {
        len * self.max_compressed_percent() as usize / 100
    }

    /// Bytes of backing memory held now: the zspages, every page of them resident.
    pub fn pool_bytes(&self) -> u64 {
        self.objects.held_bytes()
    }

    /// Heap bytes of the pool's bookkeeping held now (see [`ZpoolStats::metadata_bytes`]).
    pub fn metadata_bytes(&self) -> u64 {
        self.objects.metadata_bytes()
    }

    /// `pool_bytes + metadata_bytes`: what the pool costs, to charge to a budget.
    pub fn total_bytes(&self) -> u64 {
        self.pool_bytes() + self.metadata_bytes()
    }

    /// Uncompressed bytes stored now.
    pub fn stored_bytes(&self) -> u64 {
        self.counters.stored_bytes.load(Ordering::Relaxed)
    }

    /// Bytes the stored data takes compressed (object headers and slot rounding
    /// excluded; same-filled data takes 0).
    pub fn compressed_bytes(&self) -> u64 {
        self.counters.compressed_bytes.load(Ordering::Relaxed)
    }

    /// All counters and gauges.
    pub fn stats(&self) -> ZpoolStats {
        let mut s = self.counters.snapshot();
        let g = self.objects.gauges();
        s.pool_bytes = self.pool_bytes();
        s.metadata_bytes = self.metadata_bytes();
        s.limit_bytes = self.limit();
        s.objects = g.objects;
        s.object_bytes = g.object_bytes;
        s.zspages = g.zspages;
        s.fragmented_bytes = s.pool_bytes.saturating_sub(g.object_bytes);
        s.compactable_bytes = g.compactable_bytes;
        s
    }

    /// Whether the pool is under its limit now (else a store is refused before any
    /// work is done on it).
    pub(crate) fn under_limit(&self) -> bool {
        self.total_bytes() < self.limit()
    }

    pub(crate) fn reject(&self, why: Reject) -> Reject {
        let c = match why {
            Reject::PoorCompression => &self.counters.reject_poor_compression,
            Reject::PoolFull => &self.counters.reject_pool_full,
        };
        Counters::add(c, 1);
        why
    }

    /// Store one 4 KiB page. Same-filled pages take no memory; others are compressed
    /// into one object. Refused if it compresses over the threshold or the pool is
    /// full.
    pub fn store_page(&self, page: &[u8; PAGE_SIZE]) -> Result<Handle, Reject> {
        if let Some(pattern) = same_filled(page) {
            return self.store_same_filled(false, pattern);
        }
        if !self.under_limit() {
            return Err(self.reject(Reject::PoolFull));
        }
        let max = self.max_stored(PAGE_SIZE);
        let obj = PAGE_SCRATCH.with_borrow_mut(|scratch| {
            let room = self.compressor.max_output(PAGE_SIZE);
            if scratch.len() < room {
                scratch.resize(room, 0);
            }
            let n = match self.compressor.compress(page, scratch) {
                Some(n) if n <= max => n,
                _ => return Err(self.reject(Reject::PoorCompression)),
            };
            self.store_object(&scratch[..n], false)
                .map_err(|r| self.reject(r))
        })?;
        self.count_stored(false, false);
        Ok(Handle::object(obj))
    }

    /// Store one 4 KiB page as it is, uncompressed (one object: the page behind its
    /// header, checksummed like any): for a page that [`Zpool::store_page`] refused as
    /// compressing poorly, where a copy in RAM beats one on a slower tier (zswap keeps
    /// such pages so since Linux 6.18). Counted in `incompressible_pages` while stored.
    /// Refused only when the pool is full.
    pub fn store_page_raw(&self, page: &[u8; PAGE_SIZE]) -> Result<Handle, Reject> {
        if let Some(pattern) = same_filled(page) {
            return self.store_same_filled(false, pattern);
        }
        if !self.under_limit() {
            return Err(self.reject(Reject::PoolFull));
        }
        let obj = self.store_object(page, true).map_err(|r| self.reject(r))?;
        Counters::add(&self.counters.incompressible_pages, 1);
        self.count_stored(false, false);
        Ok(Handle::object(obj))
    }

    /// Store a same-filled page or unit: in the handle when the word allows, else as a
    /// small record.
    pub(crate) fn store_same_filled(&self, unit: bool, pattern: u64) -> Result<Handle, Reject> {
        let handle = match Handle::same_filled(unit, pattern) {
            Some(h) => h,
            None => {
                if !self.under_limit() {
                    return Err(self.reject(Reject::PoolFull));
                }
                self.records
                    .insert(&self.objects.meta, unit, Record::SameFilled(pattern))
                    .ok_or_else(|| self.reject(Reject::PoolFull))?
            }
        };
        self.count_stored(unit, true);
        Ok(handle)
    }

    /// Count a stored entry (a unit or a page; same-filled or not).
    pub(crate) fn count_stored(&self, unit: bool, same: bool) {
        let c = &self.counters;
        let (entries, same_entries, bytes) = if unit {
            (&c.stored_units, &c.same_filled_units, crate::UNIT_SIZE)
        } else {
            (&c.stored_pages, &c.same_filled_pages, PAGE_SIZE)
        };
        Counters::add(entries, 1);
        if same {
            Counters::add(same_entries, 1);
        }
        Counters::add(&c.stored_bytes, bytes as u64);
        Counters::add(&c.stores, 1);
    }

    /// Count a freed entry.
    fn count_freed(&self, unit: bool, same: bool) {
        let c = &self.counters;
        let (entries, same_entries, bytes) = if unit {
            (&c.stored_units, &c.same_filled_units, crate::UNIT_SIZE)
        } else {
            (&c.stored_pages, &c.same_filled_pages, PAGE_SIZE)
        };
        Counters::sub(entries, 1);
        if same {
            Counters::sub(same_entries, 1);
        }
        Counters::sub(&c.stored_bytes, bytes as u64);
        Counters::add(&c.frees, 1);
    }

    /// Copy the data of `handle` into `out` (4096 bytes for a page, 2 MiB for a unit),
    /// decompressing straight into it. The entry stays stored. Allocates nothing.
    pub fn load(&self, handle: Handle, out: &mut [u8]) -> Result<(), Error> {
        if out.len() != handle.data_len() {
            return Err(Error::WrongLength {
                handle,
                expected: handle.data_len(),
                got: out.len(),
            });
        }
        match handle.entry() {
            Entry::Object(obj) => self.load_object(handle, obj, out)?,
            Entry::SameFilled { pattern, .. } => fill(out, pattern),
            Entry::Record {
                unit,
                shard,
                idx,
                gen,
            } => match self.records.get(shard, idx, gen) {
                Some(Record::SameFilled(pattern)) => fill(out, pattern),
                Some(Record::Unit(chunks)) if unit => self.load_unit(handle, &chunks, out)?,
                _ => return Err(Error::InvalidHandle(handle)),
            },
        }
        Counters::add(&self.counters.loads, 1);
        Ok(())
    }

    /// Decode object `obj` (of entry `handle`) into all of `out`.
    pub(crate) fn load_object(
        &self,
        handle: Handle,
        obj: ObjRef,
        out: &mut [u8],
    ) -> Result<(), Error> {
        match self.objects.read(obj, |payload| self.decode(payload, out)) {
            None => Err(Error::InvalidHandle(handle)),
            Some(false) => {
                Counters::add(&self.counters.corrupt_loads, 1);
                Err(Error::Corrupt(handle))
            }
            Some(true) => Ok(()),
        }
    }

    /// Check and decode a payload into all of `out`; `false` if it is damaged.
    pub(crate) fn decode(&self, payload: &[u8], out: &mut [u8]) -> bool {
        let Some((sum, len, raw)) = read_header(payload) else {
            return false;
        };
        let Some(data) = payload.get(STORE_HEADER..STORE_HEADER + len) else {
            return false;
        };
        if checksum(data) != sum {
            return false;
        }
        if raw {
            if data.len() != out.len() {
                return false;
            }
            out.copy_from_slice(data);
            true
        } else {
            self.compressor.decompress(data, out)
        }
    }

    /// Free the entry of `handle` (which may not be used again). Freeing an inline
    /// same-filled handle only updates the counters: it holds nothing (and so cannot
    /// tell a second free from the first).
    pub fn free(&self, handle: Handle) -> Result<(), Error> {
        match handle.entry() {
            Entry::Object(obj) => {
                let raw = self.free_object(obj).ok_or(Error::InvalidHandle(handle))?;
                if raw {
                    Counters::sub(&self.counters.incompressible_pages, 1);
                }
                self.count_freed(false, false);
            }
            Entry::SameFilled { unit, .. } => self.count_freed(unit, true),
            Entry::Record {
                unit,
                shard,
                idx,
                gen,
            } => {
                // A handle of the wrong kind for its record is refused, the record kept.
                let record = self
                    .records
                    .remove_if(&self.objects.meta, shard, idx, gen, |r| {
                        unit || matches!(r, Record::SameFilled(_))
                    })
                    .ok_or(Error::InvalidHandle(handle))?;
                self.objects.meta.sub(record.heap_bytes());
                match record {
                    Record::SameFilled(_) => self.count_freed(unit, true),
                    Record::Unit(chunks) => {
                        self.free_unit_chunks(&chunks);
                        self.count_freed(true, false);
                    }
                }
            }
        }
        Ok(())
    }

    /// Store `data` (compressed bytes, or raw) as one object behind its header; counts
    /// it in `compressed_bytes`. The refusal is the caller's to count.
    pub(crate) fn store_object(&self, data: &[u8], raw: bool) -> Result<ObjRef, Reject> {
        // Checksummed before the class lock is taken: the lock covers only the copy.
        let header = header(data, raw);
        let obj = self
            .objects
            .alloc(STORE_HEADER + data.len(), |dst| {
                dst[..STORE_HEADER].copy_from_slice(&header);
                dst[STORE_HEADER..STORE_HEADER + data.len()].copy_from_slice(data);
            })
            .map_err(|_| Reject::PoolFull)?;
        Counters::add(&self.counters.compressed_bytes, data.len() as u64);
        Ok(obj)
    }

    /// Free one object, taking its stored bytes off `compressed_bytes`; whether it
    /// was stored raw.
    pub(crate) fn free_object(&self, obj: ObjRef) -> Option<bool> {
        let (len, raw) = self.objects.free(obj, |payload| {
            read_header(payload).map_or((0, false), |(_, len, raw)| (len, raw))
        })?;
        Counters::sub(&self.counters.compressed_bytes, len as u64);
        Some(raw)
    }

    /// Move objects out of sparse zspages into fuller ones and give the emptied
    /// zspages back to the kernel; the bytes freed. Safe to call from any thread while
    /// others store, load and free: each class is locked for one zspage's worth of
    /// moves at a time. Handles stay valid.
    pub fn compact(&self) -> u64 {
        let pages = self.objects.compact();
        Counters::add(&self.counters.compactions, 1);
        Counters::add(&self.counters.compacted_pages, pages);
        pages * PAGE_SIZE as u64
    }
}

/// The store header of `data`.
fn header(data: &[u8], raw: bool) -> [u8; STORE_HEADER] {
    debug_assert!(data.len() < RAW as usize);
    let len = data.len() as u16 | if raw { RAW } else { 0 };
    let mut h = [0u8; STORE_HEADER];
    h[..4].copy_from_slice(&checksum(data).to_le_bytes());
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

/// The length of the stored bytes behind a payload's header.
pub(crate) fn stored_len(payload: &[u8]) -> Option<usize> {
    read_header(payload).map(|(_, len, _)| len)
}

/// (checksum, length, raw) from a payload's header.
fn read_header(payload: &[u8]) -> Option<(u32, usize, bool)> {
    let sum = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?);
    let len = u16::from_le_bytes(payload.get(4..6)?.try_into().ok()?);
    Some((sum, (len & !RAW) as usize, len & RAW != 0))
}
