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
    /// at teardown): a CI gate must still see them. `outstanding` are the groups that hold memory.
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
                let e = classify(&t.series, warmup_s)?;
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
