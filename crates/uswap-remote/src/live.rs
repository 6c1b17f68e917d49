//! The ids this store holds a value for, with the generation of each one's last acknowledged
//! write: what reads check values against, what the TTL refresh walks, what `close` deletes.
//!
//! Kept per group (one Redis hash): a dense array of 512 generations (4 KiB per group, 8 bytes
//! per 4 KiB page when ids are dense swap slots), 0 meaning "no value".

use std::collections::HashMap;

use crate::layout::{group_of, GROUP_IDS};

#[derive(Clone)]
struct Group {
    generations: Box<[u64; GROUP_IDS as usize]>,
    live: u32,
    /// A write to this group failed part-way: the hash may hold fields that are not live, so
    /// `close` still deletes the key even when no id of it is live.
    dirty: bool,
}

impl Group {
    fn new() -> Group {
        Group {
            generations: Box::new([0; GROUP_IDS as usize]),
            live: 0,
            dirty: false,
        }
    }
}

/// Live ids and their generations (guarded by the store's mutex).
#[derive(Clone, Default)]
pub struct LiveSet {
    groups: HashMap<u64, Group>,
    next_generation: u64,
    live_ids: u64,
}

impl LiveSet {
    /// A generation for a new write: never 0, never repeated in this store.
    pub fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// The write of `id` at `generation` was acknowledged. Returns the generation whose value
    /// is now garbage (the one this write replaced, or this one when a newer write was
    /// acknowledged first: an older write never rolls the id back).
    pub fn acknowledged(&mut self, id: u64, generation: u64) -> Option<u64> {
        let group = self.groups.entry(group_of(id)).or_insert_with(Group::new);
        let slot = &mut group.generations[(id % GROUP_IDS) as usize];
        if *slot == 0 {
            group.live += 1;
            self.live_ids += 1;
        }
        let garbage = match (*slot).cmp(&generation) {
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Less => (*slot != 0).then_some(*slot),
            std::cmp::Ordering::Greater => Some(generation),
        };
        *slot = (*slot).max(generation);
        garbage
    }

    /// A write to `id`'s group failed: remember the group for `close`.
    pub fn write_failed(&mut self, id: u64) {
        self.groups
            .entry(group_of(id))
            .or_insert_with(Group::new)
            .dirty = true;
    }

    /// The generation a read of `id` must find, or `None` when the store holds no value of it.
    pub fn generation(&self, id: u64) -> Option<u64> {
        let g = self.groups.get(&group_of(id))?.generations[(id % GROUP_IDS) as usize];
        (g != 0).then_some(g)
    }

    /// Forgets `id`; returns the generation it held.
    pub fn remove(&mut self, id: u64) -> Option<u64> {
        let key = group_of(id);
        let group = self.groups.get_mut(&key)?;
        let slot = &mut group.generations[(id % GROUP_IDS) as usize];
        if *slot == 0 {
            return None;
        }
        let generation = std::mem::take(slot);
        group.live -= 1;
        self.live_ids -= 1;
        if group.live == 0 && !group.dirty {
            self.groups.remove(&key);
        }
        Some(generation)
    }

    /// Groups with at least one live id (their keys' TTL is refreshed).
    pub fn live_groups(&self) -> Vec<u64> {
        self.groups
            .iter()
            .filter(|(_, g)| g.live > 0)
            .map(|(&k, _)| k)
            .collect()
    }

    /// Every group whose key may exist (what `close` deletes); empties the set.
    pub fn drain_groups(&mut self) -> Vec<u64> {
        self.live_ids = 0;
        self.groups.drain().map(|(k, _)| k).collect()
    }

    /// How many ids hold a value.
    pub fn live_ids(&self) -> u64 {
        self.live_ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_ids_generations_and_groups() {
        let mut s = LiveSet::default();
        let g1 = s.next_generation();
        let g2 = s.next_generation();
        assert!(g1 != 0 && g2 > g1);
        assert_eq!(s.acknowledged(3, g1), None);
        assert_eq!(
            s.acknowledged(3, g2),
            Some(g1),
            "the replaced write is garbage"
        );
        assert_eq!(
            s.acknowledged(3, g1),
            Some(g1),
            "a late ack of an older write does not roll back"
        );
        assert_eq!(s.generation(3), Some(g2));
        assert_eq!(s.acknowledged(600, g1), None);
        assert_eq!(s.live_ids(), 2);
        let mut groups = s.live_groups();
        groups.sort();
        assert_eq!(groups, vec![0, 1]);
        assert_eq!(s.remove(3), Some(g2));
        assert_eq!(s.remove(3), None);
        assert_eq!(s.generation(3), None);
        assert_eq!(s.live_groups(), vec![1]);
        s.write_failed(5);
        assert_eq!(
            s.live_groups(),
            vec![1],
            "a dirty group without live ids is not refreshed"
        );
        let mut all = s.drain_groups();
        all.sort();
        assert_eq!(all, vec![0, 1], "close deletes the dirty group too");
        assert_eq!(s.live_ids(), 0);
    }
}
