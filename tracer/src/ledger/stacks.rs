//! The ledger's copy of every interned stack, for the report to symbolize. Held as a tree of
//! frames from the outermost in, each stack its innermost frame's node: the stacks of a Python
//! job share their outer frames (its module's line, its loop's, a library's call chain), and a
//! torch job's start-up under `--heap full` makes some 430,000 stacks of tens of frames each,
//! which held whole took 400 MiB.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::model::{Frame, StackId};

/// The node of no frame (an outermost frame's caller, an empty stack's node), and the module of
/// a frame in no known mapping.
const NONE: u32 = u32::MAX;

/// A frame in the tree: its caller's node, its module (by number), its file offset (a Python
/// frame's line) and the address it was first seen at. 24 bytes, where a [`Frame`] and its
/// caller took 40.
struct Node {
    caller: u32,
    module: u32,
    offset: u64,
    addr: u64,
}

/// The ledger's copy of every interned stack.
#[derive(Default)]
pub struct StackTable {
    nodes: Vec<Node>,
    /// Each frame's node under its caller's: (caller, module, offset). Stacks are interned as
    /// equal where their frames' modules and offsets are (`ingest::stacks`).
    children: FxHashMap<(u32, u32, u64), u32>,
    /// The modules, numbered by their shared strings (one per mapped file and per Python
    /// function).
    modules: Vec<Arc<str>>,
    module_ids: FxHashMap<usize, u32>,
    /// Each stack's innermost node, and whether its capture was truncated at the depth limit.
    stacks: FxHashMap<StackId, (u32, bool)>,
}

impl StackTable {
    /// Stack `id`'s `frames` (innermost first).
    pub fn insert(&mut self, id: StackId, frames: Arc<[Frame]>, truncated: bool) {
        let mut node = NONE;
        for f in frames.iter().rev() {
            let module = f.module.as_ref().map_or(NONE, |m| self.module_id(m));
            let nodes = &mut self.nodes;
            node = *self
                .children
                .entry((node, module, f.offset))
                .or_insert_with(|| {
                    let (offset, addr) = (f.offset, f.addr);
                    nodes.push(Node {
                        caller: node,
                        module,
                        offset,
                        addr,
                    });
                    (nodes.len() - 1) as u32
                });
        }
        self.stacks.insert(id, (node, truncated));
    }

    /// The number of `module`, by its string's address (the table holds a clone: the address
    /// names no other string while it lives).
    fn module_id(&mut self, module: &Arc<str>) -> u32 {
        let modules = &mut self.modules;
        let at = Arc::as_ptr(module).cast::<u8>() as usize;
        *self.module_ids.entry(at).or_insert_with(|| {
            modules.push(module.clone());
            (modules.len() - 1) as u32
        })
    }

    /// Frames (innermost first) and whether the capture was truncated at the depth limit.
    pub fn get(&self, id: StackId) -> Option<(Arc<[Frame]>, bool)> {
        let &(mut node, truncated) = self.stacks.get(&id)?;
        let mut frames = Vec::new();
        while let Some(n) = self.nodes.get(node as usize) {
            frames.push(Frame {
                module: self.modules.get(n.module as usize).cloned(),
                offset: n.offset,
                addr: n.addr,
            });
            node = n.caller;
        }
        Some((frames.into(), truncated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(module: &Arc<str>, offset: u64) -> Frame {
        Frame {
            module: Some(module.clone()),
            offset,
            addr: 0x1000 + offset,
        }
    }

    #[test]
    fn stacks_come_back_as_they_went_in_their_outer_frames_held_once() {
        let (lib, py): (Arc<str>, Arc<str>) = ("libc.so.6".into(), "train.py".into());
        let a: Arc<[Frame]> = [frame(&lib, 1), frame(&py, 10), frame(&py, 20)].into();
        let b: Arc<[Frame]> = [frame(&lib, 2), frame(&py, 10), frame(&py, 20)].into();
        let unknown: Arc<[Frame]> = [Frame {
            module: None,
            offset: 0x77,
            addr: 0x77,
        }]
        .into();
        let mut t = StackTable::default();
        t.insert(StackId::new(1), a.clone(), false);
        t.insert(StackId::new(2), b.clone(), true);
        t.insert(StackId::new(3), unknown.clone(), false);
        t.insert(StackId::new(4), Arc::from(Vec::new()), false);
        assert_eq!(t.get(StackId::new(1)), Some((a, false)));
        assert_eq!(t.get(StackId::new(2)), Some((b, true)));
        assert_eq!(t.get(StackId::new(3)), Some((unknown, false)));
        assert_eq!(t.get(StackId::new(4)), Some((Arc::from(Vec::new()), false)));
        assert_eq!(t.get(StackId::new(5)), None);
        // train.py:20, train.py:10 shared; each stack's innermost frame its own; the unknown.
        assert_eq!(t.nodes.len(), 5);
    }
}
