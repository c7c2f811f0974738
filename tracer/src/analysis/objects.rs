//! Python objects, judged from their sampled window (ledger/objects.rs) and their arenas' series.
//! Arenas grow with whatever objects need room; which line keeps them, the window tells: the stacks
//! whose objects, made early in it, were still held at its end. A leak of Python objects is then
//! reported on those stacks, at the rate its arenas grow, shared by what each kept; the arenas
//! themselves are `under_objects`.

use rustc_hash::FxHashMap;

use super::{Analysis, Evidence, Verdict, judge_released, series::Series, span, verdict::Window};
use crate::{
    ledger::KeptLine,
    model::{GroupKey, StackId},
};

/// Kept bytes a site needs to count as keeping its objects (eight sample intervals: fewer
/// samples than that may be chance).
pub const KEPT_MIN: u64 = 8 * tracer_common::OBJECT_SAMPLE_BYTES;
/// The samples after a window closed that its arenas are judged on without its span, at least
/// (see `Analysis::went_on_past`).
const AFTER_MIN_S: f64 = 1.0;
/// One pymalloc arena (CPython 3.10 on; 256 KiB before, which four of make).
const ONE_ARENA: u64 = 1 << 20;
/// How many times its arenas' growth a process's heap leak is at least for the arenas to be
/// under it, where no window sampled its objects (`Analysis::arenas_under_heap`): a kept numpy
/// array's header against its 12 KiB of pixels was a tenth, arenas being whole MiB; an object
/// leak of its own alongside grows them by more.
const HEAP_OVER_ARENAS: i64 = 4;

/// A process's closed window: its arena stacks, each stack's objects made and kept with its site
/// (the stacks of one site: the objects of several types one line makes), and each site's sums.
#[derive(Clone, Debug, Default)]
pub struct ObjectWindow {
    /// Where the window was on the series' axis: the program ran slowly meanwhile.
    span: (f64, f64),
    arenas: Vec<GroupKey>,
    lines: FxHashMap<Option<StackId>, (KeptLine, u32)>,
    sites: FxHashMap<u32, SiteSums>,
}

impl ObjectWindow {
    /// Whether a stack's site kept its objects (see [`site_keeps`]).
    fn keeps(&self, site: u32) -> bool {
        site_keeps(self.sites.get(&site).copied().unwrap_or_default())
    }

    /// Bytes kept by the sites that keep.
    fn kept(&self) -> u64 {
        keepers_kept(&self.sites)
    }

    /// Bytes kept by libraries' imports (the modules' state).
    fn imports_kept(&self) -> u64 {
        kept_by_imports(self.lines.values())
    }
}

/// A site's bytes made and kept early in a window, and whether what it kept grew with the window.
#[derive(Clone, Copy, Debug, Default)]
struct SiteSums {
    made: u64,
    kept: u64,
    grows: bool,
    rising: bool,
}

/// Whether a site that made and kept bytes early in a window kept its objects: [`KEPT_MIN`] at
/// least, and a quarter of what it made or more, or less where what it keeps grew with the
/// window. Not half: a line that keeps objects in a container that grows also makes the
/// container's array again and again (a list's is reallocated as it grows, the old one freed),
/// while temporaries keep next to nothing (the request in flight). A line that makes many
/// temporaries and keeps one of them (a training step's loss, kept with its tensor object, among
/// the forward's dozens) keeps a few percent, growing as a leak does.
fn site_keeps(s: SiteSums) -> bool {
    s.kept >= KEPT_MIN && keepers_share(s)
}

/// Whether a site kept a keeper's share of what it made: a quarter, or less where what it keeps
/// grew with the window (see [`site_keeps`]).
fn keepers_share(s: SiteSums) -> bool {
    s.kept.saturating_mul(4) >= s.made || s.grows
}

/// Each site's bytes made and kept, from its stacks' (`lines`, with their sites). What an import
/// kept counts as made, not kept: it is the module's state (a line that imports a library as a
/// loop's first step makes its objects).
fn site_sums(lines: &[(KeptLine, u32)]) -> FxHashMap<u32, SiteSums> {
    let mut sites: FxHashMap<u32, SiteSums> = FxHashMap::default();
    for (l, site) in lines {
        let s = sites.entry(*site).or_default();
        let kept = if l.imported { 0 } else { l.kept };
        (s.made, s.kept) = (s.made + l.made, s.kept + kept);
        (s.grows, s.rising) = (s.grows | l.grows, s.rising | l.rising);
    }
    sites
}

/// Bytes kept by the sites that keep, of a window's stacks `lines` (with their sites).
pub fn kept_by_keepers(lines: &[(KeptLine, u32)]) -> u64 {
    keepers_kept(&site_sums(lines))
}

/// Whether a site of a window's stacks `lines` (with their sites) kept, at a keeper's share, half
/// of [`KEPT_MIN`] or more, or a quarter of it and more than at the window's first look, and not
/// yet all of it: a slow leak whose window has not yet seen enough of it to tell (a loop that logs
/// a small dict of metrics every step keeps a few KiB in five seconds of the slowed program, one
/// kept sample per KiB: about seven, three or fewer in one run of twelve, more often on a busy
/// machine), which a longer window does. A line that kept a few objects once is no longer
/// undecided once its kept bytes stop rising.
pub fn undecided_keeper(lines: &[(KeptLine, u32)]) -> bool {
    let under = |s: &SiteSums| {
        (KEPT_MIN / 4..KEPT_MIN).contains(&s.kept) && (s.kept >= KEPT_MIN / 2 || s.rising)
    };
    site_sums(lines)
        .values()
        .any(|s| under(s) && keepers_share(*s))
}

/// Bytes kept by libraries' imports, of a window's stacks `lines`.
pub fn kept_by_imports<'l>(lines: impl IntoIterator<Item = &'l (KeptLine, u32)>) -> u64 {
    let imported = lines.into_iter().filter(|(l, _)| l.imported);
    imported.map(|(l, _)| l.kept).sum()
}

/// Bytes kept by the sites that keep, of `sites`' sums.
fn keepers_kept(sites: &FxHashMap<u32, SiteSums>) -> u64 {
    sites
        .values()
        .filter(|s| site_keeps(**s))
        .map(|s| s.kept)
        .sum()
}

/// Whether `arenas` rose by an arena at least from `from_s` on, above what they held then.
fn rose(arenas: &Series, from_s: f64) -> bool {
    let since = arenas.since(from_s);
    let first = since.points().first().map(|p| p.min);
    let most = since.points().iter().map(|p| p.max).max();
    matches!((first, most), (Some(a), Some(b)) if b >= a + ONE_ARENA)
}

/// Where a process's arenas are judged from: the later half of what was sampled (from
/// `warmup_s` at least). An interpreter's start-up maps most of its arenas at once (importing
/// torch: about 100 MiB in two seconds); a leak of objects then adds them a few at a time, which
/// the whole series would read as a cache that filled at the start.
fn recent_half(arenas: &super::series::Series, warmup_s: f64) -> f64 {
    let (first, last) = match arenas.points() {
        [a, .., b] => (a.t0, b.t1),
        _ => return warmup_s,
    };
    warmup_s.max((first + last) / 2.0)
}

/// The arenas judged from `from_s` on, on what they added to what they held then: importing
/// torch maps about 100 MiB of arenas, and a leak of objects adds 1 MiB at a time; judged against
/// all of it, a slow leak's few MiB would be a fraction of a percent of what the stack holds, which
/// a working set's wandering is. Arenas do not wander: they are whole MiB, mapped when objects need
/// room and unmapped when none are left in them.
///
/// And a slow leak's arenas come a few seconds apart, so that two windows may end on the same
/// floor: arenas that never fell, grew by two at least and were still rising in the last window
/// (its peak above its floor and above every earlier window's: a full cache mapping and unmapping
/// one arena does not) leak, where the series alone would read a bounded cache.
///
/// Judged up to their last step where they held since no longer than between two steps before
/// (`Series::to_last_step`): a series that holds the top it reached is judged with that hold
/// (`Series::before_fall`), which for a staircase is the wait for its next arena.
///
/// Not over a whole run: there, the import's arenas are most of the growth, and what rises after
/// them need not be at the rate of the whole. Its rate is the samples' least-squares slope.
fn classify_arenas(arenas: &Series, from_s: f64) -> Option<Evidence> {
    const TWO_ARENAS: i64 = 2 << 20;
    let added = arenas.to_last_step(from_s).added_since(from_s);
    let mut e = judge_released(&added, from_s)?;
    let never_fell = e.windows.windows(2).all(|w| w[1].floor >= w[0].floor);
    let rising = e.windows.split_last().is_some_and(|(last, earlier)| {
        earlier.iter().all(|w| last.peak > w.peak) && last.peak > last.floor
    });
    if e.verdict == Verdict::BoundedCache && never_fell && rising && e.growth_bytes >= TWO_ARENAS {
        e.verdict = Verdict::Leak;
    }
    // The rate over every sample of the span judged, not the four windows' floors: a staircase
    // of whole arenas a few seconds apart puts a window's floor a step behind at random.
    if let (Some(first), Some(last)) = (e.windows.first(), e.windows.last()) {
        e.slope_bytes_per_s = added.slope_between(first.t0_s, last.t1_s);
    }
    Some(e)
}

/// Arenas (a process's, or a stack's) that leak in the later half of what was sampled: a short
/// PyTorch job's whole run is mostly its import (about 100 MiB of arenas in four seconds, then
/// held), which alone reads as a leak. Judged on the whole run where it reads as a leak too (its
/// slope is the run's).
fn arenas_grow(arenas: &Series, warmup_s: f64) -> Option<Evidence> {
    let leak = |e: Option<Evidence>| e.filter(|e| e.verdict == Verdict::Leak);
    let later = recent_half(&arenas.before_fall(), warmup_s);
    let recent = leak(classify_arenas(arenas, later))?;
    Some(leak(judge_released(arenas, warmup_s)).unwrap_or(recent))
}

impl Analysis {
    /// The window of `pid`'s Python objects closed: `span`, from when it was asked for to its
    /// close on the series' axis; `arenas`, its arena stacks; `lines`, what each stack made and
    /// kept, with its site (stacks of one site share the number).
    pub fn objects_sampled(
        &mut self,
        pid: u32,
        span: (f64, f64),
        arenas: Vec<GroupKey>,
        lines: Vec<(KeptLine, u32)>,
    ) {
        let sites = site_sums(&lines);
        let lines = lines.into_iter().map(|(l, s)| (l.stack, (l, s))).collect();
        self.objects.insert(
            pid,
            ObjectWindow {
                span,
                arenas,
                lines,
                sites,
            },
        );
    }

    /// What `pid`'s window sampled, the stacks that keep first, then the most made: each
    /// stack's bytes made and kept, and whether it keeps them. None before its window closed.
    pub fn object_lines(&self, pid: u32) -> Option<Vec<(KeptLine, bool)>> {
        let w = self.objects.get(&pid)?;
        let mut lines: Vec<(KeptLine, bool)> = w
            .lines
            .values()
            .map(|(l, site)| (*l, w.keeps(*site)))
            .collect();
        lines.sort_by_key(|(l, keeps)| (!keeps, std::cmp::Reverse(l.made), l.stack));
        Some(lines)
    }

    /// Arena stacks of `pid` found since its window closed (a leak goes on making arenas, each
    /// with the stack of the object that needed it).
    pub fn more_arenas(&mut self, pid: u32, arenas: impl IntoIterator<Item = GroupKey>) {
        if let Some(w) = self.objects.get_mut(&pid) {
            for k in arenas {
                if !w.arenas.contains(&k) {
                    w.arenas.push(k);
                }
            }
        }
    }

    /// The page-level stacks of `pid` with a series, of `kind`.
    pub fn tracked(&self, pid: u32, kind: crate::model::Kind) -> Vec<GroupKey> {
        self.groups
            .keys()
            .filter(|k| k.pid == pid && k.kind == kind)
            .copied()
            .collect()
    }

    /// Whether `key` is an arena stack of a process whose arenas leak and whose window found the
    /// stacks that keep its objects: the leak is reported on those.
    pub(super) fn under_objects(&self, key: &GroupKey, warmup_s: f64) -> bool {
        self.objects.get(&key.pid).is_some_and(|w| {
            w.arenas.contains(key)
                && w.kept() > 0
                && self.window_arenas_leak(key.pid, w, warmup_s).is_some()
        })
    }

    /// Whether `key` is an arena stack of a process whose objects were never sampled, while its
    /// heap leaks by [`HEAP_OVER_ARENAS`] times what the stack grew by at least: the Python
    /// objects that own the leaking blocks fill arenas (each numpy array a DataLoader worker
    /// keeps is a header in an arena over its pixels in the heap). A few arenas a run grow
    /// slower than what calls for a window (2 MiB over the later half of the run): over 40
    /// epochs of such a worker, the arenas were named a leak at whichever line needed a new one
    /// (the line before the keeping one, the pickling of a batch) in two runs of four, beside
    /// the heap's leak at its line.
    pub(super) fn arenas_under_heap(&self, key: &GroupKey, e: &Evidence, warmup_s: f64) -> bool {
        self.arena_stacks.contains(key)
            && !self.objects.contains_key(&key.pid)
            && self.heap_leaks_by(
                key.pid,
                warmup_s,
                e.growth_bytes.saturating_mul(HEAP_OVER_ARENAS),
            )
    }

    /// Whether `key` is an arena stack of a process whose window found no site that keeps its
    /// objects, and imports that kept theirs ([`KEPT_MIN`] at least): the arenas grew with the
    /// modules it imported, as a training loop's first steps import what they use.
    pub(super) fn arenas_of_imports(&self, key: &GroupKey) -> bool {
        self.objects.get(&key.pid).is_some_and(|w| {
            w.arenas.contains(key) && w.kept() == 0 && w.imports_kept() >= KEPT_MIN
        })
    }

    /// The verdict of a stack of Python objects: a leak where it kept its objects and its
    /// process's arenas leak, at their rate times its share of the kept bytes; steady otherwise
    /// (temporaries, or arenas that do not grow). None before its window closed.
    pub(super) fn judge_objects(&self, key: &GroupKey, warmup_s: f64) -> Option<Evidence> {
        let w = self.objects.get(&key.pid)?;
        let (line, site) = w.lines.get(&key.stack)?;
        let arenas = self.window_arenas_leak(key.pid, w, warmup_s);
        let steady = || Evidence {
            verdict: Verdict::Steady,
            confidence: 1.0,
            growth_bytes: 0,
            slope_bytes_per_s: 0.0,
            windows: Vec::new(),
        };
        if line.imported {
            return Some(Evidence {
                verdict: Verdict::Imported,
                ..steady()
            });
        }
        let Some(arenas) = arenas.filter(|_| w.keeps(*site)) else {
            return Some(steady());
        };
        let share = line.kept as f64 / w.kept().max(1) as f64;
        let scale = |b: u64| (b as f64 * share).round() as u64;
        Some(Evidence {
            verdict: Verdict::Leak,
            confidence: arenas.confidence,
            growth_bytes: (arenas.growth_bytes as f64 * share).round() as i64,
            slope_bytes_per_s: arenas.slope_bytes_per_s * share,
            windows: arenas
                .windows
                .iter()
                .map(|x| Window {
                    floor: scale(x.floor),
                    peak: scale(x.peak),
                    ..*x
                })
                .collect(),
        })
    }

    /// One sample of each process's arenas (`arenas`: its arena stacks with their bytes; the
    /// others hold none), taken with [`Analysis::sample`] at the same `t_s`: all of them, and
    /// those mapped outside libraries' imports.
    pub fn sample_arenas(&mut self, t_s: f64, arenas: &[(GroupKey, u64)]) {
        let mut sums: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for (key, bytes) in arenas {
            let sum = sums.entry(key.pid).or_default();
            sum.0 += bytes;
            if !self.imported_stack(key) {
                sum.1 += bytes;
            }
        }
        for (pid, s) in self.procs.iter_mut() {
            let (all, program) = sums.get(pid).copied().unwrap_or_default();
            s.arenas.push(t_s, all);
            s.program_arenas.push(t_s, program);
        }
        self.arena_stacks.extend(arenas.iter().map(|(k, _)| *k));
    }

    /// Processes whose arenas, all together, leak from `start(pid)` on (the warm-up, or when
    /// its tensors began to be traced) over `span_s` seconds at least and grew by `min_bytes` at
    /// least, and not under their tensors (the Python objects of a tensor leak fill arenas too):
    /// where Python objects are to be sampled. And the arenas mapped outside libraries' imports
    /// rose by an arena meanwhile: an import's own arenas (torch's, 100 MiB in four seconds)
    /// are its module's state, and the window they called for in a job that keeps nothing
    /// slowed its loop's first seconds; imports that leave the arenas full make the program's
    /// own lines map new ones (a loop whose steps import modules), which a window tells apart
    /// from a leak.
    pub fn growing_arenas(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
    ) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .procs
            .iter()
            .filter(|(pid, s)| {
                let from = start(**pid);
                classify_arenas(&s.arenas, recent_half(&s.arenas, from)).is_some_and(|e| {
                    e.verdict == Verdict::Leak
                        && e.growth_bytes >= min_bytes
                        && span(&e) >= span_s
                        && e.windows
                            .first()
                            .is_some_and(|w| rose(&s.program_arenas, w.t0_s))
                        && !self.under_tensors(**pid, &e, from)
                })
            })
            .map(|(pid, _)| *pid)
            .collect();
        pids.sort_unstable();
        pids
    }

    /// The process's arenas' leak, all together ([`Analysis::arenas_leak`]), or where they do
    /// not read as one, the leak of the window's arena stack that grew most, on its own series
    /// without the window's span: an interpreter that gives back the empty arenas of its
    /// start-up (a PyTorch job's) while a leak's arenas grow holds about as much in all. The
    /// arenas mapped outside libraries' imports, both ways: an import maps arenas at its own
    /// lines (torch's, 100 MiB in four seconds), and a short job's loop that held them read as
    /// a leak of the import's 20 MiB/s at the line of its first `loss.backward()`, whose first
    /// call's caches its window, opened as the import ended, found kept.
    fn window_arenas_leak(&self, pid: u32, w: &ObjectWindow, warmup_s: f64) -> Option<Evidence> {
        if !self.went_on_past(pid, w) {
            return None;
        }
        self.arenas_leak(pid, warmup_s).or_else(|| {
            let own = self.program_stacks(w).filter_map(|s| {
                let series = self.before_exit(pid, s);
                arenas_grow(&series.without(w.span.0, w.span.1), warmup_s)
            });
            own.max_by_key(|e| e.growth_bytes)
        })
    }

    /// The series of the window's arena stacks mapped outside libraries' imports.
    fn program_stacks<'a>(&'a self, w: &'a ObjectWindow) -> impl Iterator<Item = &'a Series> {
        let stacks = w.arenas.iter().filter(|k| !self.imported_stack(k));
        stacks.filter_map(|k| self.groups.get(k)).map(|t| &t.series)
    }

    /// Whether what called for `pid`'s window went on past its opening: arenas judged without
    /// its span are, where fewer than [`AFTER_MIN_S`] of samples came after it closed, what
    /// they did before it alone, which is what called for it; a leak goes on while the window
    /// looks, slowed, and grows the program's arenas (the process's, or a stack's) by an arena
    /// at least.
    fn went_on_past(&self, pid: u32, w: &ObjectWindow) -> bool {
        let Some(p) = self.procs.get(&pid) else {
            return false;
        };
        let arenas = self.before_exit(pid, &p.program_arenas);
        let last = arenas.points().last().map_or(w.span.1, |p| p.t1);
        if last - w.span.1 >= AFTER_MIN_S {
            return true;
        }
        rose(&arenas, w.span.0)
            || self
                .program_stacks(w)
                .any(|s| rose(&self.before_exit(pid, s), w.span.0))
    }

    /// The program's arenas, all together, when they leak (judged on what they held before the
    /// interpreter's exit gave them back), without the window's span: while the program runs
    /// slowly, its arenas hardly grow, and a window of seconds in the later half of a short run
    /// would read as the leak ending, or halve its rate.
    fn arenas_leak(&self, pid: u32, warmup_s: f64) -> Option<Evidence> {
        let arenas = self.before_exit(pid, &self.procs.get(&pid)?.program_arenas);
        let arenas = match self.objects.get(&pid) {
            Some(w) => &arenas.without(w.span.0, w.span.1),
            None => &*arenas,
        };
        arenas_grow(arenas, warmup_s)
    }
}

#[cfg(test)]
mod tests;
