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

    /// What `pid`'s window sampled, the stacks that keep first, then the most made: each
    /// stack's bytes made and kept, and whether it keeps them. None before its window closed.
    pub fn object_lines(&self, pid: u32) -> Option<Vec<(KeptLine, bool)>> {
        let w = self.objects.get(&pid)?;
        let mut lines: Vec<(KeptLine, bool)> = w
            .lines
            .values()
            .map(|l| (*l, ObjectWindow::keeps(l)))
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

#[cfg(test)]
mod tests {
    use super::KEPT_MIN;
    use crate::{
        analysis::{Analysis, Verdict},
        ledger::{KeptLine, Ledger},
        model::{GroupKey, Kind, StackId},
    };

    fn key(s: u32, kind: Kind) -> GroupKey {
        GroupKey {
            pid: 1,
            stack: Some(StackId::new(s)),
            kind,
            inherited: false,
        }
    }

    fn line(s: u32, made: u64, kept: u64) -> KeptLine {
        KeptLine {
            stack: Some(StackId::new(s)),
            made,
            kept,
        }
    }

    /// 20 samples a second apart of two arena stacks (3 and 4) that grow by 1 and 3 MiB a
    /// second (`grow`), or hold 4 MiB each.
    fn arenas(grow: bool) -> Analysis {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 service.py".into(), Vec::new(), 0);
        let mut a = Analysis::default();
        for i in 0..20u64 {
            let (x, y) = if grow { (i + 1, 3 * (i + 1)) } else { (4, 4) };
            let groups = [(key(3, Kind::Mmap), x << 20), (key(4, Kind::Mmap), y << 20)];
            a.sample(i as f64, &ledger, &groups);
        }
        a
    }

    #[test]
    fn the_stacks_that_keep_their_objects_carry_the_arenas_leak_by_share() {
        let mut a = arenas(true);
        let arena = key(3, Kind::Mmap);
        assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::Leak);
        let whole = a.judge(&key(4, Kind::Mmap), 0.0).unwrap().slope_bytes_per_s
            + a.judge(&arena, 0.0).unwrap().slope_bytes_per_s;
        let lines = vec![
            // Kept three quarters, and a quarter: 3 : 1 of the kept bytes.
            line(1, 4 * KEPT_MIN, 3 * KEPT_MIN),
            line(2, KEPT_MIN, KEPT_MIN),
            // Temporaries: made the most, kept little.
            line(5, 100 * KEPT_MIN, KEPT_MIN),
            // Kept all it made, but too few samples to tell.
            line(6, KEPT_MIN / 2, KEPT_MIN / 2),
        ];
        a.objects_sampled(1, vec![arena, key(4, Kind::Mmap)], lines);
        let judge = |s| a.judge(&key(s, Kind::Object), 0.0).unwrap();
        let (one, two) = (judge(1), judge(2));
        assert_eq!((one.verdict, two.verdict), (Verdict::Leak, Verdict::Leak));
        assert!(
            (one.slope_bytes_per_s - whole * 0.75).abs() < 1.0,
            "{one:?}"
        );
        assert!(
            (two.slope_bytes_per_s - whole * 0.25).abs() < 1.0,
            "{two:?}"
        );
        assert_eq!(judge(5).verdict, Verdict::Steady);
        assert_eq!(judge(6).verdict, Verdict::Steady);
        assert!(a.judge(&key(9, Kind::Object), 0.0).is_none(), "not sampled");
        assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::UnderObjects);
        let order: Vec<u32> = a
            .object_lines(1)
            .unwrap()
            .iter()
            .map(|(l, _)| l.stack.unwrap().get())
            .collect();
        assert_eq!(
            order,
            vec![1, 2, 5, 6],
            "those that keep first, then by bytes made"
        );
    }

    #[test]
    fn objects_kept_while_the_arenas_hold_are_no_leak_and_nothing_kept_leaves_the_arenas_leak() {
        let mut flat = arenas(false);
        flat.objects_sampled(
            1,
            vec![key(3, Kind::Mmap)],
            vec![line(1, KEPT_MIN, KEPT_MIN)],
        );
        let v = flat.judge(&key(1, Kind::Object), 0.0).unwrap().verdict;
        assert_eq!(v, Verdict::Steady, "a cache filled before the window");
        let mut none = arenas(true);
        none.objects_sampled(1, vec![key(3, Kind::Mmap)], vec![line(5, 9 * KEPT_MIN, 0)]);
        let v = none.judge(&key(3, Kind::Mmap), 0.0).unwrap().verdict;
        assert_eq!(
            v,
            Verdict::Leak,
            "no stack kept: the arenas are the leak, at their line"
        );
    }
}
