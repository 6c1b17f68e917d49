//! A zspage: one span of pages cut into equal object slots of its class.

use super::arena::Span;
use super::size_class::Geometry;

/// Fullness groups of zspages that are neither empty nor full: group `g` holds those
/// with `g/GROUPS <= in use / slots < (g+1)/GROUPS`. Allocation takes the fullest
/// group first (so sparse zspages drain and can be freed); compaction moves objects out
/// of the sparsest into the fullest.
pub(crate) const GROUPS: usize = 4;
/// `ZsPage::group` of a full zspage (kept in no group list).
pub(crate) const FULL: u8 = GROUPS as u8;

/// See the module doc.
pub(crate) struct ZsPage {
    pub(crate) span: Span,
    /// Slots in use.
    pub(crate) inuse: usize,
    /// Fullness group, or [`FULL`].
    pub(crate) group: u8,
    /// Position in its group's list (meaningless when full).
    pub(crate) pos: usize,
    /// One bit per slot, set when in use.
    used: Bitmap,
}

/// The in-use bits: in the zspage itself for up to 64 slots (every class from 512
/// bytes up: no allocation per zspage), else on the heap.
enum Bitmap {
    One(u64),
    Many(Box<[u64]>),
}

impl Bitmap {
    fn words(&self) -> &[u64] {
        match self {
            Bitmap::One(w) => std::slice::from_ref(w),
            Bitmap::Many(ws) => ws,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match self {
            Bitmap::One(w) => std::slice::from_mut(w),
            Bitmap::Many(ws) => ws,
        }
    }
}

impl ZsPage {
    pub(crate) fn new(span: Span, geom: &Geometry) -> ZsPage {
        ZsPage {
            span,
            inuse: 0,
            group: 0,
            pos: 0,
            used: match bitmap_words(geom) {
                1 => Bitmap::One(0),
                n => Bitmap::Many(vec![0; n].into_boxed_slice()),
            },
        }
    }

    /// Take the lowest free slot (the caller knows there is one).
    pub(crate) fn take_slot(&mut self) -> usize {
        for (w, word) in self.used.words_mut().iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = word.trailing_ones() as usize;
                *word |= 1 << bit;
                self.inuse += 1;
                return w * 64 + bit;
            }
        }
        unreachable!("take_slot on a full zspage")
    }

    pub(crate) fn release_slot(&mut self, slot: usize) {
        debug_assert!(self.is_used(slot));
        self.used.words_mut()[slot / 64] &= !(1 << (slot % 64));
        self.inuse -= 1;
    }

    pub(crate) fn is_used(&self, slot: usize) -> bool {
        self.used.words()[slot / 64] & (1 << (slot % 64)) != 0
    }

    /// The bytes of `slot`.
    pub(crate) fn slot(&self, geom: &Geometry, slot: usize) -> &[u8] {
        &self.span[slot * geom.size..(slot + 1) * geom.size]
    }

    pub(crate) fn slot_mut(&mut self, geom: &Geometry, slot: usize) -> &mut [u8] {
        &mut self.span[slot * geom.size..(slot + 1) * geom.size]
    }

    /// The group a zspage with this fill belongs to.
    pub(crate) fn fullness(&self, geom: &Geometry) -> u8 {
        if self.inuse >= geom.objs {
            FULL
        } else {
            (self.inuse * GROUPS / geom.objs) as u8
        }
    }
}

/// Words of the in-use bitmap for a zspage of `geom`.
fn bitmap_words(geom: &Geometry) -> usize {
    geom.objs.div_ceil(64)
}

/// Heap bytes of one zspage's bitmap (0 when it fits inline).
pub(crate) fn bitmap_heap_bytes(geom: &Geometry) -> usize {
    match bitmap_words(geom) {
        1 => 0,
        n => n * std::mem::size_of::<u64>(),
    }
}
