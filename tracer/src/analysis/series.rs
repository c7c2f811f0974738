//! A bounded time series of outstanding bytes. Recent samples are kept as taken; when the series is
//! full, the older half is merged pairwise, so old history loses resolution but never its floor
//! (minimum) or its peak (maximum): memory per series is fixed whatever the run's length.

/// Samples kept per series at most (a point is 32 bytes).
pub const CAP: usize = 64;

/// A span of samples: its first and last time, the least and most bytes seen, and the last value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t0: f64,
    pub t1: f64,
    pub min: u64,
    pub max: u64,
    pub last: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Series {
    points: Vec<Point>,
}

impl Series {
    pub fn push(&mut self, t: f64, bytes: u64) {
        if self.points.len() == CAP {
            self.compact();
        }
        self.points.push(Point {
            t0: t,
            t1: t,
            min: bytes,
            max: bytes,
            last: bytes,
        });
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The last value pushed.
    pub fn last(&self) -> Option<u64> {
        self.points.last().map(|p| p.last)
    }

    /// Merges the older half pairwise.
    fn compact(&mut self) {
        let half = CAP / 2;
        let merged: Vec<Point> = self.points[..half]
            .chunks(2)
            .map(|c| match c {
                [a, b] => Point {
                    t0: a.t0,
                    t1: b.t1,
                    min: a.min.min(b.min),
                    max: a.max.max(b.max),
                    last: b.last,
                },
                [a] => *a,
                _ => unreachable!("chunks of two"),
            })
            .collect();
        self.points.splice(..half, merged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
