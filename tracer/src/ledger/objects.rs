//! A process's window of sampled Python objects (probes/objects.rs): what each stack made in the
//! window's first half, from the events, and what of it is still held when the window closes.
//! Objects made early in the window and still held at its end are kept (a container that grows,
//! a cache); those made and dropped meanwhile are temporaries.

use rustc_hash::FxHashMap;

use super::{Origin, Process};
use crate::model::{Kind, StackId};

/// Objects made in a window, from its first object (the probes go in a little after the window
/// is asked for): the bytes each stack made, per [`BUCKET_NS`] since then. The window lasts as
/// long as its owner finds it must (session/owner/objects.rs); its first half, whatever its
/// length, is where kept objects come from.
///
/// A reallocated object counts as what it grew by, made and kept: a list that keeps its items
/// reallocates its array as it grows, and counted whole each time, the arrays a line made would
/// hide the items it keeps.
#[derive(Clone, Debug, Default)]
pub struct ObjectWindow {
    from_ns: Option<u64>,
    made: Vec<FxHashMap<Option<StackId>, u64>>,
    /// The blocks made by reallocation in the window, by address: what each grew by.
    grown: FxHashMap<u64, u64>,
    /// What each stack had made and still held when the interpreter began its exit, where the
    /// window was open then: the window is judged on that, not on what the teardown made (the
    /// modules' clearing makes lists, tuples and weak references, and the exit handlers run).
    at_exit: Option<(u64, Vec<KeptLine>)>,
}

/// The window's time step: its first half ends on a multiple of it.
pub const BUCKET_NS: u64 = 50_000_000;
/// Buckets kept at most (a window of this many steps is long past its end).
const MAX_BUCKETS: u64 = 1200;

/// One stack's objects in a window: bytes made in its first half, and of those, bytes still held;
/// whether they were made by a library's import, whether what its site keeps grew with the
/// window as a leak's does, and whether it grew at all since the window's first look (set by the
/// window's owner, which looks at the stack's frames and at the window as it goes: what an
/// import keeps is the module's state; what a leak keeps grows as the first half lengthens, what
/// temporaries and CPython's free lists hold does not, nor what a line kept once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptLine {
    pub stack: Option<StackId>,
    pub made: u64,
    pub kept: u64,
    pub imported: bool,
    pub grows: bool,
    pub rising: bool,
}

impl ObjectWindow {
    /// When the interpreter began its exit, if the window was open then, and what each stack
    /// had made in the window's first half and still held at that point.
    pub fn at_exit(&self) -> Option<&(u64, Vec<KeptLine>)> {
        self.at_exit.as_ref()
    }

    /// When the window's first object came; none before.
    pub fn started_ns(&self) -> Option<u64> {
        self.from_ns
    }

    /// The first half of the window up to `now_ns`: from its first object to the last bucket
    /// boundary at or before half its length, and its buckets.
    fn first_half(&self, now_ns: u64) -> Option<(u64, u64, usize)> {
        let from = self.from_ns?;
        let buckets = now_ns.saturating_sub(from) / 2 / BUCKET_NS;
        Some((from, from + buckets * BUCKET_NS, buckets as usize))
    }

    /// A block allocated at `addr`: counted when it is an object, as its size, or when it was
    /// reallocated, as what it `grown` by.
    pub fn made(&mut self, addr: u64, size: u64, grown: Option<u64>, origin: &Origin) {
        if Kind::of(origin.func) != Kind::Object {
            return;
        }
        let size = match grown {
            Some(g) => {
                self.grown.insert(addr, g);
                g
            }
            None => {
                self.grown.remove(&addr);
                size
            }
        };
        let from = *self.from_ns.get_or_insert(origin.ts_ns);
        // Nor an object stamped before the first (another CPU's, read after it): it is never
        // kept either.
        if size == 0 || origin.ts_ns < from {
            return;
        }
        let at = (origin.ts_ns - from) / BUCKET_NS;
        if at >= MAX_BUCKETS {
            return;
        }
        let at = at as usize;
        if self.made.len() <= at {
            self.made.resize_with(at + 1, FxHashMap::default);
        }
        *self.made[at].entry(origin.stack).or_default() += size;
    }
}

impl Process {
    /// The interpreter began its exit at `ts_ns`: an open window's kept objects are taken as
    /// they are at this point (the first time only: an interpreter finalizes once).
    pub fn finalizing(&mut self, ts_ns: u64) {
        if self.finalized_ns.is_some() {
            return;
        }
        self.finalized_ns = Some(ts_ns);
        let kept = self.kept_objects(ts_ns);
        if let Some(w) = self.objects.as_mut().filter(|w| w.from_ns.is_some()) {
            w.at_exit = Some((ts_ns, kept));
        }
    }

    /// What each stack made in its window's first half up to `now_ns` and still holds, largest
    /// kept first; none without a window or before its first object.
    pub fn kept_objects(&self, now_ns: u64) -> Vec<KeptLine> {
        let Some((w, (from, half, n))) = self
            .objects
            .as_ref()
            .and_then(|w| Some((w, w.first_half(now_ns)?)))
        else {
            return Vec::new();
        };
        let mut made: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
        for bucket in w.made.iter().take(n) {
            for (&stack, &bytes) in bucket {
                *made.entry(stack).or_default() += bytes;
            }
        }
        let mut kept: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
        for (addr, b) in self.heap.iter() {
            if Kind::of(b.origin.func) == Kind::Object && (from..half).contains(&b.origin.ts_ns) {
                let bytes = w.grown.get(addr).copied().unwrap_or(b.size);
                *kept.entry(b.origin.stack).or_default() += bytes;
            }
        }
        let mut lines: Vec<KeptLine> = made
            .into_iter()
            .map(|(stack, made)| KeptLine {
                stack,
                made,
                kept: kept.get(&stack).copied().unwrap_or(0),
                ..KeptLine::default()
            })
            .collect();
        lines.sort_by_key(|l| {
            (
                std::cmp::Reverse(l.kept),
                std::cmp::Reverse(l.made),
                l.stack,
            )
        });
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

    fn record(ts_ns: u64, func: Option<AllocFn>, stack: Option<StackId>, what: What) -> Input {
        Input::Event(Event {
            tgid: PID,
            tid: 0,
            ts_ns,
            func,
            stack,
            what,
        })
    }

    fn ev(func: AllocFn, ts_ns: u64, stack: u32, what: What) -> Input {
        record(ts_ns, Some(func), Some(StackId::new(stack)), what)
    }

    fn alloc(func: AllocFn, ts_ns: u64, stack: u32, addr: u64, size: u64) -> Input {
        ev(func, ts_ns, stack, What::Alloc { addr, size })
    }

    fn free(ts_ns: u64, addr: u64) -> Input {
        ev(AllocFn::Free, ts_ns, 9, What::Free { addr })
    }

    #[test]
    fn a_window_counts_objects_made_in_its_first_half_and_what_of_them_is_still_held() {
        const MS: u64 = 1_000_000;
        let mut l = Ledger::default();
        l.add_root(PID, "python3".into(), Vec::new(), 0);
        assert!(
            l.procs[&PID].kept_objects(10_000 * MS).is_empty(),
            "no window"
        );
        l.open_objects(PID);
        assert!(
            l.procs[&PID].kept_objects(10_000 * MS).is_empty(),
            "no object yet"
        );
        // The first object starts the window at 5000 ms.
        l.apply(alloc(AllocFn::PyObjectMalloc, 5000 * MS, 1, 0x10, 100));
        l.apply(alloc(AllocFn::PyObjectMalloc, 5040 * MS, 1, 0x20, 50));
        l.apply(alloc(AllocFn::PyMemMalloc, 5060 * MS, 2, 0x30, 400));
        l.apply(alloc(AllocFn::PyObjectMalloc, 5070 * MS, 2, 0x40, 300));
        // A malloc block counts in no window.
        l.apply(alloc(AllocFn::Malloc, 5080 * MS, 1, 0x50, 7000));
        l.apply(alloc(AllocFn::PyObjectMalloc, 5120 * MS, 2, 0x60, 9000));
        // Stack 2's first objects go; one of stack 1's too.
        l.apply(free(5150 * MS, 0x30));
        l.apply(free(5160 * MS, 0x40));
        l.apply(free(5170 * MS, 0x20));
        let (s1, s2) = (Some(StackId::new(1)), Some(StackId::new(2)));
        let p = &l.procs[&PID];
        assert_eq!(p.objects.as_ref().unwrap().started_ns(), Some(5000 * MS));
        // 90 ms in, the first half is under one bucket: nothing counts yet.
        assert!(p.kept_objects(5090 * MS).is_empty());
        // 200 ms in, the first half is the first two buckets, [5000, 5100) ms.
        let line = |stack, made, kept| KeptLine {
            stack,
            made,
            kept,
            ..KeptLine::default()
        };
        assert_eq!(
            p.kept_objects(5200 * MS),
            vec![line(s1, 150, 100), line(s2, 700, 0)]
        );
        // 300 ms in, the first half is the first three: stack 2's last object is kept.
        assert_eq!(
            p.kept_objects(5300 * MS),
            vec![line(s2, 9700, 9000), line(s1, 150, 100)]
        );
    }

    fn realloc(ts_ns: u64, stack: u32, old: u64, addr: u64, size: u64) -> Input {
        let what = What::Realloc { old, addr, size };
        ev(AllocFn::PyMemRealloc, ts_ns, stack, what)
    }

    #[test]
    fn a_reallocated_object_counts_as_what_it_grew_by() {
        const MS: u64 = 1_000_000;
        let mut l = Ledger::default();
        l.add_root(PID, "python3".into(), Vec::new(), 0);
        l.open_objects(PID);
        // A list's array made, grown, and grown again in the second half: its growth in the
        // first half is made, and nothing of it kept (the block it grew into is gone).
        l.apply(alloc(AllocFn::PyMemMalloc, 0, 3, 0x100, 800));
        l.apply(realloc(20 * MS, 3, 0x100, 0x200, 900));
        l.apply(realloc(160 * MS, 3, 0x200, 0x300, 1000));
        // A block not recorded, grown: nothing is known of what it grew by.
        l.apply(realloc(30 * MS, 4, 0x999, 0x400, 5000));
        // An object made and grown once: its size and its growth made, its growth kept.
        l.apply(alloc(AllocFn::PyObjectMalloc, 40 * MS, 5, 0x50, 64));
        l.apply(realloc(50 * MS, 5, 0x50, 0x500, 96));
        // A grown block freed, its address reused by a new object: which counts whole.
        l.apply(alloc(AllocFn::PyObjectMalloc, 55 * MS, 7, 0x60, 64));
        l.apply(realloc(56 * MS, 7, 0x60, 0x600, 80));
        l.apply(free(60 * MS, 0x600));
        l.apply(alloc(AllocFn::PyObjectMalloc, 70 * MS, 6, 0x600, 128));
        let line = |stack: u32, made, kept| KeptLine {
            stack: Some(StackId::new(stack)),
            made,
            kept,
            ..KeptLine::default()
        };
        assert_eq!(
            l.procs[&PID].kept_objects(300 * MS),
            vec![
                line(6, 128, 128),
                line(5, 96, 32),
                line(3, 900, 0),
                line(7, 80, 0)
            ]
        );
    }

    #[test]
    fn a_window_open_when_the_interpreter_exits_is_taken_as_it_was_then() {
        const MS: u64 = 1_000_000;
        let mut l = Ledger::default();
        l.add_root(PID, "python3".into(), Vec::new(), 0);
        l.open_objects(PID);
        l.apply(alloc(AllocFn::PyObjectMalloc, 0, 1, 0x10, 100));
        l.apply(alloc(AllocFn::PyObjectMalloc, 60 * MS, 1, 0x20, 200));
        let exit = |ts_ns| record(ts_ns, None, None, What::Finalize);
        // 200 ms in: the first half is [0, 100) ms, both objects made and held.
        l.apply(exit(200 * MS));
        // The teardown makes objects and frees the program's: neither changes what was taken.
        l.apply(alloc(AllocFn::PyObjectMalloc, 210 * MS, 2, 0x30, 5000));
        l.apply(free(220 * MS, 0x10));
        l.apply(exit(300 * MS));
        let p = &l.procs[&PID];
        let line = KeptLine {
            stack: Some(StackId::new(1)),
            made: 300,
            kept: 300,
            ..KeptLine::default()
        };
        let taken = p.objects.as_ref().unwrap().at_exit().cloned();
        assert_eq!(taken, Some((200 * MS, vec![line])));
        assert_eq!(p.finalized_ns, Some(200 * MS));
        // What it would be judged on now: the teardown's object kept, the program's gone.
        assert_eq!(p.kept_objects(1000 * MS)[0].stack, Some(StackId::new(2)));
    }
}
