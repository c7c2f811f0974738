//! What leaktracer's own programs cost in the kernel (`--probe-cost`): the kernel's run-time
//! statistics of each of its programs. They are on only while a session holds them, and they add
//! two clock reads to every program run, so they are asked for. The probe traps themselves (for
//! a uprobe, the breakpoint and the return trampoline) are not in these figures.

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// One program's runs and kernel time since it was loaded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramCost {
    pub program: String,
    pub calls: u64,
    pub ns: u64,
}

/// Turns the kernel's program statistics on for as long as the descriptor returned is held.
pub fn enable() -> Result<OwnedFd, Error> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| Error::Kernel(format!("program statistics (BPF_ENABLE_STATS): {e}")))
}

/// The programs among `ids` that ran, the costliest first.
pub fn read(ids: &[u32]) -> Vec<ProgramCost> {
    let mut out: Vec<ProgramCost> = aya::programs::loaded_programs()
        .flatten()
        .filter(|p| ids.contains(&p.id()) && p.run_count() > 0)
        .map(|p| ProgramCost {
            program: p.name_as_str().unwrap_or("?").to_string(),
            calls: p.run_count(),
            ns: p.run_time().as_nanos() as u64,
        })
        .collect();
    out.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.program.cmp(&b.program)));
    out
}
