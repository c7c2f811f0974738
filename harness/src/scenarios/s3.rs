//! S3, compile workers and spikes (seed 003): the trainer runs under a wrapper (like `uv run`),
//! starts compile workers with constant memory, and has large validation spikes over a slow floor
//! leak of a few hundred KiB per step that the engineers first could not see for the spikes.
//! The wrapper is a shell that runs the trainer as its child and waits for it.

use std::os::unix::process::CommandExt as _;

use anyhow::Context as _;
use tch::{Kind, Tensor};

use super::{Workers, hold_dataset_copy, hold_until_exit, square, steps};
use crate::Config;

pub const COMPILE_WORKERS: usize = 2;
pub const WORKER_BYTES: usize = 2 << 20;
/// A validation spike in the fourth of every SPIKE_EVERY steps, of SPIKE_SQUARES square tensors,
/// held one step.
pub const SPIKE_EVERY: u64 = 5;
pub const SPIKE_SQUARES: i64 = 32;

/// Replaces this process with `sh`, which runs `harness ARGS… --trainer` as its child.
pub fn wrapper() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("own executable")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let err = std::process::Command::new("/bin/sh")
        .arg("-c")
        // `; exit $?` keeps the shell from exec'ing the trainer in its place.
        .arg("\"$0\" \"$@\" --trainer; exit $?")
        .arg(exe)
        .args(args)
        .exec();
    Err(err).context("exec /bin/sh")
}

fn compile_worker(_index: usize) {
    hold_dataset_copy(WORKER_BYTES);
}

/// Per-step metrics; the leaky variant keeps the tensor (the slow floor leak).
#[inline(never)]
fn accumulate_metrics(cfg: &Config, w: &Tensor, kept: &mut Vec<Tensor>) -> f64 {
    let _guard = tch::no_grad_guard();
    let m = square(cfg, 0.5).matmul(w);
    let v = m.mean(Kind::Float).double_value(&[]);
    if cfg.leaky() {
        kept.push(m);
    }
    v
}

/// A large validation batch.
#[inline(never)]
fn validation_spike(cfg: &Config) -> Tensor {
    Tensor::full(
        [SPIKE_SQUARES * cfg.size, cfg.size],
        1.0,
        (Kind::Float, cfg.device),
    )
}

pub fn trainer(cfg: &Config) -> anyhow::Result<String> {
    let workers = Workers::fork(COMPILE_WORKERS, compile_worker)?;
    let w = square(cfg, 0.01);
    let mut kept = Vec::new();
    let mut spike = None;
    let mut total = 0.0;
    steps(cfg, |step| {
        total += accumulate_metrics(cfg, &w, &mut kept);
        spike = (step % SPIKE_EVERY == 3).then(|| validation_spike(cfg));
        Ok(())
    })?;
    drop(workers);
    let summary = format!("s3 trainer: {} metrics kept, {total:.3}", kept.len());
    hold_until_exit((w, kept, spike));
    Ok(summary)
}
