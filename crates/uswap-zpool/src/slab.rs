//! A table of values addressed by (index, generation), grown in fixed chunks.
//!
//! Used for the handle table of each size class (handle → where the object is now) and
//! for the sharded table of records (units, odd same-filled patterns). Freed entries are
//! reused last-in first-out; every reuse bumps the entry's 8-bit generation, so a stale
//! handle is refused instead of reaching the entry's new owner (unless the entry was
//! reused a multiple of 256 times since, which a correct caller never relies on).
//!
//! Growth is one chunk of [`CHUNK_ENTRIES`] entries at a time (never a reallocation of
//! the entries), so the heap it holds grows in small, exactly counted steps.

/// Entries per chunk.
pub(crate) const CHUNK_ENTRIES: usize = 256;

/// Sentinel for "no free entry".
const NONE: u32 = u32::MAX;

enum Entry<T> {
    Free { next: u32, gen: u8 },
    Used { gen: u8, value: T },
}

/// See the module doc.
pub(crate) struct Slab<T> {
    chunks: Vec<Vec<Entry<T>>>,
    /// Head of the list of free entries (linked through `Entry::Free::next`).
    free_head: u32,
    /// Entries in use.
    used: usize,
    /// Indices must stay below this (they are packed into handles).
    max_entries: u32,
}

impl<T> Slab<T> {
    pub(crate) fn new(max_entries: u32) -> Slab<T> {
        Slab {
            chunks: Vec::new(),
            free_head: NONE,
            used: 0,
            max_entries,
        }
    }

    /// Heap bytes held (the chunk list and the chunks).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Vec<Entry<T>>>()
            + self.chunks.len() * CHUNK_ENTRIES * std::mem::size_of::<Entry<T>>()
    }

    /// Entries in use.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// Store `value`; its (index, generation), or `None` when the index space is full.
    pub(crate) fn insert(&mut self, value: T) -> Option<(u32, u8)> {
        if self.free_head == NONE {
            self.grow()?;
        }
        let idx = self.free_head;
        let entry = self.entry_mut(idx);
        let Entry::Free { next, gen } = *entry else {
            unreachable!("free list points at a used entry");
        };
        *entry = Entry::Used { gen, value };
        self.free_head = next;
        self.used += 1;
        Some((idx, gen))
    }

    /// The value at (idx, gen), if that entry is in use with that generation.
    pub(crate) fn get(&self, idx: u32, gen: u8) -> Option<&T> {
        match self
            .chunks
            .get(idx as usize / CHUNK_ENTRIES)?
            .get(idx as usize % CHUNK_ENTRIES)?
        {
            Entry::Used { gen: g, value } if *g == gen => Some(value),
            _ => None,
        }
    }

    /// The value at `idx` whatever its generation (for compaction, which finds the
    /// index in the object itself), if in use.
    pub(crate) fn get_mut_any_gen(&mut self, idx: u32) -> Option<&mut T> {
        match self
            .chunks
            .get_mut(idx as usize / CHUNK_ENTRIES)?
            .get_mut(idx as usize % CHUNK_ENTRIES)?
        {
            Entry::Used { value, .. } => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// The index of the first entry in use whose value satisfies `pred` (a scan).
    pub(crate) fn find_index(&self, pred: impl Fn(&T) -> bool) -> Option<u32> {
        self.chunks
            .iter()
            .flatten()
            .position(|e| matches!(e, Entry::Used { value, .. } if pred(value)))
            .map(|i| i as u32)
    }

    /// Take the value out of (idx, gen), if that entry is in use with that generation.
    pub(crate) fn remove(&mut self, idx: u32, gen: u8) -> Option<T> {
        self.get(idx, gen)?;
        let free_head = self.free_head;
        let entry = self.entry_mut(idx);
        let old = std::mem::replace(
            entry,
            Entry::Free {
                next: free_head,
                gen: gen.wrapping_add(1),
            },
        );
        self.free_head = idx;
        self.used -= 1;
        match old {
            Entry::Used { value, .. } => Some(value),
            Entry::Free { .. } => unreachable!("checked in use above"),
        }
    }

    fn entry_mut(&mut self, idx: u32) -> &mut Entry<T> {
        &mut self.chunks[idx as usize / CHUNK_ENTRIES][idx as usize % CHUNK_ENTRIES]
    }

    /// Add one chunk of free entries.
    fn grow(&mut self) -> Option<()> {
        let first = self.chunks.len() * CHUNK_ENTRIES;
        if first + CHUNK_ENTRIES > self.max_entries as usize {
            return None;
        }
        let mut chunk = Vec::with_capacity(CHUNK_ENTRIES);
        for i in 0..CHUNK_ENTRIES {
            let next = if i + 1 < CHUNK_ENTRIES {
                (first + i + 1) as u32
            } else {
                self.free_head
            };
            chunk.push(Entry::Free { next, gen: 0 });
        }
        self.chunks.push(chunk);
        self.free_head = first as u32;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_generations_are_refused_and_entries_reused() {
        let mut s = Slab::new(u32::MAX);
        let (a, ga) = s.insert(10u64).unwrap();
        let (b, gb) = s.insert(20u64).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.get(a, ga), Some(&10));
        assert_eq!(s.remove(a, ga), Some(10));
        assert_eq!(s.get(a, ga), None, "removed entry still readable");
        assert_eq!(s.remove(a, ga), None, "double remove accepted");
        let (c, gc) = s.insert(30).unwrap();
        assert_eq!(c, a, "freed entry not reused");
        assert_ne!(gc, ga);
        assert_eq!(s.get(a, ga), None, "stale handle reached the new owner");
        assert_eq!(s.get(c, gc), Some(&30));
        assert_eq!(s.get(b, gb), Some(&20));
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(1 << 30, 0), None);
    }

    #[test]
    fn index_space_limit_is_honoured() {
        let mut s = Slab::new(CHUNK_ENTRIES as u32);
        for i in 0..CHUNK_ENTRIES {
            assert!(s.insert(i).is_some());
        }
        assert!(s.insert(0).is_none());
        let bytes = s.heap_bytes();
        assert!(bytes >= CHUNK_ENTRIES * std::mem::size_of::<Entry<usize>>());
    }
}
