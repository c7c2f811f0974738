//! Page-level regions of one address space: non-overlapping [start, end) ranges, each with the stack
//! that created it. Unmapping part of a region splits it; mapping over a range replaces it.
//! Ranges without access (PROT_NONE: glibc's arena reservations, guard pages) are kept as reserved
//! address space and not counted until mprotect opens them.

use std::collections::BTreeMap;

use super::Origin;
use crate::model::StackId;

/// A mapped range and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub end: u64,
    pub origin: Origin,
    /// Mapped without access: address space, not memory.
    pub reserved: bool,
    /// An allocator's heap: reserved inside an allocator call and opened as it grows (glibc's
    /// thread arenas), memory the allocator keeps as the brk heap is.
    pub arena: bool,
}

/// Regions keyed by start address.
#[derive(Clone, Debug, Default)]
pub struct Regions {
    map: BTreeMap<u64, Region>,
}

impl Regions {
    /// Adds [start, end), replacing whatever overlapped it.
    pub fn insert(&mut self, start: u64, end: u64, origin: Origin, reserved: bool) {
        self.insert_region(start, end, origin, reserved, false);
    }

    /// Adds an allocator's heap reserved at [start, end) (see [`Region::arena`]).
    pub fn insert_arena(&mut self, start: u64, end: u64, origin: Origin) {
        self.insert_region(start, end, origin, true, true);
    }

    fn insert_region(&mut self, start: u64, end: u64, origin: Origin, reserved: bool, arena: bool) {
        self.remove(start, end);
        self.map.insert(
            start,
            Region {
                end,
                origin,
                reserved,
                arena,
            },
        );
    }

    /// mprotect: the parts of tracked regions inside [start, end) become reserved (no access) or
    /// memory again, keeping their origin.
    pub fn protect(&mut self, start: u64, end: u64, reserved: bool) {
        let inside: Vec<(u64, Region)> = self
            .overlapping(start, end)
            .into_iter()
            .filter_map(|s| self.map.get(&s).map(|r| (s, r.clone())))
            .collect();
        self.remove(start, end);
        for (s, r) in inside {
            let piece = Region {
                end: r.end.min(end),
                origin: r.origin,
                reserved,
                arena: r.arena,
            };
            self.map.insert(s.max(start), piece);
        }
    }

    fn overlapping(&self, start: u64, end: u64) -> Vec<u64> {
        overlapping(&self.map, start, end, |r| r.end)
    }

    /// Removes [start, end), splitting regions that straddle its edges. Returns the bytes removed.
    pub fn remove(&mut self, start: u64, end: u64) -> u64 {
        cut(
            &mut self.map,
            start,
            end,
            |r| r.end,
            |r, end| Region { end, ..r.clone() },
        )
    }

    /// The origin of each accessible region that overlaps [start, end), and by how many bytes.
    pub fn overlaps(&self, start: u64, end: u64) -> Vec<(Origin, u64)> {
        self.overlapping(start, end)
            .into_iter()
            .filter_map(|s| self.map.get(&s).map(|r| (s, r)))
            .filter(|(_, r)| !r.reserved)
            .map(|(s, r)| (r.origin.clone(), r.end.min(end) - s.max(start)))
            .collect()
    }

    /// The region starting at `start`: its origin and bytes.
    pub fn at(&self, start: u64) -> Option<(&Origin, u64)> {
        self.map.get(&start).map(|r| (&r.origin, r.end - start))
    }

    /// Gives the region starting at `start` the stack `stack`.
    pub fn set_stack(&mut self, start: u64, stack: Option<StackId>) {
        if let Some(r) = self.map.get_mut(&start) {
            r.origin.stack = stack;
        }
    }

    /// The origin of the region containing `addr`.
    pub fn origin_at(&self, addr: u64) -> Option<&Origin> {
        let (_, r) = self.map.range(..=addr).next_back()?;
        (r.end > addr).then_some(&r.origin)
    }

    pub fn is_reserved(&self, addr: u64) -> bool {
        self.map
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, r)| r.end > addr && r.reserved)
    }

    /// (bytes, origin, whether an allocator's heap) of each accessible region.
    pub fn live(&self) -> impl Iterator<Item = (u64, &Origin, bool)> {
        self.map
            .iter()
            .filter(|(_, r)| !r.reserved)
            .map(|(s, r)| (r.end - s, &r.origin, r.arena))
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Region)> {
        self.map.iter().map(|(s, r)| (*s, r))
    }

    /// Copies for a forked child, every region marked inherited.
    pub fn inherited(&self) -> Self {
        let mut map = self.map.clone();
        map.values_mut().for_each(|r| r.origin.inherited = true);
        Self { map }
    }

    /// Bytes of accessible (not reserved) regions.
    pub fn bytes(&self) -> u64 {
        self.map
            .iter()
            .filter(|(_, r)| !r.reserved)
            .map(|(s, r)| r.end - s)
            .sum()
    }
}

/// Address ranges of file-backed mappings (libraries, data files), without origins: leaktracer
/// does not count them as memory, but their unmapping is not memory that was never seen mapped
/// (`Mismatches::unmatched_unmap_bytes`: every Python run counted ~150 KiB of it, the loader's
/// and the interpreter's files).
#[derive(Clone, Debug, Default)]
pub struct Spans(BTreeMap<u64, u64>);

impl Spans {
    /// Adds [start, end), replacing whatever overlapped it.
    pub fn insert(&mut self, start: u64, end: u64) {
        self.remove(start, end);
        self.0.insert(start, end);
    }

    /// Removes [start, end) and returns the bytes of it that were there.
    pub fn remove(&mut self, start: u64, end: u64) -> u64 {
        cut(&mut self.0, start, end, |e| *e, |_, end| end)
    }
}

/// The starts of the ranges of `map` (keyed by start; `end_of` a value's end) that overlap
/// [start, end).
fn overlapping<V>(
    map: &BTreeMap<u64, V>,
    start: u64,
    end: u64,
    end_of: impl Fn(&V) -> u64,
) -> Vec<u64> {
    map.range(..end)
        .rev()
        .take_while(|(_, v)| end_of(v) > start)
        .map(|(s, _)| *s)
        .collect()
}

/// Removes [start, end) from the ranges of `map`, splitting those that straddle its edges
/// (`ending(v, e)`: `v` ending at `e` instead). Returns the bytes removed.
fn cut<V>(
    map: &mut BTreeMap<u64, V>,
    start: u64,
    end: u64,
    end_of: impl Fn(&V) -> u64,
    ending: impl Fn(&V, u64) -> V,
) -> u64 {
    let mut removed = 0;
    for s in overlapping(map, start, end, &end_of) {
        let Some(v) = map.remove(&s) else {
            continue;
        };
        let e = end_of(&v);
        if s < start {
            map.insert(s, ending(&v, start));
        }
        if e > end {
            map.insert(end, ending(&v, e));
        }
        removed += e.min(end) - s.max(start);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StackId;

    fn o(stack: u32) -> Origin {
        Origin {
            stack: Some(StackId::new(stack)),
            ts_ns: 0,
            func: None,
            inherited: false,
        }
    }

    #[test]
    fn partial_unmap_splits_and_counts_exactly() {
        let mut r = Regions::default();
        r.insert(0x10000, 0x20000, o(1), false);
        assert_eq!(r.remove(0x14000, 0x15000), 0x1000);
        assert_eq!(r.bytes(), 0x10000 - 0x1000);
        assert_eq!(r.origin_at(0x13fff), Some(&o(1)));
        assert_eq!(r.origin_at(0x14000), None);
        assert_eq!(r.origin_at(0x15000), Some(&o(1)));
        assert_eq!(
            r.remove(0x0, 0x14000),
            0x4000,
            "head removed across the start"
        );
        assert_eq!(
            r.remove(0x1f000, 0x30000),
            0x1000,
            "tail removed past the end"
        );
        assert_eq!(r.bytes(), 0xa000);
    }

    #[test]
    fn mapping_over_a_range_replaces_it() {
        let mut r = Regions::default();
        r.insert(0x1000, 0x5000, o(1), false);
        r.insert(0x2000, 0x3000, o(2), false);
        assert_eq!(r.bytes(), 0x4000);
        assert_eq!(r.origin_at(0x2800), Some(&o(2)));
        assert_eq!(r.origin_at(0x3800), Some(&o(1)));
    }

    #[test]
    fn reserved_ranges_count_once_opened() {
        // glibc's arena: 64 MiB reserved, the first 132 KiB opened read-write.
        let mut r = Regions::default();
        r.insert(0x4000_0000, 0x4400_0000, o(3), true);
        assert_eq!(r.bytes(), 0);
        r.protect(0x4000_0000, 0x4002_1000, false);
        assert_eq!(r.bytes(), 0x21000);
        assert_eq!(
            r.origin_at(0x4002_1000),
            Some(&o(3)),
            "the rest stays tracked, reserved"
        );
        r.protect(0x4000_0000, 0x4000_1000, true);
        assert_eq!(r.bytes(), 0x20000);
        assert_eq!(
            r.remove(0x4000_0000, 0x4400_0000),
            0x400_0000,
            "munmap removes it all"
        );
        assert_eq!(r.bytes(), 0);
    }
}
