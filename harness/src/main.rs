//! Training-loop leaks on libtorch, run under leaktracer as fixtures with known answers.
//!
//!   harness retain STEPS   each step keeps one activation tensor alive (the "list of losses that
//!                          holds the graph" leak): STEPS × 256 KiB of tensors outstanding.

use anyhow::{Context as _, bail};
use tch::{Device, Kind, Tensor};

/// Side of the square activations: 256 × 256 f32 = 256 KiB each.
pub const SIDE: i64 = 256;

/// One step of a toy training loop: a forward matmul and a scalar loss. The activation is pushed
/// into `history` (the leak); everything else is dropped at the end of the step.
#[inline(never)]
fn train_step(w: &Tensor, history: &mut Vec<Tensor>) -> f64 {
    let x = Tensor::ones([SIDE, SIDE], (Kind::Float, Device::Cpu));
    let y = x.matmul(w);
    let loss = y.mean(Kind::Float).double_value(&[]);
    retain_activation(history, y);
    loss
}

#[inline(never)]
fn retain_activation(history: &mut Vec<Tensor>, y: Tensor) {
    history.push(y);
}

fn retain(steps: usize) -> f64 {
    let w = Tensor::ones([SIDE, SIDE], (Kind::Float, Device::Cpu));
    let mut history = Vec::new();
    let mut total = 0.0;
    for _ in 0..steps {
        total += train_step(&w, &mut history);
    }
    // Leak on purpose: the history outlives the loop, as in the seeds.
    std::mem::forget(history);
    total
}

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["retain", steps] => {
            let steps: usize = steps.parse().context("STEPS must be a number")?;
            println!("{}", retain(steps));
        }
        _ => bail!("usage: harness retain STEPS"),
    }
    Ok(())
}
