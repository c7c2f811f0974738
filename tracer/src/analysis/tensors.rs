//! `--tensors auto`: the spans a process's CPU tensors were traced in, and what they mean for
//! its verdicts. Its pages are judged from the first span on (before, what filled them could not
//! be told, and what they did then is what called for the tensors). Its tensors are judged in
//! one span alone (outside the spans no tensor is seen made or freed): the last, while it is
//! open; or the last kept one, where they were taken out once their leak was confirmed and kept
//! as they were then, until a span traced again since has been traced long enough to judge.

use rustc_hash::FxHashMap;

use super::{Analysis, Evidence, Series, Verdict, classify, span};
use crate::model::{GroupKey, Kind};

/// How long after its tensors are traced again (`--tensors auto`) a process's tensors are judged
/// from, on the series' axis: the samples in between rise from nothing to what it holds as the
/// probes see the tensors made since.
pub const TENSOR_RAMP: f64 = 1.0;
/// How long a leak of tensors must have been judged one before they are taken out and kept as
/// they are (`--tensors auto`): the tensors of a leaking training job would otherwise stay
/// traced, at two probe traps each, for as long as it leaks.
pub const TENSORS_CONFIRM_S: f64 = 2.0;

/// A span (on the series' axis) a process's CPU tensors were traced in.
#[derive(Debug)]
pub(super) struct TensorSpan {
    from: f64,
    /// Infinite while they still are.
    to: f64,
    /// Taken out once their leak was confirmed: those outstanding then were kept, and the span
    /// was judged as it ended.
    kept: Option<KeptLeak>,
}

/// A process's tensors as they were judged when they were kept as they were (their leak
/// confirmed): each stack's verdict over the span, and the rate they leaked at. Judged then,
/// once: series are merged as they age, and a span of a few seconds would soon be too few
/// points to judge.
#[derive(Debug, Default)]
struct KeptLeak {
    stacks: FxHashMap<GroupKey, Evidence>,
    rate: f64,
}

/// Where a group is judged from: on its series from a point on the series' axis (infinite:
/// never), or as its tensors were judged when they were kept.
pub(super) enum Judged<'a> {
    From(f64),
    Kept(Option<&'a Evidence>),
}

impl Analysis {
    /// How long `pid`'s tensors, all together or at any stack, have been judged a leak from
    /// `from_x` on (a little after they were last asked for, see [`TENSOR_RAMP`]); None where
    /// they are not.
    pub fn tensors_leak(&self, pid: u32, from_x: f64) -> Option<f64> {
        let leak = |s: &Series| {
            classify(s, from_x)
                .filter(|e| e.verdict == Verdict::Leak)
                .map(|e| span(&e))
        };
        let all = self.procs.get(&pid).and_then(|p| leak(&p.tensors));
        let stacks = self
            .groups
            .iter()
            .filter(|(k, _)| k.pid == pid && k.kind == Kind::Tensor)
            .filter_map(|(_, t)| leak(&t.series));
        all.into_iter().chain(stacks).reduce(f64::max)
    }

    /// `pid`'s CPU tensors are traced from the sample at `x` on (`--tensors auto`).
    pub fn tensors_traced_from(&mut self, pid: u32, x: f64) {
        let spans = self.tensor_spans.entry(pid).or_default();
        if spans.last().is_none_or(|s| s.to.is_finite()) {
            spans.push(TensorSpan {
                from: x,
                to: f64::INFINITY,
                kept: None,
            });
        }
    }

    /// Where `pid`'s CPU tensors were first traced from, where they were traced late.
    pub fn tensors_first(&self, pid: u32) -> Option<f64> {
        self.tensor_spans
            .get(&pid)
            .and_then(|s| s.first())
            .map(|s| s.from)
    }

    /// `pid`'s CPU tensors are no longer traced from the sample at `x` on: those outstanding
    /// were forgotten, or kept as they are where their leak was confirmed (`kept`).
    pub fn tensors_taken_out(&mut self, pid: u32, x: f64, kept: bool) {
        let Some(from) = self
            .tensor_spans
            .get(&pid)
            .and_then(|s| s.last())
            .map(|s| s.from)
        else {
            return;
        };
        let leak = kept.then(|| self.judge_kept(pid, from + TENSOR_RAMP));
        if let Some(last) = self.tensor_spans.get_mut(&pid).and_then(|s| s.last_mut()) {
            (last.to, last.kept) = (last.to.min(x), leak);
        }
    }

    /// `pid`'s tensors judged from `from` on, as they are kept as they are: each stack, and the
    /// rate they leak at, of all of them or of the stacks judged a leak together, whichever is
    /// more (the others' tensors may hide a leak in the total).
    fn judge_kept(&self, pid: u32, from: f64) -> KeptLeak {
        let rate = |e: &Evidence| {
            let leaks = e.verdict == Verdict::Leak && span(e) > 0.0;
            if leaks {
                e.growth_bytes as f64 / span(e)
            } else {
                0.0
            }
        };
        let stacks: FxHashMap<GroupKey, Evidence> = self
            .groups
            .iter()
            .filter(|(k, _)| k.pid == pid && k.kind == Kind::Tensor)
            .filter_map(|(k, t)| Some((*k, classify(&t.series, from)?)))
            .collect();
        let all = self
            .procs
            .get(&pid)
            .and_then(|p| classify(&p.tensors, from));
        let together: f64 = stacks.values().map(rate).sum();
        let rate = all.as_ref().map_or(0.0, rate).max(together);
        KeptLeak { stacks, rate }
    }

    /// Where `key` is judged from: the warm-up; for the pages of a process whose tensors were
    /// traced late, from then on; for its tensors, in the span they are judged in (see the
    /// module's note), never when there is none.
    pub(super) fn judged_from(&self, key: &GroupKey, warmup_s: f64) -> Judged<'_> {
        let Some(spans) = self.tensor_spans.get(&key.pid) else {
            return Judged::From(warmup_s);
        };
        match key.kind {
            Kind::Mmap if self.arena_stacks.contains(key) => Judged::From(warmup_s),
            Kind::Mmap | Kind::Brk => Judged::From(warmup_s.max(spans[0].from)),
            Kind::Tensor => match self.tensors_judged_in(spans) {
                Some(TensorSpan {
                    kept: Some(kept), ..
                }) => Judged::Kept(kept.stacks.get(key)),
                Some(open) => Judged::From(warmup_s.max(open.from + TENSOR_RAMP)),
                None => Judged::From(f64::INFINITY),
            },
            _ => Judged::From(warmup_s),
        }
    }

    /// The span a process's tensors are judged in (see the module's note).
    fn tensors_judged_in<'s>(&self, spans: &'s [TensorSpan]) -> Option<&'s TensorSpan> {
        let last = spans.last()?;
        if last.to.is_finite() {
            return last.kept.is_some().then_some(last);
        }
        let kept = spans.iter().rev().find(|s| s.kept.is_some());
        let young = self.last_x - last.from < TENSOR_RAMP + TENSORS_CONFIRM_S;
        match kept {
            Some(k) if young => Some(k),
            _ => Some(last),
        }
    }

    /// Whether `pid`'s tensors tell what they did over a page-level stack's evidence `e`: not
    /// where they are kept as they were (not traced since) and `e` goes on past then (kept
    /// tensors do not grow, whatever the pages do).
    pub(super) fn tensors_tell(&self, pid: u32, e: &Evidence) -> bool {
        let end = e.windows.last().map_or(0.0, |w| w.t1_s);
        match self.tensor_spans.get(&pid).and_then(|s| s.last()) {
            Some(s) if s.kept.is_some() => end <= s.to,
            _ => true,
        }
    }

    /// Whether a page-level stack grew by no more than twice what its process's tensors leaked
    /// at over the span they were last kept after (see [`Analysis::kept_leak_rate`]): pages
    /// grown while its tensors are kept as they were (no tensor of theirs seen, so no page given
    /// a tensor's stack) are the leak's, unless they grow faster.
    pub(super) fn under_kept_tensors(&self, key: &GroupKey, e: &Evidence) -> bool {
        matches!(key.kind, Kind::Mmap | Kind::Brk)
            && self
                .kept_leak_rate(key.pid)
                .is_some_and(|rate| e.growth_bytes as f64 <= 2.0 * rate * span(e))
    }

    /// The rate (bytes a second, on the series' axis) at which `pid`'s tensors leaked over the
    /// span they were last kept after, while they are kept or traced again since (not where a
    /// span traced since ended without a leak).
    pub fn kept_leak_rate(&self, pid: u32) -> Option<f64> {
        let span = match self.tensor_spans.get(&pid)?.as_slice() {
            [.., k] if k.kept.is_some() => k,
            [.., k, open] if k.kept.is_some() && open.to.is_infinite() => k,
            _ => return None,
        };
        let rate = span.kept.as_ref()?.rate;
        (rate > 0.0).then_some(rate)
    }

    /// Bytes `pid`'s page-level stacks (not arenas) grew by since `x`, on the series' axis:
    /// what a leak kept as it was at `x` still grows by (see `session/owner/layers.rs`).
    pub fn pages_grown_since(&self, pid: u32, x: f64) -> i64 {
        let at = |s: &Series, x: f64| {
            let points = s.points();
            let i = points.partition_point(|p| p.t0 <= x);
            points.get(i.saturating_sub(1)).map_or(0, |p| p.last) as i64
        };
        self.groups
            .iter()
            .filter(|(k, _)| k.pid == pid && matches!(k.kind, Kind::Mmap | Kind::Brk))
            .filter(|(k, _)| !self.arena_stacks.contains(k))
            .map(|(_, t)| at(&t.series, f64::INFINITY) - at(&t.series, x))
            .sum()
    }
}
