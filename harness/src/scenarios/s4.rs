//! S4, refdet trainer (seed 004): validation result lists that grow every epoch and a logging
//! history kept forever (leaks; the fixed variant keeps numbers), a large triplet batch (a spike)
//! and an LRU frame cache of fixed capacity (a bounded cache).

use std::collections::VecDeque;

use tch::{Kind, Tensor};

use super::{hold_until_exit, square, steps};
use crate::Config;

pub const STEPS_PER_EPOCH: u64 = 3;
pub const TRIPLET_EVERY: u64 = 6;
pub const CACHE_FRAMES: usize = 6;

/// End-of-epoch validation; its predictions are appended to the results list.
#[inline(never)]
fn validate_epoch(cfg: &Config, w: &Tensor, results: &mut Vec<Tensor>, maps: &mut Vec<f64>) {
    let _guard = tch::no_grad_guard();
    let preds = square(cfg, 0.3).matmul(w);
    if cfg.leaky() {
        results.push(preds);
    } else {
        maps.push(preds.mean(Kind::Float).double_value(&[]));
    }
}

/// Per-step logging of a feature map (half a square).
#[inline(never)]
fn log_step(cfg: &Config, w: &Tensor, history: &mut Vec<Tensor>, numbers: &mut Vec<f64>) {
    let _guard = tch::no_grad_guard();
    let feature = square(cfg, 0.2).narrow(0, 0, cfg.size / 2).matmul(w);
    if cfg.leaky() {
        history.push(feature);
    } else {
        numbers.push(feature.mean(Kind::Float).double_value(&[]));
    }
}

/// Anchor, positive and negative: a large batch, held for one step.
#[inline(never)]
fn triplet_batch(cfg: &Config) -> Tensor {
    Tensor::full([12 * cfg.size, cfg.size], 0.5, (Kind::Float, cfg.device))
}

/// Puts a decoded frame in the LRU cache, evicting the oldest beyond its capacity.
#[inline(never)]
fn cache_frame(cfg: &Config, cache: &mut VecDeque<Tensor>, step: u64) {
    cache.push_back(square(cfg, step as f64));
    if cache.len() > CACHE_FRAMES {
        cache.pop_front();
    }
}

pub fn run(cfg: &Config) -> anyhow::Result<String> {
    let w = square(cfg, 0.01);
    let (mut results, mut maps) = (Vec::new(), Vec::new());
    let (mut history, mut numbers) = (Vec::new(), Vec::new());
    let mut cache = VecDeque::new();
    let mut triplet = None;
    steps(cfg, |step| {
        log_step(cfg, &w, &mut history, &mut numbers);
        cache_frame(cfg, &mut cache, step);
        triplet = (step % TRIPLET_EVERY == TRIPLET_EVERY - 1).then(|| triplet_batch(cfg));
        if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1 {
            validate_epoch(cfg, &w, &mut results, &mut maps);
        }
        Ok(())
    })?;
    let summary = format!(
        "s4: {} results, {} log entries, {} cached frames",
        results.len() + maps.len(),
        history.len() + numbers.len(),
        cache.len()
    );
    hold_until_exit((w, results, history, cache, triplet));
    Ok(summary)
}
