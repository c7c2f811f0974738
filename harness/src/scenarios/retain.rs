//! The "list that holds the activation" leak: each step keeps its activation (the whole
//! activation, one 256 × 256 f32 tensor at the default size), like `losses.append(loss)`.

use tch::{Kind, Tensor};

use super::{hold_until_exit, square, steps};
use crate::Config;

/// One step of a toy training loop: a forward matmul and a scalar loss. The activation is pushed
/// into `history` when leaky; everything else is dropped at the end of the step.
#[inline(never)]
fn train_step(cfg: &Config, w: &Tensor, history: &mut Vec<Tensor>) -> f64 {
    let x = square(cfg, 1.0);
    let y = x.matmul(w);
    let loss = y.mean(Kind::Float).double_value(&[]);
    if cfg.leaky() {
        retain_activation(history, y);
    }
    loss
}

#[inline(never)]
fn retain_activation(history: &mut Vec<Tensor>, y: Tensor) {
    history.push(y);
}

pub fn run(cfg: &Config) -> anyhow::Result<String> {
    let w = square(cfg, 1.0);
    let mut history = Vec::new();
    let mut total = 0.0;
    steps(cfg, |_| {
        total += train_step(cfg, &w, &mut history);
        Ok(())
    })?;
    hold_until_exit(history);
    Ok(format!("{total}"))
}
