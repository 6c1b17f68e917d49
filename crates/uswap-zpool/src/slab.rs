//! A table of values addressed by (index, generation), grown and shrunk in chunks.
//!
//! Used for each size class's handle table (handle → where the object is now) and its
//! zspages, and for the sharded table of records (units, odd same-filled words).
//!
//! - Every reuse of an entry bumps its 8-bit generation, so a stale handle is refused
//!   instead of reaching the entry's new owner (unless the entry was reused a multiple
//!   of 256 times since: a correct caller never relies on this, it only turns most
//!   use-after-free bugs into errors). A chunk that is dropped and made again starts
//!   past the highest generation it had.
//! - New entries go to the lowest chunk with a free entry, so entries crowd at the
//!   front, and a trailing chunk that empties is dropped (keeping one empty chunk after
//!   the last used one as slack against growing and shrinking on every call; none when
//!   the table is empty): the table follows the number of entries in use, up and down.
//! - Growth is one chunk of entries at a time (never a reallocation of the entries), so
//!   the heap it holds changes in small, exactly counted steps.

/// Sentinel for "no free entry" in a chunk.
const NONE: u16 = u16::MAX;

enum Entry<T> {
    Free { next: u16, gen: u8 },
    Used { gen: u8, value: T },
}

struct Chunk<T> {
    entries: Vec<Entry<T>>,
    /// First free entry (linked through `Entry::Free::next`).
    free_head: u16,
    /// Entries in use.
    used: u16,
}

/// See the module doc.
pub(crate) struct Slab<T> {
    chunks: Vec<Chunk<T>>,
    /// Bit `c` set: chunk `c` has a free entry.
    has_free: Vec<u64>,
    /// For each chunk number ever dropped: the generation its entries start at when
    /// it is made again.
    regrow_gen: Vec<u8>,
    /// Entries per chunk (at most 65535).
    chunk_entries: usize,
    /// Indices stay below this (they are packed into handles).
    max_entries: u32,
}

impl<T> Slab<T> {
    /// An empty table of at most `max_entries`, grown `chunk_entries` at a time.
    pub(crate) fn new(chunk_entries: usize, max_entries: u32) -> Slab<T> {
        assert!((1..NONE as usize).contains(&chunk_entries));
        Slab {
            chunks: Vec::new(),
            has_free: Vec::new(),
            regrow_gen: Vec::new(),
            chunk_entries,
            max_entries,
        }
    }

    fn split(&self, idx: u32) -> (usize, usize) {
        (
            idx as usize / self.chunk_entries,
            idx as usize % self.chunk_entries,
        )
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk<T>>()
            + self.chunks.len() * self.chunk_entries * std::mem::size_of::<Entry<T>>()
            + self.has_free.capacity() * std::mem::size_of::<u64>()
            + self.regrow_gen.capacity()
    }

    /// Entries in use.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.used as usize).sum()
    }

    /// Store `value`; its (index, generation), or the value back when the index space
    /// is full.
    pub(crate) fn insert(&mut self, value: T) -> Result<(u32, u8), T> {
        let c = match self.lowest_with_free().or_else(|| self.grow()) {
            Some(c) => c,
            None => return Err(value),
        };
        let chunk = &mut self.chunks[c];
        let i = chunk.free_head as usize;
        let Entry::Free { next, gen } = chunk.entries[i] else {
            unreachable!("free list points at a used entry");
        };
        chunk.entries[i] = Entry::Used { gen, value };
        chunk.free_head = next;
        chunk.used += 1;
        if next == NONE {
            self.has_free[c / 64] &= !(1 << (c % 64));
        }
        Ok(((c * self.chunk_entries + i) as u32, gen))
    }

    /// The values in use, in index order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.chunks
            .iter()
            .flat_map(|c| c.entries.iter())
            .filter_map(|e| match e {
                Entry::Used { value, .. } => Some(value),
                Entry::Free { .. } => None,
            })
    }

    /// The value at (idx, gen), if that entry is in use with that generation.
    pub(crate) fn get(&self, idx: u32, gen: u8) -> Option<&T> {
        let (c, i) = self.split(idx);
        match self.chunks.get(c)?.entries.get(i)? {
            Entry::Used { gen: g, value } if *g == gen => Some(value),
            _ => None,
        }
    }

    /// The value at `idx` whatever its generation, if in use (for owners that do not
    /// hand the index out, and for compaction, which finds it in the object).
    pub(crate) fn get_any_gen(&self, idx: u32) -> Option<&T> {
        let (c, i) = self.split(idx);
        match self.chunks.get(c)?.entries.get(i)? {
            Entry::Used { value, .. } => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// Mutable [`Slab::get_any_gen`].
    pub(crate) fn get_mut_any_gen(&mut self, idx: u32) -> Option<&mut T> {
        let (c, i) = self.split(idx);
        match self.chunks.get_mut(c)?.entries.get_mut(i)? {
            Entry::Used { value, .. } => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// The index of the first entry in use whose value satisfies `pred` (a scan).
    pub(crate) fn find_index(&self, pred: impl Fn(&T) -> bool) -> Option<u32> {
        self.chunks
            .iter()
            .flat_map(|c| c.entries.iter())
            .position(|e| matches!(e, Entry::Used { value, .. } if pred(value)))
            .map(|i| i as u32)
    }

    /// Take the value out of (idx, gen), if that entry is in use with that generation.
    pub(crate) fn remove(&mut self, idx: u32, gen: u8) -> Option<T> {
        self.get(idx, gen)?;
        self.remove_any_gen(idx)
    }

    /// Take the value out of `idx` whatever its generation, if in use.
    pub(crate) fn remove_any_gen(&mut self, idx: u32) -> Option<T> {
        let (c, i) = self.split(idx);
        let chunk = self.chunks.get_mut(c)?;
        let gen = match chunk.entries.get(i)? {
            Entry::Used { gen, .. } => *gen,
            Entry::Free { .. } => return None,
        };
        let old = std::mem::replace(
            &mut chunk.entries[i],
            Entry::Free {
                next: chunk.free_head,
                gen: gen.wrapping_add(1),
            },
        );
        chunk.free_head = i as u16;
        chunk.used -= 1;
        self.has_free[c / 64] |= 1 << (c % 64);
        self.drop_empty_tail();
        match old {
            Entry::Used { value, .. } => Some(value),
            Entry::Free { .. } => unreachable!("checked in use above"),
        }
    }

    fn lowest_with_free(&self) -> Option<usize> {
        self.has_free
            .iter()
            .enumerate()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| i * 64 + w.trailing_zeros() as usize)
    }

    /// Add one chunk of free entries; its number.
    fn grow(&mut self) -> Option<usize> {
        let c = self.chunks.len();
        let n = self.chunk_entries;
        if (c + 1) * n > self.max_entries as usize {
            return None;
        }
        let gen = self.regrow_gen.get(c).copied().unwrap_or(0);
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let next = if i + 1 < n { (i + 1) as u16 } else { NONE };
            entries.push(Entry::Free { next, gen });
        }
        self.chunks.push(Chunk {
            entries,
            free_head: 0,
            used: 0,
        });
        if self.has_free.len() * 64 <= c {
            self.has_free.push(0);
        }
        self.has_free[c / 64] |= 1 << (c % 64);
        Some(c)
    }

    /// Drop trailing empty chunks, keeping one after the last used one.
    fn drop_empty_tail(&mut self) {
        loop {
            let keep = match &self.chunks[..] {
                [] => true,
                [only] => only.used != 0,
                [.., before, last] => last.used != 0 || before.used != 0,
            };
            if keep {
                break;
            }
            let c = self.chunks.len() - 1;
            let dropped = self.chunks.pop().expect("checked above");
            let top = dropped
                .entries
                .iter()
                .map(|e| match e {
                    Entry::Free { gen, .. } => *gen,
                    Entry::Used { .. } => unreachable!("chunk is empty"),
                })
                .max()
                .unwrap_or(0);
            if self.regrow_gen.len() <= c {
                self.regrow_gen.resize(c + 1, 0);
            }
            self.regrow_gen[c] = top.wrapping_add(1);
            self.has_free[c / 64] &= !(1 << (c % 64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = 256;

    #[test]
    fn stale_generations_are_refused_and_entries_reused() {
        let mut s = Slab::new(CHUNK, u32::MAX);
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
        assert_eq!(s.get_any_gen(b), Some(&20));
        assert_eq!(s.find_index(|v| *v == 20), Some(b));
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(1 << 30, 0), None);
    }

    #[test]
    fn index_space_limit_is_honoured() {
        let mut s = Slab::new(CHUNK, CHUNK as u32);
        for i in 0..CHUNK {
            assert!(s.insert(i).is_ok());
        }
        assert_eq!(s.insert(0), Err(0));
    }

    #[test]
    fn the_table_shrinks_when_entries_go_and_fills_from_the_front() {
        let mut s = Slab::new(CHUNK, u32::MAX);
        let one_chunk = {
            let mut t = Slab::new(CHUNK, u32::MAX);
            t.insert(0u64).unwrap();
            t.heap_bytes()
        };
        let ids: Vec<(u32, u8)> = (0..10 * CHUNK as u64)
            .map(|v| s.insert(v).unwrap())
            .collect();
        let full = s.heap_bytes();
        assert!(full > 9 * one_chunk);
        // Free the back half: its chunks go (one kept as slack).
        for &(i, g) in &ids[5 * CHUNK..] {
            s.remove(i, g).unwrap();
        }
        assert_eq!(s.chunks.len(), 6);
        // New entries fill holes at the front first.
        s.remove(ids[3].0, ids[3].1).unwrap();
        assert_eq!(s.insert(99).unwrap().0, ids[3].0);
        for &(i, g) in &ids[..5 * CHUNK] {
            if i != ids[3].0 {
                s.remove(i, g).unwrap();
            }
        }
        s.remove_any_gen(ids[3].0).unwrap();
        assert_eq!(s.len(), 0);
        assert_eq!(s.chunks.len(), 0, "an empty table keeps chunks");
        assert!(s.heap_bytes() < full / 5);
        // Still usable, and a handle from before the chunk was dropped stays refused.
        let (i, g) = s.insert(7).unwrap();
        assert_eq!(s.get(i, g), Some(&7));
        assert_eq!(i, ids[0].0);
        assert_eq!(s.get(ids[0].0, ids[0].1), None, "stale handle after regrow");
    }
}
