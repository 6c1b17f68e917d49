//! Tiers: where a swapped page's bytes go, in the shape of the kernel's zswap in
//! front of a swap device.
//!
//! - The *front* tier (optional) is compressed RAM (`compressed.rs`): synchronous —
//!   a page is compressed into the pool, or rejected (compresses poorly, pool full)
//!   and goes on to the back; a fault decompresses it straight into its frame.
//! - The *back* tier is asynchronous: a swap file or block device (`file.rs`, O_DIRECT
//!   through each thread's io_uring), or remote memory. Requests ([`Op`]) complete
//!   later, on the thread that submitted them, through the same completion path
//!   whatever the tier ([`crate::fault::complete`]).
//!
//! Every swapped page has a slot (a swap entry), whichever tier holds it, so the
//! swap cache, readahead, fork and the stale-slot policy work by slot unchanged. This
//! process's [`SlotMeta`] says per slot which tier holds the bytes, the checksum of
//! what was written to the back tier, and whose page it is.

pub(crate) mod compressed;
pub(crate) mod file;
pub(crate) mod packed;
pub(crate) mod remote;
pub(crate) mod seal;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::pagemap::RegionInner;
use crate::slots::{Slot, CLUSTER_SLOTS};
use crate::threads::ThreadCtx;
use crate::PAGE_SIZE;
use file::SwapFile;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Tier → frames.
    Read,
    /// Frames → tier.
    Write,
}

/// One request to the back tier: `pages[i]` of `region` ↔ slot `slot + i`, its bytes
/// in `frames[i]`. The frames belong to swap-cache entries that end only when the
/// request completes, so they stay valid and untouched while it is in flight.
pub struct Op {
    /// Direction.
    pub kind: OpKind,
    /// Owner of the pages (kept alive while the I/O is in flight).
    pub region: Arc<RegionInner>,
    /// Region page indices, in slot order.
    pub pages: Vec<u64>,
    /// The frame of each page.
    pub frames: Vec<usize>,
    /// First slot.
    pub slot: Slot,
    /// Tries so far.
    pub attempt: u8,
    /// Part of a whole-unit (2 MiB) swap-in: map the unit whole when all parts are in.
    pub unit_read: bool,
    /// A read's pages whose bytes did not come back (a remote value missing, lost or
    /// damaged) although the request completed: bad whatever their frames hold (with
    /// checksums off nothing else would tell, and a frame may hold another page's
    /// bytes). Empty: none.
    pub lost: Vec<bool>,
    /// A write of part of a packed unit (`packed.rs`): its frames hold the packed
    /// bytes, not pages; `pages` only name the unit (and size the request).
    pub(crate) packed: Option<Arc<packed::PackedWrite>>,
    iov: Vec<libc::iovec>,
}

// SAFETY: the iovecs point into frames of the pool's arenas, which live as long as
// the engine and belong to this request until it completes.
unsafe impl Send for Op {}

impl Op {
    /// A request for `pages` (slot order) in `frames`, starting at `slot`.
    pub fn new(
        kind: OpKind,
        region: Arc<RegionInner>,
        pages: Vec<u64>,
        frames: Vec<usize>,
        slot: Slot,
    ) -> Op {
        debug_assert_eq!(pages.len(), frames.len());
        let iov = crate::ring::coalesce_iov(&frames);
        Op {
            kind,
            region,
            pages,
            frames,
            slot,
            attempt: 0,
            unit_read: false,
            lost: Vec::new(),
            packed: None,
            iov,
        }
    }

    /// Pages of the budget that leave it when this write completes: its frames (then
    /// clean, droppable).
    fn budget_pages(&self) -> i64 {
        self.pages.len() as i64
    }

    /// Bytes the request moves.
    pub fn bytes(&self) -> usize {
        self.pages.len() * PAGE_SIZE
    }

    /// The gather/scatter list over the frames.
    pub(crate) fn iov(&self) -> &[libc::iovec] {
        &self.iov
    }
}

/// Which tier holds a slot's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Location {
    /// Nothing written yet (or given back).
    None = 0,
    /// The back tier, at the slot.
    Back = 1,
    /// The compressed pool.
    Compressed = 2,
    /// The back tier, in a packed unit (`packed.rs`): the slot names the page, the
    /// unit's bytes are compressed in slots of their own.
    Packed = 3,
}

/// Slots per leaf table (4096 clusters: 8 GiB of swap).
const LEAF_SLOTS: u64 = 4096 * CLUSTER_SLOTS;

/// One cluster's words.
type ClusterWords = OnceLock<Box<[AtomicU64]>>;
/// One leaf: the words of 4096 clusters.
type Leaf = OnceLock<Box<[ClusterWords]>>;

/// A table of one atomic word per slot, made a cluster at a time on first use (two
/// levels, so that a swap area of terabytes costs nothing until used).
pub(crate) struct SlotWords {
    leaves: Box<[Leaf]>,
}

impl SlotWords {
    pub(crate) fn new(max_slots: u64) -> SlotWords {
        let n = max_slots.div_ceil(LEAF_SLOTS).max(1) as usize;
        SlotWords {
            leaves: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    pub(crate) fn word(&self, slot: Slot, make: bool) -> Option<&AtomicU64> {
        let leaf = self.leaves.get((slot / LEAF_SLOTS) as usize)?;
        let leaf = if make {
            leaf.get_or_init(|| {
                (0..LEAF_SLOTS / CLUSTER_SLOTS)
                    .map(|_| OnceLock::new())
                    .collect()
            })
        } else {
            leaf.get()?
        };
        let c = &leaf[((slot % LEAF_SLOTS) / CLUSTER_SLOTS) as usize];
        let words = if make {
            c.get_or_init(|| (0..CLUSTER_SLOTS).map(|_| AtomicU64::new(0)).collect())
        } else {
            c.get()?
        };
        Some(&words[(slot % CLUSTER_SLOTS) as usize])
    }
}

/// Per-slot records of this process: which tier holds the slot's bytes and the
/// checksum of what was written to the back tier (one word: 56 bits of xxh3 and the
/// location), and, for readahead by slot, whose page it is.
pub(crate) struct SlotMeta {
    words: SlotWords,
    owners: SlotWords,
}

const LOC_BITS: u64 = 8;

impl SlotMeta {
    /// Records for up to `max_slots` slots.
    pub(crate) fn new(max_slots: u64) -> SlotMeta {
        SlotMeta {
            words: SlotWords::new(max_slots),
            owners: SlotWords::new(max_slots),
        }
    }

    /// Bytes of metadata per slot (charged with each region's page map).
    pub(crate) const BYTES_PER_SLOT: u64 = 8;

    /// Record where `slot`'s bytes are, and their checksum.
    pub(crate) fn set(&self, slot: Slot, loc: Location, hash: u64) {
        if let Some(w) = self.words.word(slot, true) {
            w.store(hash << LOC_BITS | loc as u64, Relaxed);
        }
    }

    /// Where `slot`'s bytes are.
    pub(crate) fn location(&self, slot: Slot) -> Location {
        match self
            .words
            .word(slot, false)
            .map_or(0, |w| w.load(Relaxed) & 0xff)
        {
            1 => Location::Back,
            2 => Location::Compressed,
            3 => Location::Packed,
            _ => Location::None,
        }
    }

    /// Whether `hash` (a full xxh3) matches the checksum recorded for `slot`.
    pub(crate) fn hash_matches(&self, slot: Slot, hash: u64) -> bool {
        self.words
            .word(slot, false)
            .is_some_and(|w| w.load(Relaxed) >> LOC_BITS == hash << LOC_BITS >> LOC_BITS)
    }

    /// Forget `slot`'s bytes (freed, or their tier gave them back).
    pub(crate) fn clear(&self, slot: Slot) {
        if let Some(w) = self.words.word(slot, false) {
            w.store(0, Relaxed);
        }
    }

    /// Record that `slot` holds `page` of region `region` (readahead by slot only).
    pub(crate) fn set_owner(&self, slot: Slot, region: u32, page: u64) {
        if let Some(w) = self.owners.word(slot, true) {
            w.store((region as u64) << 40 | (page + 1), Relaxed);
        }
    }

    /// Who was last written to `slot` (may be stale: callers check the page map).
    pub(crate) fn owner(&self, slot: Slot) -> Option<(u32, u64)> {
        let v = self.owners.word(slot, false)?.load(Relaxed);
        let page = v & ((1 << 40) - 1);
        (page != 0).then(|| ((v >> 40) as u32, page - 1))
    }
}

/// Requests in flight on the back tier, over all threads (reclaim reads them to
/// decide whether waiting will make room).
#[derive(Default)]
pub(crate) struct Inflight {
    /// Reads and writes.
    pub(crate) requests: AtomicI64,
    /// Writes.
    pub(crate) writes: AtomicI64,
    /// Pages being written: they leave the budget when their writes complete.
    pub(crate) write_pages: AtomicI64,
}

/// The back tier.
pub(crate) enum Back {
    /// A swap file or block device.
    File(RwLock<SwapFile>),
}

/// The pool's tiers.
pub(crate) struct Tiers {
    pub(crate) meta: SlotMeta,
    /// Encryption of what goes to the back tier, if on (`seal.rs`).
    pub(crate) seal: Option<seal::Sealer>,
    /// Pages written to the back tier are hashed, and checked when read (off only to
    /// measure what that costs: `PoolBuilder::checksums`).
    pub(crate) checksums: bool,
    /// The compressed tier in front, if configured.
    pub(crate) compressed: Option<compressed::Compressed>,
    pub(crate) back: Back,
    /// Whether pages may be written to the back tier (not with `--tier compressed`,
    /// where the file only names slots and stays empty).
    pub(crate) back_writes: bool,
    /// The remote tier: the back tier's pages go there (the file only names slots).
    pub(crate) remote: Option<remote::Remote>,
    /// Units written back packed (compressed) to the back tier.
    pub(crate) packed: packed::Packed,
    pub(crate) inflight: Inflight,
}

impl Tiers {
    /// Tiers as configured: the back tier opened, records for `max_slots`.
    pub(crate) fn new(
        file: SwapFile,
        compressed: Option<compressed::Compressed>,
        remote: Option<remote::Remote>,
        back_writes: bool,
        max_slots: u64,
        seal: Option<seal::Sealer>,
        checksums: bool,
    ) -> Tiers {
        if remote.is_some() || !back_writes {
            file.set_sparse();
        }
        // Packed writeback: compressed units to the file, in the clear (sealed pages
        // are written one by one, with their tags).
        let packs = compressed.is_some() && back_writes && remote.is_none() && seal.is_none();
        Tiers {
            meta: SlotMeta::new(max_slots),
            seal,
            checksums,
            compressed,
            back: Back::File(RwLock::new(file)),
            packed: packed::Packed::new(packs),
            back_writes,
            remote,
            inflight: Inflight::default(),
        }
    }

    /// The swap file (the back tier).
    pub(crate) fn file(&self) -> std::sync::RwLockReadGuard<'_, SwapFile> {
        match &self.back {
            Back::File(f) => f.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// The swap file, for a fork (every thread quiesced).
    pub(crate) fn file_mut(&self) -> std::sync::RwLockWriteGuard<'_, SwapFile> {
        match &self.back {
            Back::File(f) => f.write().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// The checksum to record for a page about to be written to the back tier (0 when
    /// checksums are off: it then matches no page, so a clean page mapped by a move is
    /// written again rather than trusted, `unit.rs`).
    pub(crate) fn checksum(&self, bytes: &[u8]) -> u64 {
        if self.checksums {
            page_hash(bytes)
        } else {
            0
        }
    }

    /// Bytes of this process's records per slot (charged with each region's page map).
    pub(crate) fn bytes_per_slot(&self) -> u64 {
        SlotMeta::BYTES_PER_SLOT
            + self
                .seal
                .as_ref()
                .map_or(0, |_| seal::Sealer::BYTES_PER_SLOT)
    }

    /// Whether the bytes just read into `frame` from `slot` (on the back tier) are
    /// what was written there: with encryption, decrypted in place and authenticated
    /// by the tag; else checked against the checksum. False: a wrong page (its frame
    /// holds garbage), to read again or give up.
    pub(crate) fn verify_page(
        &self,
        frames: &crate::frames::Frames,
        slot: Slot,
        frame: usize,
    ) -> bool {
        match &self.seal {
            Some(s) => s.open(slot, frames.page_mut(frame)),
            None if !self.checksums => true,
            None => self.meta.hash_matches(slot, page_hash(frames.page(frame))),
        }
    }

    /// Slot space now, in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.file().capacity()
    }

    /// A region of `len` bytes (asked: `size`) joins `committed` bytes, `need` in all.
    /// A fixed-size swap file must be able to hold them all (else `SwapFull`); a file
    /// that only names slots grows now (it takes no disk). A growable file on a disk
    /// takes nothing here: it grows as pages are evicted (`writeback::grow_slots`),
    /// as kernel swap is used only by the pages swapped out.
    pub(crate) fn commit(&self, need: u64, size: u64, len: u64, committed: u64) -> Result<()> {
        let f = self.file();
        let base = f.base() * PAGE_SIZE as u64;
        match f.fixed_size() {
            Some(cap) if need > cap + base => Err(Error::SwapFull {
                requested: size,
                needed: len,
                capacity: cap,
                committed,
            }),
            None if f.is_sparse() => f.ensure(need + base).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Whether one request may read slots `slot` and `slot + 1` together (both in
    /// one file: after a fork, slots run on from an inherited file into the next).
    pub(crate) fn continues(&self, slot: Slot) -> bool {
        self.file().continues(slot)
    }

    /// Start `op` on the back tier, on this thread.
    pub(crate) fn submit(&self, e: &Engine, ctx: &mut ThreadCtx, op: Op) {
        self.inflight.requests.fetch_add(1, Relaxed);
        if op.kind == OpKind::Write {
            self.inflight.writes.fetch_add(1, Relaxed);
            self.inflight
                .write_pages
                .fetch_add(op.budget_pages(), Relaxed);
        }
        if let Some(remote) = &self.remote {
            match ctx.remote.as_mut() {
                Some(rc) => {
                    rc.submit(remote, &e.frames, op);
                    rc.arm(&mut ctx.ring);
                }
                // No connection on this thread (a forked child): the request fails.
                None => ctx.failed.push((op, -libc::EIO)),
            }
            return;
        }
        let file = self.file();
        if op.kind == OpKind::Write && !file.fill_holes(op.slot, op.pages.len() as u64) {
            drop(file);
            ctx.failed.push((op, -libc::ENOSPC));
            return;
        }
        let loc = file.locate(op.slot);
        drop(file);
        ctx.ring.queue(op, loc);
    }

    /// In a forked child: the parent's requests are not ours.
    pub(crate) fn inflight_reset(&self) {
        self.inflight.requests.store(0, Relaxed);
        self.inflight.writes.store(0, Relaxed);
        self.inflight.write_pages.store(0, Relaxed);
    }

    /// A request finished (whatever its result); its completion is handled next.
    pub(crate) fn finished(&self, done: Finished) {
        self.inflight.requests.fetch_sub(1, Relaxed);
        if done.write {
            self.inflight.writes.fetch_sub(1, Relaxed);
            self.inflight.write_pages.fetch_sub(done.pages, Relaxed);
        }
    }

    /// This process's page no longer needs slot `s` (rewritten, discarded, its region
    /// dropped): the reference goes, and with the last one the slot and its bytes.
    /// Slots of a file inherited at a fork are never reused here; the file is closed
    /// with this process's last page in it.
    pub(crate) fn release(&self, e: &Engine, s: Slot) {
        // A compressed copy is this process's own: it goes with this page's reference.
        if let Some(c) = &self.compressed {
            if c.release(s) {
                crate::tier::compressed::charge_pool(e, c);
            }
        }
        // A packed page's blob counts the references on its pages' slots.
        if self.meta.location(s) == Location::Packed {
            self.packed.ref_gone(e, s);
        }
        if self.file().release_inherited(s) {
            e.slots.put(s);
            return;
        }
        e.slots.put_with(s, || self.forget(s));
    }

    /// The swap cache lets go of `s` (`SlotAllocator::clear_cache`); when that was its
    /// last user, what the tiers keep for it goes too, as in `release`.
    pub(crate) fn clear_cache(&self, e: &Engine, s: Slot) {
        e.slots.clear_cache_with(s, || self.forget_own(s));
    }

    /// Drop one of the references a forked child held on `s` (the child is gone).
    pub(crate) fn put_child_ref(&self, e: &Engine, s: Slot) {
        if self.meta.location(s) == Location::Packed {
            self.packed.ref_gone(e, s);
        }
        e.slots.put_with(s, || self.forget_own(s));
    }

    /// Let go of one reference on each slot of `run` (a packed unit's hold on its
    /// blocks), as `release` does: a slot freed forgets what was kept for it.
    pub(crate) fn put_run(&self, e: &Engine, run: crate::slots::SlotRun) {
        for s in run.start..run.start + u64::from(run.len) {
            e.slots.put_with(s, || self.forget_own(s));
        }
    }

    /// A fork takes a reference on `s` for its child.
    pub(crate) fn dup_for_child(&self, e: &Engine, s: Slot) {
        e.slots.dup(s);
        if self.meta.location(s) == Location::Packed {
            self.packed.ref_added(s);
        }
    }

    /// `forget`, for a slot of this process's own file (an inherited file's slot has
    /// nothing of this process's kept for it).
    fn forget_own(&self, s: Slot) {
        if s >= self.file().base() {
            self.forget(s);
        }
    }

    /// `s` became free: its metadata and its remote value go. Called under the slot's
    /// cluster lock, so before `s` can be handed out again: done after, it wiped what
    /// the slot's next user had just stored (its checksum, its remote value).
    fn forget(&self, s: Slot) {
        self.meta.clear(s);
        if let Some(r) = &self.remote {
            r.release(s);
        }
    }
}

/// The checksum of one page (xxh3, 64 bits).
pub(crate) fn page_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// What the in-flight counts forget once a request's completion has been handled.
#[derive(Clone, Copy)]
pub(crate) struct Finished {
    write: bool,
    /// What the write counted in `write_pages` (`Op::budget_pages`).
    pages: i64,
}

impl Finished {
    pub(crate) fn of(op: &Op) -> Finished {
        Finished {
            write: op.kind == OpKind::Write,
            pages: op.budget_pages(),
        }
    }
}
