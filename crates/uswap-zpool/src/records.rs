//! Records: entries that are not one object — compressed units (a list of chunks) and
//! same-filled entries whose word does not fit in a handle.
//!
//! Kept in [`RECORD_SHARDS`] shards, each a [`Slab`] behind its own `RwLock`; a thread
//! inserts into "its" shard (assigned round-robin on first use), so stores from
//! different threads do not share a lock. A unit's chunk list is shared (`Arc`) so that
//! a load holds the shard lock only to clone it, not while it decompresses 2 MiB.

use crate::handle::{Handle, MAX_RECORDS_PER_SHARD, RECORD_SHARDS};
use crate::slab::Slab;
use crate::zsmalloc::{Metadata, ObjRef};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// One chunk of a stored unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Every word of the chunk is this one.
    SameFilled(u64),
    /// Stored (compressed, or raw if it did not compress) as this object.
    Object(ObjRef),
}

/// See the module doc.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    /// A same-filled page or unit (the handle says which).
    SameFilled(u64),
    /// A unit, chunk by chunk.
    Unit(Arc<[Chunk]>),
}

impl Record {
    /// Heap bytes this record holds beyond its table entry.
    pub(crate) fn heap_bytes(&self) -> u64 {
        match self {
            Record::SameFilled(_) => 0,
            // ArcInner: strong and weak counts, then the slice.
            Record::Unit(chunks) => {
                (2 * std::mem::size_of::<usize>() + std::mem::size_of_val(&**chunks)) as u64
            }
        }
    }
}

/// Guarded by its shard's lock.
struct Shard {
    slab: Slab<Record>,
    /// Heap bytes of `slab` last added to the pool's metadata counter.
    reported_heap: u64,
}

/// See the module doc.
pub(crate) struct Records {
    shards: Box<[RwLock<Shard>]>,
}

/// Records per table growth step (~6 KiB).
const RECORD_CHUNK: usize = 256;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

fn my_shard() -> usize {
    MY_SHARD.with(|s| match s.get() {
        Some(i) => i,
        None => {
            let i = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % RECORD_SHARDS;
            s.set(Some(i));
            i
        }
    })
}

impl Records {
    pub(crate) fn new(meta: &Metadata) -> Records {
        let shards: Box<[RwLock<Shard>]> = (0..RECORD_SHARDS)
            .map(|_| {
                RwLock::new(Shard {
                    slab: Slab::new(RECORD_CHUNK, MAX_RECORDS_PER_SHARD),
                    reported_heap: 0,
                })
            })
            .collect();
        meta.add(std::mem::size_of_val(&*shards) as u64);
        Records { shards }
    }

    /// Store a record; its handle, or `None` if this shard's index space is full.
    /// The record's own heap bytes are the caller's to count.
    pub(crate) fn insert(&self, meta: &Metadata, unit: bool, record: Record) -> Option<Handle> {
        let shard = my_shard();
        let mut s = self.shards[shard]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let (idx, gen) = s.slab.insert(record).ok()?;
        s.report_heap(meta);
        Some(Handle::record(unit, shard, idx, gen))
    }

    /// A copy of record (shard, idx, gen) (a unit's chunk list is shared, not copied).
    pub(crate) fn get(&self, shard: usize, idx: u32, gen: u8) -> Option<Record> {
        let s = self
            .shards
            .get(shard)?
            .read()
            .unwrap_or_else(|e| e.into_inner());
        s.slab.get(idx, gen).cloned()
    }

    /// Take record (shard, idx, gen) out, if `pred` accepts it.
    pub(crate) fn remove_if(
        &self,
        meta: &Metadata,
        shard: usize,
        idx: u32,
        gen: u8,
        pred: impl FnOnce(&Record) -> bool,
    ) -> Option<Record> {
        let mut s = self
            .shards
            .get(shard)?
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if !pred(s.slab.get(idx, gen)?) {
            return None;
        }
        let r = s.slab.remove(idx, gen)?;
        s.report_heap(meta);
        Some(r)
    }
}

impl Records {
    /// Heap bytes of the shards' tables (for tests of the metadata counter).
    #[cfg(test)]
    pub(crate) fn table_heap_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.read().unwrap().slab.heap_bytes() as u64)
            .sum()
    }
}

impl Shard {
    fn report_heap(&mut self, meta: &Metadata) {
        let now = self.slab.heap_bytes() as u64;
        meta.change(self.reported_heap, now);
        self.reported_heap = now;
    }
}
