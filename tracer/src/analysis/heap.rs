//! `--heap auto`: a process's malloc family as a layer taken out once its leak is confirmed. Its
//! heap stacks are then judged as they were when it went: their blocks stay as they were, and
//! the frees and allocations since are not seen (a series that stopped would read as a leak that
//! stopped). So is its heap-level total, which its pages are compared with. Traced again when
//! its pages go on growing, they are judged on that window alone: the stretch between went
//! unseen, and what the window shows is what the program does now. A window the run's end cut
//! short before it was decided (a leak confirmed, or the heap held) tells too little: the one
//! before it stands.
//!
//! A window traced again is judged on series of its own, begun with it: a long run's series
//! merge their points to keep their whole span (see series.rs), and 30 minutes in, one point
//! spans tens of seconds, more than such a window lasts: it had no verdict, its heap "held", and
//! a leak went unreported.

use std::borrow::Cow;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{Analysis, Evidence, Verdict, series::Series};
use crate::model::{GroupKey, Kind, StackId};

/// A process's malloc family as traced last, on the series' axis: from when it was traced again
/// (none: from the start) until it was taken out (none: traced now); while it is traced again,
/// the window before. With the series of the window traced again, and of the one before.
#[derive(Debug, Default)]
pub(super) struct HeapWindow {
    /// When it was first asked for: a layer's (`--heap auto`); absent, a malloc family traced
    /// all along has no window.
    asked: Option<f64>,
    from: Option<f64>,
    until: Option<f64>,
    before: Option<(Option<f64>, f64)>,
    series: Option<WindowSeries>,
    before_series: Option<WindowSeries>,
}

/// The series of a window of a process's malloc family traced again, from its first sample:
/// each heap stack's, and its heap-level and brk totals (see `ProcSeries`).
#[derive(Debug, Default)]
pub(super) struct WindowSeries {
    stacks: FxHashMap<GroupKey, Series>,
    heap: Series,
    pages: Series,
}

/// Which of a process's totals (see [`Analysis::heap_as_judged`]).
#[derive(Clone, Copy)]
pub(super) enum Total {
    Heap,
    Pages,
}

impl Analysis {
    /// `pid`'s malloc family was asked for, as a layer, at `x` (on the series' axis).
    pub fn heap_asked(&mut self, pid: u32, x: f64) {
        self.heap_window.entry(pid).or_default().asked = Some(x);
    }

    /// `pid`'s malloc family was taken out at `x` (on the series' axis), its leak confirmed.
    pub fn heap_taken_out(&mut self, pid: u32, x: f64) {
        self.heap_window.entry(pid).or_default().until = Some(x);
    }

    /// `pid`'s malloc family is traced again from `x` on, after it was taken out: its heap is
    /// judged on what it does from then.
    pub fn heap_traced_again(&mut self, pid: u32, x: f64) {
        let w = self.heap_window.entry(pid).or_default();
        let before = w.until.map(|until| (w.from, until));
        let before_series = before.and(w.series.take());
        *w = HeapWindow {
            asked: w.asked,
            from: Some(x),
            until: None,
            before,
            series: Some(WindowSeries::default()),
            before_series,
        };
    }

    /// Samples the window of each process whose malloc family is traced again: its heap
    /// stacks in `groups` (those gone since the window began as 0), and its totals.
    pub(super) fn sample_heap_windows(
        &mut self,
        t_s: f64,
        groups: &[(GroupKey, u64)],
        totals: impl Fn(u32) -> (u64, u64),
    ) {
        for (&pid, w) in self.heap_window.iter_mut() {
            let Some(series) = w.series.as_mut().filter(|_| w.until.is_none()) else {
                continue;
            };
            let mut seen = FxHashSet::default();
            let heap = groups
                .iter()
                .filter(|(k, _)| k.pid == pid && k.kind == Kind::Heap);
            for &(key, bytes) in heap {
                series.stacks.entry(key).or_default().push(t_s, bytes);
                seen.insert(key);
            }
            for (key, s) in series.stacks.iter_mut() {
                if !seen.contains(key) {
                    s.push(t_s, 0);
                }
            }
            let (heap, pages) = totals(pid);
            series.heap.push(t_s, heap);
            series.pages.push(t_s, pages);
        }
    }

    /// `pid`'s malloc family, traced again, was still undecided when the run ended: its heap is
    /// judged on the window before.
    pub fn heap_window_undecided(&mut self, pid: u32) {
        let Some(w) = self.heap_window.get_mut(&pid) else {
            return;
        };
        if let (None, Some((from, until))) = (w.until, w.before.take()) {
            (w.from, w.until) = (from, Some(until));
            w.series = w.before_series.take();
        }
    }

    /// How much slower `pid`'s own code ran while its malloc family was traced, as a layer, in
    /// the window its heap stacks are judged on than around it (see [`Analysis::slowdown`]):
    /// what their rates are multiplied by, to be the program's as it runs untraced. A Python job
    /// whose heap was traced for a second and a half ran 2.6 times slower then; its leak read
    /// 331 KiB/s in that window, against 0.88 MiB/s over the run.
    pub fn heap_slowdown(&self, pid: u32) -> Option<f64> {
        let w = self.heap_window.get(&pid)?;
        let from = self.heap_at_work(pid, w, w.from.or(w.asked)?);
        self.slowdown(pid, from, w.until.unwrap_or(f64::INFINITY))
    }

    /// When the probes of `pid`'s window asked for at `asked` were first seen at work: they
    /// take a few tenths of a second to attach, while the program runs at its own pace. A
    /// window traced again, from when its heap first moved; the first, from its first malloc.
    fn heap_at_work(&self, pid: u32, w: &HeapWindow, asked: f64) -> f64 {
        let moved = w.series.as_ref().and_then(|s| {
            let points = s.heap.points();
            let first = points.first()?.last;
            let moved = points.iter().find(|p| p.min != first || p.max != first);
            moved.map(|p| p.t0)
        });
        let seen = || self.heap_seen.get(&pid).copied();
        moved.or_else(seen).map_or(asked, |x| x.max(asked))
    }

    /// `evidence` of `key`, a heap stack's rate at its program's untraced pace where its malloc
    /// family was a layer that slowed it ([`Analysis::heap_slowdown`]).
    pub(super) fn at_untraced_pace(&self, key: &GroupKey, mut evidence: Evidence) -> Evidence {
        if key.kind == Kind::Heap
            && let Some(slowdown) = self.heap_slowdown(key.pid)
        {
            evidence.slope_bytes_per_s *= slowdown;
        }
        evidence
    }

    /// Whether a heap stack of `pid` is judged a leak now (from `warmup_s`).
    pub fn heap_leaks(&self, pid: u32, warmup_s: f64) -> bool {
        self.heap_leak_evidence(pid, warmup_s).next().is_some()
    }

    /// The heap stacks of `pid` judged a leak now (from `warmup_s`).
    pub fn heap_leak_stacks(&self, pid: u32, warmup_s: f64) -> FxHashSet<Option<StackId>> {
        self.heap_leak_evidence(pid, warmup_s)
            .map(|(k, _)| k.stack)
            .collect()
    }

    /// Whether the heap stacks of `pid` judged a leak grew by `bytes` at least, all together:
    /// judged until they have (a process under `--heap full` has hundreds of thousands).
    pub(super) fn heap_leaks_by(&self, pid: u32, warmup_s: f64, bytes: i64) -> bool {
        let mut grown = 0i64;
        bytes <= 0
            || self.heap_leak_evidence(pid, warmup_s).any(|(_, e)| {
                grown = grown.saturating_add(e.growth_bytes);
                grown >= bytes
            })
    }

    /// The heap stacks of `pid` judged a leak now, with their evidence.
    fn heap_leak_evidence(
        &self,
        pid: u32,
        warmup_s: f64,
    ) -> impl Iterator<Item = (&GroupKey, Evidence)> {
        self.groups
            .keys()
            .filter(move |k| k.pid == pid && k.kind == Kind::Heap)
            .filter_map(move |k| Some((k, self.judge(k, warmup_s)?)))
            .filter(|(_, e)| e.verdict == Verdict::Leak)
    }

    /// `series` of `key` as it is judged: up to when its process's malloc family was taken out,
    /// for a heap stack; before its interpreter's exit, for any.
    pub(super) fn as_judged<'s>(&'s self, key: &GroupKey, series: &'s Series) -> Cow<'s, Series> {
        let window = self
            .heap_window
            .get(&key.pid)
            .filter(|_| key.kind == Kind::Heap);
        let Some(w) = window else {
            return self.before_exit(key.pid, series);
        };
        let own = w.series.as_ref().map(|s| s.stacks.get(key));
        let series = match own {
            // Not sampled since the window began: nothing of it was seen in the window.
            Some(None) => return Cow::Owned(Series::default()),
            Some(Some(own)) => own,
            None => series,
        };
        match self.before_exit(key.pid, series) {
            Cow::Borrowed(s) => w.judged(s),
            Cow::Owned(s) => Cow::Owned(w.judged(&s).into_owned()),
        }
    }

    /// `series` of a stack of `pid`, up to the samples before its interpreter began its exit
    /// (`Py_FinalizeEx`): what the teardown makes is no line of its program's, and what it
    /// frees was held.
    pub(super) fn before_exit<'s>(&self, pid: u32, series: &'s Series) -> Cow<'s, Series> {
        match self.procs.get(&pid).and_then(|p| p.exit_x) {
            Some(x) if x.is_finite() => Cow::Owned(series.ending_before(x)),
            _ => Cow::Borrowed(series),
        }
    }

    /// `pid`'s heap-level total (`heap`) or pages beside it (`series`, `which` of them), up to
    /// when its malloc family was taken out (after, the heap is not seen, while the pages go on
    /// holding its leak), from when it was traced again (on the window's own series).
    pub(super) fn heap_as_judged<'s>(
        &'s self,
        pid: u32,
        series: &'s Series,
        which: Total,
    ) -> Cow<'s, Series> {
        let Some(w) = self.heap_window.get(&pid) else {
            return Cow::Borrowed(series);
        };
        let own = w.series.as_ref().map(|s| match which {
            Total::Heap => &s.heap,
            Total::Pages => &s.pages,
        });
        w.judged(own.unwrap_or(series))
    }
}

impl HeapWindow {
    /// `series` from when the window began (where it is not the window's own) until it was
    /// taken out.
    fn judged<'s>(&self, series: &'s Series) -> Cow<'s, Series> {
        let from = match (self.from, &self.series) {
            (Some(x), None) => Cow::Owned(series.since(x)),
            _ => Cow::Borrowed(series),
        };
        match self.until {
            Some(x) => Cow::Owned(from.until(x)),
            None => from,
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

    /// [`leaking`] with its CPU time: `user` seconds a second of its own code while its malloc
    /// family was traced (to 15 s), 0.9 after; asked for at the start as a layer, or not.
    fn leaking_at(user: f64, layer: bool) -> (Analysis, GroupKey) {
        let (mut a, heap) = leaking(true);
        if layer {
            a.heap_asked(1, 0.0);
        }
        for i in 0..30u64 {
            let t = i as f64;
            let user = user * t.min(15.0) + 0.9 * (t - 15.0).max(0.0);
            a.sample_cpu(t, 1, crate::model::CpuTimes { total: t, user });
        }
        (a, heap)
    }

    #[test]
    fn a_heap_layers_rates_are_at_the_pace_its_program_runs_untraced() {
        let rate = |a: &Analysis, heap| a.judge(heap, 0.0).unwrap().slope_bytes_per_s;
        let mib = (1 << 20) as f64;
        // Three times slower while traced: 1 MiB a second of its slowed run is 3 untraced.
        let (a, heap) = leaking_at(0.3, true);
        assert!((a.heap_slowdown(1).unwrap() - 3.0).abs() < 1e-6);
        assert!(
            (rate(&a, &heap) - 3.0 * mib).abs() < 3e4,
            "{}",
            rate(&a, &heap)
        );
        // As fast traced as untraced: no slowdown, the rate as it was.
        let (a, heap) = leaking_at(0.9, true);
        assert_eq!(a.heap_slowdown(1), None);
        assert!((rate(&a, &heap) - mib).abs() < 1e4);
        // A malloc family traced all along (--heap full) has no untraced pace to be put at.
        let (a, heap) = leaking_at(0.3, false);
        assert_eq!(a.heap_slowdown(1), None);
        assert!((rate(&a, &heap) - mib).abs() < 1e4);
    }

    /// [`leaking`], traced again at 30 s, its pages growing on: the first leak's stack holds
    /// what it was kept at, another grows by 1 MiB a second.
    fn traced_again() -> (Analysis, GroupKey, GroupKey) {
        let (mut a, first) = leaking(true);
        let second = GroupKey {
            stack: Some(crate::model::StackId::new(3)),
            ..first
        };
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        ledger.procs.get_mut(&1).unwrap().malloc_seen = true;
        a.heap_traced_again(1, 30.0);
        for i in 30..60u64 {
            let groups = [(first, 23 << 20), (second, (i - 29) << 20)];
            a.sample(i as f64, &ledger, &groups);
        }
        (a, first, second)
    }

    /// [`leaking`], then half an hour of samples ten a second, the stack kept as it was taken
    /// out; traced again there, it grows by 1 MiB a second for 5 s, sampled twenty times a
    /// second. The run's series have merged their points to one per ~50 s by then: the window
    /// is judged on its own series, a leak (on the run's series, it had no verdict at all).
    #[test]
    fn a_window_traced_again_half_an_hour_in_is_judged_on_its_own_samples() {
        let (mut a, heap) = leaking(true);
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        ledger.procs.get_mut(&1).unwrap().malloc_seen = true;
        for i in 300..18_000u64 {
            a.sample(i as f64 / 10.0, &ledger, &[(heap, 23 << 20)]);
        }
        let whole = &a.groups[&heap].series;
        let point = whole.points()[1].t0 - whole.points()[0].t0;
        assert!(point > 25.0, "{point}");
        a.heap_traced_again(1, 1800.0);
        for i in 0..100u64 {
            let bytes = (23 << 20) + i * (1 << 20) / 20;
            a.sample(1800.0 + i as f64 / 20.0, &ledger, &[(heap, bytes)]);
        }
        let e = a.judge(&heap, 0.0).unwrap();
        assert_eq!(e.verdict, Verdict::Leak, "{e:?}");
        assert!(e.windows[0].t0_s >= 1800.0, "{e:?}");
        assert!(a.heap_leaks(1, 0.0));
        // Taken out, then traced again and cut short by the run's end: this window stands.
        a.heap_taken_out(1, 1805.0);
        a.heap_traced_again(1, 1900.0);
        a.sample(1900.0, &ledger, &[(heap, 28 << 20)]);
        a.heap_window_undecided(1);
        assert_eq!(a.judge(&heap, 0.0).unwrap().verdict, Verdict::Leak);
    }

    /// Judged on its last window, the first leak's stack is no leak any more (judged whole, its
    /// rise before would still make it one) and the second is. Undecided at the run's end, the
    /// window before stands; decided (taken out again), the last one does.
    #[test]
    fn a_heap_traced_again_is_judged_on_its_last_decided_window() {
        let (mut a, first, second) = traced_again();
        assert_ne!(a.judge(&first, 0.0).unwrap().verdict, Verdict::Leak);
        assert_eq!(a.judge(&second, 0.0).unwrap().verdict, Verdict::Leak);
        let leaks = a.heap_leak_stacks(1, 0.0);
        assert_eq!(leaks.into_iter().collect::<Vec<_>>(), vec![second.stack]);
        a.heap_window_undecided(1);
        assert_eq!(a.judge(&first, 0.0).unwrap().verdict, Verdict::Leak);

        let (mut a, first, second) = traced_again();
        a.heap_taken_out(1, 45.0);
        a.heap_window_undecided(1);
        let e = a.judge(&second, 0.0).unwrap();
        assert_eq!(e.verdict, Verdict::Leak);
        assert!(e.windows[0].t0_s >= 30.0 && e.windows.last().unwrap().t1_s <= 45.0);
        assert_ne!(a.judge(&first, 0.0).unwrap().verdict, Verdict::Leak);
    }
}
