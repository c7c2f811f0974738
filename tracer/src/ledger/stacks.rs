//! The ledger's copy of every interned stack, for the report to symbolize. Held as a tree of
//! frames from the outermost in, each stack its innermost frame's node: the stacks of a Python
//! job share their outer frames (its module's line, its loop's, a library's call chain), and a
//! torch job's start-up under `--heap full` makes some 430,000 stacks of tens of frames each,
//! which held whole took 400 MiB.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::model::{Frame, StackId};

/// The node of no frame: an outermost frame's caller, an empty stack's node.
const NONE: u32 = u32::MAX;

/// A frame's identity under its caller's node: the module by its shared string (one per mapped
/// file and per Python function), and the file offset (a Python frame's line). Stacks are
/// interned as equal where these are (`ingest::stacks`).
type Child = (u32, usize, u64);

/// The ledger's copy of every interned stack.
#[derive(Default)]
pub struct StackTable {
    /// Each frame, with its caller's node.
    nodes: Vec<(u32, Frame)>,
    children: FxHashMap<Child, u32>,
    /// Each stack's innermost node, and whether its capture was truncated at the depth limit.
    stacks: FxHashMap<StackId, (u32, bool)>,
}

impl StackTable {
    /// Stack `id`'s `frames` (innermost first).
    pub fn insert(&mut self, id: StackId, frames: Arc<[Frame]>, truncated: bool) {
        let mut node = NONE;
        for f in frames.iter().rev() {
            let module = f
                .module
                .as_ref()
                .map_or(0, |m| Arc::as_ptr(m).cast::<u8>() as usize);
            let nodes = &mut self.nodes;
            node = *self
                .children
                .entry((node, module, f.offset))
                .or_insert_with(|| {
                    nodes.push((node, f.clone()));
                    (nodes.len() - 1) as u32
                });
        }
        self.stacks.insert(id, (node, truncated));
    }

    /// Frames (innermost first) and whether the capture was truncated at the depth limit.
    pub fn get(&self, id: StackId) -> Option<(Arc<[Frame]>, bool)> {
        let &(mut node, truncated) = self.stacks.get(&id)?;
        let mut frames = Vec::new();
        while let Some((caller, frame)) = self.nodes.get(node as usize) {
            frames.push(frame.clone());
            node = *caller;
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
