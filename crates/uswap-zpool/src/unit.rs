//! Whole 2 MiB units: stored as ONE entry (one accept decision, one handle), kept as
//! independent chunks so that no object is larger than 16 KiB.
//!
//! A unit is cut into [`UNIT_CHUNK`]-byte chunks (128 of them, and a 2 KiB tail).
//! Each chunk is same-filled (kept as its word), compressed, or — if compressing does
//! not make it smaller — stored raw. The unit is accepted if the chunks together take
//! at most the threshold share of 2 MiB; it is then one record listing its chunks.
//! A load decompresses every chunk straight into its place in the caller's 2 MiB
//! buffer (the engine's THP), with no copy and no allocation.
//!
//! Why 16 KiB − 16 bytes and not 16 KiB: a raw chunk then fits, with the allocator's
//! back-pointer and the store header (10 bytes), in a 16 KiB slot, four pages exactly;
//! a chunk of 16 KiB would need a 16,400-byte slot, and zspages of those waste 8–25%.
//! Chunks of 16 KiB compress within a few percent of whole 64 KiB blocks with lz4 and
//! keep every object within one size-class range.

use crate::error::{Error, Reject};
use crate::handle::{Entry, Handle};
use crate::pool::{Zpool, STORE_HEADER};
use crate::records::{Chunk, Record};
use crate::same_filled::{fill, same_filled};
use crate::stats::Counters;
#[cfg(test)]
use crate::zsmalloc::ObjRef;
use crate::zsmalloc::MAX_PAYLOAD;
use crate::UNIT_SIZE;
use std::sync::Arc;

thread_local! {
    /// One decoded chunk (`Zpool::load_part`).
    static CHUNK_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Bytes of each chunk of a unit (the last one is shorter).
pub const UNIT_CHUNK: usize = 16 * 1024 - 16;
/// Chunks in a unit.
pub(crate) const UNIT_CHUNKS: usize = UNIT_SIZE.div_ceil(UNIT_CHUNK);

const _: () = assert!(STORE_HEADER + UNIT_CHUNK <= MAX_PAYLOAD);
const _: () = assert!(
    UNIT_CHUNK.is_multiple_of(8),
    "chunks are checked word by word"
);

/// Scratch buffers kept for later unit stores (more are made while more threads store
/// units at once, and freed after).
const KEPT_UNIT_SCRATCH: usize = 2;

/// How one chunk will be stored, decided before anything is allocated.
#[derive(Debug, Clone, Copy)]
enum Plan {
    SameFilled(u64),
    /// Compressed into the scratch buffer at `at`, `len` bytes.
    Compressed {
        at: usize,
        len: usize,
    },
    /// Stored as it is.
    Raw,
}

/// Reusable buffers of one unit store.
pub(crate) struct UnitScratch {
    /// The compressed chunks, back to back.
    buf: Box<[u8]>,
    plan: Vec<Plan>,
    chunks: Vec<Chunk>,
}

impl UnitScratch {
    fn new(zpool: &Zpool) -> UnitScratch {
        let room = UNIT_SIZE + zpool.compressor.max_output(UNIT_CHUNK);
        UnitScratch {
            buf: vec![0; room].into_boxed_slice(),
            plan: Vec::with_capacity(UNIT_CHUNKS),
            chunks: Vec::with_capacity(UNIT_CHUNKS),
        }
    }

    /// Heap bytes of a new one.
    fn bytes_for(zpool: &Zpool) -> u64 {
        (UNIT_SIZE
            + zpool.compressor.max_output(UNIT_CHUNK)
            + UNIT_CHUNKS * (std::mem::size_of::<Plan>() + std::mem::size_of::<Chunk>()))
            as u64
    }

    fn heap_bytes(&self) -> u64 {
        (self.buf.len()
            + self.plan.capacity() * std::mem::size_of::<Plan>()
            + self.chunks.capacity() * std::mem::size_of::<Chunk>()) as u64
    }
}

pub(crate) fn chunk_range(i: usize) -> std::ops::Range<usize> {
    i * UNIT_CHUNK..((i + 1) * UNIT_CHUNK).min(UNIT_SIZE)
}

/// A unit compressed into a scratch buffer of the pool and not stored yet
/// ([`Zpool::prepare_unit`]): the work of a store that takes CPU and no lock of the
/// pool, so that threads compress units side by side and store them
/// ([`PreparedUnit::commit`]) one at a time. Dropped uncommitted, it gives its buffer
/// back and stores nothing.
pub struct PreparedUnit<'a> {
    pool: &'a Zpool,
    unit: &'a [u8; UNIT_SIZE],
    /// A same-filled unit: its word (no buffer, no object).
    same: Option<u64>,
    scratch: Option<UnitScratch>,
}

impl PreparedUnit<'_> {
    /// Store the unit as one entry (objects allocated and written now). Refused if the
    /// pool has filled up since it was prepared.
    pub fn commit(mut self) -> Result<Handle, Reject> {
        if let Some(pattern) = self.same {
            return self.pool.store_same_filled(true, pattern);
        }
        let mut scratch = self.scratch.take().expect("a prepared unit has its buffer");
        let result = self.pool.commit_unit(self.unit, &mut scratch);
        self.pool.put_unit_scratch(scratch);
        result
    }
}

impl Drop for PreparedUnit<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            self.pool.put_unit_scratch(s);
        }
    }
}

impl Zpool {
    /// Store one 2 MiB unit as one entry. A same-filled unit takes no memory; otherwise
    /// it is refused as a whole if its chunks compress to more than the threshold share
    /// of 2 MiB, or if the pool is full.
    pub fn store_unit(&self, unit: &[u8; UNIT_SIZE]) -> Result<Handle, Reject> {
        self.prepare_unit(unit)?.commit()
    }

    /// Compress a unit for [`PreparedUnit::commit`], refusing it as `store_unit` does
    /// (compresses poorly, pool full). Takes one of the pool's unit scratch buffers
    /// until committed or dropped: a caller that keeps the pool within a budget
    /// prepares at most as many units at once as it reserved buffers for
    /// ([`Zpool::reserve_unit_scratches`]); one more makes a new buffer (~2 MiB).
    pub fn prepare_unit<'a>(
        &'a self,
        unit: &'a [u8; UNIT_SIZE],
    ) -> Result<PreparedUnit<'a>, Reject> {
        let mut prepared = PreparedUnit {
            pool: self,
            unit,
            same: same_filled(unit),
            scratch: None,
        };
        if prepared.same.is_some() {
            return Ok(prepared);
        }
        if !self.under_limit() {
            return Err(self.reject(Reject::PoolFull));
        }
        let Some(scratch) = self.take_unit_scratch() else {
            return Err(self.reject(Reject::PoolFull));
        };
        // Given back by the drop if the plan refuses the unit.
        let scratch = prepared.scratch.insert(scratch);
        self.plan_unit(unit, scratch)?;
        Ok(prepared)
    }

    /// Decide every chunk of a unit, compressing into the scratch buffer: a unit
    /// refused costs no allocation.
    fn plan_unit(&self, unit: &[u8; UNIT_SIZE], scratch: &mut UnitScratch) -> Result<(), Reject> {
        let max_total = self.max_stored(UNIT_SIZE);
        let UnitScratch { buf, plan, chunks } = scratch;
        plan.clear();
        chunks.clear();
        let (mut total, mut at) = (0, 0);
        for i in 0..UNIT_CHUNKS {
            let data = &unit[chunk_range(i)];
            let p = match same_filled(data) {
                Some(pattern) => Plan::SameFilled(pattern),
                None => {
                    let room = self.compressor.max_output(data.len());
                    match self.compressor.compress(data, &mut buf[at..at + room]) {
                        Some(len) if len < data.len() => {
                            at += len;
                            total += len;
                            Plan::Compressed { at: at - len, len }
                        }
                        _ => {
                            total += data.len();
                            Plan::Raw
                        }
                    }
                }
            };
            // `total` only grows: refuse as soon as it is over.
            if total > max_total {
                return Err(self.reject(Reject::PoorCompression));
            }
            plan.push(p);
        }
        Ok(())
    }

    /// Store the chunks `plan_unit` decided as objects, and the unit's record.
    fn commit_unit(
        &self,
        unit: &[u8; UNIT_SIZE],
        scratch: &mut UnitScratch,
    ) -> Result<Handle, Reject> {
        let UnitScratch { buf, plan, chunks } = scratch;
        debug_assert_eq!(plan.len(), UNIT_CHUNKS);
        chunks.clear();
        for (i, p) in plan.iter().enumerate() {
            let stored = match *p {
                Plan::SameFilled(pattern) => Ok(Chunk::SameFilled(pattern)),
                Plan::Compressed { at, len } => self
                    .store_object(&buf[at..at + len], false)
                    .map(Chunk::Object),
                Plan::Raw => self
                    .store_object(&unit[chunk_range(i)], true)
                    .map(Chunk::Object),
            };
            match stored {
                Ok(c) => chunks.push(c),
                Err(r) => {
                    self.free_unit_chunks(chunks);
                    return Err(self.reject(r));
                }
            }
        }
        let record = Record::Unit(Arc::from(&chunks[..]));
        let heap = record.heap_bytes();
        let Some(handle) = self.records.insert(&self.objects.meta, true, record) else {
            self.free_unit_chunks(chunks);
            return Err(self.reject(Reject::PoolFull));
        };
        self.objects.meta.add(heap);
        self.count_stored(true, false);
        Ok(handle)
    }

    /// Free the objects of a unit's chunks.
    pub(crate) fn free_unit_chunks(&self, chunks: &[Chunk]) {
        for c in chunks {
            if let Chunk::Object(obj) = *c {
                // Only a caller freeing the same unit twice at once finds it gone.
                let _ = self.free_object(obj);
            }
        }
    }

    /// Decode every chunk of a unit into its place in `out` (2 MiB).
    pub(crate) fn load_unit(
        &self,
        handle: Handle,
        chunks: &[Chunk],
        out: &mut [u8],
    ) -> Result<(), Error> {
        if chunks.len() != UNIT_CHUNKS || out.len() != UNIT_SIZE {
            return Err(Error::InvalidHandle(handle));
        }
        for (i, c) in chunks.iter().enumerate() {
            let dst = &mut out[chunk_range(i)];
            match *c {
                Chunk::SameFilled(pattern) => fill(dst, pattern),
                Chunk::Object(obj) => self.load_object(handle, obj, dst)?,
            }
        }
        Ok(())
    }

    /// Bytes `offset..offset + out.len()` of a unit's entry, decoding only the chunks
    /// they lie in (a page takes one or two of the 129): what a caller short of room
    /// for a whole 2 MiB decode needs (the engine's fault on one page of a unit stored
    /// whole, with room for that page only). The entry stays stored. A chunk decodes
    /// into a buffer of the calling thread's (16 KiB, made on its first use and kept,
    /// as the compressors keep their state), then its part is copied out.
    pub fn load_part(&self, handle: Handle, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let end = offset.checked_add(out.len());
        if !handle.is_unit() || end.is_none_or(|e| e > UNIT_SIZE) || !offset.is_multiple_of(8) {
            return Err(Error::WrongLength {
                handle,
                expected: handle.data_len(),
                got: end.unwrap_or(usize::MAX),
            });
        }
        let end = end.expect("checked");
        let chunks = match handle.entry() {
            Entry::SameFilled { pattern, .. } => {
                fill(out, pattern);
                Counters::add(&self.counters.loads, 1);
                return Ok(());
            }
            Entry::Record {
                unit: true,
                shard,
                idx,
                gen,
            } => match self.records.get(shard, idx, gen) {
                Some(Record::SameFilled(pattern)) => {
                    fill(out, pattern);
                    Counters::add(&self.counters.loads, 1);
                    return Ok(());
                }
                Some(Record::Unit(chunks)) if chunks.len() == UNIT_CHUNKS => chunks,
                _ => return Err(Error::InvalidHandle(handle)),
            },
            _ => return Err(Error::InvalidHandle(handle)),
        };
        for i in offset / UNIT_CHUNK..end.div_ceil(UNIT_CHUNK) {
            let range = chunk_range(i);
            let (from, to) = (range.start.max(offset), range.end.min(end));
            let dst = &mut out[from - offset..to - offset];
            match chunks[i] {
                Chunk::SameFilled(pattern) => fill(dst, pattern),
                Chunk::Object(obj) => CHUNK_SCRATCH.with_borrow_mut(|buf| {
                    buf.resize(range.len(), 0);
                    self.load_object(handle, obj, buf)?;
                    dst.copy_from_slice(&buf[from - range.start..to - range.start]);
                    Ok::<(), Error>(())
                })?,
            }
        }
        Counters::add(&self.counters.loads, 1);
        Ok(())
    }

    /// A scratch buffer for one unit store: a pooled one, or a new one if holding it
    /// keeps the pool within its limit (it is counted in the metadata).
    fn take_unit_scratch(&self) -> Option<UnitScratch> {
        let mut list = self.unit_scratch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = list.pop() {
            return Some(s);
        }
        drop(list);
        let bytes = UnitScratch::bytes_for(self);
        if self.total_bytes() + bytes > self.limit() {
            return None;
        }
        let s = UnitScratch::new(self);
        self.objects.meta.add(s.heap_bytes());
        Some(s)
    }

    /// Keep a scratch buffer for the next unit store, or free it if enough are kept.
    fn put_unit_scratch(&self, s: UnitScratch) {
        let mut list = self.unit_scratch.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() >= KEPT_UNIT_SCRATCH {
            drop(list);
            self.objects.meta.sub(s.heap_bytes());
            return;
        }
        let before = list.capacity();
        list.push(s);
        let grown = list.capacity() - before;
        self.objects
            .meta
            .add((grown * std::mem::size_of::<UnitScratch>()) as u64);
    }

    /// Make and keep one scratch buffer for unit stores now (~2 MiB, in the metadata),
    /// so that a later unit store does not grow the pool by it: a caller that charges
    /// the pool to a budget takes the cost up front. False if the limit has no room.
    pub fn reserve_unit_scratch(&self) -> bool {
        self.reserve_unit_scratches(1) == 1
    }

    /// Make and keep up to `n` scratch buffers for unit stores now (at most the two
    /// the pool keeps), for as many units prepared at once ([`Zpool::prepare_unit`]).
    /// Returns how many are kept (fewer where the limit has no room for more).
    pub fn reserve_unit_scratches(&self, n: usize) -> usize {
        let held: Vec<UnitScratch> = (0..n.min(KEPT_UNIT_SCRATCH))
            .map_while(|_| self.take_unit_scratch())
            .collect();
        let kept = held.len();
        for s in held {
            self.put_unit_scratch(s);
        }
        kept
    }

    /// Free the scratch buffers kept for unit stores (~2 MiB each; a later unit store
    /// makes one again). The bytes released from `metadata_bytes`.
    pub fn release_unit_scratch(&self) -> u64 {
        let mut list = self.unit_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: u64 = list.drain(..).map(|s| s.heap_bytes()).sum();
        drop(list);
        self.objects.meta.sub(bytes);
        bytes
    }

    /// The object of each chunk that has one (tests use it to damage one).
    #[cfg(test)]
    pub(crate) fn unit_objects(&self, handle: Handle) -> Vec<ObjRef> {
        let crate::handle::Entry::Record {
            shard, idx, gen, ..
        } = handle.entry()
        else {
            return Vec::new();
        };
        match self.records.get(shard, idx, gen) {
            Some(Record::Unit(chunks)) => chunks
                .iter()
                .filter_map(|c| match c {
                    Chunk::Object(o) => Some(*o),
                    Chunk::SameFilled(_) => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}
