//! `--tensors auto`: the spans a process's CPU tensors were traced in, and what they mean for
//! its verdicts. Its pages are judged from the first span on (before, what filled them could not
//! be told, and what they did then is what called for the tensors). Its tensors are judged in
//! one span alone (outside the spans no tensor is seen made or freed): the last, while it is
//! open; or the last kept one, where they were taken out once their leak was confirmed and kept
//! as they were then, until a span traced again since has been traced long enough to judge.

use std::borrow::Cow;

use super::{Analysis, Evidence, Series, Verdict, classify, span, span_start};
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
#[derive(Clone, Copy, Debug)]
pub(super) struct TensorSpan {
    from: f64,
    /// Infinite while they still are.
    to: f64,
    /// Taken out once their leak was confirmed: those outstanding then were kept, and the span
    /// is judged up to its end.
    kept: bool,
}

impl TensorSpan {
    /// The stretch its tensors are judged over: from a little after it began (see
    /// [`TENSOR_RAMP`]) to its end.
    fn judged(&self) -> (f64, f64) {
        (self.from + TENSOR_RAMP, self.to)
    }
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
                kept: false,
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
        if let Some(last) = self.tensor_spans.get_mut(&pid).and_then(|s| s.last_mut()) {
            last.to = last.to.min(x);
            last.kept = kept;
        }
    }

    /// The stretch `key` is judged over, (from, until): from the warm-up; for the pages of a
    /// process whose tensors were traced late, from then on; for its tensors, over the span
    /// they are judged in (see the module's note), never when there is none.
    pub(super) fn judged_span(&self, key: &GroupKey, warmup_s: f64) -> (f64, f64) {
        let whole = (warmup_s, f64::INFINITY);
        let Some(spans) = self.tensor_spans.get(&key.pid) else {
            return whole;
        };
        match key.kind {
            Kind::Mmap if self.arena_stacks.contains(key) => whole,
            Kind::Mmap | Kind::Brk => (warmup_s.max(spans[0].from), f64::INFINITY),
            Kind::Tensor => match self.tensors_judged_in(spans) {
                Some((from, until)) => (warmup_s.max(from), until),
                None => (f64::INFINITY, f64::INFINITY),
            },
            _ => whole,
        }
    }

    /// The stretch of the span a process's tensors are judged in (see the module's note).
    fn tensors_judged_in(&self, spans: &[TensorSpan]) -> Option<(f64, f64)> {
        let last = spans.last()?;
        let kept = spans.iter().rev().find(|s| s.kept);
        if last.to.is_finite() {
            return last.kept.then(|| last.judged());
        }
        let young = self.last_x - last.from < TENSOR_RAMP + TENSORS_CONFIRM_S;
        match kept {
            Some(k) if young => Some(k.judged()),
            _ => Some(last.judged()),
        }
    }

    /// `key`'s series, up to `until` (the end of the span its tensors are judged in).
    pub(super) fn series_until(&self, key: &GroupKey, until: f64) -> Option<Cow<'_, Series>> {
        let series = &self.groups.get(key)?.series;
        Some(if until.is_finite() {
            Cow::Owned(series.until(until))
        } else {
            Cow::Borrowed(series)
        })
    }

    /// Up to when `pid`'s tensors tell what they did: the end of their last span where they
    /// were kept at its end (not traced since); for ever otherwise.
    fn tensors_told_until(&self, pid: u32) -> f64 {
        match self.tensor_spans.get(&pid).and_then(|s| s.last()) {
            Some(s) if s.kept => s.to,
            _ => f64::INFINITY,
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
    /// span traced since ended without a leak): of all of them, or of the stacks judged a leak
    /// together, whichever is more (the others' tensors may hide a leak in the total).
    pub fn kept_leak_rate(&self, pid: u32) -> Option<f64> {
        let spans = self.tensor_spans.get(&pid)?;
        let kept = match spans.as_slice() {
            [.., k] if k.kept => k,
            [.., k, open] if k.kept && open.to.is_infinite() => k,
            _ => return None,
        };
        let (from, until) = kept.judged();
        let rate = |s: &Series| {
            classify(&s.until(until), from)
                .filter(|e| e.verdict == Verdict::Leak && span(e) > 0.0)
                .map_or(0.0, |e| e.growth_bytes as f64 / span(&e))
        };
        let all = self.procs.get(&pid).map_or(0.0, |p| rate(&p.tensors));
        let stacks: f64 = self
            .groups
            .iter()
            .filter(|(k, _)| k.pid == pid && k.kind == Kind::Tensor)
            .map(|(_, t)| rate(&t.series))
            .sum();
        Some(all.max(stacks)).filter(|&r| r > 0.0)
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

    /// A page-level stack's evidence `e`, over the stretch its process's tensors tell what
    /// they did (see [`Analysis::tensors_told_until`]): pages are compared with tensors there
    /// alone, as tensors kept as they were do not grow.
    pub(super) fn pages_while_told<'e>(
        &self,
        pages: &GroupKey,
        e: &'e Evidence,
        warmup_s: f64,
    ) -> Option<Cow<'e, Evidence>> {
        let until = self.tensors_told_until(pages.pid);
        let end = e.windows.last().map_or(f64::INFINITY, |w| w.t1_s);
        if end <= until {
            return Some(Cow::Borrowed(e));
        }
        let series = self.groups.get(pages)?.series.until(until);
        classify(&series, span_start(e, warmup_s)).map(Cow::Owned)
    }
}
