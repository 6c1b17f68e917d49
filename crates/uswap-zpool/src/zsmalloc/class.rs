//! One size class: its zspages, its handle table, and the lock that guards both.
//!
//! Every object starts with a 4-byte back-pointer (its index in the class's handle
//! table), which is how compaction finds the handle of an object it moves (zsmalloc
//! keeps the handle in the object the same way). The rest of the slot is the payload.

use super::arena::{Arena, Span, SpanError};
use super::size_class::Geometry;
use super::zspage::{ZsPage, FULL, GROUPS};
use super::Metadata;
use crate::slab::Slab;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Bytes of the back-pointer at the start of every object.
pub(crate) const BACKPTR: usize = 4;

/// Handle indices fit in 32 bits (the handle packs them so).
const MAX_HANDLES: u32 = u32::MAX - 1;

/// Where an object is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    zspage: u32,
    slot: u32,
}

/// Why an object could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocError {
    /// A new zspage would pass the byte limit (or no address space was left).
    Full,
}

/// See the module doc.
pub(crate) struct Class {
    pub(crate) geom: Geometry,
    state: RwLock<ClassState>,
    /// Objects stored (written under the write lock; read without it for stats).
    objects: AtomicU64,
    /// Zspages held.
    zspages: AtomicU64,
}

/// Guarded by `Class::state`: loads take it shared, everything that changes a
/// zspage or the handle table (alloc, free, compaction) takes it exclusive.
struct ClassState {
    /// Handle index → where the object is now.
    handles: Slab<Loc>,
    /// Zspages by id (`None`: id free for reuse, listed in `free_ids`).
    zspages: Vec<Option<ZsPage>>,
    free_ids: Vec<u32>,
    /// Ids of the zspages that are neither empty nor full, by fullness group.
    groups: [Vec<u32>; GROUPS],
    /// Heap bytes of this state last added to the pool's metadata counter.
    reported_heap: u64,
}

impl Class {
    pub(crate) fn new(geom: Geometry, meta: &Metadata) -> Class {
        let mut state = ClassState {
            handles: Slab::new(MAX_HANDLES),
            zspages: Vec::new(),
            free_ids: Vec::new(),
            groups: Default::default(),
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
        // A panic while holding the lock cannot leave the state half-changed in a way
        // that matters more than stopping would: keep serving.
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
    ) -> Result<(u32, u8), AllocError> {
        let geom = &self.geom;
        debug_assert!(BACKPTR + len <= geom.size);
        let mut guard = self.write_state();
        let st = &mut *guard;
        let id = match st.fullest_zspage() {
            Some(id) => id,
            None => {
                let span = match arena.alloc(geom.pages, meta.bytes()) {
                    Ok(span) => span,
                    Err(SpanError::OverLimit | SpanError::NoAddressSpace) => {
                        return Err(AllocError::Full)
                    }
                };
                self.zspages.fetch_add(1, Ordering::Relaxed);
                st.add_zspage(ZsPage::new(span, geom))
            }
        };
        let slot = st.zspage_mut(id).take_slot();
        st.regroup(id, geom);
        let loc = Loc {
            zspage: id,
            slot: slot as u32,
        };
        let Some((idx, gen)) = st.handles.insert(loc) else {
            // 4 billion objects in one class: give the slot back and refuse.
            let emptied = st.release(loc, geom);
            st.report_heap(geom, meta);
            drop(guard);
            self.free_span(arena, emptied);
            return Err(AllocError::Full);
        };
        let obj = st.zspage_mut(id).slot_mut(geom, slot);
        obj[..BACKPTR].copy_from_slice(&idx.to_le_bytes());
        write(&mut obj[BACKPTR..BACKPTR + len]);
        self.objects.fetch_add(1, Ordering::Relaxed);
        st.report_heap(geom, meta);
        Ok((idx, gen))
    }

    /// Run `f` on the payload of object (idx, gen) under the shared lock; `None` if no
    /// such object.
    pub(crate) fn read<R>(&self, idx: u32, gen: u8, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let st = self.read_state();
        let loc = *st.handles.get(idx, gen)?;
        let obj = st.zspages[loc.zspage as usize]
            .as_ref()?
            .slot(&self.geom, loc.slot as usize);
        Some(f(&obj[BACKPTR..]))
    }

    /// Run `f` on the payload of object (idx, gen) with it mutable (tests corrupt
    /// objects through this).
    #[cfg(test)]
    pub(crate) fn write<R>(&self, idx: u32, gen: u8, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let mut st = self.write_state();
        let loc = *st.handles.get(idx, gen)?;
        let geom = self.geom;
        let obj = st.zspages[loc.zspage as usize]
            .as_mut()?
            .slot_mut(&geom, loc.slot as usize);
        Some(f(obj))
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
        self.objects.fetch_sub(1, Ordering::Relaxed);
        st.report_heap(geom, meta);
        drop(st);
        // MADV_DONTNEED outside the lock: loads of this class need not wait for it.
        self.free_span(arena, emptied);
        Some(r)
    }

    fn free_span(&self, arena: &Arena, span: Option<Span>) {
        if let Some(span) = span {
            self.zspages.fetch_sub(1, Ordering::Relaxed);
            arena.free(span);
        }
    }

    /// One compaction step: when the class holds at least one zspage's worth of free
    /// slots, move every object of its sparsest zspage into the fullest others and free
    /// it. Returns the pages freed (0: nothing to gain here now). The class is locked
    /// for one step only (at most one zspage of objects copied), so loads wait little.
    pub(crate) fn compact_step(&self, arena: &Arena, meta: &Metadata) -> usize {
        let geom = &self.geom;
        let mut guard = self.write_state();
        let st = &mut *guard;
        let held = st.live_zspages() * geom.objs;
        let objects = self.objects() as usize;
        if held.saturating_sub(objects) < geom.objs {
            return 0;
        }
        let Some(src) = st.sparsest_zspage() else {
            return 0;
        };
        st.unlist(src);
        let mut src_zs = st.zspages[src as usize]
            .take()
            .expect("listed zspage exists");
        // Free slots elsewhere >= (free in all) - (free in src) >= objs - (objs - inuse)
        // = objects in src, so every object finds a place.
        for slot in 0..geom.objs {
            if !src_zs.is_used(slot) {
                continue;
            }
            let old = Loc {
                zspage: src,
                slot: slot as u32,
            };
            let backptr = src_zs.slot(geom, slot)[..BACKPTR]
                .try_into()
                .expect("4 bytes");
            let Some(idx) = st.handle_of(u32::from_le_bytes(backptr), old) else {
                // In use with no handle: nobody can ever load it. Drop it.
                src_zs.release_slot(slot);
                self.objects.fetch_sub(1, Ordering::Relaxed);
                continue;
            };
            let Some(dst) = st.fullest_zspage() else {
                break; // cannot happen (see above); leave the rest where it is
            };
            let dst_zs = st.zspage_mut(dst);
            let new_slot = dst_zs.take_slot();
            let obj = dst_zs.slot_mut(geom, new_slot);
            obj.copy_from_slice(src_zs.slot(geom, slot));
            // Rewrite the back-pointer: it may have been the damaged one.
            obj[..BACKPTR].copy_from_slice(&idx.to_le_bytes());
            st.regroup(dst, geom);
            *st.handles.get_mut_any_gen(idx).expect("found in use") = Loc {
                zspage: dst,
                slot: new_slot as u32,
            };
            src_zs.release_slot(slot);
        }
        let freed = if src_zs.inuse == 0 {
            st.free_ids.push(src);
            Some(src_zs.span)
        } else {
            st.zspages[src as usize] = Some(src_zs);
            st.regroup(src, geom);
            None
        };
        st.report_heap(geom, meta);
        drop(guard);
        let pages = freed.as_ref().map_or(0, |s| s.pages());
        self.free_span(arena, freed);
        pages
    }

    /// Heap bytes of this class's state (for tests of the metadata counter).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> u64 {
        self.read_state().heap_bytes(&self.geom)
    }

    /// Start addresses of its zspages (for tests that read the page tables).
    #[cfg(test)]
    pub(crate) fn zspage_addrs(&self) -> Vec<(usize, usize)> {
        let st = self.read_state();
        st.zspages
            .iter()
            .flatten()
            .map(|z| (z.span.addr(), z.span.pages()))
            .collect()
    }
}

impl ClassState {
    fn zspage_mut(&mut self, id: u32) -> &mut ZsPage {
        self.zspages[id as usize]
            .as_mut()
            .expect("zspage id in use")
    }

    fn live_zspages(&self) -> usize {
        self.zspages.len() - self.free_ids.len()
    }

    /// Heap bytes held by this state.
    fn heap_bytes(&self, geom: &Geometry) -> u64 {
        let ids = self.free_ids.capacity() + self.groups.iter().map(Vec::capacity).sum::<usize>();
        (self.handles.heap_bytes()
            + self.zspages.capacity() * std::mem::size_of::<Option<ZsPage>>()
            + self.live_zspages() * super::zspage::bitmap_words(geom) * 8
            + ids * std::mem::size_of::<u32>()) as u64
    }

    /// Bring the pool's metadata counter up to date with this state's heap bytes.
    fn report_heap(&mut self, geom: &Geometry, meta: &Metadata) {
        let now = self.heap_bytes(geom);
        meta.change(self.reported_heap, now);
        self.reported_heap = now;
    }

    fn add_zspage(&mut self, mut zs: ZsPage) -> u32 {
        zs.group = FULL; // in no list until regroup() places it
        match self.free_ids.pop() {
            Some(id) => {
                self.zspages[id as usize] = Some(zs);
                id
            }
            None => {
                self.zspages.push(Some(zs));
                (self.zspages.len() - 1) as u32
            }
        }
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
        self.free_ids.push(loc.zspage);
        self.zspages[loc.zspage as usize].take().map(|z| z.span)
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
        let zs = self.zspages[id as usize]
            .as_mut()
            .expect("zspage id in use");
        zs.group = want;
        if want != FULL {
            let list = &mut self.groups[want as usize];
            zs.pos = list.len();
            list.push(id);
        }
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
    fn handle_of(&mut self, backptr: u32, old: Loc) -> Option<u32> {
        if self
            .handles
            .get_mut_any_gen(backptr)
            .is_some_and(|l| *l == old)
        {
            return Some(backptr);
        }
        self.handles.find_index(|l| *l == old)
    }
}
