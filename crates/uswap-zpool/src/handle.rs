//! Handles: what a caller keeps for each stored page or unit.
//!
//! A handle is a non-zero number below 2^48, so that the engine can pack it into a page
//! map word beside a few state bits (as it packs swap slots today). Layout, by the tag
//! in bits 40..48:
//!
//! | tag | entry | bits 32..40 | bits 0..32 |
//! |---|---|---|---|
//! | 1..=239 | a 4 KiB page stored as one object in size class `tag − 1` | generation | index in the class's handle table |
//! | 0xF0 / 0xF1 | a same-filled page / unit whose word is a 32-bit value repeated (zeros, 0xff.., byte and u16 patterns) | — | that 32-bit value |
//! | 0xF2 / 0xF3 | a record: a same-filled page / unit with any other word, or a compressed unit | generation | shard (bits 28..32), index (bits 0..28) |
//!
//! The class's handle table says where the object is now, so compaction moves objects
//! without changing handles. Generations make a freed handle fail (`Error::InvalidHandle`)
//! instead of reaching the entry's next owner. An inline same-filled handle carries its
//! whole content and needs no memory at all; freeing it only updates the counters.

use crate::zsmalloc::ObjRef;
use crate::{PAGE_SIZE, UNIT_SIZE};
use std::num::NonZeroU64;

/// A stored page or unit; see the module doc for its layout. Valid until freed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(NonZeroU64);

const TAG_SHIFT: u32 = 40;
const GEN_SHIFT: u32 = 32;
/// Highest object class tag (classes are numbered below 239).
const TAG_MAX_CLASS: u64 = 0xEF;
const TAG_SAME_PAGE: u64 = 0xF0;
const TAG_SAME_UNIT: u64 = 0xF1;
const TAG_RECORD_PAGE: u64 = 0xF2;
const TAG_RECORD_UNIT: u64 = 0xF3;
const SHARD_SHIFT: u32 = 28;
/// Record indices fit in 28 bits.
pub(crate) const MAX_RECORDS_PER_SHARD: u32 = 1 << SHARD_SHIFT;
/// Record shards (4 bits).
pub(crate) const RECORD_SHARDS: usize = 16;

/// A handle taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A 4 KiB page stored as one object.
    Object(ObjRef),
    /// A same-filled page or unit whose word is in the handle.
    SameFilled { unit: bool, pattern: u64 },
    /// A record in a shard of the record table.
    Record {
        unit: bool,
        shard: usize,
        idx: u32,
        gen: u8,
    },
}

impl Handle {
    /// Bits a handle needs: every handle is below `1 << Handle::BITS`.
    pub const BITS: u32 = 48;

    /// The number to keep (non-zero, below 2^48).
    pub fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// A handle from a number made by [`Handle::to_raw`]; `None` if it cannot be one.
    /// Whether it names a stored entry is checked when it is used.
    pub fn from_raw(raw: u64) -> Option<Handle> {
        if raw >> Self::BITS != 0 {
            return None;
        }
        let h = Handle(NonZeroU64::new(raw)?);
        let tag = raw >> TAG_SHIFT;
        (tag != 0 && (tag <= TAG_MAX_CLASS || (TAG_SAME_PAGE..=TAG_RECORD_UNIT).contains(&tag)))
            .then_some(h)
    }

    /// Whether this is a 2 MiB unit (else a 4 KiB page).
    pub fn is_unit(self) -> bool {
        matches!(self.tag(), TAG_SAME_UNIT | TAG_RECORD_UNIT)
    }

    /// Bytes of the data it stands for: 4096 or 2 MiB.
    pub fn data_len(self) -> usize {
        if self.is_unit() {
            UNIT_SIZE
        } else {
            PAGE_SIZE
        }
    }

    /// Whether the entry is same-filled with its word inside the handle (holds no
    /// memory at all).
    pub fn is_inline_same_filled(self) -> bool {
        matches!(self.tag(), TAG_SAME_PAGE | TAG_SAME_UNIT)
    }

    fn tag(self) -> u64 {
        self.0.get() >> TAG_SHIFT
    }

    fn make(raw: u64) -> Handle {
        Handle(NonZeroU64::new(raw).expect("every tag is non-zero"))
    }

    pub(crate) fn object(obj: ObjRef) -> Handle {
        debug_assert!((obj.class as u64) < TAG_MAX_CLASS);
        Handle::make(
            (obj.class as u64 + 1) << TAG_SHIFT | (obj.gen as u64) << GEN_SHIFT | obj.idx as u64,
        )
    }

    /// An inline same-filled handle, if `pattern` is a 32-bit value repeated.
    pub(crate) fn same_filled(unit: bool, pattern: u64) -> Option<Handle> {
        let low = pattern as u32;
        if pattern >> 32 != low as u64 {
            return None;
        }
        let tag = if unit { TAG_SAME_UNIT } else { TAG_SAME_PAGE };
        Some(Handle::make(tag << TAG_SHIFT | low as u64))
    }

    pub(crate) fn record(unit: bool, shard: usize, idx: u32, gen: u8) -> Handle {
        debug_assert!(shard < RECORD_SHARDS && idx < MAX_RECORDS_PER_SHARD);
        let tag = if unit {
            TAG_RECORD_UNIT
        } else {
            TAG_RECORD_PAGE
        };
        Handle::make(
            tag << TAG_SHIFT
                | (gen as u64) << GEN_SHIFT
                | (shard as u64) << SHARD_SHIFT
                | idx as u64,
        )
    }

    pub(crate) fn entry(self) -> Entry {
        let raw = self.0.get();
        let gen = (raw >> GEN_SHIFT) as u8;
        let low = raw as u32;
        match self.tag() {
            t @ 1..=TAG_MAX_CLASS => Entry::Object(ObjRef {
                class: (t - 1) as u8,
                gen,
                idx: low,
            }),
            t @ (TAG_SAME_PAGE | TAG_SAME_UNIT) => Entry::SameFilled {
                unit: t == TAG_SAME_UNIT,
                pattern: (low as u64) << 32 | low as u64,
            },
            t => Entry::Record {
                unit: t == TAG_RECORD_UNIT,
                shard: (low >> SHARD_SHIFT) as usize,
                idx: low & (MAX_RECORDS_PER_SHARD - 1),
                gen,
            },
        }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle({:#x}: {:?})", self.0, self.entry())
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip_below_48_bits() {
        let obj = ObjRef {
            class: 200,
            gen: 255,
            idx: u32::MAX,
        };
        let handles = [
            Handle::object(obj),
            Handle::object(ObjRef {
                class: 0,
                gen: 0,
                idx: 0,
            }),
            Handle::same_filled(false, 0).unwrap(),
            Handle::same_filled(true, u64::MAX).unwrap(),
            Handle::record(true, 15, MAX_RECORDS_PER_SHARD - 1, 7),
            Handle::record(false, 0, 0, 0),
        ];
        for h in handles {
            assert!(h.to_raw() < 1 << Handle::BITS);
            assert_eq!(Handle::from_raw(h.to_raw()), Some(h));
        }
        assert_eq!(handles[0].entry(), Entry::Object(obj));
        assert_eq!(
            handles[3].entry(),
            Entry::SameFilled {
                unit: true,
                pattern: u64::MAX
            }
        );
        assert!(handles[3].is_unit() && handles[4].is_unit() && !handles[5].is_unit());
        assert_eq!(handles[3].data_len(), UNIT_SIZE);
        assert_eq!(
            handles[4].entry(),
            Entry::Record {
                unit: true,
                shard: 15,
                idx: MAX_RECORDS_PER_SHARD - 1,
                gen: 7
            }
        );
        assert_eq!(Handle::same_filled(false, 0x1_0000_0002), None);
        assert_eq!(Handle::from_raw(0), None);
        assert_eq!(Handle::from_raw(1 << 48), None);
        assert_eq!(Handle::from_raw(0xF5 << 40), None);
        assert_eq!(Handle::from_raw(5), None, "tag 0 is no handle");
    }
}
