//! Each process's CPU time (all its threads, user and system) at each sample, as the owner reads
//! it from /proc: what a rate measured over one stretch and applied over another is also counted
//! in, where the clock would mislead; and its user time alone, the pace of its own work, which
//! tells how much slower a layer's probes made it run. A machine that takes the CPU from the program for a while
//! (a build beside it, a slow disk under its imports) slows what it does per second, and a rate
//! measured then, applied once it runs at full speed again, reads its memory as growing faster
//! than it did. Per second of its own CPU time, it does not. The clock still counts too: the
//! kernel's time in the probes' handlers is the program's, and a program that mostly waits (on
//! its data, a GPU, a timer) spends much more CPU a step while traced, at the same pace.

use super::Analysis;
use crate::model::CpuTimes;

/// A process's CPU seconds at samples (on the series' axis), in order.
#[derive(Debug, Default)]
pub(super) struct CpuClock {
    points: Vec<(f64, CpuTimes)>,
}

/// The samples a [`CpuClock`] keeps at most: past it, every other one of its older half goes (a
/// day-long run's clock stays a few tens of KiB, ever coarser where it is oldest).
const MAX_POINTS: usize = 2048;

impl CpuClock {
    fn push(&mut self, x: f64, cpu: CpuTimes) {
        if self.points.last().is_some_and(|&(last, _)| x <= last) {
            return;
        }
        if self.points.len() >= MAX_POINTS {
            let half = self.points.len() / 2;
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i > half || i % 2 == 1
            });
        }
        self.points.push((x, cpu));
    }

    /// CPU seconds at `x`, interpolated between the samples around it; None outside them.
    fn at(&self, x: f64) -> Option<CpuTimes> {
        let i = self.points.partition_point(|&(p, _)| p < x);
        let &(bx, b) = self.points.get(i)?;
        if bx == x {
            return Some(b);
        }
        let &(ax, a) = self.points.get(i.checked_sub(1)?)?;
        let f = (x - ax) / (bx - ax);
        Some(CpuTimes {
            total: a.total + (b.total - a.total) * f,
            user: a.user + (b.user - a.user) * f,
        })
    }

    /// The user CPU seconds between `x0` and `x1`, both cut to the samples and to `end`, with
    /// the span they were had over; none where nothing of it is within.
    fn user_within(&self, x0: f64, x1: f64, end: f64) -> (f64, f64) {
        let (Some(&(first, _)), Some(&(last, _))) = (self.points.first(), self.points.last())
        else {
            return (0.0, 0.0);
        };
        let (x0, x1) = (x0.max(first), x1.min(last).min(end));
        match (self.at(x0), self.at(x1)) {
            (Some(a), Some(b)) if x1 > x0 => ((b.user - a.user).max(0.0), x1 - x0),
            _ => (0.0, 0.0),
        }
    }
}

/// How far on either side of a span its program's pace is taken from ([`Analysis::slowdown`]).
const PACE_AROUND_S: f64 = 10.0;
/// The user CPU seconds a span would have had at its program's pace around it, at least, for its
/// slowdown to be told: ten of the kernel's ticks, in which user time is counted.
const PACE_MIN_USER_S: f64 = 0.1;
/// A slowdown this small or less is none: the pace of a program's own work wanders this much.
const PACE_NOISE: f64 = 1.05;

impl Analysis {
    /// `pid` had had `cpu` seconds of CPU time at the sample at `x`.
    pub fn sample_cpu(&mut self, x: f64, pid: u32, cpu: CpuTimes) {
        self.cpu.entry(pid).or_default().push(x, cpu);
    }

    /// The CPU seconds `pid` had between `x0` and `x1` (on the series' axis), where both are
    /// within its samples.
    pub(super) fn cpu_between(&self, pid: u32, x0: f64, x1: f64) -> Option<f64> {
        let clock = self.cpu.get(&pid)?;
        Some((clock.at(x1)?.total - clock.at(x0)?.total).max(0.0))
    }

    /// How much slower `pid`'s own code ran over `x0..x1` (on the series' axis; to its last
    /// sample where `x1` is past it) than in the [`PACE_AROUND_S`] on either side, before its
    /// interpreter's exit: its user CPU time per unit of the axis around the span over that
    /// within it. A layer's probes slow a program by their traps, which the kernel counts as its
    /// system time; its user time goes on at the pace of its own work. None where it was not
    /// slower, or the span is too short at that pace to tell ([`PACE_MIN_USER_S`]).
    ///
    /// The threads of a program that spin while they wait (an OpenMP pool between two parallel
    /// regions) count user time without work: their program's slowdown reads less than it was.
    pub(super) fn slowdown(&self, pid: u32, x0: f64, x1: f64) -> Option<f64> {
        let clock = self.cpu.get(&pid)?;
        let end = self.procs.get(&pid).and_then(|p| p.exit_x);
        let end = end.filter(|x| x.is_finite()).unwrap_or(f64::INFINITY);
        let (inside, inside_x) = clock.user_within(x0, x1, end);
        let (before, before_x) = clock.user_within(x0 - PACE_AROUND_S, x0, end);
        let (after, after_x) = clock.user_within(x1, x1 + PACE_AROUND_S, end);
        let around_x = before_x + after_x;
        if inside_x <= 0.0 || around_x <= 0.0 {
            return None;
        }
        let pace = (before + after) / around_x;
        if pace * inside_x < PACE_MIN_USER_S {
            return None;
        }
        // One tick at least within: a program stalled still did that much.
        let tick = PACE_MIN_USER_S / 10.0;
        let slowdown = pace / (inside.max(tick) / inside_x);
        (slowdown > PACE_NOISE).then_some(slowdown)
    }

    /// The CPU seconds `pid` had a second, on average, over `pieces` (spans on the series'
    /// axis); None where a piece is outside its samples or it had none.
    pub(super) fn cpu_share(
        &self,
        pid: u32,
        pieces: impl Iterator<Item = (f64, f64)>,
    ) -> Option<f64> {
        let (mut cpu, mut wall) = (0.0, 0.0);
        for (from, to) in pieces {
            cpu += self.cpu_between(pid, from, to)?;
            wall += to - from;
        }
        (cpu > 0.0 && wall > 0.0).then(|| cpu / wall)
    }
}

#[cfg(test)]
mod tests {
    use super::CpuClock;
    use crate::{
        analysis::{Analysis, TakenOut, Verdict},
        ledger::Ledger,
        model::{CpuTimes, GroupKey, Kind},
    };

    const M: u64 = 1 << 20;

    use crate::analysis::tests::key;

    /// Samples every half second of a process whose CPU seconds a second are `cpu` (before 8 s,
    /// after), where its CPU time is sampled. Its tensors, traced from 2 s, leak 0.5 MiB a
    /// sample (1 MiB a second on the clock) and are kept at 8 s; after, its pages grow by
    /// `pages` MiB a second at one stack and 10 at another. The verdicts of both.
    fn kept_then(cpu: Option<(f64, f64)>, pages: f64) -> (Verdict, Verdict) {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let (tensors, grown, faster) = (key(1, Kind::Tensor), key(2, Kind::Brk), key(3, Kind::Brk));
        let mut a = Analysis::default();
        for i in 0..41u64 {
            let t = i as f64 / 2.0;
            if i == 4 {
                a.tensors_traced_from(1, 2.0);
            }
            if i == 16 {
                a.tensors_taken_out(1, 8.0, TakenOut::Kept);
            }
            let held = i.clamp(4, 15).saturating_sub(4) * M / 2 + M;
            let after = (t - 8.0).max(0.0);
            let groups = [
                (tensors, held),
                (grown, M + (after * pages * M as f64) as u64),
                (faster, M + (after * 10.0 * M as f64) as u64),
            ];
            a.sample(t, &ledger, &groups);
            if let Some((before, since)) = cpu {
                let total = t.min(8.0) * before + after * since;
                a.sample_cpu(t, 1, CpuTimes { total, user: total });
            }
        }
        let verdict = |k: &GroupKey| a.judge(k, 0.0).unwrap().verdict;
        (verdict(&grown), verdict(&faster))
    }

    /// A leak of tensors measured while the machine gave the program half a CPU explains pages
    /// grown at up to twice its rate per second of the program's CPU time once it has a whole
    /// one, not only at twice its rate on the clock; and measured while its probes cost a
    /// program that waits half a CPU, pages grown at twice its rate on the clock once it needs
    /// a tenth, not only at twice its rate per second of its CPU time. Pages grown faster still
    /// are a leak of their own.
    #[test]
    fn kept_tensors_explain_pages_by_their_rate_on_the_clock_or_in_cpu_time() {
        let (under, leak) = (Verdict::UnderTensors, Verdict::Leak);
        assert_eq!(kept_then(Some((0.5, 1.0)), 4.0), (under, leak));
        // On the clock alone (no CPU time known), the same pages outgrow the rate.
        assert_eq!(kept_then(None, 4.0), (leak, leak));
        assert_eq!(kept_then(Some((0.5, 0.1)), 1.5), (under, leak));
        assert_eq!(kept_then(None, 1.5), (under, leak));
    }

    #[test]
    fn cpu_time_is_interpolated_between_samples_and_unknown_outside_them() {
        let cpu = |total: f64| CpuTimes {
            total,
            user: total / 2.0,
        };
        let mut c = CpuClock::default();
        for (x, total) in [(1.0, 0.5), (2.0, 1.5), (4.0, 2.0)] {
            c.push(x, cpu(total));
        }
        c.push(3.0, cpu(9.0)); // out of order: ignored
        assert_eq!(c.at(1.0), Some(cpu(0.5)));
        assert_eq!(c.at(1.5), Some(cpu(1.0)));
        assert_eq!(c.at(3.0), Some(cpu(1.75)));
        assert_eq!(c.at(4.0), Some(cpu(2.0)));
        assert_eq!(c.at(0.5), None);
        assert_eq!(c.at(4.5), None);
        // A long run's clock stays bounded, its first and latest samples kept.
        let mut c = CpuClock::default();
        for i in 0..10_000 {
            c.push(f64::from(i), cpu(f64::from(i) / 2.0));
        }
        assert!(c.points.len() <= super::MAX_POINTS, "{}", c.points.len());
        assert_eq!(c.at(0.0), Some(cpu(0.0)));
        assert_eq!(c.at(9999.0), Some(cpu(4999.5)));
        assert_eq!(c.at(5000.5), Some(cpu(2500.25)));
    }
}
