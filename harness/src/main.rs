//! Training-loop leaks from real investigations (seeds 000–004), reproduced on libtorch (tch) in
//! a leaky and a fixed variant, deterministic, as fixtures for leaktracer's regression tests:
//!
//!   harness SCENARIO --variant leaky|fixed --device cpu|cuda --steps N [--size D]
//!
//! Every scenario calls `harness_step` once per step (leaktracer's `--step-symbol`) and allocates
//! each kind of memory in its own named function, so a test can assert the frame of a leak. `D` is
//! the side of the square f32 tensors the scenarios are built from (D² × 4 bytes each).

mod bench;
mod scenarios;
mod step;

use clap::{Parser, ValueEnum};
use tch::Device;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The "list that holds the activation" leak: one 256 × 256 activation kept per step.
    Retain,
    /// S0 (seed 000) generation rounds: per-batch embeddings kept across rounds.
    S0,
    /// S1 (seed 001) train_a2v: cached embeddings without detach, a progress-bar dict of tensors,
    /// zero_grad keeping gradients.
    S1,
    /// S2 (seed 002) vision training: outputs kept with their graph, validation spikes, forked
    /// DataLoader-style workers each holding a copy of the dataset.
    S2,
    /// S3 (seed 003) through a wrapper that execs the trainer: compile workers, large validation
    /// spikes over a slow floor leak.
    S3,
    /// S4 (seed 004) refdet trainer: validation results per epoch, logging history, a triplet batch
    /// spike, an LRU frame cache.
    S4,
    /// leaktracer's overhead on every scenario (needs --leaktracer).
    Bench,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    Leaky,
    Fixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Debug, Parser)]
#[command(
    name = "harness",
    about = "Training-loop leaks on libtorch, leaky and fixed"
)]
pub struct Args {
    pub scenario: Scenario,
    #[arg(long, value_enum, default_value = "leaky")]
    pub variant: Variant,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Training steps (one `harness_step` call each).
    #[arg(long, default_value_t = 24)]
    pub steps: u64,
    /// Side of the square f32 tensors (D² × 4 bytes each).
    #[arg(long, default_value_t = 256)]
    pub size: i64,
    /// bench: the leaktracer binary to measure (a release build).
    #[arg(long, value_name = "PATH")]
    pub leaktracer: Option<std::path::PathBuf>,
    /// bench: runs per configuration (the median is shown).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Internal (S3): the process the wrapper execs.
    #[arg(long, hide = true)]
    pub trainer: bool,
}

/// What a scenario runs with.
pub struct Config {
    pub variant: Variant,
    pub device: Device,
    pub steps: u64,
    pub size: i64,
}

impl Config {
    pub fn leaky(&self) -> bool {
        self.variant == Variant::Leaky
    }
}

fn main() {
    let args = Args::parse();
    if args.steps == 0 || args.size < 8 {
        eprintln!("harness: --steps must be at least 1 and --size at least 8");
        std::process::exit(2);
    }
    tch::set_num_threads(1);
    let device = match args.device {
        DeviceArg::Cpu => Device::Cpu,
        DeviceArg::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
        DeviceArg::Cuda => {
            eprintln!("harness: --device cuda: no CUDA device is available to libtorch");
            std::process::exit(2);
        }
    };
    let cfg = Config {
        variant: args.variant,
        device,
        steps: args.steps,
        size: args.size,
    };
    let result = match args.scenario {
        Scenario::Retain => scenarios::retain::run(&cfg),
        Scenario::S0 => scenarios::s0::run(&cfg),
        Scenario::S1 => scenarios::s1::run(&cfg),
        Scenario::S2 => scenarios::s2::run(&cfg),
        Scenario::S3 if args.trainer => scenarios::s3::trainer(&cfg),
        Scenario::S3 => scenarios::s3::wrapper(),
        Scenario::S4 => scenarios::s4::run(&cfg),
        Scenario::Bench => match &args.leaktracer {
            Some(l) => bench::run(l, cfg.steps, args.rounds.max(1)),
            None => {
                eprintln!("harness: bench needs --leaktracer PATH");
                std::process::exit(2);
            }
        },
    };
    match result {
        Ok(summary) if summary.is_empty() => {}
        Ok(summary) => println!("{summary}"),
        Err(e) => {
            eprintln!("harness: {e:#}");
            std::process::exit(1);
        }
    }
}
