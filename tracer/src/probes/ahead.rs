//! Libraries probed ahead of their mapping. A Python job's `import torch` maps the CUDA runtime
//! (libcudart, and the copies linked into libnccl and libnvshmem_host) and PyTorch's CUDA
//! allocator, and its thread was held at each until their probes were in: 9–16 ms each, most of
//! it the kernel's RCU grace period for the first uprobe registered after a quiet spell.
//!
//! The libraries with those probes that traced processes mapped in earlier runs are kept
//! (looked.rs, `probed-ahead`). When a Python command is launched, those still as they were are
//! probed for every process once the prober has a quiet moment after the command's start (the
//! interpreter's own start-up, before it imports anything that maps them), and the kernel side
//! is told that mapping them needs no stop: the kernel writes a registered uprobe's breakpoints
//! into the mapping itself, before the mapping call returns. A library probed so is listed, with
//! its probes, once a traced process maps it.

use std::{borrow::Cow, path::Path, path::PathBuf};

use tracer_common::FileKey;

use super::{
    AttachedFn, Library, Mode, Probes, Timing, elf,
    known::markers_for,
    looked::Looked,
    sets::{ProbeSet, defined_sets},
};

/// The probe sets probed ahead: those a Python command's processes get at the mapping whatever
/// the heap mode, whose programs load with the tracepoints' (session/mod.rs, `first_roles`).
const AHEAD_ROLES: &[&str] = &["cuda-runtime", "cuda-driver", "torch-cuda"];

/// The libraries to probe ahead, and those probed but not mapped yet; owned by [`Probes`].
pub(super) struct Ahead {
    /// Libraries with probes of [`AHEAD_ROLES`] alone that traced processes mapped before.
    cache: Looked,
    /// Those to probe once the prober is idle: the kernel's name of each, and its path.
    todo: Vec<(FileKey, PathBuf)>,
    /// Probed, not yet mapped by a traced process: each with the functions probed in it.
    unmapped: Vec<(Library, Vec<AttachedFn>)>,
}

impl Ahead {
    /// The user's list, read; nothing to do yet.
    pub(super) fn open() -> Self {
        Self {
            cache: Looked::open("probed-ahead"),
            todo: Vec::new(),
            unmapped: Vec::new(),
        }
    }
}

/// The sets `path` defines (`defined`: whether it defines each of `markers`), when all of them
/// are probed ahead.
fn ahead_sets(markers: &[&str], defined: &[bool]) -> Option<Vec<&'static ProbeSet>> {
    let sets: Vec<&'static ProbeSet> = defined_sets(markers, defined).collect();
    let all_ahead = sets.iter().all(|s| AHEAD_ROLES.contains(&s.role));
    (all_ahead && !sets.is_empty()).then_some(sets)
}

impl Probes {
    /// A Python command is about to be launched: the libraries kept as probed ahead, still as
    /// they were, are to be probed once the prober is idle ([`Probes::attach_ahead`]). Not where
    /// the kernel side stops for every mapping (`--step-symbol`).
    pub(super) fn plan_ahead(&mut self) {
        if self.mode != Mode::Full || !self.known.told || self.step_symbol.is_some() {
            return;
        }
        self.ahead.todo = self.ahead.cache.with_paths().unchanged(markers_for);
    }

    /// Whether libraries are waiting to be probed ahead.
    pub fn ahead_due(&self) -> bool {
        !self.ahead.todo.is_empty()
    }

    /// Probes the planned libraries that no traced process has mapped yet, for every process,
    /// and tells the kernel side that their mappings need no stop.
    pub fn attach_ahead(&mut self) {
        for (key, path) in std::mem::take(&mut self.ahead.todo) {
            if self.checked.contains(&path) {
                continue; // mapped already, and probed then
            }
            let listed = self.attached.len();
            let roles = self.attach_ahead_sets(&path);
            if roles.is_empty() {
                continue; // looked at as usual once mapped
            }
            self.checked.insert(path.clone());
            tracing::info!(library = %path.display(), ?roles, "probed ahead");
            let fns = self.attached.split_off(listed);
            let library = Library {
                path,
                roles,
                timing: Timing::Ahead,
                pid: 0,
            };
            self.ahead.unmapped.push((library, fns));
            if let Err(e) = self.know_file(key) {
                tracing::debug!("a library probed ahead is stopped for all the same: {e}");
            }
        }
    }

    /// Attaches the sets of `path` that are probed ahead, when it has no other: the roles
    /// attached.
    fn attach_ahead_sets(&mut self, path: &Path) -> Vec<Cow<'static, str>> {
        let Ok(elf) = elf::ElfFile::open(path) else {
            return Vec::new();
        };
        let markers = markers_for(path);
        let Some(sets) = ahead_sets(&markers, &elf.defines(&markers)) else {
            return Vec::new();
        };
        let mut roles = Vec::new();
        for set in sets {
            match self.attach_first(path, &elf, set, 0) {
                Ok(()) => roles.push(set.role.into()),
                Err(e) => self.not_probed(path, set.role, &e),
            }
        }
        roles
    }

    /// A traced process `pid` maps `path`: listed with its probes, if it was probed ahead.
    pub(super) fn adopt_ahead(&mut self, path: &Path, pid: u32) {
        let unmapped = &mut self.ahead.unmapped;
        let Some(i) = unmapped.iter().position(|(l, _)| l.path == path) else {
            return;
        };
        let (library, fns) = unmapped.swap_remove(i);
        self.attached.extend(fns);
        self.libraries.push(Library { pid, ..library });
    }

    /// Keeps `path` as a library to probe ahead in later runs, when a traced process mapped it
    /// (`timing`), every set it defines (`markers`, `defined`) is probed ahead, and those were
    /// attached (`roles`).
    pub(super) fn remember_ahead(
        &mut self,
        path: &Path,
        (markers, defined): (&[&str], &[bool]),
        roles: &[Cow<'static, str>],
        timing: Timing,
    ) {
        let mapped = matches!(timing, Timing::AtMap | Timing::Late { .. });
        let Some(sets) = ahead_sets(markers, defined).filter(|_| mapped) else {
            return;
        };
        if sets.iter().all(|s| roles.iter().any(|r| r == s.role)) {
            self.ahead.cache.remember(path, markers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::sets::PROBE_SETS, ahead_sets};

    #[test]
    fn a_library_is_probed_ahead_only_when_every_set_it_defines_is() {
        let markers: Vec<&str> = PROBE_SETS.iter().map(|s| s.marker).collect();
        let of = |roles: &[&str]| -> Vec<bool> {
            let defines = |m: &&str| {
                PROBE_SETS
                    .iter()
                    .any(|s| s.marker == *m && roles.contains(&s.role))
            };
            markers.iter().map(defines).collect()
        };
        let roles = |roles: &[&str]| {
            ahead_sets(&markers, &of(roles))
                .map(|sets| sets.iter().map(|s| s.role).collect::<Vec<_>>())
        };
        assert_eq!(roles(&["cuda-runtime"]), Some(vec!["cuda-runtime"]));
        assert_eq!(roles(&["torch-cuda"]), Some(vec!["torch-cuda"]));
        // The malloc family goes in by layers, PyTorch's CPU allocator too: not ahead.
        assert_eq!(roles(&["libc"]), None);
        assert_eq!(roles(&["cuda-runtime", "libc"]), None);
        assert_eq!(roles(&["torch-cpu"]), None);
        assert_eq!(roles(&[]), None);
    }
}
