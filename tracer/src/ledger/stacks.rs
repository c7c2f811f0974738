//! The ledger's copy of every interned stack: frames by id, for the report to symbolize.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::model::{Frame, StackId};

/// The ledger's copy of every interned stack.
#[derive(Default)]
pub struct StackTable {
    stacks: FxHashMap<StackId, (Arc<[Frame]>, bool)>,
}

impl StackTable {
    pub fn insert(&mut self, id: StackId, frames: Arc<[Frame]>, truncated: bool) {
        self.stacks.insert(id, (frames, truncated));
    }

    /// Frames and whether the capture was truncated at the depth limit.
    pub fn get(&self, id: StackId) -> Option<(&Arc<[Frame]>, bool)> {
        self.stacks.get(&id).map(|(f, t)| (f, *t))
    }
}
