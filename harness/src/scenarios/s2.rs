//! S2, vision training RAM (seed 002): RAM grew every epoch until the OOM killer came.
//! - Outputs kept with their autograd graph for epoch statistics (leaky); the fixed variant keeps
//!   numbers.
//! - Validation gathers predictions for two steps, then releases them: a spike, not a leak.
//! - DataLoader-style workers, forked at start, each hold a copy of the dataset: memory of each
//!   worker process, constant, not a leak of the trainer.

use tch::{Kind, Tensor};

use super::{Workers, hold_dataset_copy, hold_until_exit, square, steps};
use crate::Config;

pub const WORKERS: usize = 2;
/// Each worker's copy of the dataset.
pub const DATASET_BYTES: usize = 4 << 20;
/// Validation runs in the third and fourth step of every VALIDATE_EVERY; its predictions are
/// released in the next step.
pub const VALIDATE_EVERY: u64 = 4;

fn dataloader_worker(_index: usize) {
    hold_dataset_copy(DATASET_BYTES);
}

/// The forward pass; its output is kept for the epoch's statistics.
#[inline(never)]
fn forward_keep(cfg: &Config, w: &Tensor, outputs: &mut Vec<Tensor>, scores: &mut Vec<f64>) {
    let x = square(cfg, 0.5);
    let out = x.matmul(w).relu();
    if cfg.leaky() {
        outputs.push(out);
    } else {
        scores.push(out.mean(Kind::Float).double_value(&[]));
    }
}

/// Validation: predictions gathered (no graph) until the validation pass ends.
#[inline(never)]
fn validate(cfg: &Config, w: &Tensor, preds: &mut Vec<Tensor>) {
    let _guard = tch::no_grad_guard();
    for _ in 0..3 {
        preds.push(square(cfg, 0.25).matmul(w));
    }
}

pub fn run(cfg: &Config) -> anyhow::Result<String> {
    // Forked before libtorch runs any op, as a DataLoader forks its workers.
    let workers = Workers::fork(WORKERS, dataloader_worker)?;
    let w = square(cfg, 0.01).set_requires_grad(true);
    let (mut outputs, mut scores, mut preds) = (Vec::new(), Vec::new(), Vec::new());
    steps(cfg, |step| {
        forward_keep(cfg, &w, &mut outputs, &mut scores);
        match step % VALIDATE_EVERY {
            2 | 3 => validate(cfg, &w, &mut preds),
            0 => preds.clear(),
            _ => {}
        }
        Ok(())
    })?;
    let pids = workers.pids().to_vec();
    drop(workers);
    let summary = format!(
        "s2: {} outputs kept, {} scores, workers {pids:?}",
        outputs.len(),
        scores.len()
    );
    hold_until_exit((w, outputs, preds));
    Ok(summary)
}
