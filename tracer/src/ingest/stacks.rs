//! Stack interning. The kernel hands over raw return addresses of one address space; they become
//! frames of (module, file offset), and identical frame lists share one [`StackId`] across processes
//! (forked workers running the same code aggregate naturally).

use std::sync::Arc;

use crate::model::{Frame, StackId};

use rustc_hash::FxHashMap;

use super::maps::MapsCache;

/// Splices a stack's Python frames (raw triples) into its native frames.
pub type MergePython<'a> = dyn FnMut(&[Frame], &[u64]) -> Vec<Frame> + 'a;

/// Separates a record's native return addresses from its Python frames in a raw stack key.
pub const PY_MARKER: u64 = u64::MAX;

/// Interned stacks kept before new ones are refused (and counted).
pub const MAX_STACKS: usize = 1 << 20;

/// A frame's identity across processes: (module, file offset).
type FrameKey = (Option<Arc<str>>, u64);

/// Raw (process, addresses) → id, and normalized frames → id.
#[derive(Default)]
pub struct Interner {
    /// Per process: raw addresses → id (looked up by slice, no allocation per event).
    raw: FxHashMap<u32, FxHashMap<Box<[u64]>, StackId>>,
    raw_count: usize,
    /// The most raw stacks held at once.
    peak: usize,
    normalized: FxHashMap<Vec<FrameKey>, StackId>,
    overflowed: u64,
}

impl Interner {
    /// The id of this stack, and its frames when it is new.
    pub fn intern(
        &mut self,
        tgid: u32,
        raw: &[u64],
        maps: &mut MapsCache,
        python: &mut MergePython<'_>,
    ) -> Option<(StackId, Option<Arc<[Frame]>>)> {
        if let Some(id) = self.raw.get(&tgid).and_then(|m| m.get(raw)) {
            return Some((*id, None));
        }
        if self.raw_count >= MAX_STACKS {
            self.overflowed += 1;
            return None;
        }
        // Native addresses, then (after PY_MARKER) the Python frames' raw triples.
        let (native, py) = match raw.iter().position(|a| *a == PY_MARKER) {
            Some(i) => (&raw[..i], &raw[i + 1..]),
            None => (raw, &[][..]),
        };
        let frames: Vec<Frame> = native
            .iter()
            .map(|&addr| match maps.resolve(tgid, addr) {
                Some((module, offset)) => Frame {
                    module: Some(module),
                    offset,
                    addr,
                },
                None => Frame {
                    module: None,
                    offset: addr,
                    addr,
                },
            })
            .collect();
        let frames = if py.is_empty() {
            frames
        } else {
            python(&frames, py)
        };
        let norm: Vec<_> = frames
            .iter()
            .map(|f| (f.module.clone(), f.offset))
            .collect();
        let next = StackId::new(self.normalized.len() as u32 + 1);
        let mut fresh = false;
        let id = *self.normalized.entry(norm).or_insert_with(|| {
            fresh = true;
            next
        });
        self.raw.entry(tgid).or_default().insert(raw.into(), id);
        self.raw_count += 1;
        self.peak = self.peak.max(self.raw_count);
        Some((id, fresh.then(|| Arc::from(frames))))
    }

    /// Forgets a process's raw addresses (its address space is gone); interned ids stay valid.
    pub fn forget(&mut self, tgid: u32) {
        if let Some(m) = self.raw.remove(&tgid) {
            self.raw_count -= m.len();
        }
    }

    /// Stacks refused because the table was full.
    pub fn overflowed(&self) -> u64 {
        self.overflowed
    }

    /// Distinct raw stacks held, of [`MAX_STACKS`].
    pub fn held(&self) -> usize {
        self.raw_count
    }

    /// The most raw stacks held at once (a process's stacks go when it exits: the table's use at
    /// its height is what tells how close it came to full).
    pub fn peak(&self) -> usize {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_raw_stack_interns_once_and_unknown_addresses_stay_raw() {
        let mut maps = MapsCache::default();
        let mut i = Interner::default();
        // pid 0 has no /proc/0/maps: every frame stays unresolved.
        let (a, new_a) = i
            .intern(0, &[0x1000, 0x2000], &mut maps, &mut |n, _| n.to_vec())
            .unwrap();
        let (b, new_b) = i
            .intern(0, &[0x1000, 0x2000], &mut maps, &mut |n, _| n.to_vec())
            .unwrap();
        let (c, _) = i
            .intern(0, &[0x1000, 0x3000], &mut maps, &mut |n, _| n.to_vec())
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let frames = new_a.unwrap();
        assert!(new_b.is_none());
        assert_eq!(
            frames[1],
            Frame {
                module: None,
                offset: 0x2000,
                addr: 0x2000
            }
        );
    }
}
