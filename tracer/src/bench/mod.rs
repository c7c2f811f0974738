//! The benchmarks behind `leaktracer bench`, out of the production path: nothing else in the crate
//! imports them. Each prints its figures beside their baselines in one run and asserts nothing.
//! - pairs.rs: ns per malloc+free pair (untraced, the probe floor, leaktracer, bcc's memleak);
//! - stress.rs: an allocation storm (event rates, losses) and the tracer's memory (`--rss`);
//! - verdicts.rs: the analysis's figures, no probes;
//! - api.rs: the explorer API's latency, no probes.
//!
//! The workloads the first two start as child processes are hidden subcommands of the same
//! binary, so that every run measures the code it ships.

mod api;
mod pairs;
mod stress;
mod verdicts;

use crate::{config::Bench, error::Error};

/// Runs a benchmark or one of its workloads; the exit code.
pub fn run(bench: Bench) -> Result<i32, Error> {
    match bench {
        Bench::Pairs { pairs, rounds } => pairs::run(pairs, rounds),
        Bench::Verdicts => verdicts::run(),
        Bench::Api { serve } => api::run(serve.as_deref()),
        Bench::Storm { seconds } => stress::storm(seconds),
        Bench::Rss { blocks } => stress::rss_bench(blocks),
        Bench::RssOne { blocks, ring_mb } => stress::rss_one(blocks, ring_mb),
        Bench::PairsWorkload {
            pairs,
            file,
            big_frame,
        } => workload_result(&file, pairs::workload(pairs, big_frame)),
        Bench::StormWorkload {
            threads,
            seconds,
            file,
        } => workload_result(&file, stress::storm_workload(threads, seconds)),
        Bench::HoldWorkload { blocks, file } => {
            workload_result(&file, stress::hold_workload(blocks))
        }
    }
}

/// Writes a workload's result where the benchmark reads it.
fn workload_result(file: &std::path::Path, value: impl std::fmt::Display) -> Result<i32, Error> {
    std::fs::write(file, format!("{value}\n"))
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
    Ok(0)
}
