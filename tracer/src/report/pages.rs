//! Page-level growth the heap explains. When malloc grows its heap (brk) or maps a large block
//! (mmap) inside a call, the kernel side gives that page event the call's stack: the same stack as
//! the blocks it holds. Such pages are that stack's, shown with it; standing as stacks of their own
//! they would report one leak three times, the page-level echo often the largest. Only page-level
//! growth no heap-level stack explains (a direct mmap, memory the allocator keeps after the blocks
//! went) is judged on its own.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::{
    ledger::Group,
    model::{GroupKey, Kind, StackId},
};

/// Pages the allocator mapped for a stack's blocks, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pages {
    pub kind: Kind,
    pub bytes: u64,
    pub blocks: u64,
}

/// A process's stack as the heap level and the page level share it.
type Site = (u32, Option<StackId>, bool);

fn site(k: &GroupKey) -> Site {
    (k.pid, k.stack, k.inherited)
}

fn heap_level(kind: Kind) -> bool {
    matches!(kind, Kind::Heap | Kind::Tensor)
}

fn page_level(kind: Kind) -> bool {
    matches!(kind, Kind::Brk | Kind::Mmap)
}

/// Which page-level groups a heap-level stack explains, and their pages by that stack.
#[derive(Default)]
pub struct Folded {
    /// Sites of the heap-level groups.
    heap: HashSet<Site>,
    /// The explained page-level groups' pages, waiting for their heap-level stack.
    pages: HashMap<Site, Vec<Pages>>,
}

impl Folded {
    /// The folding of a report's outstanding groups.
    pub fn of(groups: &[Group]) -> Self {
        let mut folded = Folded::default();
        folded.add_heap(groups.iter().map(Group::key));
        for g in groups {
            let key = g.key();
            if folded.explains(&key) {
                folded.pages.entry(site(&key)).or_default().push(Pages {
                    kind: g.kind,
                    bytes: g.bytes,
                    blocks: g.blocks,
                });
            }
        }
        folded
    }

    /// Counts the heap-level ones among `keys` as explaining the pages of their stacks (leaks
    /// released at the end, whose pages went with them).
    pub fn add_heap(&mut self, keys: impl IntoIterator<Item = GroupKey>) {
        let heap = keys
            .into_iter()
            .filter(|k| heap_level(k.kind) && k.stack.is_some());
        self.heap.extend(heap.map(|k| site(&k)));
    }

    /// Whether `key` is a page-level group that a heap-level stack explains.
    pub fn explains(&self, key: &GroupKey) -> bool {
        page_level(key.kind) && self.heap.contains(&site(key))
    }

    /// The pages explained by `key`'s stack, for its report (taken once).
    pub fn take(&mut self, key: &GroupKey) -> Vec<Pages> {
        if !heap_level(key.kind) {
            return Vec::new();
        }
        self.pages.remove(&site(key)).unwrap_or_default()
    }
}
