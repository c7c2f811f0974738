//! When the verdicts' samples are taken. With `--sample S`, every S seconds. By default the pace
//! follows the run: every 50 ms at the start, so that a run of two seconds (a CI test) is judged
//! too, slowing as the run grows (a thirty-second part of the time traced, up to one second), and
//! never spending more than a twentieth of the time on sampling (the CPU time a sample takes,
//! not its wall time, which a busy machine stretches); every 50 ms again while a layer
//! of `--heap auto` is traced and judged (its probes cost the program most while it waits for a
//! verdict). A series merges its old points
//! as it grows (analysis/series.rs), so a long run keeps its whole span either way.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::config::Sampling;

/// The finest pace, at the start of a run.
const FIRST: f64 = 0.05;
/// The slowest pace of the default, reached after 32 seconds.
const SLOWEST: f64 = 1.0;
/// The share of the run's time the pace keeps between samples: elapsed / 32.
const SHARE: f64 = 32.0;
/// At most one twentieth of the time goes to sampling.
const COST_FACTOR: f64 = 20.0;

/// Seconds until the next sample, `elapsed_s` into the run, the last sample having taken `cost`
/// of CPU time;
/// at the finest pace where a layer is judged (`fine`).
fn interval(sampling: Sampling, elapsed_s: f64, cost: Duration, fine: bool) -> f64 {
    let pace = if fine { FIRST } else { elapsed_s / SHARE };
    match sampling {
        Sampling::Every(s) => s,
        Sampling::Adaptive => pace
            .clamp(FIRST, SLOWEST)
            .max(cost.as_secs_f64() * COST_FACTOR),
    }
}

/// The next time-driven sample; none when samples come at step boundaries.
pub(super) struct SampleClock {
    sampling: Option<Sampling>,
    next: Instant,
}

impl SampleClock {
    pub(super) fn new(sampling: Option<Sampling>) -> Self {
        let first = sampling.map_or(0.0, |s| interval(s, 0.0, Duration::ZERO, false));
        Self {
            sampling,
            next: Instant::now() + Duration::from_secs_f64(first),
        }
    }

    /// Resolves when the next sample is due (never without time-driven sampling).
    pub(super) async fn due(&self) {
        match self.sampling {
            Some(_) => sleep_until(self.next).await,
            None => std::future::pending().await,
        }
    }

    /// A sample was taken `elapsed_s` into the run, in `cost` of CPU time: the next one is set, at the
    /// finest pace where a layer is judged (`fine`).
    pub(super) fn taken(&mut self, elapsed_s: f64, cost: Duration, fine: bool) {
        if let Some(s) = self.sampling {
            let next = interval(s, elapsed_s, cost, fine);
            self.next = Instant::now() + Duration::from_secs_f64(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pace_starts_fine_and_slows_as_the_run_grows() {
        let at = |t: f64, cost_ms: u64| {
            interval(Sampling::Adaptive, t, Duration::from_millis(cost_ms), false)
        };
        assert_eq!(at(0.0, 0), 0.05);
        assert_eq!(at(1.0, 0), 0.05);
        assert_eq!(at(8.0, 0), 0.25);
        assert_eq!(at(32.0, 0), 1.0);
        assert_eq!(at(3600.0, 0), 1.0);
        // A sample that takes 10 ms is taken at most every 200 ms.
        assert_eq!(at(1.0, 10), 0.2);
        assert_eq!(
            interval(Sampling::Every(0.3), 100.0, Duration::from_secs(1), true),
            0.3
        );
        // While a layer is judged: the finest pace again, as its cost allows.
        let fine = |cost_ms| {
            interval(
                Sampling::Adaptive,
                600.0,
                Duration::from_millis(cost_ms),
                true,
            )
        };
        assert_eq!((fine(0), fine(10)), (0.05, 0.2));
    }
}
