//! Verdicts: per stack and per process, outstanding bytes sampled into bounded series, classified
//! as leak, spike, bounded cache or steady (verdict.rs), with the evidence. Fed by the ledger's owner
//! at each sample tick; read by the report.

mod brk_top;
mod cpu;
mod heap;
mod objects;
mod pages;
pub mod series;
mod tensors;
pub mod verdict;

use heap::Total;
use tensors::{Clock, Judged};

use rustc_hash::FxHashMap;

pub use objects::{KEPT_MIN, kept_by_imports, kept_by_keepers, undecided_keeper};
pub use tensors::{TENSOR_RAMP, TENSORS_CONFIRM_S, TakenOut};
pub use verdict::{
    Evidence, Verdict, a_large_heaps_small_rise, classify, rose_once_within_swing, working_set,
};

use crate::{
    ledger::Ledger,
    model::{GroupKey, Kind, StackId},
};
use series::Series;
use verdict::Window;

/// Bytes a group must hold once before it gets a series: a Python program's start-up leaves a
/// quarter of a million stacks of a few small objects each (every import line), and a series for
/// each cost ~100 ms per sample and hundreds of MB. A group is tracked from its first sample at
/// or above this, and from then on.
pub const TRACK_MIN: u64 = 16 << 10;

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
    /// were not from the start (`--tensors auto`), the last open while they still are, and
    /// their chain (see tensors.rs).
    tensors: FxHashMap<u32, tensors::TensorHistory>,
    /// The mmap stacks that map arenas of Python objects (`--heap auto`): not judged from when
    /// tensors were traced, as other pages are (no tensor lands in an arena).
    arena_stacks: rustc_hash::FxHashSet<GroupKey>,
    /// Page-level stacks made while a library's module was imported (`Analysis::imported`).
    imported: rustc_hash::FxHashSet<StackId>,
    /// Per process: its malloc family's last traced window, where it was taken out (heap.rs).
    heap_window: FxHashMap<u32, heap::HeapWindow>,
    /// Per process: its CPU time at each sample (cpu.rs).
    cpu: FxHashMap<u32, cpu::CpuClock>,
    /// Samples taken so far, and when the last was (on the series' axis).
    round: u64,
    last_x: f64,
}

/// How long a process may run on after its interpreter began its exit for its series to be
/// judged up to that point: a teardown takes seconds (exit handlers that save a checkpoint, a
/// minute); a program that embeds the interpreter may finalize it and go on for hours.
const TEARDOWN_MOST_S: f64 = 60.0;

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
    /// The arenas mapped outside libraries' imports (`Analysis::imported_stack` false):
    /// where the program's own lines needed room. What a window's keepers are judged on.
    program_arenas: Series,
    /// The first sample taken once its interpreter began its exit (the ledger's
    /// `finalized_ns`): its series are judged on the samples before, what its program held,
    /// not what the teardown made and freed.
    exit_x: Option<f64>,
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
#[derive(Debug, Default)]
struct Tracked {
    series: Series,
    round: u64,
    activity: u32,
}

impl Tracked {
    /// A sample of `bytes` (`least` at the least since the last one), active when the stack's
    /// count moved since the last one.
    fn push(&mut self, t_s: f64, (least, bytes): (u64, u64), round: u64, activity: u32) {
        self.series
            .push_least(t_s, least, bytes, activity != self.activity);
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
    pub heap_growth_bytes: i64,
}

impl Retention {
    /// Whether the process's pages hold its heap's leak (see [`Verdict::UnderHeap`]): a stack of
    /// its heap judged a leak (`leaks`), or its heap-level bytes leaking by at least half of what
    /// its pages grew by over the same stretch. A brk heap holds nothing but the malloc family's
    /// blocks and the room the allocator keeps between them, so where a heap stack leaks, its
    /// pages growing faster are that room, not a leak of their own: a Trainer job's brk heap grew
    /// by 1.7 times its bytes in use (glibc's own count), and its totals over a window of its
    /// malloc family a second or two long read as a leak in some runs, not in others.
    fn under_heap(&self, leaks: impl FnOnce() -> bool) -> bool {
        let totals = self.heap == Verdict::Leak
            && self.pages == Verdict::Leak
            && self.heap_growth_bytes.saturating_mul(2) >= self.pages_growth_bytes;
        totals || leaks()
    }
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
            tensors: FxHashMap::default(),
            arena_stacks: Default::default(),
            imported: Default::default(),
            heap_window: FxHashMap::default(),
            cpu: FxHashMap::default(),
            round: 0,
            last_x: 0.0,
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
        self.last_x = t_s;
        let round = self.round;
        let mut per_proc: FxHashMap<u32, ProcBytes> = FxHashMap::default();
        for &(key, bytes) in groups {
            let tracked = if bytes >= self.track_min {
                Some(self.groups.entry(key).or_default())
            } else {
                self.groups.get_mut(&key)
            };
            if let Some(t) = tracked {
                // A stack of CPU tensors at the least it held since the last sample, as on the
                // chains (analysis/tensors.rs): an instant catches a step's activations held or
                // not by chance, and a window whose samples all fell inside steps has a floor.
                t.push(
                    t_s,
                    (ledger.least_since_sample(&key, bytes), bytes),
                    round,
                    activity(ledger, &key),
                );
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
                t.push(t_s, (0, 0), round, activity(ledger, key));
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
            if p.finalized_ns.is_none() {
                s.exit_x = None; // exec'd since
            } else if s.exit_x.is_none() {
                s.exit_x = Some(t_s);
            } else if s.exit_x.is_some_and(|x| t_s - x > TEARDOWN_MOST_S) {
                // A program that embeds the interpreter, finalized it, and runs on.
                s.exit_x = Some(f64::INFINITY);
            }
            s.heap.push(t_s, b.heap);
            s.pages.push(t_s, b.pages);
            s.tensors.push(t_s, b.tensors);
        }
        let totals = |pid: u32| {
            let b = per_proc.get(&pid).copied().unwrap_or_default();
            (b.heap, b.pages)
        };
        self.sample_heap_windows(t_s, groups, totals);
        self.sample_chains(t_s, ledger, groups);
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
        let (from, evidence) = self.judged(key, warmup_s, judge_whole)?;
        self.long_enough(key, from > warmup_s, evidence)
            .and_then(|e| self.explain(key, e, from))
    }

    /// `key`'s evidence by `how` (a verdict of a series from a point on), on the series where
    /// [`Analysis::judged_from`] says, with where it was judged from; or as its tensors were
    /// judged when they were kept.
    fn judged(&self, key: &GroupKey, warmup_s: f64, how: Judge) -> Option<(f64, Evidence)> {
        match self.judged_from(key, warmup_s) {
            Judged::From(from) => {
                let series = self.as_judged(key, &self.groups.get(key)?.series);
                Some((
                    from,
                    self.at_untraced_pace(key, how(&series, from, Clock::Own)?),
                ))
            }
            Judged::Chain(series, from, chain) => {
                let e = how(series?, from, Clock::Chain(chain))?;
                let e = chain.moved_on_chain(e, from);
                Some((warmup_s, chain.on_series_axis(e)))
            }
            Judged::Kept(e) => Some((warmup_s, e?.clone())),
        }
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
        if let Some(before) = self.before_late_tensors(key, warmup_s) {
            return before;
        }
        let (from, evidence) = self.judged(key, warmup_s, judge_at_end)?;
        self.long_enough(key, from > warmup_s, evidence)
            .and_then(|e| self.explain(key, e, from))
    }

    /// A leak verdict turned into what explains it, if anything does (see [`Analysis::judge`]).
    fn explain(&self, key: &GroupKey, mut evidence: Evidence, warmup_s: f64) -> Option<Evidence> {
        if evidence.verdict != Verdict::Leak {
            return Some(evidence);
        }
        // Looked at once, for the brk stacks that get that far.
        let seen = std::cell::OnceCell::new();
        let retention = || seen.get_or_init(|| self.retention(key.pid, warmup_s));
        match key.kind {
            Kind::Brk | Kind::Mmap if self.made_by_import(key) => {
                evidence.verdict = Verdict::Imported
            }
            Kind::Brk | Kind::Mmap if self.under_kept_tensors(key, &evidence) => {
                evidence.verdict = Verdict::UnderTensors
            }
            Kind::Brk
                if retention()
                    .as_ref()
                    .is_some_and(|r| r.under_heap(|| self.heap_leaks(key.pid, warmup_s))) =>
            {
                evidence.verdict = Verdict::UnderHeap
            }
            Kind::Brk if retention().as_ref().is_some_and(|r| r.retention) => {
                evidence.verdict = Verdict::Retention
            }
            // Arenas of Python objects whose keeping stacks the objects' window found.
            Kind::Mmap if self.under_objects(key, warmup_s) => {
                evidence.verdict = Verdict::UnderObjects
            }
            Kind::Mmap if self.arenas_under_heap(key, &evidence, warmup_s) => {
                evidence.verdict = Verdict::UnderHeap
            }
            // The allocator's heap top moved up once, in the last window: a block that happened
            // to be above the others when it was sampled (a scratch buffer of a spike), not a
            // growth; a leak moves it window after window.
            Kind::Brk if last_step_only(&evidence) => evidence.verdict = Verdict::Steady,
            // The top of a heap holding tens of MiB floats with its padding and trimming (glibc
            // keeps up to twice its mmap threshold above the last block): a rise of less than a
            // tenth of where its floors started is that, not a leak.
            Kind::Brk if within_a_tenth(&evidence) => evidence.verdict = Verdict::Steady,
            // A spike's scratch block placed a little higher in the heap now and then: the
            // floors drift up by less than a tenth of how far the stack swings in every window.
            Kind::Brk if drift_under_spikes(&evidence) => evidence.verdict = Verdict::Spike,
            Kind::Brk if self.top_moved(key.pid, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Moved
            }
            // The heap's top no higher than where it was: its floors rose under it (glibc trims
            // less often as the free space at its top stays under the trim threshold).
            Kind::Brk if self.top_held(key.pid, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Steady
            }
            // Pages a tensor's allocation grew, whose tensors did not grow with them (made and
            // freed every step): the allocator keeps them, no tensor of that line holds them.
            // Judged so at the end whatever they grew by: what filled the heap below them is not
            // known (the malloc family, where it was asked for by such growth, judges it), and
            // a transient tensor of a spike is seldom sampled at its peak.
            Kind::Brk | Kind::Mmap if self.outlived_their_tensors(key, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Retention
            }
            // Segments of PyTorch's caching allocator grow with the blocks in them (a leak of
            // blocks is reported on the blocks, at their line) or stay cached when the blocks go.
            Kind::Device if self.caching.contains(&key.pid) => {
                evidence.verdict = Verdict::Retention
            }
            Kind::Heap if self.moved(key.pid, &evidence, warmup_s) => {
                evidence.verdict = Verdict::Moved
            }
            // Tensors judged on their chain were told moved there (`Chain::moved_on_chain`);
            // traced from the start, against the process's tensors.
            Kind::Tensor
                if matches!(self.judged_from(key, warmup_s), Judged::From(_))
                    && self.tensors_moved(key.pid, &evidence, warmup_s) =>
            {
                evidence.verdict = Verdict::Moved
            }
            Kind::Brk | Kind::Mmap
                if !self.heap_seen.contains_key(&key.pid)
                    && self.tensors_tell(key.pid, &evidence)
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
        grew_over(&same_span(&s.tensors, pages), span_start(pages, warmup_s))
            .is_some_and(|t| t.saturating_mul(2) >= pages.growth_bytes)
    }

    /// What a page-level stack's own tensors (the pages were grown for them, see
    /// `Process::pages_to_tensor`) did over its evidence `e`, from `from` on, where they tell:
    /// their series then and the growth judged on it.
    fn own_tensors(&self, pages: &GroupKey, e: &Evidence, from: f64) -> Option<(Series, Evidence)> {
        let tensors = GroupKey {
            kind: Kind::Tensor,
            ..*pages
        };
        let t = self.groups.get(&tensors)?;
        if !self.tensors_tell(pages.pid, e) {
            return None;
        }
        let series = same_span(&t.series, e);
        let judged = classify(&series, span_start(e, from))?;
        Some((series, judged))
    }

    /// Whether a page-level stack's own tensors explain its growth `e`: they grew by half of
    /// it at least (a leak of theirs, judged on them), or it is pages the allocator kept for
    /// them (see [`retained_for_their_tensors`]). Pages grown for a tensor while
    /// something else fills the heap below its top (a leak of the malloc family, of objects)
    /// are not explained by a tensor that held a few KiB.
    fn explained_by_own_tensors(&self, pages: &GroupKey, e: &Evidence, from: f64) -> bool {
        self.own_tensors(pages, e, from).is_some_and(|(series, t)| {
            t.growth_bytes.saturating_mul(2) >= e.growth_bytes
                || retained_for_their_tensors(&series, &t, e, from)
        })
    }

    /// Whether a page-level stack with tensors of its own grew by more than twice what those
    /// tensors did over its span.
    fn outlived_their_tensors(&self, pages: &GroupKey, e: &Evidence, warmup_s: f64) -> bool {
        self.own_tensors(pages, e, warmup_s)
            .is_some_and(|(_, t)| t.growth_bytes.saturating_mul(2) < e.growth_bytes)
    }

    /// Whether its process's heap-level bytes hold while a heap-level stack grows (`stack`): over
    /// the same span they move by less than half the stack's growth, up or down, so the other
    /// stacks gave back what this one gained. (A process whose heap falls meanwhile, as when the
    /// garbage of an interpreter's start-up is collected under a growing leak, does not hold.)
    fn moved(&self, pid: u32, stack: &Evidence, warmup_s: f64) -> bool {
        let Some(s) = self.procs.get(&pid) else {
            return false;
        };
        holds(
            &self.heap_as_judged(pid, &s.heap, Total::Heap),
            stack,
            warmup_s,
        )
    }

    /// Whether its process's tensors held while a tensor stack grew (`stack`), as `moved`
    /// tells of the heap: other tensors gave back what it gained.
    fn tensors_moved(&self, pid: u32, stack: &Evidence, warmup_s: f64) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|s| holds(&s.tensors, stack, warmup_s))
    }

    /// Groups that leaked while sampled but hold nothing now (the leaking container was released
    /// at teardown: destructors, the interpreter's exit): a CI gate must still see them.
    /// `outstanding` are the groups that hold memory. Each is judged on what it held before its
    /// final fall, when that fall came at the end of the run (within one verdict window of it);
    /// a leak by some windows only, within what an earlier one reached, is a working set
    /// ([`verdict::released_working_set`]); a brk stack's rise small beside its heap, the top
    /// moving, as for one outstanding ([`a_large_heaps_small_rise`]).
    pub fn released_leaks(
        &self,
        outstanding: &std::collections::HashSet<GroupKey>,
        warmup_s: f64,
    ) -> Vec<(GroupKey, Evidence)> {
        let mut out: Vec<(GroupKey, Evidence)> = self
            .groups
            .iter()
            .filter(|(k, _)| !outstanding.contains(k) && !self.under_objects(k, warmup_s))
            .filter(|(k, _)| !self.made_by_import(k))
            .filter_map(|(k, _)| {
                let (from, e) = self.judged(k, warmup_s, released_on)?;
                let e = self.long_enough(k, from > warmup_s, e)?;
                let moved = || {
                    k.kind == Kind::Brk
                        && (self.top_moved(k.pid, &e, warmup_s)
                            || self.top_held(k.pid, &e, warmup_s)
                            || a_large_heaps_small_rise(&e, self.heap_peak(k.pid, &e)))
                };
                let leak =
                    e.verdict == Verdict::Leak && !verdict::released_working_set(&e) && !moved();
                leak.then_some((*k, e))
            })
            .collect();
        out.sort_by_key(|x| std::cmp::Reverse(x.1.growth_bytes));
        out
    }

    /// Marks a page-level stack as made while a library's module was imported (the owner looks
    /// at each stack's Python frames once, [`crate::report::made_by_import`]).
    pub fn imported(&mut self, stack: StackId) {
        self.imported.insert(stack);
    }

    /// Whether `key`'s stack was made while a library's module was imported.
    fn imported_stack(&self, key: &GroupKey) -> bool {
        key.stack.is_some_and(|s| self.imported.contains(&s))
    }

    /// Whether `key` is a page-level stack made by a library's import, or arenas that grew
    /// with the objects of imports alone.
    fn made_by_import(&self, key: &GroupKey) -> bool {
        matches!(key.kind, Kind::Brk | Kind::Mmap)
            && (self.imported_stack(key) || self.arenas_of_imports(key))
    }

    /// Allocator retention of a process, from `warmup_s` on, or from when its malloc family was
    /// first seen; None while it has not been.
    pub fn retention(&self, pid: u32, warmup_s: f64) -> Option<Retention> {
        let s = self.procs.get(&pid)?;
        let from = self.heap_seen.get(&pid)?.max(warmup_s);
        let (heap, pages) = (
            self.heap_as_judged(pid, &s.heap, Total::Heap),
            self.heap_as_judged(pid, &s.pages, Total::Pages),
        );
        let (heap, pages) = (classify(&heap, from)?, classify(&pages, from)?);
        Some(Retention {
            retention: pages.verdict == Verdict::Leak && heap.verdict != Verdict::Leak,
            heap: heap.verdict,
            pages: pages.verdict,
            pages_growth_bytes: pages.growth_bytes,
            heap_growth_bytes: heap.growth_bytes,
        })
    }
}

/// Whether a page-level stack's growth `e` is pages the allocator kept for its own tensors
/// (`series`, judged `t`): more than twice what they grew by, and no more than twice the most
/// they held at once (a 16 MiB tensor made and freed every step, the heap's top held above
/// it). More than that is not theirs to keep.
fn retained_for_their_tensors(series: &Series, t: &Evidence, e: &Evidence, warmup_s: f64) -> bool {
    let from = span_start(e, warmup_s);
    let most = series
        .points()
        .iter()
        .filter(|p| p.t1 >= from)
        .map(|p| p.max)
        .max()
        .unwrap_or(0);
    let grown = e.growth_bytes.max(0) as u64;
    t.growth_bytes.saturating_mul(2) < e.growth_bytes && grown <= most.saturating_mul(2)
}

/// Whether a process's `series` moved by less than half a stack's growth over the stack's span,
/// up or down: the process held what the stack gained.
pub(super) fn holds(series: &Series, stack: &Evidence, warmup_s: f64) -> bool {
    grew_over(&same_span(series, stack), span_start(stack, warmup_s)).is_some_and(|grew| {
        grew.unsigned_abs().saturating_mul(2) < stack.growth_bytes.unsigned_abs()
    })
}

/// Whether a series' window floors rose between its last two windows only, or before then
/// floated by less than a tenth above the first (a heap's top between a scratch buffer's
/// spikes), or rose by less than a tenth of their whole rise (a no-leak training job's heap top,
/// 532, 664, 664 then 3736 KiB: one late move of the top over a validation's block).
pub(super) fn last_step_only(evidence: &Evidence) -> bool {
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    let tol = verdict::tolerance(&floors);
    let rose: Vec<bool> = floors.windows(2).map(|f| f[1] > f[0] + tol).collect();
    let before = &floors[..floors.len().saturating_sub(1)];
    let little_before = match (floors.first(), before.iter().max(), floors.last()) {
        (Some(&first), Some(&most), Some(&last)) if last > first => {
            most.saturating_sub(first).saturating_mul(10) < last - first
        }
        _ => false,
    };
    rose.last() == Some(&true)
        && (rose.iter().filter(|&&r| r).count() == 1
            || floats_within_a_tenth(before)
            || little_before)
}

/// Whether a brk stack's heap top stayed, through its last window, at or above every peak it
/// reached in the windows before: what a leak's blocks do, kept under the top window after
/// window (a Trainer job's kept hidden states: floors 25, 37, 46, 55 MiB under peaks of 36, 46,
/// 54, 63 MiB). A top that came back below an earlier peak moves with the blocks placed near it
/// as they come and go: a no-leak transformer job's, floors 17, 20, 20, 28 MiB under peaks of
/// 27, 39, 40, 39 MiB as longer sequences came, which its malloc family, traced 5 s, found held.
pub(super) fn top_kept_its_reach(evidence: &Evidence) -> bool {
    let Some((last, before)) = evidence.windows.split_last() else {
        return false;
    };
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    last.floor + verdict::tolerance(&floors) >= verdict::highest_peak(before)
}

/// Whether each of a series' window floors is above the one before it.
fn rose_in_every_window(evidence: &Evidence) -> bool {
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    let tol = verdict::tolerance(&floors);
    floors.windows(2).all(|f| f[1] > f[0] + tol)
}

/// Whether a brk stack's floors rose by less than a tenth of how far above its floor it swung in
/// every window: a scratch block of a spike (a 16 MiB tensor made and dropped every step, in the
/// brk heap once glibc's mmap threshold rose past it) that glibc placed a little higher now and
/// then, not pages kept. A leak under such spikes outgrows a tenth of them as it goes on.
fn drift_under_spikes(evidence: &Evidence) -> bool {
    let growth = evidence.growth_bytes.max(0) as u64;
    let swings = evidence
        .windows
        .iter()
        .map(|w| w.peak.saturating_sub(w.floor));
    growth > 0 && swings.min().is_some_and(|s| growth.saturating_mul(10) < s)
}

/// Whether a series' window floors stay within a tenth above the first one (that is not 0).
fn within_a_tenth(evidence: &Evidence) -> bool {
    let floors: Vec<u64> = evidence.windows.iter().map(|w| w.floor).collect();
    floats_within_a_tenth(&floors)
}

/// Whether `floors` stay within a tenth above the first (that is not 0).
fn floats_within_a_tenth(floors: &[u64]) -> bool {
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

/// What a process's series grew by from `from` on, by the floors of [`ends_over`].
fn grew_over(series: &Series, from: f64) -> Option<i64> {
    let (first, last) = ends_over(series, from)?;
    Some(last.floor as i64 - first.floor as i64)
}

/// The first and last windows of a process's series from `from` on, as its verdict reads them;
/// where its points are too coarse to fill a verdict's windows, its first and last points. A
/// process's series sampled for 20 s has a point every fifth of a second, and a stack's of the
/// last second twenty: its tensors, traced again for that second, grew 6 MiB over five points
/// while the stack's pages grew 2.3 MiB, and a comparison that gave up there asked for its malloc
/// family.
pub(super) fn ends_over(series: &Series, from: f64) -> Option<(Window, Window)> {
    if let Some(e) = classify(series, from) {
        return e.windows.first().cloned().zip(e.windows.last().cloned());
    }
    let window = |p: &series::Point| Window {
        t0_s: p.t0,
        t1_s: p.t1,
        floor: p.min,
        peak: p.max,
    };
    let mut since = series.points().iter().filter(|p| p.t0 >= from);
    let first = since.next()?;
    let last = since.next_back()?;
    Some((window(first), window(last)))
}

/// A process's series over a stack's evidence: up to the end of its last window (a stack judged
/// on what it held before a teardown is compared with its process before that teardown too).
fn same_span(process: &Series, stack: &Evidence) -> Series {
    process.until(stack.windows.last().map_or(f64::INFINITY, |w| w.t1_s))
}

/// A verdict of a series from a point on its axis, its spans read on the run's clock.
type Judge = fn(&Series, f64, Clock<'_>) -> Option<Evidence>;

/// The verdict of the whole series from `from` on.
fn judge_whole(series: &Series, from: f64, _: Clock<'_>) -> Option<Evidence> {
    classify(series, from)
}

/// The verdict of a series at the end of a run: on what it held before a fall at the end
/// ([`judge_released`]) when it ends below the floor of the last window before the fall, else on
/// the whole series.
fn judge_at_end(series: &Series, from: f64, clock: Clock<'_>) -> Option<Evidence> {
    let held = released_on(series, from, clock)?;
    let floor = held.windows.last().map_or(0, |w| w.floor);
    if series.last().unwrap_or(0) < floor {
        Some(held)
    } else {
        classify(series, from)
    }
}

/// The verdict of a series that ends released: on what it held before its final fall when the
/// fall came at the end (teardown), else on the whole series (memory released mid-run, long
/// before the end, is not a leak at exit).
fn judge_released(series: &Series, warmup_s: f64) -> Option<Evidence> {
    released_on(series, warmup_s, Clock::Own)
}

/// As [`judge_released`], how long it held and how long since its fall read on the run's
/// `clock`: a chain of tensors traced again a second before the end, whose teardown freed what
/// its leak kept, fell at the end of a run of 16 s, not a quarter of the 4 s the chain's spans
/// cover before its end.
fn released_on(series: &Series, warmup_s: f64, clock: Clock<'_>) -> Option<Evidence> {
    let held = series.before_fall();
    let after = clock.span(series) - clock.span(&held);
    if after <= clock.span(&held) / verdict::WINDOWS as f64 {
        classify(&held, warmup_s)
    } else {
        classify(series, warmup_s)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_late;
#[cfg(test)]
mod tests_layers;
