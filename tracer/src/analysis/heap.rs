//! `--heap auto`: a process's malloc family as a layer taken out once its leak is confirmed. Its
//! heap stacks are then judged as they were when it went: their blocks stay as they were, and
//! the frees and allocations since are not seen (a series that stopped would read as a leak that
//! stopped). So is its heap-level total, which its pages are compared with.

use std::borrow::Cow;

use super::{Analysis, Verdict, series::Series};
use crate::model::{GroupKey, Kind};

impl Analysis {
    /// `pid`'s malloc family was taken out at `x` (on the series' axis), its leak confirmed.
    pub fn heap_taken_out(&mut self, pid: u32, x: f64) {
        self.heap_out.insert(pid, x);
    }

    /// Whether a heap stack of `pid` is judged a leak now (from `warmup_s`).
    pub fn heap_leaks(&self, pid: u32, warmup_s: f64) -> bool {
        self.groups
            .keys()
            .filter(|k| k.pid == pid && k.kind == Kind::Heap)
            .any(|k| {
                self.judge(k, warmup_s)
                    .is_some_and(|e| e.verdict == Verdict::Leak)
            })
    }

    /// `series` of `key` as it is judged: up to when its process's malloc family was taken out,
    /// for a heap stack.
    pub(super) fn as_judged<'s>(&self, key: &GroupKey, series: &'s Series) -> Cow<'s, Series> {
        if key.kind != Kind::Heap {
            return Cow::Borrowed(series);
        }
        self.heap_as_judged(key.pid, series)
    }

    /// `pid`'s heap-level total (`heap`) or pages beside it, up to when its malloc family was
    /// taken out: after, the heap is not seen, while the pages go on holding its leak.
    pub(super) fn heap_as_judged<'s>(&self, pid: u32, series: &'s Series) -> Cow<'s, Series> {
        match self.heap_out.get(&pid) {
            Some(&x) => Cow::Owned(series.until(x)),
            None => Cow::Borrowed(series),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;

    /// 30 samples a second apart of a process whose heap stack grows by 1 MiB a second and
    /// whose brk pages grow with it, its malloc family no longer seen from 15 s on: the heap
    /// stack holds what it held then, as the ledger keeps its blocks; taken out there (`out`),
    /// or not said to be.
    fn leaking(out: bool) -> (Analysis, GroupKey) {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        ledger.procs.get_mut(&1).unwrap().malloc_seen = true;
        let heap = GroupKey {
            pid: 1,
            stack: Some(crate::model::StackId::new(1)),
            kind: Kind::Heap,
            inherited: false,
        };
        let pages = GroupKey {
            kind: Kind::Brk,
            stack: Some(crate::model::StackId::new(2)),
            ..heap
        };
        let mut a = Analysis::default();
        for i in 0..30u64 {
            let groups = [(heap, (8 + i.min(15)) << 20), (pages, (9 + i) << 20)];
            a.sample(i as f64, &ledger, &groups);
            if out && i == 15 {
                a.heap_taken_out(1, 15.0);
            }
        }
        (a, heap)
    }

    #[test]
    fn a_heap_taken_out_is_judged_as_it_was_then_and_its_pages_are_no_retention() {
        let (a, heap) = leaking(true);
        let e = a.judge(&heap, 0.0).unwrap();
        assert_eq!(e.verdict, Verdict::Leak);
        assert!(e.windows.last().unwrap().t1_s <= 15.0, "{e:?}");
        assert!(
            (e.slope_bytes_per_s - (1 << 20) as f64).abs() < 1e4,
            "{e:?}"
        );
        assert!(a.heap_leaks(1, 0.0));
        let r = a.retention(1, 0.0).unwrap();
        assert!(!r.retention, "the heap leaked as far as it was seen: {r:?}");
        // Not said to be taken out, the same heap holding still for half the run while its pages
        // grow reads as a leak that stopped and the allocator's retention: what a take-out must
        // not be read as.
        let (b, heap) = leaking(false);
        assert_ne!(b.judge(&heap, 0.0).unwrap().verdict, Verdict::Leak);
        assert!(b.retention(1, 0.0).unwrap().retention);
    }
}
