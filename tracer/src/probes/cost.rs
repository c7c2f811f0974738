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

/// The programs among `programs` (kernel id, name: the kernel keeps 15 characters of it) that
/// ran, the costliest first.
pub fn read(programs: &[(u32, String)]) -> Vec<ProgramCost> {
    let mut out: Vec<ProgramCost> = aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.run_count() > 0)
        .filter_map(|p| {
            let (_, name) = programs.iter().find(|(id, _)| *id == p.id())?;
            Some(ProgramCost {
                program: name.clone(),
                calls: p.run_count(),
                ns: p.run_time().as_nanos() as u64,
            })
        })
        .collect();
    out.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.program.cmp(&b.program)));
    out
}
