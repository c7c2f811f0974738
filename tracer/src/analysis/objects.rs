//! Python objects, judged from their sampled window (ledger/objects.rs) and their arenas' series.
//! Arenas grow with whatever objects need room; which line keeps them, the window tells: the stacks
//! whose objects, made early in it, were still held at its end. A leak of Python objects is then
//! reported on those stacks, at the rate its arenas grow, shared by what each kept; the arenas
//! themselves are `under_objects`.

use rustc_hash::FxHashMap;

use super::{Analysis, Evidence, Verdict, judge_released, verdict::Window};
use crate::{
    ledger::KeptLine,
    model::{GroupKey, StackId},
};

/// Kept bytes a stack needs to count as keeping its objects (eight sample intervals: fewer
/// samples than that may be chance).
pub const KEPT_MIN: u64 = 8 * tracer_common::OBJECT_SAMPLE_BYTES;

/// A process's closed window: its arena stacks, and each stack's objects made and kept.
#[derive(Clone, Debug, Default)]
pub struct ObjectWindow {
    arenas: Vec<GroupKey>,
    lines: FxHashMap<Option<StackId>, KeptLine>,
}

impl ObjectWindow {
    /// Whether a stack kept its objects: half of what it made early in the window or more, and
    /// [`KEPT_MIN`] at least.
    fn keeps(line: &KeptLine) -> bool {
        line.kept >= KEPT_MIN && line.kept.saturating_mul(2) >= line.made
    }

    /// Bytes kept by the stacks that keep.
    fn kept(&self) -> u64 {
        self.lines
            .values()
            .filter(|l| Self::keeps(l))
            .map(|l| l.kept)
            .sum()
    }
}

impl Analysis {
    /// The window of `pid`'s Python objects closed: `arenas`, its arena stacks; `lines`, what
    /// each stack made and kept.
    pub fn objects_sampled(&mut self, pid: u32, arenas: Vec<GroupKey>, lines: Vec<KeptLine>) {
        let lines = lines.into_iter().map(|l| (l.stack, l)).collect();
        self.objects.insert(pid, ObjectWindow { arenas, lines });
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

    /// Whether `key` is an arena stack of a process whose window found the stacks that keep its
    /// objects: the leak, if any, is reported on those.
    pub(super) fn under_objects(&self, key: &GroupKey) -> bool {
        self.objects
            .get(&key.pid)
            .is_some_and(|w| w.arenas.contains(key) && w.kept() > 0)
    }

    /// The verdict of a stack of Python objects: a leak where it kept its objects and its
    /// process's arenas leak, at their rate times its share of the kept bytes; steady otherwise
    /// (temporaries, or arenas that do not grow). None before its window closed.
    pub(super) fn judge_objects(&self, key: &GroupKey, warmup_s: f64) -> Option<Evidence> {
        let w = self.objects.get(&key.pid)?;
        let line = w.lines.get(&key.stack)?;
        let arenas = self.arenas_leak(w, warmup_s);
        let steady = || Evidence {
            verdict: Verdict::Steady,
            confidence: 1.0,
            growth_bytes: 0,
            slope_bytes_per_s: 0.0,
            windows: Vec::new(),
        };
        let Some(arenas) = arenas.filter(|_| ObjectWindow::keeps(line)) else {
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

    /// The process's leaking arena stacks as one: the evidence of the one that grew most, with
    /// the growth and slope of them all. None when none leaks.
    fn arenas_leak(&self, w: &ObjectWindow, warmup_s: f64) -> Option<Evidence> {
        let leaks: Vec<Evidence> = w
            .arenas
            .iter()
            .filter_map(|k| judge_released(&self.groups.get(k)?.series, warmup_s))
            .filter(|e| e.verdict == Verdict::Leak)
            .collect();
        let mut all = leaks.iter().max_by_key(|e| e.growth_bytes)?.clone();
        all.growth_bytes = leaks.iter().map(|e| e.growth_bytes).sum();
        all.slope_bytes_per_s = leaks.iter().map(|e| e.slope_bytes_per_s).sum();
        Some(all)
    }
}
