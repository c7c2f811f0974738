//! A process's window of sampled Python objects (probes/objects.rs): what each stack made in the
//! window's first half, from the events, and what of it is still held when the window closes.
//! Objects made early in the window and still held at its end are kept (a container that grows,
//! a cache); those made and dropped meanwhile are temporaries.

use rustc_hash::FxHashMap;

use super::{Origin, Process};
use crate::model::{Kind, StackId};

/// The window's first half, from its first object (the probes go in a little after the window
/// is asked for), and the bytes each stack made in it.
#[derive(Clone, Debug, Default)]
pub struct ObjectWindow {
    from_ns: Option<u64>,
    half_ns: u64,
    made: FxHashMap<Option<StackId>, u64>,
}

/// One stack's objects in a window: bytes made in its first half, and of those, bytes still held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptLine {
    pub stack: Option<StackId>,
    pub made: u64,
    pub kept: u64,
}

impl ObjectWindow {
    pub fn new(half_ns: u64) -> Self {
        Self {
            half_ns,
            ..Self::default()
        }
    }

    fn in_first_half(&self, ts_ns: u64) -> bool {
        self.from_ns
            .is_some_and(|from| (from..=from + self.half_ns).contains(&ts_ns))
    }

    /// When the window ends: two halves after its first object.
    pub fn end_ns(&self) -> Option<u64> {
        Some(self.from_ns? + 2 * self.half_ns)
    }

    /// A block allocated: counted when it is an object made in the first half.
    pub fn made(&mut self, size: u64, origin: &Origin) {
        if Kind::of(origin.func) != Kind::Object {
            return;
        }
        self.from_ns.get_or_insert(origin.ts_ns);
        if self.in_first_half(origin.ts_ns) {
            *self.made.entry(origin.stack).or_default() += size;
        }
    }
}

impl Process {
    /// What each stack made in the window's first half and still holds, largest kept first; none
    /// without a window.
    pub fn kept_objects(&self) -> Vec<KeptLine> {
        let Some(w) = &self.objects else {
            return Vec::new();
        };
        let mut kept: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
        for b in self.heap.values() {
            if Kind::of(b.origin.func) == Kind::Object && w.in_first_half(b.origin.ts_ns) {
                *kept.entry(b.origin.stack).or_default() += b.size;
            }
        }
        let mut lines: Vec<KeptLine> = w
            .made
            .iter()
            .map(|(&stack, &made)| KeptLine {
                stack,
                made,
                kept: kept.get(&stack).copied().unwrap_or(0),
            })
            .collect();
        lines.sort_by_key(|l| (std::cmp::Reverse(l.kept), std::cmp::Reverse(l.made)));
        lines
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::AllocFn;

    use super::KeptLine;
    use crate::{
        ingest::{Event, Input, What},
        ledger::Ledger,
        model::StackId,
    };

    const PID: u32 = 7;

    fn ev(func: AllocFn, ts_ns: u64, stack: u32, what: What) -> Input {
        Input::Event(Event {
            tgid: PID,
            ts_ns,
            func: Some(func),
            stack: Some(StackId::new(stack)),
            what,
        })
    }

    fn alloc(func: AllocFn, ts_ns: u64, stack: u32, addr: u64, size: u64) -> Input {
        ev(func, ts_ns, stack, What::Alloc { addr, size })
    }

    fn free(ts_ns: u64, addr: u64) -> Input {
        ev(AllocFn::Free, ts_ns, 9, What::Free { addr })
    }

    #[test]
    fn a_window_counts_objects_made_in_its_first_half_and_what_of_them_is_still_held() {
        let mut l = Ledger::default();
        l.add_root(PID, "python3".into(), Vec::new(), 0);
        assert!(l.procs[&PID].kept_objects().is_empty(), "no window");
        l.open_objects(PID, 1000);
        // The first object opens the first half: [5000, 6000].
        l.apply(alloc(AllocFn::PyObjectMalloc, 5000, 1, 0x10, 100));
        l.apply(alloc(AllocFn::PyObjectMalloc, 5500, 1, 0x20, 50));
        l.apply(alloc(AllocFn::PyMemMalloc, 5600, 2, 0x30, 400));
        l.apply(alloc(AllocFn::PyObjectMalloc, 5700, 2, 0x40, 300));
        // A malloc block and an object of the second half count in neither.
        l.apply(alloc(AllocFn::Malloc, 5800, 1, 0x50, 7000));
        l.apply(alloc(AllocFn::PyObjectMalloc, 6500, 2, 0x60, 9000));
        // Stack 2's objects go; one of stack 1's too.
        l.apply(free(6600, 0x30));
        l.apply(free(6700, 0x40));
        l.apply(free(6800, 0x20));
        let (s1, s2) = (Some(StackId::new(1)), Some(StackId::new(2)));
        let w = l.procs[&PID].objects.as_ref().unwrap();
        assert_eq!(w.end_ns(), Some(7000));
        assert_eq!(
            l.procs[&PID].kept_objects(),
            vec![
                KeptLine {
                    stack: s1,
                    made: 150,
                    kept: 100
                },
                KeptLine {
                    stack: s2,
                    made: 700,
                    kept: 0
                },
            ]
        );
    }
}
