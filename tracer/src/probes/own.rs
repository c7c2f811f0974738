//! The first layer's probes in the traced processes alone: the CUDA runtime and driver,
//! PyTorch's caching allocator, PyTorch's CPU allocator under `--tensors all`, the malloc family
//! from `--heap-after`'s point, and the libraries probed ahead (ahead.rs).
//!
//! A uprobe is a breakpoint written into a library's code in every process that maps it, for
//! the processes its links name. Attached for every process, PyTorch's caching allocator would
//! trap on each block of every job on the machine that uses the same PyTorch, while one is
//! traced. So where the session holds its processes at their forks (`run`, `check`, `attach`),
//! each traced process has links of its own, for every such set found so far:
//! - the launched command from before its exec, an adopted process from its adoption, and they
//!   follow it through its execs (a link names a task, whatever it runs);
//! - a forked child from its first instruction: while any such set is placed, its parent's fork
//!   is held until the child's links are in (`hold::hold_forks`);
//! - a set found later is attached for every traced process then. A link registered before its
//!   library is mapped works the same: the kernel writes the breakpoints at the mapping.
//!
//! `serve`, which may adopt hundreds of processes, attaches them for every process.

use std::{collections::HashMap, num::NonZeroU32, path::Path};

use aya::programs::uprobe::UProbeScope;

use super::{AttachedLink, Probes, attach::PlacedSet, elf, sets::ProbeSet};
use crate::error::Error;

/// The sets attached for each traced process, and their links; owned by [`Probes`].
#[derive(Default)]
pub(super) struct OwnLinks {
    /// The sets found so far, placed.
    placed: Vec<PlacedSet>,
    /// The traced processes, each with its links.
    links: HashMap<u32, Vec<AttachedLink>>,
}

impl OwnLinks {
    /// Whether sets are attached for each process and some were found: forks are to be held.
    pub(super) fn any(&self) -> bool {
        !self.placed.is_empty()
    }
}

impl Probes {
    /// Attaches `set` in the file at `path` (mapped by the traced process `lib_pid`; 0: none
    /// yet) for every process, or where the session holds its processes, for each traced one.
    pub(super) fn attach_first(
        &mut self,
        path: &Path,
        elf: &elf::ElfFile,
        set: &'static ProbeSet,
        lib_pid: u32,
    ) -> Result<(), Error> {
        if !self.layers.own_links {
            return self
                .attach_set(path, elf, set, UProbeScope::AllProcesses)
                .map(drop);
        }
        if lib_pid != 0 && lib_pid != std::process::id() {
            self.own.links.entry(lib_pid).or_default();
        }
        let placed = self.place_set(path, elf, set, UProbeScope::AllProcesses);
        let mut pids: Vec<u32> = self.own.links.keys().copied().collect();
        pids.sort_unstable();
        let mut failed = None;
        let mut attached = pids.is_empty();
        for pid in pids {
            match self.attach_own(&placed, pid) {
                Ok(()) => attached = true,
                Err(e) => failed = Some(e),
            }
        }
        if let (false, Some(e)) = (attached, failed) {
            return Err(e);
        }
        self.list_probed(&placed);
        self.own.placed.push(placed);
        self.hold_forks_as_needed();
        Ok(())
    }

    /// Attaches `placed` for the process `pid` alone.
    fn attach_own(&mut self, placed: &PlacedSet, pid: u32) -> Result<(), Error> {
        let Some(one) = NonZeroU32::new(pid) else {
            return Ok(());
        };
        let links = self.attach_placed(placed, UProbeScope::OneProcess(one))?;
        self.own.links.entry(pid).or_default().extend(links);
        Ok(())
    }

    /// `pid` is traced from now on (launched, forked, adopted): it gets links for every set
    /// placed so far, where sets are attached for each process.
    pub(super) fn own_process(&mut self, pid: u32) {
        if !self.layers.own_links || pid == 0 || self.own.links.contains_key(&pid) {
            return;
        }
        self.own.links.insert(pid, Vec::new());
        for placed in self.own.placed.clone() {
            let Err(e) = self.attach_own(&placed, pid) else {
                continue;
            };
            if crate::procfs::executable(pid).is_some() {
                self.not_probed(&placed.library, placed.role, &e);
            } else {
                tracing::debug!(pid, "gone before its probes went in: {e}");
            }
        }
    }

    /// `parent` forked `child`: a child of a process with links of its own gets its own.
    pub(super) fn own_forked(&mut self, parent: u32, child: u32) {
        if self.own.links.contains_key(&parent) {
            self.own_process(child);
        }
    }

    /// `pid` has exited: its links probe nothing now, and retire.
    pub(super) fn own_gone(&mut self, pid: u32) {
        if let Some(links) = self.own.links.remove(&pid) {
            self.retire(links);
        }
    }

    /// Holds forks while a process's own links must be in before its first instruction: those
    /// of a native process traced whole (layers.rs), or of a set placed here.
    pub(super) fn hold_forks_as_needed(&self) {
        let l = &self.layers;
        crate::hold::hold_forks(l.own_links && (l.whole || self.own.any()));
    }
}
