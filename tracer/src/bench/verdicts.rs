//! `leaktracer bench --verdicts`: the analysis's own figures, each beside its baseline.
//! - Steps until a steady 1 MiB/step leak is flagged after warm-up, on a series with noise and
//!   periodic spikes as a training loop has; the baseline is the same series without the leak,
//!   which must never be flagged.
//! - Memory per tracked stack series (fixed: the series is bounded).
//! - Report latency with 100k outstanding stacks, beside 1k stacks.

use std::time::Instant;

use crate::{
    analysis::{Verdict, classify, series},
    error::Error,
    report::synthetic::{ledger_with, report_of},
};
use series::Series;

const MIB: u64 = 1 << 20;

/// One stack's outstanding bytes at step `i` of a training loop: a 256 MiB working set that varies
/// by up to 64 KiB from step to step, a 300 MiB temporary from the same call site every 10th step
/// (validation), and `leak` bytes more each step.
fn step_bytes(i: u64, leak: u64) -> u64 {
    let jitter = i.wrapping_mul(2_654_435_761) % (64 << 10);
    let spike = if i % 10 == 9 { 300 * MIB } else { 0 };
    256 * MIB + jitter + spike + leak * i
}

/// Steps after `warmup` until the series is first classified a leak (None: never, in `limit`).
fn steps_to_flag(leak: u64, warmup: u64, limit: u64) -> Option<u64> {
    let mut s = Series::default();
    for i in 0..limit {
        s.push(i as f64, step_bytes(i, leak));
        if i >= warmup && classify(&s, warmup as f64).is_some_and(|e| e.verdict == Verdict::Leak) {
            return Some(i - warmup + 1);
        }
    }
    None
}

/// Milliseconds to build a report of `top` stacks from `n` stacks.
fn report_ms(n: u32, top: usize) -> f64 {
    let (ledger, analysis) = ledger_with(n, 8);
    let t = Instant::now();
    let r = report_of(&ledger, &analysis, top);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(r.stacks.len(), top.min(n as usize));
    ms
}

pub fn run() -> Result<i32, Error> {
    let warmup = 20;
    let leak = steps_to_flag(MIB, warmup, 1000);
    let steady = steps_to_flag(0, warmup, 1000);
    let show = |s: Option<u64>| s.map_or("never (1000 steps)".into(), |n| format!("{n} steps"));
    crate::tell!(
        "verdicts on one stack's series: 256 MiB working set, 64 KiB jitter, 300 MiB spike every 10th step, warm-up {warmup} steps:"
    );
    crate::tell!(
        "  1 MiB/step leak flagged after     {:>20}   (goal: ≤ 5)",
        show(leak)
    );
    crate::tell!(
        "  same loop without the leak        {:>20}   (baseline: never)",
        show(steady)
    );
    let per_series = size_of::<Series>() + series::CAP * size_of::<series::Point>();
    crate::tell!(
        "memory per tracked stack series: {per_series} bytes (bounded); 100k stacks: {:.1} MiB",
        per_series as f64 * 1e5 / MIB as f64
    );
    for (n, top) in [
        (1_000, 10),
        (100_000, 10),
        (1_000, 1_000),
        (100_000, 100_000),
    ] {
        crate::tell!(
            "report with {n:>7} stacks, top {top:>7}: {:>9.1} ms",
            report_ms(n, top)
        );
    }
    Ok(0)
}
