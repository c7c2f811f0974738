//! Loading the programs into the kernel and attaching them. The verifier takes 0.1–0.25 s for
//! each of the largest (alloc_return, heap_flush, page_send, device_return: the CUDA calls' and
//! PyTorch's caching allocator's returns, one program), so programs needed together are loaded
//! together, each on its own thread: at start, the
//! tracepoints' with those the command will need first (the malloc family's for a native command;
//! for a Python one, the CUDA and PyTorch sets it maps while it imports torch: a process is held
//! while its new library is probed, and importing torch held one about 0.5 s for their loads);
//! later, a probe set before it is attached.

use std::path::Path;

use aya::{
    maps::ProgramArray,
    programs::{
        Program, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};

use super::{Probes, load_error, program, sets::PROBE_SETS};
use crate::error::Error;

/// Programs that send their page-level events by tail call, the program they call, and its slot.
const FLUSHERS: &[(&str, &str, &str)] = &[
    ("alloc_return", "heap_flush", "HEAP_FLUSH"),
    ("c10_alloc_return", "c10_flush", "C10_FLUSH"),
];

impl Probes {
    /// Loads those of `names` not loaded yet, side by side, with the programs they reach by tail
    /// call (put in their slots).
    pub(super) fn load_all(&mut self, names: &[&str]) -> Result<(), Error> {
        let callees = FLUSHERS.iter().filter(|f| names.contains(&f.0));
        let wanted: Vec<&str> = names
            .iter()
            .copied()
            .chain(callees.clone().map(|f| f.1))
            .collect();
        let t = std::time::Instant::now();
        let mut todo: Vec<(&str, &mut Program)> = self
            .bpf
            .programs_mut()
            .filter(|(name, p)| wanted.contains(name) && p.fd().is_err())
            .collect();
        let loaded: Vec<String> = todo.iter().map(|(n, _)| n.to_string()).collect();
        let loading: Result<(), Error> = std::thread::scope(|s| {
            let threads: Vec<_> = todo
                .iter_mut()
                .map(|(name, prog)| s.spawn(move || load_one(name, prog)))
                .collect();
            let joined: Vec<Result<(), Error>> = threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("loader thread").into()))
                })
                .collect();
            joined.into_iter().collect()
        });
        if !loaded.is_empty() {
            tracing::debug!(
                ?loaded,
                ms = t.elapsed().as_secs_f64() * 1e3,
                "programs loaded"
            );
        }
        // The slots of those callees that loaded, whatever else failed: a callee already loaded
        // is not loaded again, and its slot would stay empty for good.
        for &(_, callee, slots) in callees {
            let ok = self.bpf.program(callee).is_some_and(|p| p.fd().is_ok());
            if ok && loaded.iter().any(|l| l == callee) {
                self.fill_slot(slots, callee)?;
            }
        }
        loading
    }

    /// The programs of the probe sets with these roles ("libc", "cuda-runtime", "cuda-driver",
    /// "torch-cpu", "torch-cuda"), for [`Probes::load_with_ring`] to load with the tracepoints.
    /// A function probed after its call takes that program (its entry and return ones load
    /// only if its code does not allow it).
    pub fn programs_of(roles: &[&str]) -> Vec<&'static str> {
        PROBE_SETS
            .iter()
            .filter(|set| roles.contains(&set.role))
            .flat_map(|set| set.fns.iter())
            .flat_map(|f| match &f.after_call {
                Some(after) => vec![after.program],
                None => std::iter::once(f.entry).chain(f.ret).collect(),
            })
            .collect()
    }

    /// Attaches `prog` at `points` of `library`: (file offset, cookie) each. By file offset,
    /// which the symbol look-up found: by symbol, the attach would look every name up again.
    pub(super) fn attach_points(
        &mut self,
        library: &Path,
        prog: &str,
        points: impl Iterator<Item = (u64, Option<u64>)>,
        scope: UProbeScope,
    ) -> Result<UProbeLinkId, Error> {
        let points: Vec<UProbeAttachPoint<'static>> = points
            .map(|(offset, cookie)| UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie,
            })
            .collect();
        self.load_all(&[prog])?;
        let up: &mut UProbe = program(&mut self.bpf, prog)?;
        let what = format!(
            "{} point(s) of {prog} in {}",
            points.len(),
            library.display()
        );
        let file = library.file_name().unwrap_or_default().to_string_lossy();
        if crate::fault::fails("attach", &file) {
            return Err(Error::Kernel(format!(
                "attaching {what}: a failure on purpose (LEAKTRACER_FAULT)"
            )));
        }
        let started = std::time::Instant::now();
        let attached = up.attach(points, library, scope);
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "attached {what}"
        );
        attached.map_err(|e| Error::Kernel(format!("attaching {what}: {e}")))
    }

    /// Puts the loaded program `callee` (reached only by tail call) in slot 0 of the program array
    /// `slots`. The array stays with the object, which keeps it open: a program array that user
    /// space has closed is emptied by the kernel.
    pub(super) fn fill_slot(&mut self, slots: &str, callee: &str) -> Result<(), Error> {
        let fd = self
            .bpf
            .program(callee)
            .ok_or_else(|| anyhow::anyhow!("program {callee} missing from the object"))?
            .fd()
            .and_then(|fd| fd.try_clone().map_err(Into::into))
            .map_err(|e| anyhow::anyhow!("{callee}: {e}"))?;
        let map = self
            .bpf
            .map_mut(slots)
            .ok_or_else(|| anyhow::anyhow!("no {slots} map"))?;
        ProgramArray::try_from(map)
            .and_then(|mut array| array.set(0, &fd, 0))
            .map_err(|e| anyhow::anyhow!("{slots}: {e}").into())
    }
}

/// Loads one program (a uprobe or a tracepoint).
fn load_one(name: &str, prog: &mut Program) -> Result<(), Error> {
    let t = std::time::Instant::now();
    let loaded = match prog {
        Program::UProbe(p) => p.load(),
        Program::TracePoint(p) => p.load(),
        _ => return Err(anyhow::anyhow!("program {name}: not a uprobe or tracepoint").into()),
    };
    loaded.map_err(|e| load_error(e.into()))?;
    tracing::debug!(
        prog = name,
        ms = t.elapsed().as_secs_f64() * 1e3,
        "program loaded"
    );
    Ok(())
}
