//! One size class: its zspages, its handle table, and the lock that guards both.
//!
//! Every object starts with a 4-byte back-pointer (its index in the class's handle
//! table), which is how compaction finds the handle of an object it moves (zsmalloc
//! keeps the handle in the object the same way). The rest of the slot is the payload.

use super::arena::{Arena, Span};
use super::size_class::{Geometry, MAX_OBJECT};
use super::zspage::{bitmap_heap_bytes, ZsPage, FULL, GROUPS};
use super::Metadata;
use crate::slab::Slab;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Bytes of the back-pointer at the start of every object.
pub(crate) const BACKPTR: usize = 4;

/// Handle and zspage indices fit in 32 bits (handles pack them so).
const MAX_ENTRIES: u32 = u32::MAX - 1;
/// Table growth steps: ~3 KiB of handles, ~4 KiB of zspage descriptors.
const HANDLE_CHUNK: usize = 256;
const ZSPAGE_CHUNK: usize = 64;

/// Where an object is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    zspage: u32,
    slot: u32,
}

/// Why an object could not be allocated: a new zspage would pass the byte limit (or
/// no address space or index was left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// See the module doc.
pub(crate) struct Class {
    pub(crate) geom: Geometry,
    state: RwLock<ClassState>,
    /// Copies of `ClassState::objects` and `::live`, written under the write lock, for
    /// stats read without it.
    objects: AtomicU64,
    zspages: AtomicU64,
}

/// Guarded by `Class::state`: loads take it shared; everything that changes a zspage
/// or the handle table (alloc, free, compaction) takes it exclusive.
struct ClassState {
    /// Handle index → where the object is now.
    handles: Slab<Loc>,
    /// The zspages, by id (their index here; generations unused).
    zspages: Slab<ZsPage>,
    /// Ids of the zspages that are neither empty nor full, by fullness group.
    groups: [Vec<u32>; GROUPS],
    /// Objects stored, and zspages held.
    objects: u64,
    live: u64,
    /// Heap bytes of this state last added to the pool's metadata counter.
    reported_heap: u64,
}

impl Class {
    pub(crate) fn new(geom: Geometry, meta: &Metadata) -> Class {
        let mut state = ClassState {
            handles: Slab::new(HANDLE_CHUNK, MAX_ENTRIES),
            zspages: Slab::new(ZSPAGE_CHUNK, MAX_ENTRIES),
            groups: Default::default(),
            objects: 0,
            live: 0,
            reported_heap: 0,
        };
        state.report_heap(&geom, meta);
        Class {
            geom,
            state: RwLock::new(state),
            objects: AtomicU64::new(0),
            zspages: AtomicU64::new(0),
        }
    }

    fn read_state(&self) -> RwLockReadGuard<'_, ClassState> {
        // Nothing panics while holding the lock with the state half-changed; if
        // something did, serving on beats stopping every thread of the engine.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, ClassState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Objects stored now.
    pub(crate) fn objects(&self) -> u64 {
        self.objects.load(Ordering::Relaxed)
    }

    /// Zspages held now.
    pub(crate) fn zspages(&self) -> u64 {
        self.zspages.load(Ordering::Relaxed)
    }

    /// Store an object of `len` payload bytes written by `write`; its (index, generation).
    pub(crate) fn alloc(
        &self,
        arena: &Arena,
        meta: &Metadata,
        len: usize,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<(u32, u8), Full> {
        let geom = &self.geom;
        debug_assert!(BACKPTR + len <= geom.size);
        let mut st = self.write_state();
        let id = match st.fullest_zspage() {
            Some(id) => id,
            None => {
                let span = arena.alloc(geom.pages, meta.bytes()).map_err(|_| Full)?;
                match st.add_zspage(ZsPage::new(span, geom)) {
                    Ok(id) => id,
                    Err(span) => {
                        drop(st);
                        arena.free(span);
                        return Err(Full);
                    }
                }
            }
        };
        let slot = st.zspage_mut(id).take_slot();
        st.regroup(id, geom);
        let loc = Loc {
            zspage: id,
            slot: slot as u32,
        };
        let Ok((idx, gen)) = st.handles.insert(loc) else {
            // 4 billion objects in one class: give the slot back and refuse.
            let emptied = st.release(loc, geom);
            self.publish(&mut st, meta);
            drop(st);
            if let Some(span) = emptied {
                arena.free(span);
            }
            return Err(Full);
        };
        let obj = st.zspage_mut(id).slot_mut(geom, slot);
        obj[..BACKPTR].copy_from_slice(&idx.to_le_bytes());
        write(&mut obj[BACKPTR..BACKPTR + len]);
        st.objects += 1;
        self.publish(&mut st, meta);
        Ok((idx, gen))
    }

    /// Run `f` on the payload of object (idx, gen) under the shared lock; `None` if no
    /// such object.
    pub(crate) fn read<R>(&self, idx: u32, gen: u8, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let st = self.read_state();
        let loc = *st.handles.get(idx, gen)?;
        let obj = st
            .zspages
            .get_any_gen(loc.zspage)?
            .slot(&self.geom, loc.slot as usize);
        Some(f(&obj[BACKPTR..]))
    }

    /// Run `f` on the whole slot of object (idx, gen), mutable (tests damage objects
    /// through this).
    #[cfg(test)]
    pub(crate) fn write<R>(&self, idx: u32, gen: u8, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let mut st = self.write_state();
        let loc = *st.handles.get(idx, gen)?;
        let geom = self.geom;
        Some(f(st
            .zspage_mut(loc.zspage)
            .slot_mut(&geom, loc.slot as usize)))
    }

    /// Free object (idx, gen), first showing its payload to `inspect`; `None` if no such
    /// object. A zspage left empty goes back to the arena at once.
    pub(crate) fn free<R>(
        &self,
        arena: &Arena,
        meta: &Metadata,
        idx: u32,
        gen: u8,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let geom = &self.geom;
        let mut st = self.write_state();
        let loc = st.handles.remove(idx, gen)?;
        let r = inspect(&st.zspage_mut(loc.zspage).slot(geom, loc.slot as usize)[BACKPTR..]);
        let emptied = st.release(loc, geom);
        st.objects -= 1;
        self.publish(&mut st, meta);
        drop(st);
        // MADV_DONTNEED outside the lock: loads of this class need not wait for it.
        if let Some(span) = emptied {
            arena.free(span);
        }
        Some(r)
    }

    /// One compaction step: when the class holds at least one zspage's worth of free
    /// slots, move every object of its sparsest zspage into the fullest others and free
    /// it. Returns the pages freed (0: nothing to gain here now). The class is locked
    /// for one step only (at most one zspage of objects copied), so loads wait little.
    pub(crate) fn compact_step(&self, arena: &Arena, meta: &Metadata) -> usize {
        let geom = &self.geom;
        let mut st = self.write_state();
        let free_slots = (st.live * geom.objs as u64).saturating_sub(st.objects);
        if free_slots < geom.objs as u64 {
            return 0;
        }
        let Some(src) = st.sparsest_zspage() else {
            return 0;
        };
        // Out of the lists: never picked as a destination for its own objects.
        st.unlist(src);
        // Free slots in the others >= (free in all) - (free in src) >= objs - (objs -
        // in use in src) = objects in src: every object finds a place.
        let mut tmp = [0u8; MAX_OBJECT];
        let tmp = &mut tmp[..geom.size];
        for slot in 0..geom.objs {
            let src_zs = st.zspage_mut(src);
            if !src_zs.is_used(slot) {
                continue;
            }
            tmp.copy_from_slice(src_zs.slot(geom, slot));
            let old = Loc {
                zspage: src,
                slot: slot as u32,
            };
            let backptr = u32::from_le_bytes(tmp[..BACKPTR].try_into().expect("4 bytes"));
            let Some(idx) = st.handle_of(backptr, old) else {
                // In use but no handle leads here: nobody can load it. Drop it.
                st.zspage_mut(src).release_slot(slot);
                st.objects -= 1;
                continue;
            };
            let Some(dst) = st.fullest_zspage() else {
                break; // cannot happen (see above); the rest stays where it is
            };
            let dst_zs = st.zspage_mut(dst);
            let new_slot = dst_zs.take_slot();
            let obj = dst_zs.slot_mut(geom, new_slot);
            obj.copy_from_slice(tmp);
            // Rewrite the back-pointer: it may have been the damaged one.
            obj[..BACKPTR].copy_from_slice(&idx.to_le_bytes());
            st.regroup(dst, geom);
            *st.handles.get_mut_any_gen(idx).expect("found in use") = Loc {
                zspage: dst,
                slot: new_slot as u32,
            };
            st.zspage_mut(src).release_slot(slot);
        }
        let freed = if st.zspage_mut(src).inuse == 0 {
            st.live -= 1;
            st.zspages.remove_any_gen(src).map(|z| z.span)
        } else {
            st.regroup(src, geom);
            None
        };
        self.publish(&mut st, meta);
        drop(st);
        let pages = freed.as_ref().map_or(0, Span::pages);
        if let Some(span) = freed {
            arena.free(span);
        }
        pages
    }

    /// After a change under the write lock: update the gauges read without it and the
    /// pool's metadata counter.
    fn publish(&self, st: &mut ClassState, meta: &Metadata) {
        self.objects.store(st.objects, Ordering::Relaxed);
        self.zspages.store(st.live, Ordering::Relaxed);
        st.report_heap(&self.geom, meta);
    }

    /// Heap bytes of this class's state (for tests of the metadata counter).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> u64 {
        self.read_state().heap_bytes(&self.geom)
    }

    /// Its zspages' (start address, pages) (for tests that read the page tables).
    #[cfg(test)]
    pub(crate) fn zspage_spans(&self) -> Vec<(usize, usize)> {
        let st = self.read_state();
        st.zspages
            .values()
            .map(|z| (z.span.addr(), z.span.pages()))
            .collect()
    }
}

impl ClassState {
    fn zspage_mut(&mut self, id: u32) -> &mut ZsPage {
        self.zspages.get_mut_any_gen(id).expect("zspage id in use")
    }

    /// Heap bytes held by this state.
    fn heap_bytes(&self, geom: &Geometry) -> u64 {
        let lists: usize = self.groups.iter().map(Vec::capacity).sum();
        (self.handles.heap_bytes()
            + self.zspages.heap_bytes()
            + self.live as usize * bitmap_heap_bytes(geom)
            + lists * std::mem::size_of::<u32>()) as u64
    }

    /// Bring the pool's metadata counter up to date with this state's heap bytes.
    fn report_heap(&mut self, geom: &Geometry, meta: &Metadata) {
        let now = self.heap_bytes(geom);
        meta.change(self.reported_heap, now);
        self.reported_heap = now;
    }

    /// Keep a new zspage; its id (or the span back if no id is left).
    fn add_zspage(&mut self, mut zs: ZsPage) -> Result<u32, Span> {
        zs.group = FULL; // in no list until regroup() places it
        let (id, _) = self.zspages.insert(zs).map_err(|zs| zs.span)?;
        self.live += 1;
        Ok(id)
    }

    /// Give back the slot at `loc`; the zspage's span if that emptied it.
    fn release(&mut self, loc: Loc, geom: &Geometry) -> Option<Span> {
        let zs = self.zspage_mut(loc.zspage);
        zs.release_slot(loc.slot as usize);
        if zs.inuse > 0 {
            self.regroup(loc.zspage, geom);
            return None;
        }
        self.unlist(loc.zspage);
        self.live -= 1;
        self.zspages.remove_any_gen(loc.zspage).map(|z| z.span)
    }

    /// A zspage with a free slot, from the fullest group.
    fn fullest_zspage(&self) -> Option<u32> {
        self.groups.iter().rev().find_map(|g| g.last().copied())
    }

    /// A zspage from the sparsest group.
    fn sparsest_zspage(&self) -> Option<u32> {
        self.groups.iter().find_map(|g| g.last().copied())
    }

    /// Move zspage `id` to the group list its fill says.
    fn regroup(&mut self, id: u32, geom: &Geometry) {
        let zs = self.zspage_mut(id);
        let want = zs.fullness(geom);
        if want == zs.group {
            return;
        }
        self.unlist(id);
        let pos = match want {
            FULL => 0,
            g => {
                let list = &mut self.groups[g as usize];
                list.push(id);
                list.len() - 1
            }
        };
        let zs = self.zspage_mut(id);
        zs.group = want;
        zs.pos = pos;
    }

    /// Take zspage `id` out of its group list (it stays where it is otherwise).
    fn unlist(&mut self, id: u32) {
        let zs = self.zspage_mut(id);
        let (group, pos) = (zs.group, zs.pos);
        zs.group = FULL;
        if group == FULL {
            return;
        }
        let list = &mut self.groups[group as usize];
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.zspage_mut(moved).pos = pos;
        }
    }

    /// The handle index of the object at `old`. It is the object's back-pointer; if that
    /// does not lead back to `old` (the back-pointer was damaged in memory), the index is
    /// found by a scan instead: trusting a wrong one would repoint another caller's
    /// handle here and hand it these (checksum-valid) bytes.
    fn handle_of(&self, backptr: u32, old: Loc) -> Option<u32> {
        if self.handles.get_any_gen(backptr) == Some(&old) {
            return Some(backptr);
        }
        self.handles.find_index(|l| *l == old)
    }
}
