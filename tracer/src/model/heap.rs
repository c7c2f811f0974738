//! How the heap is traced (`--heap`, `--sample-bytes`, `--heap-after`), as the session configures
//! it and the report states it.

use serde::{Deserialize, Serialize};

/// `--heap`: what is traced of the malloc family and CPU tensors.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HeapMode {
    Off,
    Sampled,
    Full,
    /// Layers: every allocation of a native program; in a Python process, device memory and
    /// pages from the start, its CPU tensors (unless `--tensors all`) and then its malloc family
    /// from the moment its page-level growth calls for them (see probes::Probes::engage_tensors
    /// and engage_heap).
    Auto,
}

/// `--tensors`: when a Python process's CPU tensors are traced under `--heap auto` (under `full`
/// and `sampled` they are traced all along).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TensorsMode {
    /// A layer: from the moment the process's pages grow.
    Auto,
    /// From the start.
    #[default]
    All,
}

/// What was traced of the heap (`--heap`): `full`, `off` (no heap probes: the heap kinds are
/// absent, not zero), or `sampled` with the mean interval in bytes (heap bytes are then
/// estimates, scaled from the blocks recorded; blocks count the recorded ones).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeapTracing {
    pub mode: HeapMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_bytes: Option<u64>,
    /// `--heap-after`: the heap functions are probed from this point on only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<HeapAfter>,
    /// When CPU tensors are traced: `auto` (under `--heap auto`, from the moment a Python
    /// process's pages grow) or `all`.
    #[serde(default)]
    pub tensors: TensorsMode,
}

/// Why a process's malloc family was asked for (`--heap auto`), the first time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HeapAsked {
    /// Its pages grew by more than twice what its tensors grew, once those were traced long
    /// enough to tell (or, with every tensor traced, over the later half of the run so far).
    BeyondTensors,
    /// Its pages grew for ten seconds with no layer below to explain them.
    Unexplained,
}

/// Where heap tracing starts with `--heap-after`: blocks allocated before are not seen.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum HeapAfter {
    /// Seconds into tracing.
    Seconds(f64),
    /// The step (with `--step-symbol`).
    Steps(u64),
}

impl Default for HeapTracing {
    fn default() -> Self {
        Self {
            mode: HeapMode::Full,
            sample_bytes: None,
            after: None,
            tensors: TensorsMode::All,
        }
    }
}

/// `--unwind`: how heap stacks are taken. `auto`: raw stack copies unwound with the call-frame
/// information for executables without frame pointers, the kernel's frame-pointer walk for the
/// rest (see probes/frames.rs).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HeapUnwind {
    #[default]
    Auto,
    /// The frame-pointer walk for every process.
    #[value(name = "fp")]
    #[serde(rename = "fp")]
    FramePointers,
    /// Raw stack copies for every process.
    Cfi,
}
