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
pub type Site = (u32, Option<StackId>, bool);

pub fn site(k: &GroupKey) -> Site {
    (k.pid, k.stack, k.inherited)
}

fn heap_level(kind: Kind) -> bool {
    matches!(kind, Kind::Heap | Kind::Tensor)
}

fn page_level(kind: Kind) -> bool {
    matches!(kind, Kind::Brk | Kind::Mmap)
}

/// Takes out of `groups` (order kept) the page-level groups that a heap-level group of the same
/// process and stack explains; returns them by that stack.
pub fn fold(groups: &mut Vec<Group>) -> HashMap<Site, Vec<Pages>> {
    let explained: HashSet<Site> = groups
        .iter()
        .filter(|g| heap_level(g.kind) && g.stack.is_some())
        .map(|g| site(&g.key()))
        .collect();
    let mut folded: HashMap<Site, Vec<Pages>> = HashMap::new();
    groups.retain(|g| {
        let at = site(&g.key());
        if !(page_level(g.kind) && explained.contains(&at)) {
            return true;
        }
        folded.entry(at).or_default().push(Pages {
            kind: g.kind,
            bytes: g.bytes,
            blocks: g.blocks,
        });
        false
    });
    folded
}

/// Drops the page-level keys of `keyed` that a heap-level key among them, or in `heap`, explains
/// (the same process and stack): for leaks released at the end, whose pages went with them.
pub fn drop_explained<T>(keyed: &mut Vec<(GroupKey, T)>, heap: &HashSet<Site>) {
    let mut sites: HashSet<Site> = keyed
        .iter()
        .filter(|(k, _)| heap_level(k.kind))
        .map(|(k, _)| site(k))
        .collect();
    sites.extend(heap.iter().copied());
    keyed.retain(|(k, _)| !(page_level(k.kind) && sites.contains(&site(k))));
}

/// The sites of the heap-level groups among `groups`.
pub fn heap_sites(groups: &[Group]) -> HashSet<Site> {
    groups
        .iter()
        .filter(|g| heap_level(g.kind) && g.stack.is_some())
        .map(|g| site(&g.key()))
        .collect()
}
