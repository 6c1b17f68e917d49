//! The object allocator, after the kernel's zsmalloc: objects of similar size share
//! *zspages* (spans of 1–16 pages cut into equal slots), and callers hold *handles*
//! that stay valid while compaction moves objects between zspages.
//!
//! - `arena`: the backing memory (mmap'd chunks, spans given back with MADV_DONTNEED);
//! - `size_class`: the class sizes and zspage lengths;
//! - `zspage`: one zspage and its in-use bitmap;
//! - `class`: one class — its zspages, its handle table, its lock;
//! - this file: [`ObjPool`], the classes together, and compaction over all of them.
//!
//! Locking: each class has one `RwLock`. Loads take it shared (loads of one class run
//! in parallel, loads of different classes never share a lock); alloc, free and one
//! compaction step take it exclusive. The arena's mutex is taken only when a class
//! needs a new zspage or gives one back (once per `objs` stores or frees at most).

pub(crate) mod arena;
pub(crate) mod class;
pub(crate) mod size_class;
pub(crate) mod zspage;

use crate::PAGE_SIZE;
use arena::Arena;
use class::{Class, Full, BACKPTR};
use size_class::{ClassTable, MAX_OBJECT};
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest payload an object may have.
pub(crate) const MAX_PAYLOAD: usize = MAX_OBJECT - BACKPTR;

/// An object: its class and its entry in that class's handle table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ObjRef {
    pub(crate) class: u8,
    pub(crate) gen: u8,
    pub(crate) idx: u32,
}

/// The pool's count of heap bytes held for bookkeeping (everything but the zspages).
#[derive(Debug, Default)]
pub(crate) struct Metadata(AtomicU64);

impl Metadata {
    pub(crate) fn bytes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, bytes: u64) {
        self.0.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Something that counted `before` bytes now holds `now`.
    pub(crate) fn change(&self, before: u64, now: u64) {
        if now > before {
            self.add(now - before);
        } else {
            self.sub(before - now);
        }
    }
}

/// Gauges of the allocator, summed over its classes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Gauges {
    /// Objects stored.
    pub(crate) objects: u64,
    /// Bytes of their slots (class size × objects).
    pub(crate) object_bytes: u64,
    /// Zspages held.
    pub(crate) zspages: u64,
    /// Bytes compaction could free now: per class, whole zspages' worth of free slots.
    pub(crate) compactable_bytes: u64,
}

/// See the module doc.
pub(crate) struct ObjPool {
    table: ClassTable,
    classes: Box<[Class]>,
    pub(crate) arena: Arena,
    pub(crate) meta: Metadata,
}

impl ObjPool {
    pub(crate) fn new(limit_bytes: u64) -> ObjPool {
        let table = ClassTable::new();
        let meta = Metadata::default();
        let classes: Box<[Class]> = table
            .classes
            .iter()
            .map(|g| Class::new(*g, &meta))
            .collect();
        let arena = Arena::new(limit_bytes);
        meta.add((classes.len() * std::mem::size_of::<Class>() + table.heap_bytes()) as u64);
        ObjPool {
            table,
            classes,
            arena,
            meta,
        }
    }

    /// Heap bytes of bookkeeping: classes, handle tables, bitmaps, arena lists, plus
    /// what the layers above added with `meta`.
    pub(crate) fn metadata_bytes(&self) -> u64 {
        // The arena's lists change under its own lock and are counted there.
        self.meta.bytes() + self.arena.bookkeeping_bytes()
    }

    /// Store an object with `len` payload bytes (≤ [`MAX_PAYLOAD`]) written by `write`.
    pub(crate) fn alloc(&self, len: usize, write: impl FnOnce(&mut [u8])) -> Result<ObjRef, Full> {
        debug_assert!(len <= MAX_PAYLOAD);
        let class = self.table.class_for(BACKPTR + len);
        let (idx, gen) = self.classes[class].alloc(&self.arena, &self.meta, len, write)?;
        Ok(ObjRef {
            class: class as u8,
            gen,
            idx,
        })
    }

    /// Run `f` on an object's payload (the whole slot after the back-pointer: callers
    /// keep their own length); `None` if `obj` is not a stored object.
    pub(crate) fn read<R>(&self, obj: ObjRef, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.classes
            .get(obj.class as usize)?
            .read(obj.idx, obj.gen, f)
    }

    /// Free an object after showing its payload to `inspect`; `None` if not stored.
    pub(crate) fn free<R>(&self, obj: ObjRef, inspect: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.classes.get(obj.class as usize)?.free(
            &self.arena,
            &self.meta,
            obj.idx,
            obj.gen,
            inspect,
        )
    }

    /// Move objects out of sparse zspages into fuller ones in every class and free the
    /// emptied zspages; the pages freed.
    pub(crate) fn compact(&self) -> u64 {
        let mut pages = 0;
        for class in self.classes.iter() {
            loop {
                let freed = class.compact_step(&self.arena, &self.meta);
                if freed == 0 {
                    break;
                }
                pages += freed as u64;
            }
        }
        pages
    }

    /// Bytes of zspages held (all resident).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.arena.held_bytes()
    }

    pub(crate) fn gauges(&self) -> Gauges {
        let mut g = Gauges::default();
        for c in self.classes.iter() {
            let (objects, zspages) = (c.objects(), c.zspages());
            let geom = &c.geom;
            let free_slots = (zspages * geom.objs as u64).saturating_sub(objects);
            g.objects += objects;
            g.object_bytes += objects * geom.size as u64;
            g.zspages += zspages;
            g.compactable_bytes += free_slots / geom.objs as u64 * (geom.pages * PAGE_SIZE) as u64;
        }
        g
    }

    /// Test access to one object's whole slot (back-pointer included), mutable.
    #[cfg(test)]
    pub(crate) fn write_raw<R>(&self, obj: ObjRef, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        self.classes
            .get(obj.class as usize)?
            .write(obj.idx, obj.gen, f)
    }

    #[cfg(test)]
    pub(crate) fn classes(&self) -> &[Class] {
        &self.classes
    }
}
