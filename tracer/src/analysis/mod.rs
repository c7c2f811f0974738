//! Verdicts: per stack and per process, outstanding bytes sampled into bounded series, classified
//! as leak, spike, bounded cache or steady (verdict.rs), with the evidence. Fed by the ledger's owner
//! at each sample tick; read by the report.

pub mod series;
pub mod verdict;

use rustc_hash::FxHashMap;

pub use verdict::{Evidence, Verdict, classify};

use crate::{
    ledger::Ledger,
    model::{GroupKey, Kind},
};
use series::Series;

/// Series per stack group and per process.
#[derive(Default)]
pub struct Analysis {
    groups: FxHashMap<GroupKey, Tracked>,
    /// Per process: heap-level bytes (heap and tensors) and page-level bytes of the allocator's
    /// heap (brk).
    procs: FxHashMap<u32, (Series, Series)>,
    /// Samples taken so far.
    round: u64,
}

/// A group's series and the sample it was last given a value in.
#[derive(Default)]
struct Tracked {
    series: Series,
    round: u64,
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

impl Analysis {
    /// Takes one sample at `t_s` seconds of every outstanding group (`groups`: the ledger's
    /// `group_bytes`, one entry per group) and every process. Groups seen before and gone now get
    /// a 0 at every sample (a spike that came back is a spike).
    pub fn sample(&mut self, t_s: f64, ledger: &Ledger, groups: &[(GroupKey, u64)]) {
        self.round += 1;
        let round = self.round;
        let mut per_proc: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for &(key, bytes) in groups {
            let t = self.groups.entry(key).or_default();
            t.series.push(t_s, bytes);
            t.round = round;
            let e = per_proc.entry(key.pid).or_default();
            match key.kind {
                Kind::Heap | Kind::Tensor => e.0 += bytes,
                // The allocator's own heap: mmap regions are mostly the program's (or freed
                // with the block they hold), so they do not tell retention.
                Kind::Brk => e.1 += bytes,
                _ => {}
            }
        }
        for t in self.groups.values_mut() {
            if t.round != round {
                t.series.push(t_s, 0);
                t.round = round;
            }
        }
        for pid in ledger.procs.keys() {
            let (heap, pages) = per_proc.get(pid).copied().unwrap_or_default();
            let (h, p) = self.procs.entry(*pid).or_default();
            h.push(t_s, heap);
            p.push(t_s, pages);
        }
    }

    /// A group's sampled series, oldest first.
    pub fn series(&self, key: &GroupKey) -> Option<&[series::Point]> {
        self.groups.get(key).map(|t| t.series.points())
    }

    /// A process's heap-level and brk series, oldest first.
    pub fn process_series(&self, pid: u32) -> Option<(&[series::Point], &[series::Point])> {
        self.procs.get(&pid).map(|(h, p)| (h.points(), p.points()))
    }

    /// The verdict of a group, from `warmup_s` on. The brk heap of a process whose heap bytes
    /// stay flat while its pages grow is retention by the allocator, not a leak.
    pub fn judge(&self, key: &GroupKey, warmup_s: f64) -> Option<Evidence> {
        let mut evidence = classify(&self.groups.get(key)?.series, warmup_s)?;
        if evidence.verdict == Verdict::Leak
            && key.kind == Kind::Brk
            && self
                .retention(key.pid, warmup_s)
                .is_some_and(|r| r.retention)
        {
            evidence.verdict = Verdict::Retention;
        }
        Some(evidence)
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
            .filter(|(k, _)| !outstanding.contains(k))
            .filter_map(|(k, t)| {
                let e = judge_released(&t.series, warmup_s)?;
                (e.verdict == Verdict::Leak).then_some((*k, e))
            })
            .collect();
        out.sort_by_key(|x| std::cmp::Reverse(x.1.growth_bytes));
        out
    }

    /// Allocator retention of a process, from `warmup_s` on.
    pub fn retention(&self, pid: u32, warmup_s: f64) -> Option<Retention> {
        let (h, p) = self.procs.get(&pid)?;
        let (heap, pages) = (classify(h, warmup_s)?, classify(p, warmup_s)?);
        Some(Retention {
            retention: pages.verdict == Verdict::Leak && heap.verdict != Verdict::Leak,
            heap: heap.verdict,
            pages: pages.verdict,
            pages_growth_bytes: pages.growth_bytes,
        })
    }
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
