//! `--tensors auto`: the spans a process's CPU tensors were traced in, and what they mean for
//! its verdicts. Its pages are judged from the first span on (before, what filled them could not
//! be told, and what they did then is what called for the tensors). Its tensors are judged on
//! their chain (outside the spans no tensor is seen made or freed): the spans since they were
//! last forgotten, each traced again after their leak was confirmed and they were kept as they
//! were, put end to end; while one is open, on the chain so far, else as the chain was judged
//! when they were last kept.

use rustc_hash::FxHashMap;

use super::{Analysis, Evidence, Series, Tracked, Verdict, classify, holds, span};
use crate::{
    ledger::Ledger,
    model::{GroupKey, Kind},
};

/// The samples a process's memory needs after its tensors went in for a page-level stack of
/// its to be judged on what it did before, where they went in too late (see
/// `Analysis::before_late_tensors`): whether the memory grew on, or held (a warm-up that
/// ended). Less tells neither, and the stack is judged on what had its tensors traced.
const TAIL_MIN_S: f64 = 1.0;

/// How long after its tensors went in (`--tensors auto`) a process's tensors are judged from, at
/// the start of their chain (on its axis): the samples in between rise from nothing to what it
/// holds as the probes see the tensors made since. (Traced again, those of the leak were kept:
/// the chain goes on from where it was.)
pub const TENSOR_RAMP: f64 = 1.0;
/// How long a leak of tensors must have been judged one before they are taken out and kept as
/// they are (`--tensors auto`): the tensors of a leaking training job would otherwise stay
/// traced, at two probe traps each, for as long as it leaks.
pub const TENSORS_CONFIRM_S: f64 = 2.0;

/// A process's CPU tensors as a layer: the spans (on the series' axis) they were traced in, and
/// their chain.
#[derive(Debug, Default)]
pub(super) struct TensorHistory {
    spans: Vec<TensorSpan>,
    chain: Chain,
}

/// A span (on the series' axis) a process's CPU tensors were traced in.
#[derive(Debug)]
struct TensorSpan {
    from: f64,
    /// Infinite while they still are.
    to: f64,
    /// Taken out once their leak was confirmed: those outstanding then were kept, and the
    /// chain was judged as it ended.
    kept: Option<KeptLeak>,
}

/// A process's tensors over the spans they were traced in since they were last forgotten: the
/// first span, and each traced again after a confirmed leak (those kept were kept, not
/// forgotten, so each span goes on from where the last ended). Sampled only while a span is
/// open, on an axis of the seconds traced: what the tensors would show had they been traced
/// without the stretches between, where a leak of them went on unseen, or stopped. On that
/// axis a span of a few seconds keeps its grain however long the run (the series' own grain
/// widens with the run, to half a minute a point after half an hour), and a leak that stopped
/// shows as a growth, then a quiet stretch.
#[derive(Debug, Default)]
pub(super) struct Chain {
    stacks: FxHashMap<GroupKey, Tracked>,
    all: Series,
    round: u64,
    /// Where each span begins: on the chain's axis, and on the series' axis.
    starts: Vec<(f64, f64)>,
    /// The stacks that held bytes as the open span began (traced again): where their chain
    /// went on from.
    resumed: FxHashMap<GroupKey, Resumed>,
    /// Each stack's least on the chain less its least on the ledger, at its last sample.
    offsets: FxHashMap<GroupKey, i64>,
}

/// A stack of a chain traced again: the least it held on the chain as the span began, and
/// the least it held over its first [`RESUME_SAMPLES`] samples that saw it hold anything since.
/// It goes on by what it gained or lost since: those of a leak kept as they were are still
/// held (a list that keeps every step's tensor), but an accumulator grown by copying (`acc =
/// torch.cat([acc, x])`) holds one block, its last copy, made anew as the span began, grown by
/// all it gained while not traced: taken as it is, the chain would jump there, and its leak
/// read as a cache that filled in one window. (The least, not what a sample caught: such a
/// stack holds two copies while it copies, most of the time once it is large. And over more
/// than one sample: one may catch a step's temporary at the same stack, a validation pass's
/// hidden layer of a megabyte beside logits of 40 KiB each, and the whole span would read a
/// megabyte low.) Until then it reads where it began, unless it holds nothing.
#[derive(Clone, Copy, Debug)]
struct Resumed {
    from: u64,
    first: Option<u64>,
    seen: u32,
    /// The chain less the ledger at the stack's last sample before: where the ledger's `first`
    /// puts the chain, should `from` be higher (the last sample caught a temporary, and the
    /// whole span would read a megabyte high). Applied once, as `first` is settled.
    off: Option<i64>,
}

/// The samples a stack traced again must hold anything in before where it goes on from is
/// settled (see [`Resumed`]).
const RESUME_SAMPLES: u32 = 3;

impl Resumed {
    fn new(from: u64, off: i64) -> Self {
        Self {
            from,
            first: None,
            seen: 0,
            off: Some(off),
        }
    }

    /// `(least, bytes)` on the chain, where the stack holds them now.
    fn on_chain(&mut self, (least, bytes): (u64, u64)) -> (u64, u64) {
        if least > 0 && self.seen < RESUME_SAMPLES {
            self.seen += 1;
            self.first = Some(self.first.map_or(least, |f| f.min(least)));
        }
        let Some(first) = self.first else {
            return (self.from, self.from);
        };
        // Settling, but for a fall to nothing (the teardown freed them all).
        if self.seen < RESUME_SAMPLES && least > 0 {
            return (self.from, self.from);
        }
        if let Some(off) = self.off.take() {
            self.from = self.from.min((first as i64 + off).max(0) as u64);
        }
        let at = |b: u64| (self.from + b).saturating_sub(first);
        (at(least), at(bytes))
    }
}

impl Chain {
    /// A span begins where the chain was kept: each stack holding bytes goes on from there.
    fn resume(&mut self) {
        let offsets = &self.offsets;
        self.resumed = self
            .stacks
            .iter()
            .filter_map(|(k, t)| Some((*k, t.series.points().last()?.min)))
            .filter(|&(_, from)| from > 0)
            .map(|(k, from)| (k, Resumed::new(from, offsets.get(&k).copied().unwrap_or(0))))
            .collect();
    }

    /// `key` judged on this chain, from [`TENSOR_RAMP`] on.
    fn judged(&self, key: &GroupKey) -> Judged<'_> {
        let series = self.stacks.get(key).map(|t| &t.series);
        Judged::Chain(series, TENSOR_RAMP, self)
    }

    /// `(least, bytes)` of `key` (what it holds on the ledger), as they read on the chain.
    fn held(&mut self, key: &GroupKey, held: (u64, u64)) -> (u64, u64) {
        let on = match self.resumed.get_mut(key) {
            Some(r) => r.on_chain(held),
            None => held,
        };
        self.offsets.insert(*key, on.0 as i64 - held.0 as i64);
        on
    }

    /// A stack's evidence `e` on the chain's axis, judged from `from`, as a leak only where the
    /// process's tensors together grew with it: where they held while it grew, other stacks
    /// gave back what it gained (`moved`). Judged here, on the chain, where the tensors were
    /// seen: the process's heap-level series on the run's axis spans stretches where they were
    /// not traced (a Hugging Face job's leak of 6.8 MB/s read as moved against a heap that held
    /// while they were out).
    pub(super) fn moved_on_chain(&self, mut e: Evidence, from: f64) -> Evidence {
        if e.verdict == Verdict::Leak && holds(&self.all, &e, from) {
            e.verdict = Verdict::Moved;
        }
        e
    }

    /// `e`, judged on the chain's axis, with its windows put on the series' axis.
    pub(super) fn on_series_axis(&self, mut e: Evidence) -> Evidence {
        for w in &mut e.windows {
            (w.t0_s, w.t1_s) = (self.at(w.t0_s), self.at(w.t1_s));
        }
        e
    }

    /// `t` on the chain's axis, on the series' axis.
    fn at(&self, t: f64) -> f64 {
        let i = self.starts.partition_point(|s| s.0 <= t).saturating_sub(1);
        self.starts.get(i).map_or(t, |&(c, x)| x + (t - c))
    }

    /// Whether a stack judged a leak on the chain holds more at the end of the open span than
    /// it did as the span began (where it resumed from: the least of the last point of the span
    /// before, which lies where this one begins): the leak goes on (it may have stopped where
    /// none does).
    fn grew_in_last_span(&self) -> bool {
        if self.starts.is_empty() {
            return false;
        }
        self.stacks.iter().any(|(key, t)| {
            let leak = classify(&t.series, TENSOR_RAMP).is_some_and(|e| e.verdict == Verdict::Leak);
            // By the least held (a sample may catch an accumulator holding two copies).
            let then = self.resumed.get(key).map_or(0, |r| r.from);
            leak && t
                .series
                .points()
                .last()
                .is_some_and(|now| now.min > then + 4096)
        })
    }
}

/// A process's tensors as they were judged when they were kept as they were (their leak
/// confirmed): each stack's verdict over the chain, on the series' axis, the rate they leaked
/// at while traced, and, where they had stopped growing (a leak that ended, or a cache that
/// filled), until when (on the series' axis) that stands: once its quiet stretch is as long as
/// its growth, it was a cache. Judged then, once.
#[derive(Clone, Debug, Default)]
struct KeptLeak {
    stacks: FxHashMap<GroupKey, Evidence>,
    rate: f64,
    /// The process's CPU seconds a second over the chain's spans (cpu.rs): `rate` over it is
    /// the rate per second of its CPU time. None where not known.
    cpu_share: Option<f64>,
    stopped: Option<f64>,
}

/// How a process's tensors were taken out: forgotten (their memory held, or a leak of theirs that
/// stopped has been quiet for longer than it grew: a cache that filled); kept as they were once
/// their leak was confirmed on their chain; or kept still, as they were judged when last kept,
/// their leak having stopped a while before (as a training loop's does when it ends).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TakenOut {
    Forgotten,
    Kept,
    /// Until when (on the series' axis) the stopped leak stands.
    Stopped(f64),
}

/// The run's clock for a series being judged: its own axis, or a chain's, which leaves out the
/// stretches its tensors were not traced in (the program ran on through them).
#[derive(Clone, Copy)]
pub(super) enum Clock<'a> {
    Own,
    Chain(&'a Chain),
}

impl Clock<'_> {
    /// The seconds `s` covers on the run's clock.
    pub(super) fn span(self, s: &Series) -> f64 {
        let (Some(first), Some(last)) = (s.points().first(), s.points().last()) else {
            return 0.0;
        };
        match self {
            Clock::Own => last.t1 - first.t0,
            Clock::Chain(c) => c.at(last.t1) - c.at(first.t0),
        }
    }
}

/// Where a group is judged from: on its series from a point on the series' axis (infinite:
/// never), on its tensors' chain series from a point on the chain's axis, or as its tensors
/// were judged when they were kept.
pub(super) enum Judged<'a> {
    From(f64),
    Chain(Option<&'a Series>, f64, &'a Chain),
    Kept(Option<&'a Evidence>),
}

impl Analysis {
    /// How long `pid`'s tensors, all together or at any stack, have been judged a leak on their
    /// chain (from a little after they were first traced in it, see [`TENSOR_RAMP`]); None
    /// where they are not.
    pub fn tensors_leak(&self, pid: u32) -> Option<f64> {
        let chain = &self.tensors.get(&pid)?.chain;
        let leak = |s: &Series| {
            classify(s, TENSOR_RAMP)
                .filter(|e| e.verdict == Verdict::Leak)
                .map(|e| span(&e))
        };
        let stacks = chain.stacks.values().filter_map(|t| leak(&t.series));
        leak(&chain.all).into_iter().chain(stacks).reduce(f64::max)
    }

    /// `pid`'s CPU tensors are traced from the sample at `x` on (`--tensors auto`): their chain
    /// goes on where they were kept as they were, else begins.
    pub fn tensors_traced_from(&mut self, pid: u32, x: f64) {
        let h = self.tensors.entry(pid).or_default();
        let last = h.spans.last();
        if last.is_some_and(|s| s.to.is_infinite()) {
            return;
        }
        let traced = match last {
            Some(s) if s.kept.is_some() => {
                h.chain.resume();
                h.chain.starts.last().map_or(0.0, |c| c.0) + s.to - s.from
            }
            _ => {
                h.chain = Chain::default();
                0.0
            }
        };
        h.chain.starts.push((traced, x));
        h.spans.push(TensorSpan {
            from: x,
            to: f64::INFINITY,
            kept: None,
        });
    }

    /// Samples the chain of each process whose tensors are traced now, at `x` on the series'
    /// axis: each tensor stack of `groups` (the ledger's group bytes), those gone as 0.
    pub(super) fn sample_chains(&mut self, x: f64, ledger: &Ledger, groups: &[(GroupKey, u64)]) {
        for (&pid, h) in self.tensors.iter_mut() {
            let (Some(span), Some(&(at, _))) = (h.spans.last(), h.chain.starts.last()) else {
                continue;
            };
            if span.to.is_finite() {
                continue;
            }
            let (t, chain) = (at + x - span.from, &mut h.chain);
            chain.round += 1;
            let mut all = 0;
            for &(key, bytes) in groups {
                if key.pid == pid && key.kind == Kind::Tensor {
                    let activity = super::activity(ledger, &key);
                    let held = (ledger.least_since_sample(&key, bytes), bytes);
                    let held = chain.held(&key, held);
                    chain
                        .stacks
                        .entry(key)
                        .or_default()
                        .push(t, held, chain.round, activity);
                    all += held.1;
                }
            }
            let gone: Vec<GroupKey> = chain
                .stacks
                .iter()
                .filter(|(_, tracked)| tracked.round != chain.round)
                .map(|(k, _)| *k)
                .collect();
            for key in gone {
                let held = chain.held(&key, (0, 0));
                let activity = super::activity(ledger, &key);
                if let Some(tracked) = chain.stacks.get_mut(&key) {
                    tracked.push(t, held, chain.round, activity);
                }
            }
            chain.all.push(t, all);
        }
    }

    /// Where `pid`'s CPU tensors were first traced from, where they were traced late.
    pub fn tensors_first(&self, pid: u32) -> Option<f64> {
        let h = self.tensors.get(&pid)?;
        h.spans.first().map(|s| s.from)
    }

    /// A page-level stack (not an arena's) of a process whose tensors went in less than
    /// [`super::CUT_SPAN_S`] before its last sample (too late for it to be judged from then on, and
    /// for its tensors to show a leak), unless the process's memory held after: it
    /// is judged on its samples up to then instead, as without tensors (`--heap off`), the
    /// growth that had them traced at its own line. A short job (a smoke test of a few
    /// training steps in CI) gets a verdict on the pages it grew, where until then it got
    /// none and passed; one whose pages grew in its warm-up and held once its tensors went in
    /// gets none.
    pub(super) fn before_late_tensors(
        &self,
        key: &GroupKey,
        warmup_s: f64,
    ) -> Option<Option<Evidence>> {
        let (went_in, went_on, series) = self.late_tensors(key, warmup_s)?;
        if went_on == Some(false) {
            tracing::debug!(
                ?key,
                went_in,
                "pages not judged before late tensors: none grew after"
            );
            return Some(None);
        }
        let before = classify(&series.until(went_in), warmup_s);
        let before = before.and_then(|e| self.explain(key, e, warmup_s));
        if before.as_ref().is_some_and(|e| e.growth_bytes > 0) {
            tracing::debug!(?key, ?before, "pages judged before late tensors");
        }
        Some(before)
    }

    /// Where a page-level stack is judged on its samples before its process's tensors went in,
    /// as they went in too late ([`Analysis::before_late_tensors`]): when they went in, whether
    /// the process's memory went on growing after, as a leak grows (None: too few samples after
    /// to tell), and the stack's series as judged.
    fn late_tensors(
        &self,
        key: &GroupKey,
        warmup_s: f64,
    ) -> Option<(f64, Option<bool>, std::borrow::Cow<'_, Series>)> {
        if !matches!(key.kind, Kind::Mmap | Kind::Brk) || self.arena_stacks.contains(key) {
            return None;
        }
        let went_in = self.tensors_first(key.pid)?;
        let series = self.as_judged(key, &self.groups.get(key)?.series);
        let end = series.points().last()?.t1;
        if went_in <= warmup_s || end - went_in >= super::CUT_SPAN_S {
            return None;
        }
        Some((went_in, self.went_on(key.pid, went_in), series))
    }

    /// Whether a page-level stack judged at the end on what it did before its process's late
    /// tensors went in saw that memory go on growing after them, as a leak grows: what its
    /// verdict read was the start of that growth, not a warm-up's moves of the heap's top that
    /// stop (see [`super::a_large_heaps_small_rise`]). A short training job's heap of 187 MiB,
    /// torch's, rose 14 MiB in the loop's first second at the line whose tensors it kept, and
    /// went on.
    pub fn grew_on_after_late_tensors(&self, key: &GroupKey, warmup_s: f64) -> bool {
        matches!(self.late_tensors(key, warmup_s), Some((_, Some(true), _)))
    }

    /// Whether `pid`'s tensors, or the pages of its heap (brk), grew from `x` on (before its
    /// interpreter's exit) as a leak grows, in all windows but one at most (samples a busy
    /// machine spaces unevenly leave one short window now and then): not by a block or two,
    /// once. None
    /// where less than [`TAIL_MIN_S`] of samples came since: too few to tell either way.
    fn went_on(&self, pid: u32, x: f64) -> Option<bool> {
        let p = self.procs.get(&pid)?;
        let rising = |e: Evidence| {
            let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
            let tol = super::verdict::tolerance(&floors);
            let rises = floors.windows(2).filter(|f| f[1] > f[0] + tol).count();
            e.verdict == Verdict::Leak && rises + 1 >= floors.len().saturating_sub(1)
        };
        let tails = [&p.tensors, &p.pages].map(|s| self.before_exit(pid, s).since(x));
        if tails.iter().all(|t| t.span() < TAIL_MIN_S) {
            return None;
        }
        let judged = tails.map(|t| classify(&t, x));
        tracing::debug!(pid, x, ?judged, "memory after late tensors");
        Some(judged.into_iter().any(|e| e.is_some_and(rising)))
    }

    /// `pid`'s CPU tensors are no longer traced from the sample at `x` on: those outstanding
    /// were forgotten, or kept as they are where their leak was confirmed (`kept`).
    pub fn tensors_taken_out(&mut self, pid: u32, x: f64, how: TakenOut) {
        let leak = match how {
            TakenOut::Forgotten => None,
            TakenOut::Kept => self.judge_kept(pid),
            TakenOut::Stopped(until_x) => self.last_kept(pid).map(|k| KeptLeak {
                stopped: Some(until_x),
                ..k.clone()
            }),
        };
        if let Some(k) = &leak {
            tracing::debug!(pid, rate = k.rate, cpu_share = k.cpu_share, "tensors kept");
        }
        let Some(last) = self.tensors.get_mut(&pid).and_then(|h| h.spans.last_mut()) else {
            return;
        };
        (last.to, last.kept) = (last.to.min(x), leak);
    }

    /// Whether a stack judged a leak on `pid`'s chain grew in the span open now.
    pub fn tensors_grew(&self, pid: u32) -> bool {
        self.tensors
            .get(&pid)
            .is_some_and(|h| h.chain.grew_in_last_span())
    }

    /// Where (on the series' axis) `pid`'s chain of tensors began.
    pub fn tensors_chain_from(&self, pid: u32) -> Option<f64> {
        let h = self.tensors.get(&pid)?;
        h.chain.starts.first().map(|s| s.1)
    }

    /// `pid`'s tensors judged on their chain, as they are kept as they are: each stack, and the
    /// rate they leak at, of all of them or of the stacks judged a leak together, whichever is
    /// more (the others' tensors may hide a leak in the total).
    fn judge_kept(&self, pid: u32) -> Option<KeptLeak> {
        let chain = &self.tensors.get(&pid)?.chain;
        let rate = |e: &Evidence| {
            let leaks = e.verdict == Verdict::Leak && span(e) > 0.0;
            if leaks {
                e.growth_bytes as f64 / span(e)
            } else {
                0.0
            }
        };
        let judged: Vec<(GroupKey, Evidence)> = chain
            .stacks
            .iter()
            .filter_map(|(k, t)| {
                let e = classify(&t.series, TENSOR_RAMP)?;
                Some((*k, chain.moved_on_chain(e, TENSOR_RAMP)))
            })
            .collect();
        let together: f64 = judged.iter().map(|(_, e)| rate(e)).sum();
        let all = classify(&chain.all, TENSOR_RAMP);
        let rate = all.as_ref().map_or(0.0, rate).max(together);
        let stacks = judged
            .into_iter()
            .map(|(k, e)| (k, chain.on_series_axis(e)))
            .collect();
        let from = chain.starts.first().map_or(f64::INFINITY, |s| s.1);
        let h = self.tensors.get(&pid)?;
        let spans = h.spans.iter().filter(|s| s.from >= from);
        let pieces = spans.map(|s| (s.from, s.to.min(self.last_x)));
        Some(KeptLeak {
            stacks,
            rate,
            cpu_share: self.cpu_share(pid, pieces),
            stopped: None,
        })
    }

    /// Where `key` is judged from: the warm-up; for the pages of a process whose tensors were
    /// traced late, from then on; for its tensors, on their chain while a span of it is open,
    /// as they were judged when they were last kept, never where they were taken out without.
    pub(super) fn judged_from(&self, key: &GroupKey, warmup_s: f64) -> Judged<'_> {
        let Some(h) = self.tensors.get(&key.pid) else {
            return Judged::From(warmup_s);
        };
        let Some(first) = h.spans.first() else {
            return Judged::From(warmup_s);
        };
        match key.kind {
            Kind::Mmap if self.arena_stacks.contains(key) => Judged::From(warmup_s),
            Kind::Mmap | Kind::Brk => Judged::From(warmup_s.max(first.from)),
            Kind::Tensor => match h.spans.last() {
                // Traced again after their leak stopped: as they were judged until this span
                // tells (a quiet chain reads as a cache that filled, not as the leak it was).
                Some(open) if open.to.is_infinite() && self.kept_leak_stopped(key.pid) => self
                    .last_kept(key.pid)
                    .map_or(Judged::From(f64::INFINITY), |k| self.as_kept(h, k, key)),
                Some(open) if open.to.is_infinite() => h.chain.judged(key),
                Some(TensorSpan {
                    kept: Some(kept), ..
                }) => self.as_kept(h, kept, key),
                _ => Judged::From(f64::INFINITY),
            },
            _ => Judged::From(warmup_s),
        }
    }

    /// `key` as its tensors were judged when they were `kept`: on their chain, which is not
    /// sampled while they are kept (the same evidence, and a fall at its end read as the
    /// teardown it was where the run ends soon after: the teardown of an attached job that
    /// freed its logits while traced again, then kept them, had them judged steady on the
    /// evidence of the keep, and unreported); where a leak of theirs had stopped, as it was
    /// judged when they were last kept before, and not judged once it has been quiet for as
    /// long as it grew (a cache that filled).
    fn as_kept<'a>(
        &'a self,
        h: &'a TensorHistory,
        kept: &'a KeptLeak,
        key: &GroupKey,
    ) -> Judged<'a> {
        match kept.stopped {
            Some(until_x) if self.last_x >= until_x => Judged::From(f64::INFINITY),
            Some(_) => Judged::Kept(kept.stacks.get(key)),
            None => h.chain.judged(key),
        }
    }

    /// Whether `pid`'s tensors tell what they did over a page-level stack's evidence `e`: not
    /// where they are kept as they were (not traced since) and `e` goes on past then (kept
    /// tensors do not grow, whatever the pages do).
    pub(super) fn tensors_tell(&self, pid: u32, e: &Evidence) -> bool {
        let end = e.windows.last().map_or(0.0, |w| w.t1_s);
        match self.tensors.get(&pid).and_then(|h| h.spans.last()) {
            Some(s) if s.kept.is_some() => end <= s.to,
            _ => true,
        }
    }

    /// Whether a page-level stack grew by no more than twice what its process's tensors leaked
    /// at over the span they were last kept after (see [`Analysis::kept_leak_rate`]): pages
    /// grown while its tensors are kept as they were (no tensor of theirs seen, so no page given
    /// a tensor's stack) are the leak's, unless they grow faster.
    ///
    /// Counted on the clock or in the process's CPU time, whichever allows more (see
    /// [`Analysis::kept_leak_bytes`]): a rate measured while the machine gave the program half a
    /// CPU explains pages grown at twice it once it has a whole one again.
    pub(super) fn under_kept_tensors(&self, key: &GroupKey, e: &Evidence) -> bool {
        if !matches!(key.kind, Kind::Mmap | Kind::Brk) {
            return false;
        }
        let (from, to) = match (e.windows.first(), e.windows.last()) {
            (Some(a), Some(b)) => (a.t0_s, b.t1_s),
            _ => return false,
        };
        self.kept_leak_bytes(key.pid, from, to)
            .is_some_and(|(_, most)| e.growth_bytes as f64 <= 2.0 * most)
    }

    /// What `pid`'s tensors leaked between `x0` and `x1` (on the series' axis) at the rate
    /// they leaked at when they were last kept (see [`Analysis::kept_leak_rate`]), while they
    /// are kept or traced again since: the least and the most of it on the clock and in the
    /// process's CPU time over both (cpu.rs), where that is known. Neither alone tells: a
    /// machine that takes the CPU from the program slows it on the clock, not in its CPU time;
    /// a program that waits (on its data, on a GPU, on a timer) does as much per second of
    /// the clock whatever its probes cost it, which its CPU time does not.
    pub fn kept_leak_bytes(&self, pid: u32, x0: f64, x1: f64) -> Option<(f64, f64)> {
        let rate = self.kept_leak_rate(pid)?;
        let clock = rate * (x1 - x0);
        let share = self.last_kept(pid).and_then(|k| k.cpu_share);
        let cpu = share.zip(self.cpu_between(pid, x0, x1));
        Some(cpu.map_or((clock, clock), |(share, cpu)| {
            let cpu = rate / share * cpu;
            (clock.min(cpu), clock.max(cpu))
        }))
    }

    /// `pid`'s tensors as they were last kept, while they are kept or traced again since (not
    /// where a span traced since ended without a leak).
    fn last_kept(&self, pid: u32) -> Option<&KeptLeak> {
        let (last, before) = self.tensors.get(&pid)?.spans.split_last()?;
        if last.to.is_infinite() {
            before.last()?.kept.as_ref()
        } else {
            last.kept.as_ref()
        }
    }

    /// The rate (bytes a second traced) at which `pid`'s tensors leaked over their chain when
    /// they were last kept, while they are kept or traced again since.
    pub fn kept_leak_rate(&self, pid: u32) -> Option<f64> {
        let rate = self.last_kept(pid)?.rate;
        (rate > 0.0).then_some(rate)
    }

    /// The stacks judged a leak when `pid`'s tensors were last kept, and those held and rising
    /// then ([`held_rising`]): their tensors are likely held still.
    pub fn kept_held_stacks(&self, pid: u32) -> Vec<Option<crate::model::StackId>> {
        let Some(kept) = self.last_kept(pid) else {
            return Vec::new();
        };
        let held = kept
            .stacks
            .iter()
            .filter(|(_, e)| e.verdict == Verdict::Leak || held_rising(e));
        held.map(|(k, _)| k.stack).collect()
    }

    /// Whether `pid`'s tensors had stopped growing when they were last kept.
    pub fn kept_leak_stopped(&self, pid: u32) -> bool {
        self.last_kept(pid).is_some_and(|k| k.stopped.is_some())
    }

    /// Bytes `pid`'s page-level stacks (not arenas) held at the last sample.
    pub fn pages_now(&self, pid: u32) -> i64 {
        self.groups
            .iter()
            .filter(|(k, _)| k.pid == pid && matches!(k.kind, Kind::Mmap | Kind::Brk))
            .filter(|(k, _)| !self.arena_stacks.contains(k))
            .map(|(_, t)| t.series.last().unwrap_or(0) as i64)
            .sum()
    }
}

/// Whether a stack's tensors, not judged a leak when they were kept, were held and rising all
/// the same: every window's floor at least the one before, the last above the first. A job's
/// smaller leak beside a larger one (its validation logits, 40 KiB an epoch, beside the 1 MiB
/// activations their graphs hold) may not be confirmed by the time the larger one is, and its
/// tensors are as likely held still as the leak's. A step's temporaries (floors of nothing) and
/// what swung are not.
fn held_rising(e: &Evidence) -> bool {
    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
    let tol = super::verdict::tolerance(&floors);
    e.growth_bytes > tol as i64 && floors.windows(2).all(|w| w[1] + tol >= w[0])
}
