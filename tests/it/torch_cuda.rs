//! PyTorch's CUDA wheel on a machine without a GPU: the training loop of train_loop.py on the
//! device (`DEVICE=cuda`), its tensors in the wheel's real caching allocator, which runs on the
//! stand-in CUDA libraries (`fixture::torch_cuda`: kernels compute nothing, allocations are the
//! real ones). Each case runs under `leaktracer check` with default options, and untraced with
//! PyTorch's own allocation history (`ORACLE=1`; its records grow the process's memory as a leak
//! would, hence a run of its own): the bytes and blocks still allocated at the end per line of
//! the script, which the caching allocator's blocks (`torch_block`) traced at each line must
//! equal.

use std::process::Command;

use serde_json::Value;
use tests::{fixture, report::Report};

use crate::{
    python::{line, python, script},
    pytorch::{check_torch_at, own_line, site},
};

/// `check --no-store --top 100000 -- python3 train_loop.py ARGS…` on the device: the gate's
/// output, exit code and report; and PyTorch's own figures from a run of the same untraced with
/// its allocation history (its per-line oracle, `memory_allocated()`).
fn check_on_device(name: &str, vars: &[&str], args: &[&str]) -> (String, i32, Report, Value) {
    let env = fixture::torch_cuda();
    let mut all: Vec<&str> = env.iter().map(String::as_str).collect();
    all.push("DEVICE=cuda");
    all.extend(vars);
    let options = ["--top", "100000"];
    let (o, r) = check_torch_at(name, &script("train_loop"), &all, &options, args);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    all.push("ORACLE=1");
    let pythonpath = format!("PYTHONPATH={}", fixture::pydeps().display());
    let oracle = Command::new("/usr/bin/env")
        .arg(pythonpath)
        .args(&all)
        .arg(python())
        .arg(script("train_loop"))
        .args(args)
        .output()
        .expect("the oracle's run");
    let text = String::from_utf8_lossy(&oracle.stdout).to_string();
    let figures = text
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("PyTorch's figures: {text}"));
    (out, o.status.code().unwrap_or(-1), r, figures)
}

/// (bytes, blocks) of the caching allocator's blocks whose innermost line of the script is `at`
/// (0: none of its lines, as blocks made on autograd's thread).
fn blocks_at(r: &Report, at: u64) -> (u64, u64) {
    r.sum(|s| s["kind"] == "torch_block" && own_line(s).unwrap_or(0) == at)
}

/// Every line PyTorch's history holds blocks at, and those it does not hold any at that the
/// traced blocks name: the bytes and blocks traced at each equal the history's.
fn every_line_as_the_oracle(r: &Report, figures: &Value, out: &str) {
    let oracle = figures["oracle"].as_object().expect("the oracle's lines");
    let mut lines: Vec<u64> = oracle.keys().filter_map(|k| k.parse().ok()).collect();
    let traced = r.stacks().iter().filter(|s| s["kind"] == "torch_block");
    lines.extend(traced.map(|s| own_line(s).unwrap_or(0)));
    lines.sort_unstable();
    lines.dedup();
    for at in lines {
        assert_eq!(blocks_at(r, at), oracle_at(figures, at), "line {at}: {out}");
    }
}

/// What PyTorch's history says is still allocated at line `at`, as (bytes, blocks).
fn oracle_at(figures: &Value, at: u64) -> (u64, u64) {
    let held = &figures["oracle"][at.to_string()];
    (held[0].as_u64().unwrap_or(0), held[1].as_u64().unwrap_or(0))
}

/// Predictions kept with their graphs, on the device: a leak of the caching allocator's blocks
/// at the validation lines, with exactly the bytes and blocks PyTorch's history holds there (and
/// PyTorch's own walk of the kept graphs: two blocks a step, 64 × 256 and 64 × 512 floats).
fn the_validation_leak_is_found_with_pytorchs_bytes(name: &str, vars: &[&str]) {
    let (out, code, r, figures) = check_on_device(name, vars, &["validation", "200", "abrupt"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("LEAK torch_block") && out.contains(&site("predictions.append")),
        "{out}"
    );
    let input = line("train_loop", "# VALIDATION INPUT");
    let kept = line("train_loop", "predictions.append");
    assert_eq!(
        oracle_at(&figures, input),
        (200 * 64 * 256 * 4, 200),
        "{figures}"
    );
    assert_eq!(
        oracle_at(&figures, kept),
        (200 * 64 * (256 + 512) * 4, 400),
        "{figures}"
    );
    every_line_as_the_oracle(&r, &figures, &out);
}

#[test]
fn predictions_kept_on_the_device_are_a_leak_of_the_caching_allocators_blocks_at_their_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    the_validation_leak_is_found_with_pytorchs_bytes("cuda-validation", &[]);
}

/// The same leak with expandable segments: the caching allocator maps its memory with the
/// driver's virtual memory calls (cuMemCreate, cuMemMap) instead of cudaMalloc.
#[test]
fn with_expandable_segments_the_leak_is_still_found_with_pytorchs_bytes() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    the_validation_leak_is_found_with_pytorchs_bytes(
        "cuda-expandable",
        &["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"],
    );
}

/// The control: the metric summed with `.item()`, nothing kept on the device but the last step's
/// tensors, which its variables still hold. It passes, with what is held at each line as
/// PyTorch's history says.
#[test]
fn a_loop_that_keeps_nothing_on_the_device_passes_the_check() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let (out, code, r, figures) =
        check_on_device("cuda-fixed", &[], &["metrics-fixed", "200", "abrupt"]);
    assert_eq!(code, 0, "{out}");
    let input = line("train_loop", "# METRIC INPUT");
    assert_eq!(oracle_at(&figures, input), (64 * 256 * 4, 1), "{figures}");
    every_line_as_the_oracle(&r, &figures, &out);
}

/// PyTorch's caching allocator (`libc10_cuda.so`) is probed in the traced job alone: a process
/// beside it that maps the same library never carries its probes, through two runs of the job
/// (the second probes it before its mapping, as the first remembered it), and each run traces
/// the validation leak's blocks with PyTorch's bytes (two a step, 64 × 256 and 64 × 512 floats).
#[test]
fn the_caching_allocator_is_probed_in_the_traced_job_alone() {
    if !fixture::bpf_available() {
        return;
    }
    let env = fixture::torch_cuda();
    let vars: Vec<(&str, &str)> = env.iter().filter_map(|v| v.split_once('=')).collect();
    let library = std::fs::canonicalize(fixture::pydeps().join("torch/lib/libc10_cuda.so"))
        .expect("the wheel's caching allocator");
    let beside = fixture::probed_beside(Some(&library), &vars);
    let mut all: Vec<&str> = env.iter().map(String::as_str).collect();
    all.push("DEVICE=cuda");
    let kept = line("train_loop", "predictions.append");
    let mut timings = Vec::new();
    for run in ["first", "second"] {
        let args = ["validation", "20", "abrupt"];
        let (o, r) = check_torch_at(run, &script("train_loop"), &all, &[], &args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            blocks_at(&r, kept),
            (20 * 64 * (256 + 512) * 4, 40),
            "{out}"
        );
        let libraries = r.0["libraries"].as_array().cloned().unwrap_or_default();
        let c10 = libraries
            .iter()
            .find(|l| l["path"] == library.to_str().unwrap());
        timings.push(c10.map(|l| l["timing"]["when"].clone()));
    }
    let verdict = beside.verdict();
    assert_eq!(
        timings[1],
        Some(Value::from("ahead")),
        "the second run probes it before its mapping: {timings:?}"
    );
    assert_eq!(
        verdict, "untouched",
        "a process beside the job carries none of its probes"
    );
}
