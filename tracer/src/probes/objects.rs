//! `--heap auto`: CPython's object allocator as a layer of its own. Small Python objects come from
//! pymalloc's arenas, which the page level sees only as arenas, named by the line whose object
//! needed a new one; what keeps the objects is not seen. When a process's arenas grow, its
//! `PyObject_*` and `PyMem_*` functions are probed for its address space alone, sampled, for a
//! bounded window ([`Probes::engage_objects`]), then detached ([`Probes::disengage_objects`]):
//! every call is a probe trap (a pure-Python service makes millions a second), so they are not
//! left on.

use std::{collections::HashMap, num::NonZeroU32, path::PathBuf};

use aya::programs::uprobe::UProbeScope;
use tracer_common::TRACED_OBJECTS;

use super::{AttachedLink, BPF_EXIST, Library, Probes, Timing, sets::OBJECTS};

/// The object layer's state, owned by [`Probes`].
#[derive(Default)]
pub(super) struct ObjectLayer {
    /// Files with CPython's object allocator (libpython, a statically linked interpreter).
    pub(super) found: Vec<PathBuf>,
    /// Processes whose objects are sampled now, and their links.
    engaged: HashMap<u32, Vec<AttachedLink>>,
}

impl Probes {
    /// Samples the Python objects of the layered process `pid` from now on (`after_s` seconds
    /// into tracing). False when it cannot be: `--heap auto` is off, the process is not traced
    /// or already engaged, or no interpreter with its functions was found.
    pub fn engage_objects(&mut self, pid: u32, after_s: f64) -> bool {
        let Some(one) = NonZeroU32::new(pid) else {
            return false;
        };
        if !self.layers.on || self.objects.engaged.contains_key(&pid) {
            return false;
        }
        let Ok(flags) = self.traced.get(&pid, 0) else {
            return false;
        };
        let started = std::time::Instant::now();
        let links = self.attach_objects(one, after_s);
        if links.is_empty() {
            return false;
        }
        tracing::debug!(
            pid,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "Python objects' probes in"
        );
        self.objects.engaged.insert(pid, links);
        if self
            .traced
            .insert(&pid, &(flags | TRACED_OBJECTS), BPF_EXIST)
            .is_err()
        {
            self.disengage_objects(pid); // exited meanwhile
            return false;
        }
        tracing::info!(
            pid,
            after_s,
            "Python objects sampled: the process's arenas grow"
        );
        let _ = self.settings_changed();
        true
    }

    /// Attaches the object allocator's probes for `pid`'s address space, in each interpreter file
    /// it maps (`after_s`: when, for the libraries listed); their links.
    fn attach_objects(&mut self, pid: NonZeroU32, after_s: f64) -> Vec<AttachedLink> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mapped = |path: &PathBuf| maps.contains(path.to_string_lossy().as_ref());
        let files: Vec<PathBuf> = self
            .objects
            .found
            .iter()
            .filter(|p| mapped(p))
            .cloned()
            .collect();
        let mut links = Vec::new();
        for path in files {
            // The entries keep the heap's per-thread state (switched out with their thread).
            match self.attach_heap_set(&path, &OBJECTS, UProbeScope::OneProcess(pid)) {
                Ok(l) => links.extend(l),
                Err(e) => {
                    tracing::warn!(%pid, library = %path.display(), error = %e, "Python objects not probed");
                    continue;
                }
            }
            self.libraries.push(Library {
                path,
                roles: vec![OBJECTS.role.into()],
                timing: Timing::Engaged { after_s },
                pid: pid.get(),
            });
        }
        links
    }

    /// Ends the window of `pid`'s objects: its blocks recorded and still allocated stay as they
    /// are now (their frees are no longer seen), and its probes go.
    pub fn disengage_objects(&mut self, pid: u32) {
        let Some(links) = self.objects.engaged.remove(&pid) else {
            return;
        };
        if let Ok(flags) = self.traced.get(&pid, 0) {
            let _ = self
                .traced
                .insert(&pid, &(flags & !TRACED_OBJECTS), BPF_EXIST);
            let _ = self.settings_changed();
        }
        self.detach_links(links);
        tracing::info!(pid, "Python objects no longer sampled: the window closed");
    }

    /// The process has exited or exec'd: its links go with its address space.
    pub(super) fn objects_gone(&mut self, pid: u32) {
        self.disengage_objects(pid);
    }
}
