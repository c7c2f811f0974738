//! S1, train_a2v (seed 001): three things the seed's engineers fixed at once.
//! - Cached embeddings reused without `detach()`: each step's embedding is computed from the cached
//!   one, so the graph (and every earlier embedding it saved) stays alive. Leak.
//! - A progress-bar postfix holding the loss tensors (with their graphs) instead of numbers. Leak.
//! - `zero_grad()` without `set_to_none`: the gradient stays allocated, zeroed. Constant extra
//!   memory: steady, not a leak (the fixed variant frees it each step).

use tch::{Kind, Tensor};

use super::{hold_until_exit, square, steps};
use crate::Config;

/// The next cached embedding from the cached one.
#[inline(never)]
fn refresh_cached_embedding(cfg: &Config, cached: &Tensor, encoder: &Tensor) -> Tensor {
    let e = cached.matmul(encoder).tanh();
    if cfg.leaky() { e } else { e.detach() }
}

/// The progress bar's postfix: this step's L1 loss of the (trainable) scaled embedding.
#[inline(never)]
fn set_postfix(
    cfg: &Config,
    postfix: &mut Vec<Tensor>,
    shown: &mut Vec<f64>,
    cached: &Tensor,
    target: &Tensor,
) {
    let y = (cached.detach() * 2.0).set_requires_grad(true);
    let l1 = (&y - target).abs().mean(Kind::Float);
    if cfg.leaky() {
        postfix.push(l1);
    } else {
        shown.push(l1.double_value(&[]));
    }
}

/// Forward, backward; the gradient is zeroed (leaky: kept allocated) or dropped (fixed).
#[inline(never)]
fn backward_step(cfg: &Config, head: &mut Tensor, x: &Tensor) -> f64 {
    if cfg.leaky() {
        head.zero_grad();
    } else {
        // set_to_none: a fresh leaf on the same storage, without the old gradient.
        *head = head.detach().set_requires_grad(true);
    }
    let loss = x.matmul(head).square().mean(Kind::Float);
    loss.backward();
    loss.double_value(&[])
}

pub fn run(cfg: &Config) -> anyhow::Result<String> {
    let encoder = (square(cfg, 1.0 / cfg.size as f64)).set_requires_grad(true);
    let mut head = square(cfg, 0.001).set_requires_grad(true);
    let target = square(cfg, 0.5);
    let mut cached = square(cfg, 1.0);
    let (mut postfix, mut shown) = (Vec::new(), Vec::new());
    let mut loss = 0.0;
    steps(cfg, |_| {
        cached = refresh_cached_embedding(cfg, &cached, &encoder);
        set_postfix(cfg, &mut postfix, &mut shown, &cached, &target);
        loss = backward_step(cfg, &mut head, &square(cfg, 0.1));
        Ok(())
    })?;
    let summary = format!(
        "s1: postfix {} tensors / {} numbers, last loss {loss:.6}",
        postfix.len(),
        shown.len()
    );
    hold_until_exit((encoder, head, target, cached, postfix));
    Ok(summary)
}
