//! Verdicts: per stack and per process, outstanding bytes sampled into bounded series, classified
//! as leak, spike, bounded cache or steady (verdict.rs), with the evidence. Fed by the ledger's owner
//! at each sample tick; read by the report.

mod objects;
pub mod series;
pub mod verdict;

use rustc_hash::FxHashMap;

pub use objects::{KEPT_MIN, kept_by_keepers};
pub use verdict::{Evidence, Verdict, classify, working_set};

use crate::{
    ledger::Ledger,
    model::{GroupKey, Kind},
};
use series::Series;

/// Bytes a group must hold once before it gets a series: a Python program's start-up leaves a
/// quarter of a million stacks of a few small objects each (every import line), and a series for
/// each cost ~100 ms per sample and hundreds of MB. A group is tracked from its first sample at
/// or above this, and from then on.
pub const TRACK_MIN: u64 = 16 << 10;

/// How long after its tensors are traced again (`--tensors auto`) a process's tensors are judged
/// from, on the series' axis: the samples in between rise from nothing to what it holds as the
/// probes see the tensors made since.
pub const TENSOR_RAMP: f64 = 1.0;
/// The span a page-level stack's verdict needs at least when its process's tensors were traced
/// late and it is judged from then on (see `Analysis::judged_from`).
const CUT_SPAN_S: f64 = 3.0;

/// Series per stack group and per process.
pub struct Analysis {
    groups: FxHashMap<GroupKey, Tracked>,
    /// Bytes a group must hold once to be tracked ([`TRACK_MIN`]).
    track_min: u64,
    /// Processes in which PyTorch's CUDA caching allocator handed out blocks: their device
    /// memory (cudaMalloc'd segments) is the allocator's cache under the blocks.
    caching: rustc_hash::FxHashSet<u32>,
    /// Per process: its heap-level, brk and tensor bytes.
    procs: FxHashMap<u32, ProcSeries>,
    /// Per process: the first sample since its malloc family was seen (the ledger's
    /// `malloc_seen`, since its last exec). Before, its heap-level bytes
    /// are tensors alone (`--heap auto` before the malloc family is traced, `--heap off`), and its
    /// brk growth cannot be told from a leak: it is not judged retention.
    heap_seen: FxHashMap<u32, f64>,
    /// Per process: its window of sampled Python objects, once closed.
    objects: FxHashMap<u32, objects::ObjectWindow>,
    /// Per process: the spans (on the series' axis) its CPU tensors were traced in, where they
    /// were not from the start (`--tensors auto`), the last open while they still are. Its pages
    /// are judged from the first on: before, what filled them could not be told, and what they
    /// did then was what called for the tensors. Its tensors are judged in the last, open one
    /// alone: outside them, no tensor is seen made or freed.
    tensor_spans: FxHashMap<u32, Vec<(f64, f64)>>,
    /// The mmap stacks that map arenas of Python objects (`--heap auto`): not judged from when
    /// tensors were traced, as other pages are (no tensor lands in an arena).
    arena_stacks: rustc_hash::FxHashSet<GroupKey>,
    /// Samples taken so far.
    round: u64,
}

/// A process's series.
#[derive(Default)]
struct ProcSeries {
    /// Heap-level bytes: heap blocks and CPU tensors.
    heap: Series,
    /// Page-level bytes of the allocator's heap (brk).
    pages: Series,
    /// Tensors: CPU tensors and the blocks of PyTorch's CUDA caching allocator.
    tensors: Series,
    /// Arenas of CPython's object allocator, all its stacks together (`Analysis::sample_arenas`):
    /// a leak of objects makes arenas at whichever line needs one, so no one arena stack
    /// shows it whole.
    arenas: Series,
}

/// A process's bytes in one sample, summed for its [`ProcSeries`].
#[derive(Clone, Copy, Default)]
struct ProcBytes {
    heap: u64,
    pages: u64,
    tensors: u64,
}

/// A group's series, the sample it was last given a value in, and its stack's activity count
/// then (see `Ledger::activity`).
#[derive(Default)]
struct Tracked {
    series: Series,
    round: u64,
    activity: u32,
}

impl Tracked {
    /// A sample of `bytes`, active when the stack's count moved since the last one.
    fn push(&mut self, t_s: f64, bytes: u64, round: u64, activity: u32) {
        self.series
            .push_sample(t_s, bytes, activity != self.activity);
        (self.round, self.activity) = (round, activity);
    }
}

/// A process's memory read for allocator retention: the allocator's heap (brk) growing while the
/// heap bytes inside it do not.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Retention {
    pub heap: Verdict,
    pub pages: Verdict,
    /// Pages grow while heap bytes do not: the allocator keeps memory nothing holds (fragmentation,
    /// arenas), not a leak in the program.
    pub retention: bool,
    pub pages_growth_bytes: i64,
}

impl Default for Analysis {
    fn default() -> Self {
        Self {
            groups: FxHashMap::default(),
            track_min: TRACK_MIN,
            caching: Default::default(),
            procs: FxHashMap::default(),
            heap_seen: FxHashMap::default(),
            objects: FxHashMap::default(),
            tensor_spans: FxHashMap::default(),
            arena_stacks: Default::default(),
            round: 0,
        }
    }
}

impl Analysis {
    /// An analysis that gives every group a series, however small (tests and benchmarks of
    /// ledgers of small blocks).
    pub fn tracking_every_group() -> Self {
        Self {
            track_min: 0,
            ..Self::default()
        }
    }

    /// Takes one sample at `t_s` seconds of every outstanding group (`groups`: the ledger's
    /// `group_bytes`, one entry per group) that holds [`TRACK_MIN`] or has before, and of every
    /// process. Groups tracked and gone now get a 0 at every sample (a spike that came back is a
    /// spike).
    pub fn sample(&mut self, t_s: f64, ledger: &Ledger, groups: &[(GroupKey, u64)]) {
        self.round += 1;
        let round = self.round;
        let mut per_proc: FxHashMap<u32, ProcBytes> = FxHashMap::default();
        for &(key, bytes) in groups {
            let tracked = if bytes >= self.track_min {
                Some(self.groups.entry(key).or_default())
            } else {
                self.groups.get_mut(&key)
            };
            if let Some(t) = tracked {
                t.push(t_s, bytes, round, activity(ledger, &key));
            }
            if key.kind == Kind::TorchBlock {
                self.caching.insert(key.pid);
            }
            let e = per_proc.entry(key.pid).or_default();
            match key.kind {
                Kind::Heap => e.heap += bytes,
                Kind::Tensor => (e.heap, e.tensors) = (e.heap + bytes, e.tensors + bytes),
                Kind::TorchBlock => e.tensors += bytes,
                // The allocator's own heap: mmap regions are mostly the program's (or freed
                // with the block they hold), so they do not tell retention.
                Kind::Brk => e.pages += bytes,
                _ => {}
            }
        }
        for (key, t) in self.groups.iter_mut() {
            if t.round != round {
                t.push(t_s, 0, round, activity(ledger, key));
            }
        }
        for (pid, p) in &ledger.procs {
            // Seen since its last exec: an exec'd interpreter is not its shell.
            if p.malloc_seen {
                self.heap_seen.entry(*pid).or_insert(t_s);
            } else {
                self.heap_seen.remove(pid);
            }
            let b = per_proc.get(pid).copied().unwrap_or_default();
            let s = self.procs.entry(*pid).or_default();
            s.heap.push(t_s, b.heap);
            s.pages.push(t_s, b.pages);
            s.tensors.push(t_s, b.tensors);
        }
    }

    /// Page-level stacks (mmap, brk) that no tensor explains, judged a leak from `start(pid)` on
    /// (the warm-up, or when the process's tensors began to be traced) over `span_s` seconds at
    /// least and grown by `min_bytes` at least: where `--heap auto` traces its process's next
    /// layer, to tell what fills those pages. (A start-up grows like a leak for a few seconds;
    /// the pages a tensor's allocation maps have the tensor's stack.)
    pub fn growing_pages(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
    ) -> Vec<GroupKey> {
        let tensor = |k: &GroupKey| GroupKey {
            kind: Kind::Tensor,
            ..*k
        };
        let mut grown: Vec<GroupKey> = self
            .groups
            .iter()
            .filter(|(k, _)| matches!(k.kind, Kind::Mmap | Kind::Brk))
            .filter(|(k, _)| !self.groups.contains_key(&tensor(k)))
            .filter_map(|(k, t)| {
                let e = classify(&t.series, start(k.pid))?;
                let span = span(&e);
                let grows =
                    e.verdict == Verdict::Leak && e.growth_bytes >= min_bytes && span >= span_s;
                if grows {
                    tracing::debug!(key = ?k, growth = e.growth_bytes, span, "pages grow");
                }
                grows.then_some(*k)
            })
            .collect();
        grown.sort_unstable_by_key(|k| k.pid);
        grown
    }

    /// A group's sampled series, oldest first.
    pub fn series(&self, key: &GroupKey) -> Option<&[series::Point]> {
        self.groups.get(key).map(|t| t.series.points())
    }

    /// A process's heap-level and brk series, oldest first.
    pub fn process_series(&self, pid: u32) -> Option<(&[series::Point], &[series::Point])> {
        self.procs
            .get(&pid)
            .map(|s| (s.heap.points(), s.pages.points()))
    }

    /// The verdict of a group, from `warmup_s` on. The brk heap of a process whose heap bytes
    /// stay flat while its pages grow is retention by the allocator, not a leak; so is the device
    /// memory of a process whose CUDA memory goes through PyTorch's caching allocator. A heap-level
    /// stack whose growth its process's heap-level bytes do not show has memory moved to it.
    pub fn judge(&self, key: &GroupKey, warmup_s: f64) -> Option<Evidence> {
        if key.kind == Kind::Object {
            return self.judge_objects(key, warmup_s);
        }
        let from = self.judged_from(key, warmup_s);
        let evidence = classify(&self.groups.get(key)?.series, from)?;
        self.long_enough(key, from > warmup_s, evidence)
            .and_then(|e| self.explain(key, e, from))
    }

    /// `evidence` of `key`, unless it was cut at when its process's tensors went in (`cut`) and
    /// is too short since then to tell a leak: a page-level stack that made one block after
    /// that moment has grown, over a second or two, as a leak grows.
    fn long_enough(&self, key: &GroupKey, cut: bool, evidence: Evidence) -> Option<Evidence> {
        let pages = matches!(key.kind, Kind::Mmap | Kind::Brk);
        (!(cut && pages && span(&evidence) < CUT_SPAN_S)).then_some(evidence)
    }

    /// As [`Analysis::judge`], at the end of a run: a group whose bytes fell at the end (the
    /// program's teardown freed most of what it held, and the allocator gave the pages back) is
    /// judged on what it held before, as [`Analysis::released_leaks`] does for those that hold
    /// nothing now. A fall counts as teardown only when it ends below the floor of the last window before it
    /// (what the program held all along went); a cache flushed on its usual beat just before the
    /// end does not.
    pub fn judge_final(&self, key: &GroupKey, warmup_s: f64) -> Option<Evidence> {
        if key.kind == Kind::Object {
            return self.judge_objects(key, warmup_s);
        }
        let from = self.judged_from(key, warmup_s);
        let series = &self.groups.get(key)?.series;
        let held = judge_released(series, from)?;
        let floor = held.windows.last().map_or(0, |w| w.floor);
        let evidence = if series.last().unwrap_or(0) < floor {
            held
        } else {
            classify(series, from)?
        };
        self.long_enough(key, from > warmup_s, evidence)
            .and_then(|e| self.explain(key, e, from))
    }

    /// Whether `pid`'s tensors, all together or at any stack, leak from `from_x` on (a little
    /// after they were last asked for, see [`TENSOR_RAMP`]).
    pub fn tensors_leak(&self, pid: u32, from_x: f64) -> bool {
        let leaks = |s: &Series| classify(s, from_x).is_some_and(|e| e.verdict == Verdict::Leak);
        self.procs.get(&pid).is_some_and(|p| leaks(&p.tensors))
            || self
                .groups
                .iter()
                .any(|(k, t)| k.pid == pid && k.kind == Kind::Tensor && leaks(&t.series))
    }

    /// `pid`'s CPU tensors are traced from the sample at `x` on (`--tensors auto`).
    pub fn tensors_traced_from(&mut self, pid: u32, x: f64) {
        let spans = self.tensor_spans.entry(pid).or_default();
        if spans.last().is_none_or(|s| s.1.is_finite()) {
            spans.push((x, f64::INFINITY));
        }
    }

    /// `pid`'s CPU tensors are no longer traced from the sample at `x` on, and those outstanding
    /// were forgotten.
    pub fn tensors_taken_out(&mut self, pid: u32, x: f64) {
        if let Some(last) = self.tensor_spans.get_mut(&pid).and_then(|s| s.last_mut()) {
            last.1 = last.1.min(x);
        }
    }

    /// Where `key` is judged from: the warm-up; for the pages of a process whose tensors were
    /// traced late, from then on; for its tensors, from a little after the last time they were
    /// (its tensors outstanding then rise from nothing as the probes see them), or never when
    /// they are not traced now.
    fn judged_from(&self, key: &GroupKey, warmup_s: f64) -> f64 {
        let Some(spans) = self.tensor_spans.get(&key.pid) else {
            return warmup_s;
        };
        match key.kind {
            Kind::Mmap if self.arena_stacks.contains(key) => warmup_s,
            Kind::Mmap | Kind::Brk => warmup_s.max(spans[0].0),
            Kind::Tensor => match spans.last() {
                Some(&(from, to)) if to.is_infinite() => warmup_s.max(from + TENSOR_RAMP),
                _ => f64::INFINITY,
            },
            _ => warmup_s,
        }
    }

    /// A leak verdict turned into what explains it, if anything does (see [`Analysis::judge`]).
    fn explain(&self, key: &GroupKey, mut evidence: Evidence, warmup_s: f64) -> Option<Evidence> {
        if evidence.verdict != Verdict::Leak {
            return Some(evidence);
        }
        let retention = || {
            self.retention(key.pid, warmup_s)
                .is_some_and(|r| r.retention)
        };
        match key.kind {
            Kind::Brk if retention() => evidence.verdict = Verdict::Retention,
            // Arenas of Python objects whose keeping stacks the objects' window found.
            Kind::Mmap if self.under_objects(key, warmup_s) => {
                evidence.verdict = Verdict::UnderObjects
            }
            // The allocator's heap top moved up once, in the last window: a block that happened
            // to be above the others when it was sampled (a scratch buffer of a spike), not a
            // growth; a leak moves it window after window.
            Kind::Brk if last_step_only(&evidence) => evidence.verdict = Verdict::Steady,
            // The top of a heap holding tens of MiB floats with its padding and trimming (glibc
            // keeps up to twice its mmap threshold above the last block): a rise of less than a
            // tenth of where its floors started is that, not a leak.
            Kind::Brk if within_a_tenth(&evidence) => evidence.verdict = Verdict::Steady,
            // Pages a tensor's allocation grew, whose tensors did not grow with them (made and
            // freed every step): the allocator keeps them, no tensor of that line holds them.
            Kind::Brk | Kind::Mmap if self.outlived_their_tensors(key, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Retention
            }
            // Segments of PyTorch's caching allocator grow with the blocks in them (a leak of
            // blocks is reported on the blocks, at their line) or stay cached when the blocks go.
            Kind::Device if self.caching.contains(&key.pid) => {
                evidence.verdict = Verdict::Retention
            }
            Kind::Heap | Kind::Tensor if self.moved(key.pid, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Moved
            }
            Kind::Brk | Kind::Mmap
                if !self.heap_seen.contains_key(&key.pid)
                    && self.under_tensors(key.pid, &evidence, warmup_s) =>
            {
                evidence.verdict = Verdict::UnderTensors
            }
            _ => {}
        }
        Some(evidence)
    }

    /// Whether its process's tensors (CPU tensors and caching-allocator blocks: the host memory
    /// of a tensor leak is its Python objects and autograd nodes) grew over a page-level stack's
    /// span by at least half the stack's growth.
    fn under_tensors(&self, pid: u32, pages: &Evidence, warmup_s: f64) -> bool {
        let Some(s) = self.procs.get(&pid) else {
            return false;
        };
        classify(&same_span(&s.tensors, pages), span_start(pages, warmup_s))
            .is_some_and(|t| t.growth_bytes.saturating_mul(2) >= pages.growth_bytes)
    }

    /// Whether a page-level stack that has tensors of its own (the pages were grown for them, see
    /// `Process::pages_to_tensor`) grew by more than twice what those tensors did over its span.
    fn outlived_their_tensors(&self, pages: &GroupKey, e: &Evidence, warmup_s: f64) -> bool {
        let tensors = GroupKey {
            kind: Kind::Tensor,
            ..*pages
        };
        let Some(t) = self.groups.get(&tensors) else {
            return false;
        };
        classify(&same_span(&t.series, e), span_start(e, warmup_s))
            .is_some_and(|t| t.growth_bytes.saturating_mul(2) < e.growth_bytes)
    }

    /// Whether its process's heap-level bytes hold while a heap-level stack grows (`stack`): over
    /// the same span they move by less than half the stack's growth, up or down, so the other
    /// stacks gave back what this one gained. (A process whose heap falls meanwhile, as when the
    /// garbage of an interpreter's start-up is collected under a growing leak, does not hold.)
    fn moved(&self, pid: u32, stack: &Evidence, warmup_s: f64) -> bool {
        let Some(s) = self.procs.get(&pid) else {
            return false;
        };
        classify(&same_span(&s.heap, stack), span_start(stack, warmup_s)).is_some_and(|p| {
            p.growth_bytes.unsigned_abs().saturating_mul(2) < stack.growth_bytes.unsigned_abs()
        })
    }

    /// Groups that leaked while sampled but hold nothing now (the leaking container was released
    /// at teardown: destructors, the interpreter's exit): a CI gate must still see them.
    /// `outstanding` are the groups that hold memory. Each is judged on what it held before its
    /// final fall, when that fall came at the end of the run (within one verdict window of it).
    pub fn released_leaks(
        &self,
        outstanding: &std::collections::HashSet<GroupKey>,
        warmup_s: f64,
    ) -> Vec<(GroupKey, Evidence)> {
        let mut out: Vec<(GroupKey, Evidence)> = self
            .groups
            .iter()
            .filter(|(k, _)| !outstanding.contains(k) && !self.under_objects(k, warmup_s))
            .filter_map(|(k, t)| {
                let from = self.judged_from(k, warmup_s);
                let e = judge_released(&t.series, from)?;
                let e = self.long_enough(k, from > warmup_s, e)?;
                (e.verdict == Verdict::Leak).then_some((*k, e))
            })
            .collect();
        out.sort_by_key(|x| std::cmp::Reverse(x.1.growth_bytes));
        out
    }

    /// Allocator retention of a process, from `warmup_s` on, or from when its malloc family was
    /// first seen; None while it has not been.
    pub fn retention(&self, pid: u32, warmup_s: f64) -> Option<Retention> {
        let s = self.procs.get(&pid)?;
        let from = self.heap_seen.get(&pid)?.max(warmup_s);
        let (heap, pages) = (classify(&s.heap, from)?, classify(&s.pages, from)?);
        Some(Retention {
            retention: pages.verdict == Verdict::Leak && heap.verdict != Verdict::Leak,
            heap: heap.verdict,
            pages: pages.verdict,
            pages_growth_bytes: pages.growth_bytes,
        })
    }
}

/// Whether a series' window floors rose between its last two windows only.
fn last_step_only(evidence: &Evidence) -> bool {
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    let tol = verdict::tolerance(&floors);
    let rose: Vec<bool> = floors.windows(2).map(|f| f[1] > f[0] + tol).collect();
    rose.last() == Some(&true) && rose.iter().filter(|&&r| r).count() == 1
}

/// Whether a series' window floors stay within a tenth above the first one (that is not 0).
fn within_a_tenth(evidence: &Evidence) -> bool {
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    let (Some(&first), Some(&most)) = (floors.first(), floors.iter().max()) else {
        return false;
    };
    first > 0 && (most - first).saturating_mul(10) < first
}

/// The activity count of a group's stack, for the kinds whose every allocation and free the
/// ledger counts (blocks: heap, tensors, device memory); 0 for pages, whose mappings and unmaps
/// are not counted (their series are judged whole).
fn activity(ledger: &Ledger, key: &GroupKey) -> u32 {
    match key.kind {
        Kind::Mmap | Kind::Brk => 0,
        _ => ledger.activity(key.stack),
    }
}

/// The seconds (or steps) a verdict's windows cover.
fn span(e: &Evidence) -> f64 {
    match (e.windows.first(), e.windows.last()) {
        (Some(a), Some(b)) => b.t1_s - a.t0_s,
        _ => 0.0,
    }
}

/// Where a stack's evidence begins, from `warmup_s` on.
fn span_start(stack: &Evidence, warmup_s: f64) -> f64 {
    stack
        .windows
        .first()
        .map_or(warmup_s, |w| w.t0_s.max(warmup_s))
}

/// A process's series over a stack's evidence: up to the end of its last window (a stack judged
/// on what it held before a teardown is compared with its process before that teardown too).
fn same_span(process: &Series, stack: &Evidence) -> Series {
    process.until(stack.windows.last().map_or(f64::INFINITY, |w| w.t1_s))
}

/// The verdict of a series that ends released: on what it held before its final fall when the
/// fall came at the end (teardown), else on the whole series (memory released mid-run, long
/// before the end, is not a leak at exit).
fn judge_released(series: &Series, warmup_s: f64) -> Option<Evidence> {
    let held = series.before_fall();
    let after = series.span() - held.span();
    if after <= held.span() / verdict::WINDOWS as f64 {
        classify(&held, warmup_s)
    } else {
        classify(series, warmup_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: &[u64]) -> Series {
        let mut s = Series::default();
        for (i, v) in values.iter().enumerate() {
            s.push(i as f64, *v);
        }
        s
    }

    fn released(values: &[u64]) -> Option<Verdict> {
        judge_released(&series(values), 0.0).map(|e| e.verdict)
    }

    const K: u64 = 64 << 10;

    /// Stack `s` of process 1, of `kind`.
    fn key(s: u32, kind: Kind) -> GroupKey {
        GroupKey {
            pid: 1,
            stack: Some(crate::model::StackId::new(s)),
            kind,
            inherited: false,
        }
    }

    /// The analysis after `n` samples of two heap stacks of one process, `a(i)` and `b(i)` bytes.
    fn two_stacks(
        n: u64,
        a: impl Fn(u64) -> u64,
        b: impl Fn(u64) -> u64,
    ) -> (Analysis, GroupKey, GroupKey) {
        let (ka, kb) = (key(1, Kind::Heap), key(2, Kind::Heap));
        let mut analysis = Analysis::default();
        let mut ledger = Ledger::default();
        ledger.add_root(1, "app".into(), Vec::new(), 0);
        for i in 0..n {
            analysis.sample(i as f64, &ledger, &[(ka, a(i)), (kb, b(i))]);
        }
        (analysis, ka, kb)
    }

    /// 20 samples a second apart of a process whose brk stack grows by 512 KiB a sample, beside a
    /// flat heap stack of `heap` bytes (0: none) and a stack of tensors (`tensors`: CPU tensors or
    /// caching-allocator blocks) of 8 MiB that grows by `tensor_step` bytes a sample.
    fn brk_beside(heap: u64, tensors: Kind, tensor_step: u64) -> (Analysis, GroupKey) {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        ledger.procs.get_mut(&1).unwrap().malloc_seen = heap > 0;
        let mut analysis = Analysis::default();
        let pages = key(1, Kind::Brk);
        for i in 0..20u64 {
            let groups = [
                (pages, (i + 1) * 8 * K),
                (key(2, Kind::Heap), heap),
                (key(3, tensors), (8 << 20) + i * tensor_step),
            ];
            analysis.sample(i as f64, &ledger, &groups);
        }
        (analysis, pages)
    }

    /// `--tensors auto`: the pages of a process whose tensors went in late are judged from then
    /// on, and not on a tail too short to tell; its tensors in the span they are traced in, never
    /// while taken out.
    #[test]
    fn late_tensors_cut_what_their_process_is_judged_on() {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let (pages, tensors) = (key(1, Kind::Brk), key(2, Kind::Tensor));
        let mut a = Analysis::default();
        // Samples every half second. Pages grow for 10 s (a warm-up that called for the
        // tensors), then hold; one block more at 12 s. The tensors go in at 10 s and rise to a
        // flat 8 MiB.
        for i in 0..26u64 {
            let brk = i.min(20) * 8 * K + if i >= 24 { 8 * K } else { 0 };
            let held = if i >= 20 { 8 << 20 } else { 0 };
            if i == 20 {
                a.tensors_traced_from(1, 10.0);
            }
            a.sample(i as f64 / 2.0, &ledger, &[(pages, brk), (tensors, held)]);
        }
        let whole = classify(&a.groups[&pages].series, 0.0).unwrap();
        assert_eq!(
            whole.verdict,
            Verdict::Leak,
            "the whole run reads as a leak"
        );
        assert!(
            a.judge(&pages, 0.0).is_none(),
            "2.5 s since the tensors: too short"
        );
        assert!(a.judge_final(&pages, 0.0).is_none());
        let t = a.judge(&tensors, 0.0).unwrap();
        assert_ne!(
            t.verdict,
            Verdict::Leak,
            "the rise as they went in is left out"
        );
        a.tensors_taken_out(1, 14.0);
        assert!(
            a.judge(&tensors, 0.0).is_none(),
            "not judged while taken out"
        );
        assert!(a.released_leaks(&Default::default(), 0.0).is_empty());
    }

    #[test]
    fn brk_growth_is_retention_only_where_the_malloc_family_is_seen() {
        // Heap blocks seen and flat: the allocator keeps pages nothing holds.
        let (seen, pages) = brk_beside(1 << 20, Kind::Tensor, 0);
        assert_eq!(seen.judge(&pages, 0.0).unwrap().verdict, Verdict::Retention);
        assert!(seen.retention(1, 0.0).unwrap().retention);
        // Tensors alone (the malloc family not traced): the growth is unexplained, a leak; and
        // pages grown for over 10 s by 4 MiB call for the malloc family.
        let (unseen, pages) = brk_beside(0, Kind::Tensor, 0);
        assert_eq!(unseen.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
        assert!(unseen.retention(1, 0.0).is_none());
        assert_eq!(unseen.growing_pages(|_| 0.0, 10.0, 4 << 20), vec![pages]);
        assert!(
            unseen.growing_pages(|_| 0.0, 20.0, 4 << 20).is_empty(),
            "a 19 s span"
        );
        // Growth is floor to floor of the first and last windows: 7.5 MiB.
        assert!(unseen.growing_pages(|_| 0.0, 10.0, 8 << 20).is_empty());
        // Tensors growing as fast: the pages hold them; the leak, if any, is on the tensors.
        // So for tensors on the GPU: the host pages hold their Python objects and autograd nodes.
        for kind in [Kind::Tensor, Kind::TorchBlock] {
            let (under, pages) = brk_beside(0, kind, 8 * K);
            assert_eq!(
                under.judge(&pages, 0.0).unwrap().verdict,
                Verdict::UnderTensors,
                "{kind:?}"
            );
            let (slower, pages) = brk_beside(0, kind, 2 * K);
            assert_eq!(slower.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
        }
        // Device memory without PyTorch's blocks explains no host pages.
        let (device, pages) = brk_beside(0, Kind::Device, 8 * K);
        assert_eq!(device.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
    }

    #[test]
    fn the_heap_top_moving_up_once_at_the_end_is_not_a_leak_of_pages() {
        // A 16 MiB scratch buffer every other sample; in the last window it stays above the
        // others: the window floors go 16, 16, 16, 32 MiB while the peaks hold at 47.
        let m = |n: u64| n << 20;
        let bytes = |i: u64| match (i % 2, i >= 15) {
            (1, _) => m(47),
            (_, false) => m(16),
            (_, true) => m(32),
        };
        let (pages, blocks) = (key(1, Kind::Brk), key(2, Kind::Heap));
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            analysis.sample(i as f64, &ledger, &[(pages, bytes(i)), (blocks, bytes(i))]);
        }
        // Blocks that stay are blocks kept; the heap's top is where the allocator put the last.
        assert_eq!(analysis.judge(&blocks, 0.0).unwrap().verdict, Verdict::Leak);
        assert_eq!(
            analysis.judge(&pages, 0.0).unwrap().verdict,
            Verdict::Steady
        );
        // Moving up in every window, it is a leak of pages.
        let (unseen, pages) = brk_beside(0, Kind::Tensor, 0);
        assert_eq!(unseen.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
    }

    #[test]
    fn a_large_heap_top_floating_by_less_than_a_tenth_is_not_a_leak_of_pages() {
        // The spike control's brk stack: a 16 MiB scratch buffer, its heap's top floating from
        // 16 to 17.5 MiB in steps between the spikes.
        let m = |n: u64| n << 20;
        let bytes = |i: u64| match i % 2 {
            1 => m(48),
            _ => m(16) + (i / 5) * m(1) / 2,
        };
        let (pages, heap) = (key(1, Kind::Brk), key(1, Kind::Heap));
        let run = |f: &dyn Fn(u64) -> u64| {
            let mut ledger = Ledger::default();
            ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
            let mut analysis = Analysis::default();
            for i in 0..20u64 {
                analysis.sample(i as f64, &ledger, &[(pages, f(i))]);
            }
            analysis.judge(&pages, 0.0).unwrap().verdict
        };
        assert_eq!(run(&bytes), Verdict::Steady);
        // Rising by a MiB a window from 4 MiB: growth, whatever its size.
        assert_eq!(run(&|i| m(4) + (i / 5) * m(1)), Verdict::Leak);
        // The heap kind keeps the classifier's rule.
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            analysis.sample(i as f64, &ledger, &[(heap, bytes(i))]);
        }
        assert_ne!(analysis.judge(&heap, 0.0).unwrap().verdict, Verdict::Steady);
    }

    #[test]
    fn pages_kept_after_their_stacks_tensors_were_freed_are_retention() {
        // The spike control as CI once saw it: a 16 MiB tensor made and freed every step, and
        // the heap's top held higher window after window by something small allocated above
        // its pages. The tensors of that line hold 0 or 16 MiB, never more.
        let m = |n: u64| n << 20;
        let run = |tensors: &dyn Fn(u64) -> u64| {
            let mut ledger = Ledger::default();
            ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
            let mut analysis = Analysis::default();
            let (pages, blocks) = (key(5, Kind::Brk), key(5, Kind::Tensor));
            for i in 0..20u64 {
                let held = m(16) + (i / 5) * m(8);
                let groups = [(pages, held + (i % 2) * m(16)), (blocks, tensors(i))];
                analysis.sample(i as f64, &ledger, &groups);
            }
            analysis.judge(&pages, 0.0).unwrap().verdict
        };
        assert_eq!(run(&|i| (i % 2) * m(16)), Verdict::Retention);
        // Tensors of that line kept as the pages grow: the pages are theirs (judged under them).
        assert_eq!(run(&|i| (i / 5) * m(8)), Verdict::UnderTensors);
    }

    #[test]
    fn a_fall_at_the_end_is_teardown_only_below_the_last_floor() {
        // Rising for 19 samples, then freed at teardown but for a block: judged before the fall.
        let (a, key, _) = two_stacks(20, |i| if i < 19 { (i + 1) * 8 * K } else { K }, |_| 0);
        assert_eq!(a.judge_final(&key, 0.0).unwrap().verdict, Verdict::Leak);
        assert_ne!(a.judge(&key, 0.0).unwrap().verdict, Verdict::Leak);
        // A cache of 64 blocks flushed to 48 on its beat, the last time just before the end:
        // judged whole, as during the run.
        let cache = |i: u64| if i % 5 == 4 { 48 * K } else { 64 * K };
        let (a, key, _) = two_stacks(
            20,
            |i| if i < 3 { (i + 1) * 16 * K } else { cache(i) },
            |_| 0,
        );
        let whole = a.judge(&key, 0.0).unwrap().verdict;
        assert_eq!(a.judge_final(&key, 0.0).unwrap().verdict, whole);
        assert_ne!(whole, Verdict::Leak);
    }

    #[test]
    fn pages_under_tensors_do_not_call_for_the_malloc_family() {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            let bytes = (i + 1) * 4 * K;
            let groups = [(key(7, Kind::Brk), bytes), (key(7, Kind::Tensor), bytes)];
            analysis.sample(i as f64, &ledger, &groups);
        }
        assert!(analysis.growing_pages(|_| 0.0, 10.0, 1 << 20).is_empty());
    }

    #[test]
    fn segments_under_pytorchs_caching_allocator_are_its_cache_not_a_second_leak() {
        let (blocks, segments) = (key(1, Kind::TorchBlock), key(2, Kind::Device));
        let mut ledger = Ledger::default();
        ledger.add_root(1, "train".into(), Vec::new(), 0);
        let run = |with_blocks: bool| {
            let mut analysis = Analysis::default();
            for i in 0..20u64 {
                let mut groups = vec![(segments, (i + 1) * 2 * K)];
                if with_blocks {
                    groups.push((blocks, (i + 1) * K));
                }
                analysis.sample(i as f64, &ledger, &groups);
            }
            analysis
        };
        let analysis = run(true);
        assert_eq!(
            analysis.judge(&blocks, 0.0).map(|e| e.verdict),
            Some(Verdict::Leak)
        );
        assert_eq!(
            analysis.judge(&segments, 0.0).map(|e| e.verdict),
            Some(Verdict::Retention)
        );
        // cudaMalloc without the caching allocator: device memory is judged as itself.
        let analysis = run(false);
        assert_eq!(
            analysis.judge(&segments, 0.0).map(|e| e.verdict),
            Some(Verdict::Leak)
        );
    }

    #[test]
    fn records_moving_from_the_load_path_to_the_update_path_are_not_a_leak() {
        // 2 MiB loaded at start-up from one call site, replaced record by record from another:
        // the update path rises, the load path falls, the process holds the same.
        let total = 32 * K;
        let moved = |i: u64| (total * i / 20).min(total);
        let (analysis, load, update) = two_stacks(20, |i| total - moved(i), moved);
        assert_eq!(
            analysis.judge(&update, 0.0).map(|e| e.verdict),
            Some(Verdict::Moved)
        );
        assert_ne!(
            analysis.judge(&load, 0.0).map(|e| e.verdict),
            Some(Verdict::Leak)
        );
        // The same rise beside a steady stack: the process grows with it, a leak.
        let (analysis, _, leak) = two_stacks(20, |_| total, moved);
        assert_eq!(
            analysis.judge(&leak, 0.0).map(|e| e.verdict),
            Some(Verdict::Leak)
        );
        // Beside a stack that falls by far more (start-up garbage collected under the leak): the
        // process falls, it does not hold, and the rise is a leak.
        let (analysis, _, leak) = two_stacks(20, |i| 8 * total - 4 * moved(i), moved);
        assert_eq!(
            analysis.judge(&leak, 0.0).map(|e| e.verdict),
            Some(Verdict::Leak)
        );
    }

    #[test]
    fn a_leak_freed_at_the_end_is_judged_on_what_it_held() {
        let grow: Vec<u64> = (1..=20).map(|i| i * K).collect();
        // All at once, or over a few samples, at the end.
        assert_eq!(
            released(&[grow.clone(), vec![0]].concat()),
            Some(Verdict::Leak)
        );
        let teardown = vec![12 * K, 3 * K, 0, 0];
        assert_eq!(
            released(&[grow.clone(), teardown].concat()),
            Some(Verdict::Leak)
        );
        // The whole series, fall included, reads otherwise: that was the defect.
        let whole = classify(&series(&[grow.clone(), vec![0, 0, 0]].concat()), 0.0);
        assert_ne!(whole.map(|e| e.verdict), Some(Verdict::Leak));
        assert_eq!(
            released(&[grow, vec![0, 0, 0]].concat()),
            Some(Verdict::Leak)
        );
    }

    #[test]
    fn memory_released_long_before_the_end_or_never_leaking_is_not_a_released_leak() {
        // Grown during loading, then dropped, and the run went on three times as long.
        let grow: Vec<u64> = (1..=10).map(|i| i * K).collect();
        let late = [grow, vec![0; 30]].concat();
        assert_ne!(released(&late), Some(Verdict::Leak));
        // A buffer filled and flushed again and again, flushed at the end too.
        let saw: Vec<u64> = (0..24).map(|i| (i % 6) * 8 * K).collect();
        assert_ne!(released(&[saw, vec![0]].concat()), Some(Verdict::Leak));
        // A cache that fills, holds, and is cleared at exit.
        let cache: Vec<u64> = (1..=24).map(|i| i.min(6) * 8 * K).collect();
        assert_ne!(released(&[cache, vec![0]].concat()), Some(Verdict::Leak));
    }
}
