//! leaktracer's integration tests: the real binary, real eBPF in the running kernel, C fixtures
//! with known leaks and controls, exact bytes and frames read from the JSON report.

mod api;
mod attach;
mod check;
mod ddp;
mod diff;
mod errors;
mod explorer;
mod exports;
mod gpu;
mod heap;
mod history;
mod objects;
mod oracle;
mod pages;
mod python;
mod pytorch;
mod run;
mod scenarios;
mod serve;
mod torch;
mod torch_cuda;
mod trainer;
mod tree;
mod unwind;
mod verdicts;
mod workers;

use std::path::Path;

/// The 1-based line of the first line of fixture `name` (`name.c`, or a file name with its
/// extension) containing `needle`.
pub fn line_of(name: &str, needle: &str) -> u64 {
    let file = if name.contains('.') {
        name.to_string()
    } else {
        format!("{name}.c")
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(&file);
    let text = std::fs::read_to_string(&src).expect("fixture source");
    let i = text
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} not in {file}"));
    i as u64 + 1
}
