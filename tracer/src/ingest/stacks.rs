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

/// A stack's frames' identities across processes, (module, file offset), in order, as a 128-bit
/// hash: what the interner keeps of a stack's frames (the ledger keeps them, `StackTable`).
fn normalized_hash(frames: &[Frame]) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    for f in frames {
        // Each module by its length first: a Python frame's holds NUL bytes.
        let module = f.module.as_deref().map_or(&[][..], str::as_bytes);
        let tag = f.module.as_ref().map_or(0, |_| module.len() as u64 + 1);
        h.update(&tag.to_le_bytes());
        h.update(module);
        h.update(&f.offset.to_le_bytes());
    }
    h.digest128()
}

/// A raw stack's 128-bit hash: what the interner keeps of it. Its words whole cost a few hundred
/// bytes to 2 KiB a stack (a Python stack's frames are three words each), and a torch job's
/// start-up under `--heap full` makes some 430,000 of them; two of a million raw stacks share
/// a hash with odds of about one in 10^26.
fn raw_hash(raw: &[u64]) -> u128 {
    // SAFETY: a u64 slice read as its bytes (u8 has no alignment, every byte is initialized).
    let bytes = unsafe { std::slice::from_raw_parts(raw.as_ptr().cast::<u8>(), size_of_val(raw)) };
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// Raw (process, addresses) → id, and normalized frames → id.
#[derive(Default)]
pub struct Interner {
    /// Per process: raw addresses, by their hash ([`raw_hash`]) → id.
    raw: FxHashMap<u32, FxHashMap<u128, StackId>>,
    raw_count: usize,
    /// The most raw stacks held at once.
    peak: usize,
    normalized: FxHashMap<u128, StackId>,
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
        let hash = raw_hash(raw);
        if let Some(id) = self.raw.get(&tgid).and_then(|m| m.get(&hash)) {
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
        let next = StackId::new(self.normalized.len() as u32 + 1);
        let mut fresh = false;
        let id = *self
            .normalized
            .entry(normalized_hash(&frames))
            .or_insert_with(|| {
                fresh = true;
                next
            });
        self.raw.entry(tgid).or_default().insert(hash, id);
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

    #[test]
    fn stacks_of_the_same_frames_in_two_processes_share_an_id() {
        let mut maps = MapsCache::default();
        let mut i = Interner::default();
        // The Python frames' first word is the line; the others differ by process.
        let mut merge =
            |_: &[Frame], py: &[u64]| vec![Frame::python("a.py", "f", Some(py[0] as u32), py[1])];
        let mut id = |i: &mut Interner, tgid: u32, raw: &[u64]| {
            let (id, new) = i.intern(tgid, raw, &mut maps, &mut merge).unwrap();
            (id, new.is_some())
        };
        let (a, new_a) = id(&mut i, 0, &[PY_MARKER, 5, 9, 9]);
        let (b, new_b) = id(&mut i, 1, &[PY_MARKER, 5, 8, 8]);
        let (c, new_c) = id(&mut i, 1, &[PY_MARKER, 6, 8, 8]);
        assert_eq!((a, new_a, new_b), (b, true, false));
        assert!(c != a && new_c);
        assert_eq!(i.held(), 3);
        i.forget(1);
        assert_eq!(i.held(), 1);
        assert_eq!(id(&mut i, 1, &[PY_MARKER, 5, 8, 8]), (a, false));
    }
}
