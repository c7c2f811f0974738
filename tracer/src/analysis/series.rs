//! A bounded time series of outstanding bytes. Each point covers the same number of samples (its
//! stride); when the series is full, every pair of points is merged and the stride doubles, so a
//! long run keeps its whole span at an even grain, never losing its floor (minimum) or its peak
//! (maximum): memory per series is fixed whatever the run's length. (Merging only the older half
//! made the oldest points ever wider until one spanned more than a verdict window, and a long
//! run's verdicts vanished.)

use std::borrow::Cow;

/// Points kept per series at most (a point is 32 bytes).
pub const CAP: usize = 64;

/// A span of samples: its first and last time, the least and most bytes seen, the last value,
/// and whether the program allocated or freed at the stack during it (known for heap-level
/// stacks; false where it is not known).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t0: f64,
    pub t1: f64,
    pub min: u64,
    pub max: u64,
    pub last: u64,
    pub active: bool,
}

#[derive(Clone, Debug)]
pub struct Series {
    points: Vec<Point>,
    /// Samples per point.
    stride: u32,
    /// Samples in the last point.
    filled: u32,
}

impl Default for Series {
    fn default() -> Self {
        Self {
            points: Vec::new(),
            stride: 1,
            filled: 0,
        }
    }
}

impl Series {
    pub fn push(&mut self, t: f64, bytes: u64) {
        self.push_sample(t, bytes, false);
    }

    /// A sample, and whether the stack was used since the one before.
    pub fn push_sample(&mut self, t: f64, bytes: u64, active: bool) {
        self.push_least(t, bytes, bytes, active);
    }

    /// A sample of `bytes`, where the least held since the sample before was `least` (see
    /// `Ledger::least_since_sample`), and whether the stack was used since then.
    pub fn push_least(&mut self, t: f64, least: u64, bytes: u64, active: bool) {
        let least = least.min(bytes);
        if self.filled < self.stride
            && let Some(p) = self.points.last_mut()
        {
            p.t1 = t;
            p.min = p.min.min(least);
            p.max = p.max.max(bytes);
            p.last = bytes;
            p.active |= active;
            self.filled += 1;
            return;
        }
        if self.points.len() == CAP {
            self.compact();
        }
        self.points.push(Point {
            t0: t,
            t1: t,
            min: least,
            max: bytes,
            last: bytes,
            active,
        });
        self.filled = 1;
    }

    /// Its points in `range`, whole.
    fn slice(&self, range: impl std::slice::SliceIndex<[Point], Output = [Point]>) -> Series {
        Series {
            points: self.points[range].to_vec(),
            stride: self.stride,
            filled: self.stride,
        }
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The series up to where its final fall began: the last points go while each one's floor
    /// is at most the floor before it (memory released at the end, at once or over a few
    /// samples), but not those that held the top the fall began from. What a stack held before
    /// the program's teardown freed it, and for how long: a series that ends holding what it
    /// grew to (an interpreter's arenas after its import) held it, which is not growth.
    pub fn before_fall(&self) -> Series {
        let p = &self.points;
        let mut end = p.len();
        while end > 1 && p[end - 1].min <= p[end - 2].min {
            end -= 1;
        }
        while end > 0 && end < p.len() && p[end].min == p[end - 1].min {
            end += 1;
        }
        self.slice(..end)
    }

    /// The series up to its last rise, where what it held since is no longer than it held
    /// between two rises from `from_s` on (a staircase between two steps: a slow leak's arenas,
    /// mapped whole a few seconds apart); the whole series where it held longer than that (it
    /// stopped rising: an import's arenas, mapped every sample, then held).
    pub fn to_last_step(&self, from_s: f64) -> Cow<'_, Series> {
        let p = &self.points;
        let rises: Vec<usize> = (1..p.len())
            .filter(|&i| p[i].t0 >= from_s && p[i].min > p[i - 1].min)
            .collect();
        let (Some(&last), Some(end)) = (rises.last(), p.last()) else {
            return Cow::Borrowed(self);
        };
        let longest = rises
            .windows(2)
            .map(|w| p[w[1]].t0 - p[w[0]].t0)
            .fold(0.0, f64::max);
        if end.t1 - p[last].t0 > longest {
            return Cow::Borrowed(self);
        }
        Cow::Owned(self.slice(..=last))
    }

    /// The series up to its points whose samples all came before `t_s`.
    pub fn ending_before(&self, t_s: f64) -> Series {
        self.slice(..self.points.partition_point(|p| p.t1 < t_s))
    }

    /// The series up to its points that begin at `t_s` or before.
    pub fn until(&self, t_s: f64) -> Series {
        self.slice(..self.points.partition_point(|p| p.t0 <= t_s))
    }

    /// The series from its points that begin at `t_s` or after.
    pub fn since(&self, t_s: f64) -> Series {
        self.slice(self.points.partition_point(|p| p.t0 < t_s)..)
    }

    /// The series from `t_s` on, less the least it held there: what it added to what it held
    /// then.
    pub fn added_since(&self, t_s: f64) -> Series {
        let from = self.points.partition_point(|p| p.t0 < t_s);
        let points = &self.points[from..];
        let least = points.iter().map(|p| p.min).min().unwrap_or(0);
        Series {
            points: points
                .iter()
                .map(|p| Point {
                    min: p.min - least,
                    max: p.max - least,
                    last: p.last - least,
                    ..*p
                })
                .collect(),
            stride: self.stride,
            filled: self.stride,
        }
    }

    /// The series without the stretch [`t0_s`, `t1_s`): the points inside it go, those after it
    /// move back by as long, and a point that began in it and goes on past it (merged samples)
    /// stays, from `t0_s`. What it would be had that stretch not been.
    pub fn without(&self, t0_s: f64, t1_s: f64) -> Series {
        let cut = (t1_s - t0_s).max(0.0);
        let moved = |p: &Point, t0: f64| Point {
            t0,
            t1: p.t1 - cut,
            ..*p
        };
        let points = self.points.iter().filter_map(|p| {
            if p.t0 >= t1_s {
                Some(moved(p, p.t0 - cut))
            } else if p.t0 >= t0_s {
                (p.t1 > t1_s).then(|| moved(p, t0_s))
            } else {
                Some(*p)
            }
        });
        Series {
            points: points.collect(),
            stride: self.stride,
            filled: self.stride,
        }
    }

    /// The least-squares slope of the points' floors (bytes a second) over those that begin in
    /// [`t0_s`, `t1_s`]; 0 with fewer than two.
    pub fn slope_between(&self, t0_s: f64, t1_s: f64) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .points
            .iter()
            .filter(|p| (t0_s..=t1_s).contains(&p.t0))
            .map(|p| ((p.t0 + p.t1) / 2.0, p.min as f64))
            .collect();
        let n = pts.len() as f64;
        let (mx, my) = pts
            .iter()
            .fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if pts.len() < 2 || sxx == 0.0 {
            0.0
        } else {
            sxy / sxx
        }
    }

    /// Time from the first sample to the last.
    pub fn span(&self) -> f64 {
        match (self.points.first(), self.points.last()) {
            (Some(a), Some(b)) => b.t1 - a.t0,
            _ => 0.0,
        }
    }

    /// The last value pushed.
    pub fn last(&self) -> Option<u64> {
        self.points.last().map(|p| p.last)
    }

    /// Merges every pair of points (all full: compaction happens only when the last one is).
    fn compact(&mut self) {
        self.points = self
            .points
            .chunks(2)
            .map(|c| match c {
                [a, b] => Point {
                    t0: a.t0,
                    t1: b.t1,
                    min: a.min.min(b.min),
                    max: a.max.max(b.max),
                    last: b.last,
                    active: a.active || b.active,
                },
                [a] => *a,
                _ => unreachable!("chunks of two"),
            })
            .collect();
        self.stride *= 2;
        self.filled = self.stride;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_cut_out_moves_what_follows_back_and_keeps_merged_points_across_it() {
        let mut s = Series::default();
        for t in 0..10 {
            s.push(t as f64, t * 10);
        }
        let cut = s.without(3.0, 6.0);
        let at: Vec<(f64, u64)> = cut.points().iter().map(|p| (p.t0, p.min)).collect();
        assert_eq!(
            at,
            vec![
                (0.0, 0),
                (1.0, 10),
                (2.0, 20),
                (3.0, 60),
                (4.0, 70),
                (5.0, 80),
                (6.0, 90)
            ]
        );
        // A merged point from 2 to 8 s begins before the stretch: it stays as it was.
        let merged = Series {
            points: vec![Point {
                t0: 2.0,
                t1: 8.0,
                min: 5,
                max: 9,
                last: 9,
                active: true,
            }],
            ..Series::default()
        };
        assert_eq!(merged.without(3.0, 6.0).points()[0].t0, 2.0);
        // One from 4 to 8 s goes on past it: it stays, from the stretch's start, 3 s shorter.
        let mut late = merged.clone();
        late.points[0].t0 = 4.0;
        let p = late.without(3.0, 6.0).points()[0];
        assert_eq!((p.t0, p.t1), (3.0, 5.0));
    }

    #[test]
    fn a_final_fall_begins_after_the_top_was_held_and_an_exit_cuts_whole_points() {
        let mut s = Series::default();
        // Grown to 5, held for four samples, then freed over two.
        for b in [1, 3, 5, 5, 5, 5, 2, 0] {
            s.push(s.points().len() as f64, b);
        }
        let held: Vec<u64> = s.before_fall().points().iter().map(|p| p.min).collect();
        assert_eq!(held, vec![1, 3, 5, 5, 5, 5]);
        // Freed at once, then nothing held for a while: the fall is from the top.
        let mut freed = Series::default();
        for (t, b) in [1, 3, 5, 0, 0, 0].into_iter().enumerate() {
            freed.push(t as f64, b);
        }
        assert_eq!(freed.before_fall().points().len(), 3);
        // Two samples a point: the one from 4 to 5 s holds the sample at the exit (4.5 s on).
        let mut merged = Series {
            stride: 2,
            ..Series::default()
        };
        for t in 0..6 {
            merged.push(t as f64, t);
        }
        let ends: Vec<f64> = merged
            .ending_before(4.5)
            .points()
            .iter()
            .map(|p| p.t1)
            .collect();
        assert_eq!(ends, vec![1.0, 3.0]);
    }

    #[test]
    fn a_staircase_between_two_steps_ends_at_its_last_step_and_one_that_stopped_does_not() {
        let steps = |end: u64| {
            let mut s = Series::default();
            for t in 0..=end {
                // A step every 3 s from 2 s on, the last at 11 s.
                s.push(t as f64, (t.min(11) + 1) / 3);
            }
            s
        };
        let ends = |s: Cow<'_, Series>| s.points().last().map(|p| p.t1);
        assert_eq!(ends(steps(13).to_last_step(0.0)), Some(11.0));
        assert_eq!(ends(steps(14).to_last_step(0.0)), Some(11.0));
        // Held 4 s: longer than between two steps.
        assert_eq!(ends(steps(15).to_last_step(0.0)), Some(15.0));
        // From 9 s on there is one step: nothing to say it goes on.
        assert_eq!(ends(steps(13).to_last_step(9.0)), Some(13.0));
    }

    #[test]
    fn the_slope_between_two_times_is_the_least_squares_one_of_the_floors() {
        let mut s = Series::default();
        for t in 0..10 {
            // A staircase: 1 MiB every 3 s, as a slow leak maps arenas.
            s.push(t as f64, (t / 3) << 20);
        }
        let mib_per_s = s.slope_between(0.0, 8.0) / (1 << 20) as f64;
        assert!((mib_per_s - 1.0 / 3.0).abs() < 0.05, "{mib_per_s}");
        assert_eq!(s.slope_between(4.0, 4.0), 0.0, "one point");
    }

    #[test]
    fn memory_is_bounded_and_extremes_survive_compaction() {
        let mut s = Series::default();
        for i in 0..10_000u64 {
            // One spike early on, a floor of 100 otherwise.
            let v = if i == 3 { 1_000_000 } else { 100 + i };
            s.push(i as f64, v);
        }
        assert!(s.points().len() <= CAP);
        assert_eq!(s.points().iter().map(|p| p.max).max(), Some(1_000_000));
        assert_eq!(s.points()[0].min, 100);
        assert_eq!(s.points()[0].t0, 0.0);
        assert_eq!(s.last(), Some(100 + 9_999));
        let times: Vec<f64> = s.points().iter().map(|p| p.t0).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "in time order");
        // An even grain: every point but the last spans the same number of samples.
        let spans: Vec<f64> = s.points().iter().map(|p| p.t1 - p.t0).collect();
        assert!(
            spans[..spans.len() - 1].iter().all(|d| *d == spans[0]),
            "{spans:?}"
        );
        assert_eq!(spans[0], 255.0, "10,000 samples in points of 256");
    }
}
