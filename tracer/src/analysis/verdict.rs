//! What a series of outstanding bytes means: a leak (the floor rises window after window, whatever
//! the spikes above it), a spike (it rises and comes back), a bounded cache (it rises, then the
//! floor holds), or steady. The evidence is part of the verdict: the floor and peak of each window,
//! the floor's slope, the growth, and how sure the call is.

use serde::Serialize;

use super::series::{Point, Series};

/// Windows the analysed span is cut into.
pub const WINDOWS: usize = 4;
/// Samples needed (after warm-up) before a verdict is given: one per window.
pub const MIN_POINTS: usize = WINDOWS;
/// A leak's growth is at least this part of its least window floor (2%).
const MIN_GROWTH_SHARE: u64 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Leak,
    Spike,
    BoundedCache,
    Steady,
    /// Not from the series alone: a page-level stack (the allocator's brk heap) rising in a
    /// process whose heap-level bytes do not, so memory the allocator keeps (fragmentation), not
    /// memory the program holds. Set by the report from the process's `Retention`.
    Retention,
    /// Not from the series alone: a heap-level stack rising while its process's heap-level bytes
    /// do not, over the same windows: what it gains, other stacks of the process give back (a
    /// working set replaced from another call site: records loaded at start-up, then updated
    /// from the update path), not memory the program keeps adding.
    Moved,
    /// Not from the series alone: a page-level stack of a process whose malloc family is not
    /// traced (`--heap auto`), rising no faster than its tensors (CPU tensors, caching-allocator
    /// blocks): the pages hold the tensors or their Python objects, whose leak, if it is one, is
    /// reported on the tensor stacks at their lines.
    UnderTensors,
    /// Not from the series alone: the allocator's brk heap of a process whose malloc family was
    /// traced and judged a leak (a stack of it, or its bytes by at least half of what its pages
    /// grew over the same stretch): the leak is reported on the heap stacks, at their lines, and
    /// what the pages grew by beyond it is the room the allocator keeps around the leaking
    /// blocks. A brk stack names whichever
    /// allocation moved the heap's top, not the one that keeps (a worker's cache of decoded
    /// samples grew its heap at the line that converts each sample, the one after). Also the
    /// pymalloc arenas of a process whose objects were never sampled, beside a heap leak of
    /// several times their growth: the objects that own the leaking blocks fill them
    /// (`Analysis::arenas_under_heap`).
    UnderHeap,
    /// Not from the series alone: arenas of CPython's object allocator in a process whose
    /// objects were sampled, and whose window found the stacks that keep them: the leak is
    /// reported on those stacks (kind `object`), at their lines.
    UnderObjects,
    /// Not from the series alone: pages or Python objects made while a library's module was
    /// imported ([`crate::report::made_by_import`]): the module's state, made once and held for as
    /// long as it is loaded, however many modules a training loop's first steps import.
    Imported,
}

impl Verdict {
    /// Every verdict, as a filter of the stacks takes them.
    pub const ALL: [Verdict; 10] = [
        Self::Leak,
        Self::Spike,
        Self::BoundedCache,
        Self::Steady,
        Self::Retention,
        Self::Moved,
        Self::UnderTensors,
        Self::UnderHeap,
        Self::UnderObjects,
        Self::Imported,
    ];

    /// The name in JSON, history and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::Spike => "spike",
            Self::BoundedCache => "bounded_cache",
            Self::Steady => "steady",
            Self::Retention => "retention",
            Self::Moved => "moved",
            Self::UnderTensors => "under_tensors",
            Self::UnderHeap => "under_heap",
            Self::UnderObjects => "under_objects",
            Self::Imported => "imported",
        }
    }
}

/// One window's floor (least outstanding bytes) and peak.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Window {
    pub t0_s: f64,
    pub t1_s: f64,
    pub floor: u64,
    pub peak: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Evidence {
    pub verdict: Verdict,
    /// 0–1: how consistently the windows support the verdict, scaled down for short series.
    pub confidence: f64,
    /// Floor of the last window minus floor of the first.
    pub growth_bytes: i64,
    /// Least-squares slope of the window floors over time.
    pub slope_bytes_per_s: f64,
    pub windows: Vec<Window>,
}

/// Changes of window floors smaller than this are noise: 0.1% of the lowest floor, never under a
/// page (not a share of the peak: a large spike must not hide a slow leak under it). Floors are
/// window minima, so jitter above the floor does not move them.
pub fn tolerance(floors: &[u64]) -> u64 {
    (floors.iter().copied().min().unwrap_or(0) / 1000).max(4096)
}

/// Classifies `series` from time `warmup_s` on; None while there are too few samples. A stack the
/// program stopped using is judged on the span it was used ([`until_quiet`]).
pub fn classify(series: &Series, warmup_s: f64) -> Option<Evidence> {
    let pts = until_quiet(series.points(), warmup_s);
    if pts.len() < MIN_POINTS {
        return None;
    }
    // Windows of equal duration (not of equal sample count: old samples are merged, and windows
    // by count would make the recent ones short).
    let (start, end) = (pts[0].t0, pts[pts.len() - 1].t0);
    let span = (end - start).max(f64::MIN_POSITIVE);
    let index = |p: &Point| (((p.t0 - start) / span * WINDOWS as f64) as usize).min(WINDOWS - 1);
    let mut windows: Vec<Option<Window>> = vec![None; WINDOWS];
    for p in &pts {
        let w = windows[index(p)].get_or_insert(Window {
            t0_s: p.t0,
            t1_s: p.t1,
            floor: p.min,
            peak: p.max,
        });
        w.t1_s = p.t1;
        w.floor = w.floor.min(p.min);
        w.peak = w.peak.max(p.max);
    }
    // A window without a sample (a gap in sampling) leaves nothing to compare.
    let windows: Vec<Window> = windows.into_iter().collect::<Option<_>>()?;
    let floors: Vec<u64> = windows.iter().map(|w| w.floor).collect();
    let peak = highest_peak(&windows);
    let base = floors.iter().copied().min().unwrap_or(0);
    let tol = tolerance(&floors);
    let rises = floors.windows(2).filter(|f| f[1] > f[0] + tol).count();
    let falls = floors.windows(2).filter(|f| f[1] + tol < f[0]).count();
    let growth = floors[WINDOWS - 1] as i64 - floors[0] as i64;
    let pairs = (WINDOWS - 1) as f64;
    let length = (pts.len() as f64 / (4 * MIN_POINTS) as f64).min(1.0);
    // A leak grows by a share of what the stack holds: a working set of thousands of blocks of
    // random sizes, replaced at random, wanders by a fraction of a percent, and three windows
    // out of four rise by chance one time in eight.
    let grows = growth >= (base / MIN_GROWTH_SHARE).max(tol) as i64;
    // And it is still growing in the last window, by a tenth of its growth at least (a steady
    // leak adds a third there): a working set that filled in the first window and then wanders
    // up by a few blocks is a cache.
    let recent = floors[WINDOWS - 1] as i64 - floors[WINDOWS - 2] as i64;
    let held = pts[pts.len() - 1].last;
    let still_growing =
        recent.saturating_mul(10) >= growth || grew_on_in_last_window(&windows, held, growth, tol);
    let (verdict, support) = if rises == WINDOWS - 1 && grows && still_growing {
        (Verdict::Leak, 1.0)
    } else if growth > tol as i64 && rises >= 1 && falls == 0 {
        // One step up, into a last window that held flat through: a block or an allocator's
        // heap that grew once (a thread's arena extended as a native pool warmed up), not a
        // trend.
        let last = windows[WINDOWS - 1];
        let stepped = rises == 1 && last.peak <= last.floor + tol;
        let tail_flat =
            floors[WINDOWS - 1].abs_diff(floors[WINDOWS - 2]) <= tol || !still_growing || stepped;
        if tail_flat {
            (Verdict::BoundedCache, (pairs - rises as f64 + 1.0) / pairs)
        } else if grows {
            (Verdict::Leak, rises as f64 / pairs)
        } else {
            (Verdict::Steady, 1.0 - rises as f64 / pairs)
        }
    } else if rises == 0 && falls == 0 && peak > floors.iter().copied().max().unwrap_or(0) + tol {
        // The floor holds while something above it comes and goes.
        (Verdict::Spike, 1.0)
    } else {
        (Verdict::Steady, 1.0 - (rises + falls) as f64 / pairs)
    };
    Some(Evidence {
        verdict,
        confidence: (support * length * 100.0).round() / 100.0,
        growth_bytes: growth,
        slope_bytes_per_s: slope(&windows),
        windows,
    })
}

/// Whether a stack that never went below the last window's start grew on through it, by a
/// tenth of its `growth` at least: its last window began at the reach of the one before (no
/// swing: all it held, it still held) and it holds now (`held`, not a passing spike) that much
/// above that reach. A floor is a window's least, for such a stack its start: it lags the
/// growth by a window. A DataLoader worker's heap top, its malloc family traced for a second of
/// its third window (which slowed it): floors of 47, 83, 122 and 129 MiB under peaks of 82, 120,
/// 129 and 143 MiB, 143 MiB held at the end.
fn grew_on_in_last_window(windows: &[Window], held: u64, growth: i64, tol: u64) -> bool {
    let [.., before, last] = windows else {
        return false;
    };
    last.floor + tol >= before.peak && (held.saturating_sub(before.peak) as i64) * 10 >= growth
}

/// The highest peak of `windows` (0 where there are none).
pub(super) fn highest_peak(windows: &[Window]) -> u64 {
    windows.iter().map(|w| w.peak).max().unwrap_or(0)
}

/// Whether a leak verdict (`e`, on seconds) is a working set sampled at different moments of its
/// cycle rather than memory kept: the last window's floor is no higher than a peak the stack
/// reached in an earlier window, and none of its outstanding blocks (the oldest `oldest_age_s`
/// old, `now_s` into the run) is as old as the last window. A training step's gradients are made
/// in the backward pass and freed at the next step's `zero_grad`: a window whose few samples all
/// fall between the two has a floor as high as the gradients, the windows before it lower ones,
/// yet nothing stays. A leak under an early spike keeps its old blocks; a container that grows
/// by reallocation rises above its earlier peaks, unless one of them was higher still: that one
/// is read as a working set too. A working set's peaks wander by chance (a longer sequence, a
/// validation step caught), not with its floor; a stack whose last window peaks above every
/// earlier one by as much as its floor rose is growing still, whatever its blocks' ages
/// ([`peaks_with_its_floor`]: the teardown of a process that kept Python objects frees their
/// arenas but the last one, young, yet the arenas grew to the end).
///
/// Not where the floors rose in every window by about as much each time ([`rises_steadily`]): an
/// accumulator grown by copying holds one block, always young, and the earlier windows' peaks
/// caught it holding two copies while it copied, the last window's samples not (floors of 6.0,
/// 9.4, 13.5 and 16.7 MiB under peaks of 16.7, 24.6, 32.0 and 19.7 MiB).
pub fn working_set(e: &Evidence, oldest_age_s: f64, now_s: f64) -> bool {
    let Some((last, earlier)) = e.windows.split_last() else {
        return false;
    };
    let reached = highest_peak(earlier);
    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
    e.verdict == Verdict::Leak
        && last.floor <= reached
        && !peaks_with_its_floor(e)
        && !rises_steadily(&floors)
        && oldest_age_s < now_s - last.t0_s
}

/// Whether the last of `e`'s windows peaks above every earlier one by as much as its floor rose
/// above theirs at least: memory kept lifts the peaks with the floor, while a window whose
/// samples all missed a working set's low moment lifts its floor alone. A no-leak transformer
/// job's per-step activations, every tensor traced, sampled as instants: floors of nothing in
/// three windows, then 325 KiB, under peaks of 1446, 1414, 1446 and then 1544 KiB (a longer
/// sequence): up by 98 KiB, less than the floor.
fn peaks_with_its_floor(e: &Evidence) -> bool {
    let Some((last, earlier)) = e.windows.split_last() else {
        return false;
    };
    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
    let floor_before = earlier.iter().map(|w| w.floor).max().unwrap_or(0);
    let rise = last.floor.saturating_sub(floor_before);
    last.peak > highest_peak(earlier) + tolerance(&floors).max(rise)
}

/// Whether a leak verdict of a stack that moved its process's heap top (`e`) rose by less than a
/// tenth of that heap (`heap_bytes`, what all its brk stacks hold now): a PyTorch job's heap
/// holds some 140 MiB once torch is imported, and its top goes on moving up by a MiB or two in
/// its loop's first seconds (its warm-up, longer while it is traced), which is no leak. A leak in
/// such a heap is for its malloc family to find, exactly, which the layers ask for where the
/// pages grow on.
pub fn a_large_heaps_small_rise(e: &Evidence, heap_bytes: u64) -> bool {
    e.verdict == Verdict::Leak && (e.growth_bytes.max(0) as u64).saturating_mul(10) < heap_bytes
}

/// Whether `floors` rose in every window by about as much each time (the least rise half the
/// most at least), as a leak rises and chance does not.
fn rises_steadily(floors: &[u64]) -> bool {
    let tol = tolerance(floors);
    let every = floors.len() > 1 && floors.windows(2).all(|f| f[1] > f[0] + tol);
    let rises = floors.windows(2).map(|f| f[1].saturating_sub(f[0]));
    let (least, most) = rises.fold((u64::MAX, 0), |(l, m), r| (l.min(r), m.max(r)));
    every && least.saturating_mul(2) >= most
}

/// Whether a leak verdict (`e`, on seconds) rests on one rise, in the last window, within what
/// the stack swung to before, of blocks all made since the window before it began (the oldest
/// `oldest_age_s` old, `now_s` into the run): a step's temporaries held across one window, as
/// when the process stalls mid-step, not memory kept window after window (a leak's floors rise
/// in the windows before, and its first blocks stay). Its tensors kept as they were once their
/// process's leak was confirmed, a backward pass's gradients (made at `loss.backward()`, freed
/// at the next step's `zero_grad`) caught so read as a leak of their own.
pub fn rose_once_within_swing(e: &Evidence, oldest_age_s: f64, now_s: f64) -> bool {
    let n = e.windows.len();
    if e.verdict != Verdict::Leak || n < 3 {
        return false;
    }
    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
    let tol = tolerance(&floors);
    let flat_before = floors[..n - 1].iter().all(|&f| f <= floors[0] + tol);
    let reached = highest_peak(&e.windows[..n - 1]);
    flat_before && floors[n - 1] <= reached && oldest_age_s < now_s - e.windows[n - 2].t0_s
}

/// Whether a leak verdict of a group that holds nothing now (released at the end) is a working
/// set by its series alone, its blocks' ages gone with them: its floor did not rise in every
/// window, or rose by less than its last window's peak stays below an earlier one (the floors
/// crept up within the stack's swing), and its last window stays within what an earlier one
/// reached ([`working_set`]). A training step's temporaries, kept as they were when their
/// process's tensors were taken out and freed later, read so: a floor of nothing, then one block
/// sampled in the last window. So does a step's logits of a length that varies, one tensor
/// alive at a time: its floors, the shortest sampled in each window, 1562, 1687, 2000 and 2375
/// KiB by chance, under peaks of 9.5, 5.7, 10.3 and 5.7 MiB.
///
/// Not where the floors rose in every window by about as much each time (the least rise half
/// the most at least), as a leak rises and chance does not: an accumulator grown by copying
/// (`acc = torch.cat([acc, x])`) holds two copies while it copies, and a window whose samples
/// never caught it so has a peak well below the earlier ones' (floors of 7.2, 8.3, 9.4 and
/// 10.5 MiB under peaks of 8.3, 18.6, 20.6 and 11.5 MiB).
pub fn released_working_set(e: &Evidence) -> bool {
    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor).collect();
    let tol = tolerance(&floors);
    let every = floors.windows(2).all(|f| f[1] > f[0] + tol);
    let within_swing = e.windows.split_last().is_some_and(|(last, earlier)| {
        let reached = highest_peak(earlier);
        last.peak.saturating_add(e.growth_bytes.max(0) as u64) < reached
    });
    // Floors that rose steadily are no working set ([`working_set`] says so).
    (!every || within_swing) && working_set(e, 0.0, f64::INFINITY)
}

/// The points from `warmup_s` on, up to the last one in which the stack was used, when the quiet
/// stretch after it is shorter than the span it was used (from its first point, warm-up included:
/// a process's tensors traced late rise from nothing for their first second, and a short loop
/// that leaked through it has used the stack for that second too): a training loop that leaked
/// until it ended, then evaluation, saving and exit, is judged on the loop, not read as a cache
/// that filled up. A cache at work allocates and frees through its plateau; one filled once and
/// kept for long has a quiet stretch longer than its filling and is judged whole. Series without
/// activity from `warmup_s` on are whole.
fn until_quiet(points: &[Point], warmup_s: f64) -> Vec<&Point> {
    let pts: Vec<&Point> = points.iter().filter(|p| p.t0 >= warmup_s).collect();
    let Some(last) = pts.iter().rposition(|p| p.active) else {
        return pts;
    };
    let (first, end) = (points[0].t0, pts[pts.len() - 1].t1);
    let used_until = pts[last].t1;
    if end - used_until < used_until - first {
        pts[..=last].to_vec()
    } else {
        pts
    }
}

/// Least-squares slope of the floors against the windows' mid times.
fn slope(windows: &[Window]) -> f64 {
    let xs: Vec<f64> = windows.iter().map(|w| (w.t0_s + w.t1_s) / 2.0).collect();
    let ys: Vec<f64> = windows.iter().map(|w| w.floor as f64).collect();
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    if sxx == 0.0 {
        return 0.0;
    }
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    sxy / sxx
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn series(f: impl Fn(u64) -> u64, n: u64) -> Series {
        let mut s = Series::default();
        for i in 0..n {
            s.push(i as f64, f(i));
        }
        s
    }

    fn verdict(s: &Series) -> Verdict {
        classify(s, 0.0).expect("enough samples").verdict
    }

    /// 30 samples rising by a MiB while the stack is used, then `tail` flat samples, used or not.
    fn loop_then_tail(tail: u64, used: bool) -> Series {
        let mut s = Series::default();
        for i in 0..30 + tail {
            let (bytes, active) = if i < 30 {
                (i * MIB, true)
            } else {
                (30 * MIB, used)
            };
            s.push_sample(i as f64, bytes, active);
        }
        s
    }

    #[test]
    fn a_leak_that_stopped_with_its_loop_is_judged_on_the_loop() {
        // Evaluation and exit after the loop: the stack is not used, the plateau is shorter than
        // the loop. Whole, the series would read as a cache.
        assert_eq!(verdict(&loop_then_tail(20, false)), Verdict::Leak);
        // A cache at work through its plateau is a cache.
        assert_eq!(verdict(&loop_then_tail(45, true)), Verdict::BoundedCache);
        // Filled once and kept for longer than its filling: not a leak either.
        assert_eq!(verdict(&loop_then_tail(60, false)), Verdict::BoundedCache);
    }

    #[test]
    fn the_span_a_stack_was_used_counts_from_its_first_sample_not_from_the_warm_up() {
        // Judged from 20 s: 10 s of the loop against 12 s quiet; used since 0 s, it was used
        // for 30 s, and the loop is what is judged.
        let late = |tail| classify(&loop_then_tail(tail, false), 20.0).map(|e| e.verdict);
        assert_eq!(late(12), Some(Verdict::Leak));
        // Quiet for longer than it was used: judged whole, a cache.
        assert_eq!(late(40), Some(Verdict::BoundedCache));
    }

    #[test]
    fn a_working_set_that_filled_then_wanders_up_is_a_cache() {
        // 24 MiB filled in the first window, then 20 KiB more per window.
        let fill = series(
            |i| {
                if i < 5 {
                    i * 5 * MIB
                } else {
                    24 * MIB + (i / 10) * (20 << 10)
                }
            },
            40,
        );
        assert_eq!(verdict(&fill), Verdict::BoundedCache);
    }

    /// A DataLoader worker's heap top, always at its highest (MiB, ten samples a window),
    /// slowed in its third window (its malloc family traced): its last floor up by less than a
    /// tenth of its growth, yet it grew on through the last window and holds it. The same
    /// stack come back from a spike there, or up by less than a tenth, filled.
    #[test]
    fn a_top_that_grew_on_through_its_last_window_is_growing_still() {
        let reach = [(47, 82), (83, 120), (122, 129), (129, 143)];
        // Sample `i` of a top rising through each window to its reach, to `end` in the last.
        let rising = |i: u64, end: u64| {
            let (from, to) = reach[(i / 10) as usize];
            let to = if i / 10 == 3 { end } else { to };
            (from + (to - from) * (i % 10) / 9) * MIB
        };
        assert_eq!(verdict(&series(|i| rising(i, 143), 40)), Verdict::Leak);
        assert_eq!(
            verdict(&series(|i| rising(i, 133), 40)),
            Verdict::BoundedCache,
            "up by 4 MiB"
        );
        let spike = series(|i| if i == 35 { 143 * MIB } else { rising(i, 129) }, 40);
        assert_eq!(
            verdict(&spike),
            Verdict::BoundedCache,
            "a spike that came back"
        );
    }

    #[test]
    fn one_step_up_held_through_the_last_window_is_not_a_leak() {
        // A native thread's arena extended once by 200 KiB, then held (a DDP rank's gloo pool).
        let step = |i: u64| if i < 25 { 812 << 10 } else { 1012 << 10 };
        assert_eq!(verdict(&series(step, 40)), Verdict::BoundedCache);
        // The same step with the last window still rising is a leak that began.
        let began = |i: u64| step(i) + i.saturating_sub(30) * (32 << 10);
        assert_eq!(verdict(&series(began, 40)), Verdict::Leak);
    }

    #[test]
    fn a_working_set_wandering_by_a_fraction_of_a_percent_is_not_a_leak() {
        // 24 MiB of blocks whose floor happens to rise by 64 KiB a window.
        let wander = series(|i| 24 * MIB + (i / 10) * (64 << 10), 40);
        assert_eq!(verdict(&wander), Verdict::Steady);
        // The same rises from a small base are a leak.
        assert_eq!(
            verdict(&series(|i| MIB + (i / 10) * (64 << 10), 40)),
            Verdict::Leak
        );
    }

    #[test]
    fn a_steady_leak_is_a_leak_with_its_slope() {
        let e = classify(&series(|i| 10 * MIB + i * MIB, 40), 0.0).unwrap();
        assert_eq!(e.verdict, Verdict::Leak);
        assert!(
            (e.slope_bytes_per_s - MIB as f64).abs() < 1.0,
            "{}",
            e.slope_bytes_per_s
        );
        assert_eq!(e.confidence, 1.0);
        assert_eq!(e.growth_bytes, 30 * MIB as i64);
    }

    #[test]
    fn a_long_run_keeps_its_verdicts() {
        // Four quarter-second samples a second for an hour: the leak is still a leak, the
        // constant stack still steady (both had no verdict past a minute before the even grain).
        for n in [200, 240, 1000, 14_400] {
            let e = classify(&series(|i| 10 * MIB + i * 256 * 1024, n), 0.0)
                .unwrap_or_else(|| panic!("no verdict after {n} samples"));
            assert_eq!(e.verdict, Verdict::Leak, "after {n} samples");
            let rel = (e.slope_bytes_per_s / (256.0 * 1024.0) - 1.0).abs();
            assert!(rel < 0.01, "after {n} samples: {}", e.slope_bytes_per_s);
            assert_eq!(
                verdict(&series(|_| 5 * MIB, n)),
                Verdict::Steady,
                "after {n} samples"
            );
        }
    }

    #[test]
    fn a_slow_leak_under_large_spikes_is_a_leak() {
        // Every 5th sample a 500 MiB validation spike; underneath, 256 KiB more each sample.
        let s = series(
            |i| i * 256 * 1024 + if i % 5 == 0 { 500 * MIB } else { 0 },
            60,
        );
        assert_eq!(verdict(&s), Verdict::Leak);
    }

    #[test]
    fn spikes_alone_are_spikes() {
        let s = series(|i| 50 * MIB + if i % 5 == 0 { 500 * MIB } else { 0 }, 41);
        assert_eq!(verdict(&s), Verdict::Spike);
    }

    #[test]
    fn a_cache_that_plateaus_is_bounded() {
        let s = series(|i| 200 * MIB * i.min(15) / 15, 60);
        assert_eq!(verdict(&s), Verdict::BoundedCache);
    }

    #[test]
    fn a_sawtooth_is_not_a_leak() {
        // Grows for 10 samples, released, again: the floor comes back every cycle.
        let s = series(|i| (i % 10) * 10 * MIB, 60);
        assert_ne!(verdict(&s), Verdict::Leak);
        assert_ne!(verdict(&s), Verdict::BoundedCache);
    }

    #[test]
    fn noise_around_a_steady_state_is_steady() {
        let noise = |i: u64| (i * 7919 % 13) * 1000; // ±13 KB of jitter on 100 MiB
        let s = series(|i| 100 * MIB + noise(i), 50);
        assert_eq!(verdict(&s), Verdict::Steady);
    }

    #[test]
    fn too_few_samples_give_no_verdict() {
        assert!(classify(&series(|i| i * MIB, 3), 0.0).is_none());
        assert_eq!(
            classify(&series(|i| i * MIB, 4), 0.0).unwrap().verdict,
            Verdict::Leak,
            "one sample per window is enough for a steady leak"
        );
        assert!(
            classify(&series(|i| i * MIB, 20), 17.0).is_none(),
            "warm-up samples do not count"
        );
    }

    /// The gradients of a training step, sampled: floors [0, 78 KB, 141 KB, 405 KB] under peaks
    /// of 470 KB in every window, the oldest block 0.7 s old 8.5 s in, the last window from
    /// 6.7 s: a working set. With a block as old as the first window, or a last floor or peak
    /// above every earlier peak, it is memory kept.
    #[test]
    fn a_working_set_sampled_across_its_cycle_is_told_by_its_blocks_ages() {
        let mut e = leak_in_windows(
            1.2,
            &[
                (2.6, 0, 470_056),
                (4.0, 78_376, 405_544),
                (5.4, 141_352, 405_544),
                (6.7, 405_544, 470_056),
            ],
        );
        assert!(working_set(&e, 0.7, 8.5));
        assert!(!working_set(&e, 6.0, 8.5), "a block kept from the start");
        e.windows[3].floor = 480_000;
        assert!(!working_set(&e, 0.7, 8.5), "above every earlier peak");
        e.windows[3].floor = 405_544;
        e.windows[3].peak = 760_000;
        assert!(
            !working_set(&e, 0.7, 8.5),
            "peaks above every earlier peak by more than the floor rose"
        );
        e.windows[3].peak = 600_000;
        assert!(
            working_set(&e, 0.7, 8.5),
            "peaks above every earlier peak by less than the floor rose (264 KB)"
        );
        e.windows[3].peak = 470_056;
        e.verdict = Verdict::BoundedCache;
        assert!(!working_set(&e, 0.7, 8.5), "not a leak");
    }

    /// An accumulator grown by copying (`acc = torch.cat([acc, x])`), every tensor traced: one
    /// block, made anew every step (its age a step's), its floors rising by 3.5, 4.1 and 3.2 MiB
    /// in the windows, the earlier peaks two copies, the last window's samples never so: memory
    /// kept, not a working set. Floors about flat, then a rise in the last window, are one.
    #[test]
    fn floors_rising_steadily_under_earlier_peaks_are_memory_kept() {
        let mut e = leak_in_windows(
            2.4,
            &[
                (9.66, 5_963_776, 16_711_680),
                (12.40, 9_437_184, 24_576_000),
                (15.41, 13_500_416, 32_047_104),
                (17.99, 16_711_680, 19_660_800),
            ],
        );
        assert!(!working_set(&e, 0.04, 20.4));
        e.windows[1].floor = 6_000_000;
        e.windows[2].floor = 6_100_000;
        assert!(working_set(&e, 0.04, 20.4));
    }

    /// The heap top at a CPU training job's `loss.backward()`, traced, no leak: floors of 1.07,
    /// 1.57, 1.57 and 1.78 MiB, a 141 MiB heap. A pure-Python service's heap of 4 MiB rising so
    /// leaks.
    #[test]
    fn a_large_heaps_top_rising_by_a_mib_is_no_leak() {
        let e = leak_in_windows(
            1.8,
            &[
                (4.3, 1_118_208, 1_642_496),
                (6.2, 1_642_496, 1_642_496),
                (8.0, 1_642_496, 1_867_776),
                (9.9, 1_867_776, 2_260_992),
            ],
        );
        assert!(a_large_heaps_small_rise(&e, 141 * MIB));
        assert!(!a_large_heaps_small_rise(&e, 4 * MIB));
    }

    /// A backward pass's gradients (about 1 MiB) sampled in every window, their floors nothing
    /// until one 64 KiB block was held across the last window, made 2.4 s before the report at
    /// 19.5 s: one rise within the stack's swing, on young blocks. With a block as old as the
    /// second window, a floor that rose before, or a last floor above every earlier peak, it is
    /// memory kept.
    #[test]
    fn one_rise_in_the_last_window_on_young_blocks_is_no_leak() {
        let mut e = leak_in_windows(
            0.6,
            &[
                (15.14, 0, 1_051_648),
                (15.87, 0, 1_051_648),
                (16.49, 0, 1_117_184),
                (17.16, 65_536, 1_117_184),
            ],
        );
        assert!(rose_once_within_swing(&e, 2.4, 19.5));
        assert!(
            !rose_once_within_swing(&e, 3.7, 19.5),
            "a block from the second window"
        );
        e.windows[2].floor = 32_768;
        assert!(
            !rose_once_within_swing(&e, 2.4, 19.5),
            "the floor rose before"
        );
        e.windows[2].floor = 0;
        e.windows[3].floor = 2 << 20;
        assert!(
            !rose_once_within_swing(&e, 2.4, 19.5),
            "above every earlier peak"
        );
    }

    /// A step's temporary sampled in the last window of four, its floors nothing before: a leak
    /// by one rise, and a working set once released (no block left to date); a floor rising in
    /// every window stays a leak.
    #[test]
    fn a_released_leak_by_one_rise_within_earlier_peaks_is_a_working_set() {
        let mut e = leak_in_windows(
            0.5,
            &[
                (5.26, 0, 131_072),
                (5.96, 0, 0),
                (6.34, 0, 131_072),
                (6.96, 65_536, 131_072),
            ],
        );
        assert!(released_working_set(&e));
        e.windows[3].peak = 262_144;
        assert!(!released_working_set(&e), "peaks above every earlier peak");
        // Per-step activations of a no-leak transformer job, every tensor traced, each sample an
        // instant: the last window's samples all caught a step's (floors and peaks in bytes).
        let activations = leak_in_windows(
            7.0,
            &[
                (2.6, 0, 1_480_960),
                (10.4, 0, 1_447_680),
                (18.1, 0, 1_480_960),
                (24.6, 332_800, 1_580_800),
            ],
        );
        assert!(
            released_working_set(&activations),
            "the last peak up by 98 KiB, the floor by 325 KiB"
        );
        let mut steps = leak_in_windows(
            0.5,
            &[
                (5.26, 0, 131_072),
                (5.96, 32_768, 131_072),
                (6.34, 65_536, 131_072),
                (6.96, 98_304, 131_072),
            ],
        );
        assert!(!released_working_set(&steps), "rose in every window");
        steps.verdict = Verdict::BoundedCache;
        assert!(!released_working_set(&steps), "not a leak");
        // Floors up in every window by less than the last window's peak is below an earlier
        // one: one tensor of a varying length alive at a time (KiB).
        let k = |n: u64| n << 10;
        let mut logits = leak_in_windows(
            0.5,
            &[
                (2.3, k(1562), k(9687)),
                (8.3, k(1687), k(5875)),
                (14.5, k(2000), k(10562)),
                (19.7, k(2375), k(5812)),
            ],
        );
        assert!(released_working_set(&logits));
        logits.windows[3].peak = k(9800);
        assert!(
            !released_working_set(&logits),
            "last peak within the rise of the highest"
        );
        // An accumulator grown by copying, its floors the least it held between samples, up by
        // about as much in every window; its last window's samples never caught two copies.
        let acc = leak_in_windows(
            0.7,
            &[
                (8.56, 7_536_640, 8_716_288),
                (9.29, 8_716_288, 19_464_192),
                (10.02, 9_895_936, 21_561_344),
                (10.75, 11_010_048, 12_058_624),
            ],
        );
        assert!(!released_working_set(&acc), "a steady rise");
    }

    /// The arenas of Python objects a loop kept, 12 s judged, their teardown freeing all but the
    /// last arena (1.5 s old): the last floor is the peak before it (the arenas stood still
    /// across the window's edge), yet the last window peaks far above every earlier one.
    #[test]
    fn arenas_growing_to_the_end_are_no_working_set_whatever_the_ages_left() {
        let e = leak_in_windows(
            2.7,
            &[
                (0.3, 2_097_152, 40_894_464),
                (3.0, 42_991_616, 78_643_200),
                (5.6, 80_740_352, 117_440_512),
                (8.3, 117_440_512, 157_286_400),
            ],
        );
        assert!(!working_set(&e, 1.5, 12.0));
    }

    /// A leak verdict over `windows`, each `long_s` long from its start: (start, floor, peak).
    fn leak_in_windows(long_s: f64, windows: &[(f64, u64, u64)]) -> Evidence {
        let windows: Vec<Window> = windows
            .iter()
            .map(|&(t0_s, floor, peak)| Window {
                t0_s,
                t1_s: t0_s + long_s,
                floor,
                peak,
            })
            .collect();
        let growth = windows[windows.len() - 1].floor as i64 - windows[0].floor as i64;
        Evidence {
            verdict: Verdict::Leak,
            confidence: 1.0,
            growth_bytes: growth,
            slope_bytes_per_s: slope(&windows),
            windows,
        }
    }
}
