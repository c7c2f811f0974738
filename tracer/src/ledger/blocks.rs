//! The outstanding heap blocks of a process, by address: a million of them is the common case
//! for a training process. One hash table doubling from 1M to 2M slots holds both tables at once
//! (three times the entries' memory, briefly); split into shards, one shard grows at a time.

use rustc_hash::FxHashMap;

use super::Origin;

const SHARDS: usize = 64;

#[derive(Clone, Debug)]
pub struct Blocks {
    shards: Box<[FxHashMap<u64, Block>]>,
}

impl Default for Blocks {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| FxHashMap::default()).collect(),
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
        self.shards[shard(addr)].insert(addr, block)
    }

    pub fn remove(&mut self, addr: &u64) -> Option<Block> {
        self.shards[shard(*addr)].remove(addr)
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
        for s in self.shards.iter_mut() {
            s.retain(|a, b| keep(a, b));
        }
    }

    pub fn clear(&mut self) {
        self.shards
            .iter_mut()
            .for_each(|s| *s = FxHashMap::default());
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
