//! The outstanding heap blocks of a process, by address: a million of them is the common case
//! for a training process. One hash table doubling from 1M to 2M slots holds both tables at once
//! (three times the entries' memory, briefly); split into shards, one shard grows at a time.
//! The large blocks are also kept in address order: an allocator maps each of them on its own,
//! and a block whose pages were unmapped was freed, whether its free was seen or not.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::Origin;

const SHARDS: usize = 64;

/// Blocks this large or larger are kept in address order too: glibc maps a block of 128 KiB or
/// more on its own (its threshold at the least; 64 KiB leaves room for a lowered one).
pub const LARGE: u64 = 64 << 10;

#[derive(Clone, Debug)]
pub struct Blocks {
    shards: Box<[FxHashMap<u64, Block>]>,
    large: BTreeSet<u64>,
}

impl Default for Blocks {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| FxHashMap::default()).collect(),
            large: BTreeSet::new(),
        }
    }
}

/// A heap block.
#[derive(Clone, Debug)]
pub struct Block {
    pub size: u64,
    pub origin: Origin,
}

/// Blocks are 16-byte aligned: the bits above those pick the shard.
fn shard(addr: u64) -> usize {
    ((addr >> 4) ^ (addr >> 12)) as usize % SHARDS
}

impl Blocks {
    /// The block now at `addr`; the one it replaces, if any.
    pub fn insert(&mut self, addr: u64, block: Block) -> Option<Block> {
        let large = block.size >= LARGE;
        let old = self.shards[shard(addr)].insert(addr, block);
        if large {
            self.large.insert(addr);
        } else if old.as_ref().is_some_and(|b| b.size >= LARGE) {
            self.large.remove(&addr);
        }
        old
    }

    pub fn remove(&mut self, addr: &u64) -> Option<Block> {
        let old = self.shards[shard(*addr)].remove(addr);
        if old.as_ref().is_some_and(|b| b.size >= LARGE) {
            self.large.remove(addr);
        }
        old
    }

    /// The addresses of the large blocks ([`LARGE`]) that begin in [start, end).
    pub fn large_in(&self, start: u64, end: u64) -> Vec<u64> {
        self.large.range(start..end).copied().collect()
    }

    pub fn get(&self, addr: &u64) -> Option<&Block> {
        self.shards[shard(*addr)].get(addr)
    }

    pub fn values(&self) -> impl Iterator<Item = &Block> {
        self.shards.iter().flat_map(|s| s.values())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Block)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Block> {
        self.shards.iter_mut().flat_map(|s| s.values_mut())
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.is_empty())
    }

    /// Keeps the blocks `keep` says to, by address and block.
    pub fn retain(&mut self, mut keep: impl FnMut(&u64, &Block) -> bool) {
        let large = &mut self.large;
        for s in self.shards.iter_mut() {
            s.retain(|a, b| {
                let kept = keep(a, b);
                if !kept && b.size >= LARGE {
                    large.remove(a);
                }
                kept
            });
        }
    }

    pub fn clear(&mut self) {
        self.shards
            .iter_mut()
            .for_each(|s| *s = FxHashMap::default());
        self.large.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Origin;

    #[test]
    fn blocks_are_found_by_address_across_shards() {
        let mut b = Blocks::default();
        let origin = Origin {
            stack: None,
            ts_ns: 0,
            func: None,
            inherited: false,
        };
        for i in 0..10_000u64 {
            assert!(
                b.insert(
                    0x5000_0000 + i * 48,
                    Block {
                        size: i,
                        origin: origin.clone()
                    }
                )
                .is_none()
            );
        }
        assert_eq!(b.len(), 10_000);
        assert!(
            b.shards.iter().all(|s| s.len() > 50),
            "spread over the shards"
        );
        assert_eq!(b.get(&(0x5000_0000 + 77 * 48)).map(|x| x.size), Some(77));
        assert_eq!(b.remove(&(0x5000_0000 + 77 * 48)).map(|x| x.size), Some(77));
        assert!(b.remove(&(0x5000_0000 + 77 * 48)).is_none());
        assert_eq!(
            b.values().map(|x| x.size).sum::<u64>(),
            (0..10_000).sum::<u64>() - 77
        );
        b.clear();
        assert!(b.is_empty());
    }
}
