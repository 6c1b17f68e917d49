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
    used: Box<[u64]>,
}

impl ZsPage {
    pub(crate) fn new(span: Span, geom: &Geometry) -> ZsPage {
        ZsPage {
            span,
            inuse: 0,
            group: 0,
            pos: 0,
            used: vec![0; bitmap_words(geom)].into_boxed_slice(),
        }
    }

    /// Take the lowest free slot (the caller knows there is one).
    pub(crate) fn take_slot(&mut self) -> usize {
        for (w, word) in self.used.iter_mut().enumerate() {
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
        self.used[slot / 64] &= !(1 << (slot % 64));
        self.inuse -= 1;
    }

    pub(crate) fn is_used(&self, slot: usize) -> bool {
        self.used[slot / 64] & (1 << (slot % 64)) != 0
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
pub(crate) fn bitmap_words(geom: &Geometry) -> usize {
    geom.objs.div_ceil(64)
}
