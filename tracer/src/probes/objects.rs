//! Every heap mode but `off`: CPython's object allocator as a layer of its own. Small Python
//! objects come from pymalloc's arenas, which the page level sees only as arenas, named by the line whose
//! object needed a new one; what keeps the objects is not seen. When a process's arenas grow, its
//! `PyObject_*` and `PyMem_*` functions are probed for its address space alone, sampled, for a
//! bounded window ([`Probes::engage_objects`]), then detached ([`Probes::disengage_objects`]):
//! every call is a probe trap (a pure-Python service makes millions a second), so they are not left
//! on.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use aya::programs::uprobe::UProbeScope;
use iced_x86::Register;
use tracer_common::TRACED_OBJECTS;

use super::{
    AttachedLink, BPF_EXIST, Library, Probes, Timing,
    elf::Function,
    placement::{self, Placement},
    sets::OBJECTS,
};
use crate::procfs::ProcMaps;

/// The object layer's state, owned by [`Probes`].
#[derive(Default)]
pub(super) struct ObjectLayer {
    /// Windows are opened (every heap mode but `off`).
    pub(super) on: bool,
    /// Files with CPython's object allocator (libpython, a statically linked interpreter).
    pub(super) found: Vec<PathBuf>,
    /// Processes whose objects are sampled now, and their links.
    engaged: HashMap<u32, Vec<AttachedLink>>,
}

impl Probes {
    /// Samples the Python objects of process `pid` from now on (`after_s` seconds into tracing).
    /// False when it cannot be: no windows in this heap mode, the process is not traced or
    /// already engaged, or no interpreter with its functions was found.
    pub fn engage_objects(&mut self, pid: u32, after_s: f64) -> bool {
        let Some(one) = NonZeroU32::new(pid) else {
            return false;
        };
        if !self.objects.on || self.objects.engaged.contains_key(&pid) {
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
        let maps = ProcMaps::read(pid.get()).unwrap_or_default();
        let mapped = |path: &PathBuf| maps.paths().any(|m| Path::new(&**m) == path);
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
                    self.not_probed(&path, OBJECTS.role, &e);
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

    /// Python objects' windows are opened (every heap mode but `off`).
    pub fn window_objects(&mut self) {
        self.objects.on = true;
    }

    /// Ends the window of `pid`'s objects: its blocks recorded and still allocated stay as they
    /// are now (their frees are no longer seen), and its probes go.
    pub fn disengage_objects(&mut self, pid: u32) {
        let Some(links) = self.objects.engaged.remove(&pid) else {
            return;
        };
        self.take_layer_out(pid, links, |f| f & !TRACED_OBJECTS);
        tracing::info!(pid, "Python objects no longer sampled: the window closed");
    }

    /// The process has exited or exec'd: its links go with its address space.
    pub(super) fn objects_gone(&mut self, pid: u32) {
        self.disengage_objects(pid);
    }
}

/// The function the table slot that wrapper `func` of `library` jumps through holds in `pid`
/// (`PyObject_Free` → `_PyObject.free`, pymalloc's `_PyObject_Free` unless the program installed
/// hooks: debug, tracemalloc), found in `library` as well: its file offset, and where in it to
/// probe, its arguments (`args` of the wrapper) one register later. None where it cannot be
/// found, is in another file, or has no instruction to probe cheaply either.
pub(super) fn table_target(
    pid: NonZeroU32,
    library: &Path,
    func: &Function,
    args: &[Register],
) -> Option<(u64, Placement)> {
    let slot = placement::jump_slot(&func.code, func.addr)?;
    let maps = ProcMaps::read(pid.get())?;
    let path = library.to_str()?;
    let bias = maps
        .address_of(path, func.file_offset)?
        .wrapping_sub(func.addr);
    let word = crate::python::mem::read(pid.get(), bias.wrapping_add(slot), 8)?;
    let target = u64::from_le_bytes(word.try_into().ok()?);
    let (file, offset) = maps.resolve(target)?;
    if **file != *path {
        return None;
    }
    let code = read_at(library, offset, TARGET_CODE)?;
    let args: Vec<Register> = args
        .iter()
        .filter_map(|&r| placement::next_argument(r))
        .collect();
    let place = placement::choose(&code, target, &args);
    place.emulated.then_some((offset, place))
}

/// Bytes of a table's function read to place its probe (its prologue, and the branches of what
/// follows that could land in it).
const TARGET_CODE: usize = 4096;

/// Up to `len` bytes of `path` from `offset`.
fn read_at(path: &Path, offset: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0; len];
    let n = std::fs::File::open(path)
        .ok()?
        .read_at(&mut buf, offset)
        .ok()?;
    buf.truncate(n);
    (n > 0).then_some(buf)
}
