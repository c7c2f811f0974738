//! The step marker: called once at the start of every training step; leaktracer's
//! `--step-symbol harness_step` samples at its entries.

/// Marks the start of step `step`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn harness_step(step: u64) {
    std::hint::black_box(step);
}
