//! How far each stack fell below what it holds now since the last sample: a sample reads what a
//! stack holds at one instant, and a stack that holds two blocks for most of the time and one
//! between (an accumulator grown by copying: `acc = torch.cat([acc, x])` makes the new tensor,
//! copies, then frees the old one) is caught holding two at random. Its floor is the least it
//! held between samples, which these tell. So for the brk heap's pages: its top is moved a
//! hundred times a second in a PyTorch job, and a stack whose pages were trimmed and grown again
//! between two samples held less between them than either shows.

use std::hash::Hash;

use rustc_hash::FxHashMap;
use tracer_common::AllocFn;

use super::{Origin, blocks::Block};
use crate::model::StackId;

/// Per key (a stack of one process), its bytes as made and freed since it was first seen (a
/// level, not what it holds: what was made before its layer went in is not counted, and blocks
/// forgotten are not freed), and the least that level was after a fall since the last sample
/// (none: it fell nowhere below what it holds now).
#[derive(Clone, Debug)]
pub struct Dips<K> {
    stacks: FxHashMap<K, Level>,
}

impl<K> Default for Dips<K> {
    fn default() -> Self {
        Self {
            stacks: FxHashMap::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Level {
    now: i64,
    least: Option<i64>,
}

/// The key of a brk heap's pages: their stack, and whether a forked child inherited them (the
/// group they count in).
pub type PagesKey = (Option<StackId>, bool);

/// The key of pages of `origin`.
pub fn pages_key(origin: &Origin) -> PagesKey {
    (origin.stack, origin.inherited)
}

/// The stack of `b`, where it is a CPU tensor: heap blocks are not followed (a level kept per
/// stack for every malloc and free slowed the test binary's ingest enough to shift when a Python
/// objects' window closed).
fn tensor_stack(b: &Block) -> Option<StackId> {
    (b.origin.func == Some(AllocFn::C10AllocCpu))
        .then_some(b.origin.stack)
        .flatten()
}

impl Dips<StackId> {
    /// Block `b` made.
    pub fn made(&mut self, b: &Block) {
        if let Some(s) = tensor_stack(b) {
            self.rise(s, b.size);
        }
    }

    /// Block `b` freed (or replaced at its address).
    pub fn freed(&mut self, b: &Block) {
        if let Some(s) = tensor_stack(b) {
            self.fall(s, b.size);
        }
    }
}

impl<K: Hash + Eq> Dips<K> {
    /// `key` gained `bytes`.
    pub fn rise(&mut self, key: K, bytes: u64) {
        self.stacks.entry(key).or_default().now += bytes as i64;
    }

    /// `key` gave back `bytes`.
    pub fn fall(&mut self, key: K, bytes: u64) {
        let l = self.stacks.entry(key).or_default();
        l.now -= bytes as i64;
        l.least = Some(l.least.map_or(l.now, |least| least.min(l.now)));
    }

    /// How far below what it holds now `key` held at its least since the last sample.
    pub fn dip(&self, key: &K) -> u64 {
        let level = self.stacks.get(key);
        level.map_or(0, |l| (l.now - l.least.unwrap_or(l.now)).max(0) as u64)
    }

    /// A sample was taken: the least begins again; keys back at zero are dropped (a stack
    /// used once costs nothing from then on).
    pub fn sampled(&mut self) {
        self.stacks.retain(|_, l| {
            l.least = None;
            l.now != 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(n: u32) -> Option<StackId> {
        Some(StackId::new(n))
    }

    /// A CPU tensor of `size` bytes made at stack 7.
    fn t(size: u64) -> Block {
        Block {
            size,
            origin: crate::ledger::Origin {
                stack: stack(7),
                ts_ns: 0,
                func: Some(AllocFn::C10AllocCpu),
                inherited: false,
            },
        }
    }

    #[test]
    fn an_accumulator_grown_by_copying_dips_to_one_block_between_samples() {
        let mut d = Dips::default();
        let s = StackId::new(7);
        d.made(&t(100));
        d.sampled();
        // Step: the new block made (both held), the old one freed; then the next step's new
        // block made, and the sample comes while both are held.
        d.made(&t(110));
        d.freed(&t(100));
        d.made(&t(120));
        assert_eq!(d.dip(&s), 120, "it held 110 at its least since, 230 now");
        d.sampled();
        assert_eq!(d.dip(&s), 0);
        d.freed(&t(110));
        assert_eq!(
            d.dip(&s),
            0,
            "a fall to what it holds now is no dip below it"
        );
        assert_eq!(d.dip(&StackId::new(8)), 0);
        d.freed(&t(120));
        d.sampled();
        assert!(d.stacks.is_empty(), "a stack back at zero is dropped");
    }
}
