//! S0, generation rounds (seed 000): embeddings are computed batch by batch in rounds, with the
//! adapter moved to the device every batch. Leaky: every batch's output stays alive across rounds
//! (a list that is never cleared). Fixed: outputs gather on the host during a round and are
//! released when the round is saved.

use tch::{Device, Kind, Tensor};

use super::{hold_until_exit, square, steps};
use crate::Config;

/// Batches per generation round.
pub const BATCHES_PER_ROUND: u64 = 4;

/// One batch's embeddings (inference: no graph). The leak site of the leaky variant.
#[inline(never)]
fn embed_batch(cfg: &Config, adapter: &Tensor, step: u64) -> Tensor {
    let _guard = tch::no_grad_guard();
    // Moved to the device every batch, as in the seed (a no-op once it is there).
    let adapter = adapter.to_device(cfg.device);
    let batch = square(cfg, 1.0 / (step + 1) as f64);
    batch.matmul(&adapter).tanh()
}

/// Saves a round's outputs (here: their sum) and lets them go.
#[inline(never)]
fn save_round(round: &mut Vec<Tensor>) -> f64 {
    let total = round
        .iter()
        .map(|t| t.sum(Kind::Float).double_value(&[]))
        .sum();
    round.clear();
    total
}

pub fn run(cfg: &Config) -> anyhow::Result<String> {
    let adapter = square(cfg, 0.01);
    let mut kept = Vec::new();
    let mut round = Vec::new();
    let mut saved = 0.0;
    steps(cfg, |step| {
        let emb = embed_batch(cfg, &adapter, step);
        if cfg.leaky() {
            kept.push(emb);
        } else {
            round.push(emb.to_device(Device::Cpu));
        }
        if step % BATCHES_PER_ROUND == BATCHES_PER_ROUND - 1 {
            saved += save_round(&mut round);
        }
        Ok(())
    })?;
    let summary = format!("s0: {} outputs kept, saved {saved:.3}", kept.len());
    hold_until_exit((adapter, kept, round));
    Ok(summary)
}
