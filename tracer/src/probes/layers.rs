//! `--heap auto`: CPU tensors and the malloc family as layers over the first. A native program is
//! traced whole, as under `--heap full`. A Python process is traced by its first layer from the
//! start (device memory, PyTorch's caching-allocator blocks, pages, with their Python lines), by
//! its CPU tensors once its pages grow in a way the session judges a leak
//! ([`Probes::engage_tensors`]), and by its malloc family once they grow in a way its tensors do
//! not explain ([`Probes::engage_heap`]): importing torch makes millions of malloc calls, and a
//! CPU training loop tens of thousands of tensors a second, each a probe trap or two, while a
//! correct job's pages hold.
//!
//! Every process pays the traps of the probes in its address space, so each layer's probes are
//! attached for the processes that need them alone, never for every process: a program
//! allocating beside a traced one ran 18 times slower while a native command was traced, when
//! the malloc family was attached for every process.
//! - In a tree without Python processes (a C program, or the shell that execs the interpreter),
//!   each native process is traced whole through links of its own: the launched command's from
//!   before its exec, a forked child's from its first instruction (its parent's fork is held
//!   until they are in: `hold::hold_forks`), an exec'd one's kept.
//! - Once a Python process is traced, every process is layered like it, native ones too (the
//!   `ldconfig` that importing torch runs, a shell script around the training job, a worker
//!   binary): each layer for a process's own address space once its pages grow.
//!
//! A process whose malloc family is untraced has [`TRACED_NO_HEAP`]: the probes, where they fire,
//! record nothing for it, and its tensors' frees come from `c10::free_cpu`. One whose tensors are
//! untraced has [`TRACED_NO_TENSORS`].

use std::{
    collections::{HashMap, HashSet},
    num::NonZeroU32,
    path::{Path, PathBuf},
    time::Instant,
};

use aya::programs::{UProbe, uprobe::UProbeScope};
use tracer_common::{TRACED_HEAP_LOCAL, TRACED_NO_HEAP, TRACED_NO_TENSORS};

use super::{
    AttachedLink, BPF_EXIST, Library, Probes, Timing,
    attach::PlacedSet,
    elf, program,
    sets::{HEAP, ProbeSet, TORCH_CPU},
};

/// Links of processes gone left attached at most (a dozen a native process), as a share of the
/// open files leaktracer may have: detaching them costs the kernel about as much as attaching
/// (each unregistration looks at every mapping of the library on the machine): a shell running
/// a hundred commands took 1.45 times as long when a score of processes' links were detached at
/// a time.
fn retired_most() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur as usize
    } else {
        1024
    };
    (soft / 4).clamp(64, 2048)
}

/// A layer's library found (a malloc family, PyTorch's CPU allocator): its set, placed once,
/// the process seen mapping it (0: leaktracer's own) and when it was found.
#[derive(Clone)]
pub(super) struct Found {
    pub(super) placed: PlacedSet,
    lib_pid: u32,
    timing: Timing,
}

/// The layering's state, owned by [`Probes`].
#[derive(Default)]
pub(super) struct HeapLayers {
    /// `--heap auto`.
    pub(super) on: bool,
    /// CPU tensors are a layer too (`--tensors auto`).
    pub(super) tensors: bool,
    /// `--heap full` or `sampled`: every traced process's malloc family (and PyTorch's CPU
    /// allocator) is traced whole, none as a layer.
    pub(super) every: bool,
    /// Processes are traced whole now: under `--heap auto`, native ones while no Python process
    /// is traced, nor expected.
    pub(super) whole: bool,
    /// The session holds its processes at their forks (`run`, `check`, `attach`): each process
    /// traced whole is traced through links of its own. Otherwise (`serve`, which may adopt
    /// hundreds) through links for every process, while one is.
    pub(super) own_links: bool,
    /// Those links for every process.
    everywhere: Option<Vec<AttachedLink>>,
    /// Links of processes gone, to be detached (see [`Probes::process_gone`]).
    retired: Vec<AttachedLink>,
    /// The layers' libraries found: malloc families, PyTorch's CPU allocators.
    pub(super) waiting: Vec<Found>,
    /// Processes traced whole, with the links attached for each alone.
    whole_links: HashMap<u32, Vec<AttachedLink>>,
    /// Layered processes whose malloc family is traced now, with the links attached for them
    /// alone.
    pub(super) engaged: HashMap<u32, Vec<AttachedLink>>,
    /// Layered processes whose CPU tensors are traced now, with the links attached for them
    /// alone (none for a native process traced whole).
    pub(super) tensors_engaged: HashMap<u32, Vec<AttachedLink>>,
    /// Native and Python processes traced now.
    natives: HashSet<u32>,
    pythons: HashSet<u32>,
    /// The launched command runs a Python interpreter in the end, through native wrappers
    /// (`env`, a script's `#!/usr/bin/env python3`): they are layered as if it were traced.
    python_expected: bool,
    /// The layers' programs were loaded ahead of their first engagement
    /// ([`Probes::preload_layers`]).
    preloaded: bool,
}

impl HeapLayers {
    /// Whether `set`, found now, is a layer's or one traced whole: attached for the processes
    /// that need it, not at once for every process.
    pub(super) fn holds_back(&self, set: &ProbeSet) -> bool {
        let layer = set.role == HEAP.role || (self.tensors && set.role == TORCH_CPU.role);
        (self.on && layer) || (self.every && set.heap())
    }

    /// The traced flags of a process none of whose layers is traced.
    fn untraced(&self, flags: u32) -> u32 {
        let tensors = if self.tensors { TRACED_NO_TENSORS } else { 0 };
        (flags | TRACED_NO_HEAP | tensors) & !TRACED_HEAP_LOCAL
    }
}

impl Probes {
    /// `--heap auto`; `tensors`: CPU tensors are layered too (`--tensors auto`).
    pub fn layer_heap(&mut self, tensors: bool) {
        self.layers.on = true;
        self.layers.tensors = tensors;
    }

    /// `--heap full` and `sampled`: every traced process's malloc family is traced whole.
    pub fn heap_whole_always(&mut self) {
        self.layers.every = true;
    }

    /// The session holds its processes at their forks (see [`HeapLayers::own_links`]).
    pub fn hold_processes(&mut self) {
        self.layers.own_links = true;
    }

    /// A command is about to be launched as `root`, held before its exec (`python`: one that
    /// runs a Python interpreter in the end): its malloc family is traced whole from now on
    /// under `--heap full` and `sampled`, and under `--heap auto` unless it is a Python one.
    pub fn launching(&mut self, python: bool, root: u32) {
        self.own_process(root);
        self.layers.python_expected = python;
        if python {
            self.plan_ahead();
        }
        if (self.layers.on && !python) || self.layers.every {
            self.layers.natives.insert(root);
            self.trace_whole(root);
        }
    }

    /// Sets the malloc family's layer of `pid`, which has just exec'd or started to be traced,
    /// while it is still held: untraced for a Python interpreter, and for anything else once a
    /// Python process is traced; otherwise traced whole, by links of its own, kept through an
    /// exec (see the module's text). Returns the traced flags to set.
    pub(super) fn layer_flags(&mut self, pid: u32, flags: u32, python: bool) -> u32 {
        if self.layers.every {
            self.trace_whole(pid);
            return flags;
        }
        if !self.layers.on {
            return flags;
        }
        // Links for a process follow it through its exec; layers' links for its old address
        // space go.
        let whole = self.layers.whole_links.remove(&pid);
        self.process_gone(pid);
        if python {
            self.layers.pythons.insert(pid);
            self.layers.python_expected = false;
            self.localize_natives();
        } else {
            self.layers.natives.insert(pid);
        }
        if !self.layers.pythons.is_empty() || self.layers.python_expected {
            self.detach_links(whole.unwrap_or_default());
            return self.layers.untraced(flags);
        }
        match whole {
            Some(links) => {
                self.layers.whole_links.insert(pid, links);
            }
            None => self.trace_whole(pid),
        }
        flags & !(TRACED_NO_HEAP | TRACED_HEAP_LOCAL | TRACED_NO_TENSORS)
    }

    /// `parent` forked `child` (held, where forks are held): a child of a process traced whole
    /// is traced whole too, from its first instruction. Its pages hold its parent's breakpoints,
    /// but the kernel runs a process's probes only for the processes they were attached for.
    pub fn forked(&mut self, parent: u32, child: u32) {
        self.own_forked(parent, child);
        let l = &self.layers;
        if !l.whole || !l.whole_links.contains_key(&parent) || l.whole_links.contains_key(&child) {
            return;
        }
        self.layers.natives.insert(child);
        self.trace_whole(child);
    }

    /// `pid` has exited (or exec'd). The links attached for it alone probe nothing now; they go
    /// at the end, or with others once many are left ([`retired_most`]; each unregistration
    /// waits for a grace period: detached at once, the last process's links held the session's
    /// end 46 ms).
    fn process_gone(&mut self, pid: u32) {
        self.objects_gone(pid);
        self.layers.engaged.remove(&pid);
        self.layers.tensors_engaged.remove(&pid);
        if let Some(links) = self.layers.whole_links.remove(&pid) {
            self.retire(links);
        }
        self.layers.pythons.remove(&pid);
        self.layers.natives.remove(&pid);
    }

    /// `pid` has exited: its links go (see [`Probes::process_gone`]).
    pub fn exited(&mut self, pid: u32) {
        self.own_gone(pid);
        self.process_gone(pid);
    }

    /// Links of a process gone, detached with others once many are left.
    pub(super) fn retire(&mut self, links: Vec<AttachedLink>) {
        self.layers.retired.extend(links);
        if self.layers.retired.len() >= retired_most() {
            let retired = std::mem::take(&mut self.layers.retired);
            self.detach_links(retired);
        }
    }

    /// A Python process is traced: the native ones are layered like it, their own links gone.
    fn localize_natives(&mut self) {
        if !self.layers.whole {
            return;
        }
        self.layers.whole = false;
        self.hold_forks_as_needed();
        let everywhere = self.layers.everywhere.take();
        self.detach_links(everywhere.unwrap_or_default());
        for (pid, links) in std::mem::take(&mut self.layers.whole_links) {
            if let Ok(flags) = self.traced.get(&pid, 0) {
                let flags = self.layers.untraced(flags);
                let _ = self.traced.insert(&pid, &flags, BPF_EXIST);
            }
            self.layers.tensors_engaged.remove(&pid);
            self.detach_links(links);
        }
        tracing::info!("heap probes out: a Python process is traced");
        if let Err(e) = self.settings_changed() {
            tracing::warn!("native processes' heap still traced: {e}");
        }
    }

    /// The processes whose malloc family is traced whole, not as a layer: the native ones while
    /// no Python process is traced.
    pub fn heap_whole(&self) -> Vec<u32> {
        let l = &self.layers;
        if !l.on || !l.whole || !l.pythons.is_empty() {
            return Vec::new();
        }
        let mut pids: Vec<u32> = l.whole_links.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// Whether the programs of the CPU tensors' and the malloc family's layers are to be loaded
    /// ahead: a layered process maps PyTorch, and they were not yet.
    pub fn preload_due(&self) -> bool {
        let l = &self.layers;
        l.on && !l.preloaded && l.waiting.iter().any(|w| w.placed.role == TORCH_CPU.role)
    }

    /// Loads those programs (verified, not attached), once: while a training job still imports,
    /// with a core to spare, not when its loop first asks for its tensors and then its malloc
    /// family, both cores busy (66 and 132 ms on this thread, some 0.3 CPU-s of the verifier's,
    /// in a Trainer job).
    pub fn preload_layers(&mut self) {
        if !self.preload_due() {
            return;
        }
        self.layers.preloaded = true;
        let roles: &[&str] = if self.layers.tensors {
            &[TORCH_CPU.role, HEAP.role]
        } else {
            &[HEAP.role]
        };
        let started = Instant::now();
        match self.load_all(&Self::programs_of(roles)) {
            Ok(()) => tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "layers' programs loaded ahead"
            ),
            Err(e) => tracing::warn!("layers' programs not loaded ahead: {e}"),
        }
    }

    /// Traces the malloc family of the process `pid` whole, with PyTorch's CPU allocator where
    /// tensors are a layer: every layer's library found so far, attached for its address space
    /// alone while it is held (before its exec, at its fork or exec), or for every process.
    fn trace_whole(&mut self, pid: u32) {
        if self.layers.whole_links.contains_key(&pid) {
            return;
        }
        if !self.layers.whole {
            self.layers.whole = true;
            self.hold_forks_as_needed();
        }
        self.layers.whole_links.insert(pid, Vec::new());
        let scope = if self.layers.own_links {
            Some(pid)
        } else if self.layers.everywhere.is_none() {
            self.layers.everywhere = Some(Vec::new());
            None
        } else {
            return;
        };
        for found in self.layers.waiting.clone() {
            self.attach_whole(scope, &found);
        }
    }

    /// Attaches a library `found` traced whole for the process `pid` alone, or for every
    /// process, and lists it as probed once.
    fn attach_whole(&mut self, pid: Option<u32>, found: &Found) {
        let scope = match pid.map(NonZeroU32::new) {
            Some(Some(one)) => UProbeScope::OneProcess(one),
            Some(None) => return,
            None => UProbeScope::AllProcesses,
        };
        let placed = &found.placed;
        let links = match self.attach_layer(placed, scope) {
            Ok(links) => links,
            Err(e) => return self.not_probed(&placed.library, placed.role, &e),
        };
        let held = match pid {
            Some(pid) => self.layers.whole_links.entry(pid).or_default(),
            None => self.layers.everywhere.get_or_insert_default(),
        };
        held.extend(links);
        let path = &placed.library;
        tracing::debug!(?pid, library = %path.display(), "heap traced whole");
        if !self.libraries.iter().any(|l| l.path == *path) {
            tracing::info!(library = %path.display(), role = placed.role, "heap probes in");
            self.libraries.push(Library {
                path: path.clone(),
                roles: vec![placed.role.into()],
                timing: found.timing,
                pid: found.lib_pid,
            });
        }
    }

    /// A library `path` (`elf`) found now whose `set` is a layer's or traced whole, mapped by
    /// `lib_pid` (0: leaktracer) at `timing`: placed, waiting for the processes whose layer is
    /// engaged, attached at once for those traced whole.
    pub(super) fn layer_found(
        &mut self,
        path: &Path,
        elf: &elf::ElfFile,
        set: &'static ProbeSet,
        (lib_pid, timing): (u32, Timing),
    ) {
        let placed = self.place_set(path, elf, set, UProbeScope::AllProcesses);
        let found = Found {
            placed,
            lib_pid,
            timing,
        };
        self.layers.waiting.push(found.clone());
        if self.layers.everywhere.is_some() {
            self.attach_whole(None, &found);
        }
        if !self.layers.own_links {
            return;
        }
        let mut pids: Vec<u32> = self.layers.whole_links.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            self.attach_whole(Some(pid), &found);
        }
    }

    /// Traces the malloc family of the layered process `pid` from now on (`after_s` seconds into
    /// tracing), its pages having grown: a process already engaged, not traced, or whose malloc
    /// family is traced already is left as it is.
    pub fn engage_heap(&mut self, pid: u32, after_s: f64) {
        if !self.layers.on || self.layers.engaged.contains_key(&pid) {
            return;
        }
        // The layer below first: a block of posix_memalign's is a tensor's where tensors count.
        self.engage_tensors(pid, after_s);
        let Ok(flags) = self.traced.get(&pid, 0) else {
            return;
        };
        if flags & TRACED_NO_HEAP == 0 {
            return;
        }
        let new = (flags & !TRACED_NO_HEAP) | TRACED_HEAP_LOCAL;
        let Some(links) = self.attach_local(pid, Some(after_s), &HEAP) else {
            return;
        };
        if self.traced.insert(&pid, &new, BPF_EXIST).is_err() {
            return; // exited meanwhile
        }
        self.layers.engaged.insert(pid, links);
        tracing::info!(pid, after_s, "heap traced for a process whose pages grow");
        if let Err(e) = self.settings_changed() {
            tracing::warn!(pid, "heap of threads already seen not traced: {e}");
        }
    }

    /// Traces the CPU tensors of the layered process `pid` from now on (`after_s` seconds into
    /// tracing), its pages having grown. True if they are traced now, false if they were already,
    /// or cannot be (not layered, not traced, no PyTorch mapped).
    pub fn engage_tensors(&mut self, pid: u32, after_s: f64) -> bool {
        let layers = &self.layers;
        if !layers.on || !layers.tensors || layers.tensors_engaged.contains_key(&pid) {
            return false;
        }
        // A forked child of a process whose tensors are traced has its flags, not its links.
        let Ok(flags) = self.traced.get(&pid, 0) else {
            return false;
        };
        let libraries = self.tensor_libraries();
        let maps = crate::procfs::ProcMaps::read(pid);
        if !maps.is_some_and(|m| m.maps_any(&libraries)) {
            return false;
        }
        let links = if self.layers.whole_links.contains_key(&pid) {
            for path in libraries {
                let roles = vec![TORCH_CPU.role.into()];
                let timing = Timing::Engaged { after_s };
                self.libraries.push(Library {
                    path,
                    roles,
                    timing,
                    pid,
                });
            }
            Vec::new()
        } else {
            let Some(links) = self.attach_local(pid, Some(after_s), &TORCH_CPU) else {
                return false;
            };
            links
        };
        if self
            .traced
            .insert(&pid, &(flags & !TRACED_NO_TENSORS), BPF_EXIST)
            .is_err()
        {
            self.detach_links(links);
            return false; // exited meanwhile
        }
        self.layers.tensors_engaged.insert(pid, links);
        tracing::info!(
            pid,
            after_s,
            "CPU tensors traced for a process whose pages grow"
        );
        if let Err(e) = self.settings_changed() {
            tracing::warn!(pid, "tensors of threads already seen not traced: {e}");
        }
        true
    }

    /// The libraries with PyTorch's CPU allocator found so far, held back as a layer.
    pub fn tensor_libraries(&self) -> Vec<PathBuf> {
        let layers = &self.layers;
        let found = layers.waiting.iter();
        found
            .filter(|w| w.placed.role == TORCH_CPU.role)
            .map(|w| w.placed.library.clone())
            .collect()
    }

    /// The layered processes whose CPU tensors are traced now.
    pub fn tensors_traced(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.layers.tensors_engaged.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// Stops tracing the malloc family of the layered process `pid`, once its leak was
    /// confirmed: its probe traps cost a training job that leaks autograd nodes three times its
    /// time for as long as it runs. Its blocks stay as they are (`Ledger::heap_taken_out`).
    pub fn disengage_heap(&mut self, pid: u32) {
        let Some(links) = self.layers.engaged.remove(&pid) else {
            return;
        };
        tracing::info!(pid, "heap no longer traced: its leak was confirmed");
        self.take_layer_out(pid, links, |f| (f | TRACED_NO_HEAP) & !TRACED_HEAP_LOCAL);
    }

    /// Sets `pid`'s traced `flags` so that a layer's probes, where they still fire, record
    /// nothing for it, then detaches the layer's `links`. In that order: the links go on
    /// threads of their own, in no order, and a `free` probe gone before `malloc`'s while the
    /// flags still said traced would miss the free of a block whose address the next malloc
    /// then reuses.
    pub(super) fn take_layer_out(
        &mut self,
        pid: u32,
        links: Vec<AttachedLink>,
        flags: impl Fn(u32) -> u32,
    ) {
        if let Ok(f) = self.traced.get(&pid, 0) {
            let _ = self.traced.insert(&pid, &flags(f), BPF_EXIST);
        }
        if let Err(e) = self.settings_changed() {
            tracing::warn!(pid, "a layer of threads already seen still traced: {e}");
        }
        self.detach_links(links);
    }

    /// Stops tracing the CPU tensors of `pid` (its memory holds): its own links go, and its
    /// probes, where they still fire, record nothing for it. Its tensors outstanding now stay as
    /// they were last seen.
    pub fn disengage_tensors(&mut self, pid: u32) {
        let Some(links) = self.layers.tensors_engaged.remove(&pid) else {
            return;
        };
        tracing::info!(
            pid,
            "CPU tensors no longer traced: the process's memory holds"
        );
        self.take_layer_out(pid, links, |f| f | TRACED_NO_TENSORS);
    }

    /// Attaches the waiting libraries of `layer` (the malloc family, or PyTorch's CPU allocator)
    /// for `pid`'s address space alone; the libraries are listed as probed `after_s` into
    /// tracing, when given. Their links; none if one could not be attached.
    fn attach_local(
        &mut self,
        pid: u32,
        after_s: Option<f64>,
        layer: &ProbeSet,
    ) -> Option<Vec<AttachedLink>> {
        let one = NonZeroU32::new(pid)?;
        let found = self.layers.waiting.iter();
        let waiting: Vec<PlacedSet> = found
            .filter(|w| w.placed.role == layer.role)
            .map(|w| w.placed.clone())
            .collect();
        let mut all = Vec::new();
        for placed in waiting {
            // A process's own links go with it, where they are not detached before.
            match self.attach_layer(&placed, UProbeScope::OneProcess(one)) {
                Ok(links) => all.extend(links),
                Err(e) => {
                    self.not_probed(&placed.library, placed.role, &e);
                    self.detach_links(all);
                    return None;
                }
            }
            if let Some(after_s) = after_s {
                self.libraries.push(Library {
                    path: placed.library,
                    roles: vec![placed.role.into()],
                    timing: Timing::Engaged { after_s },
                    pid,
                });
            }
        }
        Some(all)
    }

    /// Detaches `links`, in the background, each on a thread of its own: each unregistration
    /// waits for a grace period (about 0.1 s), which is not for the prober's path, and one
    /// after the other a malloc family's dozen links took 1.4 s, its probes firing meanwhile.
    pub(super) fn detach_links(&mut self, links: Vec<AttachedLink>) {
        let mut taken = Vec::new();
        for (prog, id) in links {
            let up: Result<&mut UProbe, _> = program(&mut self.bpf, prog);
            if let Ok(link) =
                up.and_then(|up| up.take_link(id).map_err(|e| anyhow::anyhow!("{e}").into()))
            {
                taken.push(link);
            }
        }
        for link in taken {
            std::thread::spawn(move || drop(link));
        }
    }

    /// Attaches a layer's set `placed` for `scope`, with the thread switch-out program the
    /// heap-level entries need.
    fn attach_layer(
        &mut self,
        placed: &PlacedSet,
        scope: UProbeScope,
    ) -> Result<Vec<AttachedLink>, crate::error::Error> {
        self.attach_switch_out()?;
        self.attach_placed(placed, scope)
    }

    /// Attaches `set` in the file at `path` for `scope`, with the thread switch-out program the
    /// heap-level entries need.
    pub(super) fn attach_heap_set(
        &mut self,
        path: &Path,
        set: &'static ProbeSet,
        scope: UProbeScope,
    ) -> Result<Vec<AttachedLink>, crate::error::Error> {
        let elf = elf::ElfFile::open(path).map_err(|e| crate::error::Error::Other(e.into()))?;
        self.attach_switch_out()?;
        self.attach_set(path, &elf, set, scope)
    }
}
