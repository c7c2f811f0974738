//! Loading the eBPF object, attaching its programs, and owning the links for the tracer's
//! lifetime. Also the checks that turn a missing privilege or kernel feature into a clear error.

mod ahead;
mod attach;
mod channels;
pub mod cost;
pub mod elf;
mod finalize;
pub mod frames;
mod known;
mod layers;
mod load;
mod looked;
mod objects;
mod own;
pub mod placement;
pub mod prober;
mod release;
mod ring;
mod sets;
pub mod tracefs;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        BtfTracePoint, TracePoint,
        uprobe::{UProbeLinkId, UProbeScope},
    },
};
use serde::Serialize;

use tracer_common::{TRACED_HOLD, TRACED_ON};

pub use channels::{KernelChannels, KernelCounters};
pub use ring::Ring;

use crate::{error::Error, model::HeapUnwind};
use sets::{HEAP, OBJECTS, ProbeSet, TRACEPOINTS};

/// A program's link: what detaches it.
type AttachedLink = (&'static str, UProbeLinkId);

/// Map update flag: only an entry that exists is updated.
const BPF_EXIST: u64 = 2;

/// Whether the programs do the work or are empty (the probe floor, for the benchmark).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Full,
    Bare,
}

/// One function as probed: where, and why there.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct AttachedFn {
    pub function: String,
    pub library: PathBuf,
    pub offset: u64,
    pub reason: std::borrow::Cow<'static, str>,
}

/// When a library's probes went in, relative to the traced code that could call it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "when")]
pub enum Timing {
    /// Before the traced command started.
    BeforeStart,
    /// Already loaded in a process leaktracer attached to: its calls before the attach are not seen.
    AlreadyLoaded,
    /// Mapped while traced; the mapping thread was stopped until the probes were in: nothing missed.
    AtMap,
    /// Probed before a traced process mapped it (known from earlier runs to have probes a
    /// Python job's import needs), for each traced process: nothing missed, and the mapping
    /// thread not stopped.
    Ahead,
    /// Mapped while traced, probed `late_ms` after (the process could not be held): calls in that
    /// window are not seen.
    Late { late_ms: f64 },
    /// Heap functions probed `after_s` seconds into tracing (`--heap-after`): calls before are
    /// not seen.
    HeapAfter { after_s: f64 },
    /// Heap functions probed for one process (the library's `pid`) `after_s` seconds into
    /// tracing, when its page-level growth called for them (`--heap auto`).
    Engaged { after_s: f64 },
}

/// A library leaktracer probes, with what it is and when its probes went in.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Library {
    pub path: PathBuf,
    /// "libc", "cuda-runtime", "cuda-driver", "torch-cpu".
    pub roles: Vec<std::borrow::Cow<'static, str>>,
    pub timing: Timing,
    /// The process whose mapping of it was first seen (0: before any).
    pub pid: u32,
}

/// A probe set that could not be attached in a library: what that library does for its role
/// (the CUDA runtime's allocations, the malloc family…) is not traced there.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ProbeFailure {
    pub library: PathBuf,
    pub role: std::borrow::Cow<'static, str>,
    pub error: String,
}

impl std::fmt::Display for ProbeFailure {
    /// "LIBRARY could not be probed for ROLE", what every output says of it before its error.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} could not be probed for {}",
            self.library.display(),
            self.role
        )
    }
}

/// The loaded eBPF object and everything attached from it. Dropping it detaches all probes.
pub struct Probes {
    bpf: Ebpf,
    mode: Mode,
    traced: BpfHashMap<MapData, u32, u32>,
    /// Processes whose Python frames the kernel side walks (tracer-ebpf/src/python.rs).
    python: BpfHashMap<MapData, u32, tracer_common::PyConfig>,
    /// CPython versions seen that have no known layout (said once each).
    python_unknown: std::collections::HashSet<(u8, u8)>,
    /// Changes made to processes' settings so far (an interpreter configured, `TRACED_CFI` set
    /// or cleared): the kernel side's `PROC_GEN`.
    settings_changed: u64,
    /// The kernel's copy lengths per allocation site (`DEEP_HINTS`).
    deep_hints: BpfHashMap<MapData, tracer_common::DeepHintKey, u32>,
    /// `--unwind`, and what was found of each executable looked at.
    unwind: HeapUnwind,
    code_traits: std::collections::HashMap<PathBuf, Option<frames::CodeTraits>>,
    /// `--no-python-stacks`.
    no_python: bool,
    attached: Vec<AttachedFn>,
    libraries: Vec<Library>,
    /// Probe sets that could not be attached, once per library and role.
    failures: Vec<ProbeFailure>,
    /// Every file looked at, probed or not.
    checked: std::collections::HashSet<PathBuf>,
    /// Files looked at in earlier runs that define none of the probed functions.
    looked: looked::Looked,
    /// Those files, as the kernel side knows them.
    known: known::KnownFiles,
    /// The function whose entries mark training steps (`--step-symbol`).
    step_symbol: Option<String>,
    /// `--no-heap`: the malloc family and PyTorch's CPU allocator are not probed.
    no_heap: bool,
    /// `--heap sampled`: the mean interval in bytes (0: every allocation).
    heap_sampling: u64,
    /// Whether `switch_out` is attached (with the first heap probes).
    switch_out: bool,
    /// `--heap-after`, until the heap probes go in: the heap sets found, with the library and
    /// the process seen mapping it (0: leaktracer's own).
    heap_deferred: Option<Vec<(PathBuf, &'static ProbeSet, u32)>>,
    /// `--heap auto`: the malloc family as a second layer for Python processes.
    layers: layers::HeapLayers,
    /// `--heap auto`: CPython's object allocator, sampled in a window per process.
    objects: objects::ObjectLayer,
    /// Interpreters' exits to mark once the thread held for their mapping is let go.
    finalize: finalize::Finalize,
    /// Libraries probed before a traced process maps them.
    ahead: ahead::Ahead,
    /// The first layer's sets attached for each traced process alone.
    own: own::OwnLinks,
}

impl Probes {
    /// Ends tracing without waiting for the kernel to unregister the uprobes. Each unregistration
    /// waits for an RCU grace period under a global lock (about 0.1 s each on this kind of machine,
    /// one after another: 6 s for a session's 60 probes). A child process inherits the
    /// descriptors and lets go of them once this process has exited, all at once (release.rs),
    /// so leaktracer ends as soon as its report is written. Until then the old programs still
    /// run, and filter everything out.
    pub fn detach_in_background(self) {
        if FOREGROUND_DETACH.load(std::sync::atomic::Ordering::Relaxed) {
            return drop(self);
        }
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return drop(self);
        }
        let [r, w] = fds;
        let open = release::open_fds();
        // SAFETY: the child makes only async-signal-safe calls (close, read, those of
        // `close_all_at_once`, _exit).
        match unsafe { libc::fork() } {
            0 => unsafe {
                for fd in [0, 1, 2, w] {
                    libc::close(fd); // the caller's pipes must see EOF when this process exits
                }
                let mut b = 0u8;
                libc::read(r, (&raw mut b).cast(), 1); // returns when this process is gone
                release::close_all_at_once(&open);
                libc::_exit(0);
            },
            pid => {
                // SAFETY: closing the read end this process does not use.
                unsafe { libc::close(r) };
                if pid < 0 {
                    // SAFETY: closing the pipe's write end on the failure path.
                    unsafe { libc::close(w) };
                }
                // With a child holding them, closing the descriptors here is a reference drop;
                // `w` stays open until exit.
                drop(self);
            }
        }
    }
}

static FOREGROUND_DETACH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`Probes::detach_in_background`] detach before returning (the benchmark: the next
/// measurement must not run under the last one's probes).
pub fn detach_in_foreground() {
    FOREGROUND_DETACH.store(true, std::sync::atomic::Ordering::Relaxed);
}

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Root of /sys, overridable so the tests can show the errors of a kernel without BTF or uprobes.
fn sysfs() -> PathBuf {
    std::env::var_os("LEAKTRACER_SYSFS").map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// Fails with a clear error when the process lacks privileges or the kernel lacks a feature.
pub fn check_environment() -> Result<(), Error> {
    if !has_capabilities() {
        return Err(Error::Permission(
            "loading eBPF programs needs privileges".into(),
        ));
    }
    let sys = sysfs();
    if !sys.join("kernel/btf/vmlinux").exists() {
        return Err(Error::Kernel(
            "no BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF)".into(),
        ));
    }
    if !sys.join("bus/event_source/devices/uprobe").exists() {
        return Err(Error::Kernel(
            "no uprobe event source (CONFIG_UPROBES / CONFIG_UPROBE_EVENTS)".into(),
        ));
    }
    Ok(())
}

/// Root, or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN in the effective set.
fn has_capabilities() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let cap_eff = crate::procfs::own_capabilities();
    let need = (1u64 << 39) | (1 << 38) | (1 << 21);
    cap_eff & need == need
}

impl Probes {
    /// Loads the object with the tracepoint field offsets of this kernel and attaches the page-level
    /// and process tracepoints. Heap probes come with [`Probes::attach_heap`].
    pub fn load(mode: Mode) -> Result<Self, Error> {
        Self::load_with_ring(mode, tracer_common::RINGBUF_BYTES, &[])
    }

    /// As [`Probes::load`] with an event ring of `ring_bytes` (a power of two, a page or more),
    /// and the programs `first` loaded with the tracepoints' (see load.rs).
    pub fn load_with_ring(mode: Mode, ring_bytes: u32, first: &[&str]) -> Result<Self, Error> {
        check_environment()?;
        let looked = looked::Looked::open("no-probes");
        let finding = (mode == Mode::Full).then(|| known::find(looked.with_paths()));
        let tracefs = tracefs::ensure_mounted()?;
        let off = |cat, name, field, default| {
            tracefs::field_offset(&tracefs, cat, name, field).unwrap_or(default)
        };
        let newtask_pid: u32 = off("task", "task_newtask", "pid", 8);
        let newtask_flags: u32 = off("task", "task_newtask", "clone_flags", 32);
        let exit_group_dead: u32 = off("sched", "sched_process_exit", "group_dead", 0);
        let mut bpf = EbpfLoader::new()
            // PENDING is task storage, which aya creates but does not wrap.
            .allow_unsupported_maps()
            .override_global("NEWTASK_PID_OFF", &newtask_pid, true)
            .override_global("NEWTASK_FLAGS_OFF", &newtask_flags, true)
            .override_global("EXIT_GROUP_DEAD_OFF", &exit_group_dead, true)
            .override_global("WAKE_AT_BYTES", &(u64::from(ring_bytes) / 4), true)
            .map_max_entries("EVENTS", ring_bytes)
            .load(OBJECT)
            .map_err(load_error)?;
        let traced = BpfHashMap::try_from(
            bpf.take_map("TRACED")
                .ok_or_else(|| anyhow::anyhow!("no TRACED map"))?,
        )
        .map_err(|e| anyhow::anyhow!("TRACED map: {e}"))?;
        let python = BpfHashMap::try_from(
            bpf.take_map("PY_CONFIG")
                .ok_or_else(|| anyhow::anyhow!("no PY_CONFIG map"))?,
        )
        .map_err(|e| anyhow::anyhow!("PY_CONFIG map: {e}"))?;
        let deep_hints = BpfHashMap::try_from(
            bpf.take_map("DEEP_HINTS")
                .ok_or_else(|| anyhow::anyhow!("no DEEP_HINTS map"))?,
        )
        .map_err(|e| anyhow::anyhow!("DEEP_HINTS map: {e}"))?;
        let mut probes = Self {
            bpf,
            mode,
            traced,
            deep_hints,
            python,
            python_unknown: Default::default(),
            settings_changed: 0,
            unwind: HeapUnwind::default(),
            code_traits: Default::default(),
            no_python: false,
            attached: Vec::new(),
            libraries: Vec::new(),
            failures: Vec::new(),
            checked: Default::default(),
            looked,
            known: Default::default(),
            step_symbol: None,
            no_heap: false,
            heap_sampling: 0,
            switch_out: false,
            heap_deferred: None,
            layers: Default::default(),
            objects: Default::default(),
            finalize: Default::default(),
            ahead: ahead::Ahead::open(),
            own: own::OwnLinks::default(),
        };
        if mode == Mode::Full {
            probes.attach_tracepoints(first)?;
        }
        if let Some(finding) = finding {
            probes.tell_known_files(&finding);
        }
        Ok(probes)
    }

    /// A thread's heap entry is resident in its CPU's slot while it runs, and `--heap full` keeps
    /// its frees there until its next record: a thread switched out sends them and takes its entry
    /// home (tracer-ebpf's `switch_out`, `entries`). Attached before the first heap probe.
    fn attach_switch_out(&mut self) -> Result<(), Error> {
        if self.switch_out || self.mode != Mode::Full {
            return Ok(());
        }
        let btf = aya::Btf::from_sys_fs()
            .map_err(|e| Error::Kernel(format!("kernel BTF (/sys/kernel/btf/vmlinux): {e}")))?;
        let prog: &mut BtfTracePoint = program(&mut self.bpf, "switch_out")?;
        prog.load("sched_switch", &btf)
            .map_err(|e| load_error(e.into()))?;
        prog.attach()
            .map_err(|e| Error::Kernel(format!("attaching sched_switch: {e}")))?;
        self.switch_out = true;
        Ok(())
    }

    fn attach_tracepoints(&mut self, first: &[&str]) -> Result<(), Error> {
        let mut progs: Vec<&str> = TRACEPOINTS.iter().map(|t| t.0).collect();
        progs.push("page_send");
        progs.extend(first);
        self.load_all(&progs)?;
        // The exits' shared stack-sending program, in its slot before any exit can run.
        self.fill_slot("PAGE_SEND", "page_send")?;
        for (prog, category, name) in TRACEPOINTS {
            let tp: &mut TracePoint = program(&mut self.bpf, prog)?;
            tp.attach(category, name).map_err(|e| {
                Error::Kernel(format!("attaching tracepoint {category}:{name}: {e}"))
            })?;
        }
        Ok(())
    }

    /// Looks at a file with executable code once: when it has one of the function sets leaktracer
    /// probes (a libc's malloc family, the CUDA runtime or driver, PyTorch's CPU allocator), probes
    /// them, for every process, filtered in the kernel. `pid` is the process seen mapping it.
    pub fn attach_code(&mut self, path: &Path, pid: u32, timing: Timing) -> Result<(), Error> {
        if timing != Timing::BeforeStart
            && !self.no_python
            && crate::python::interp::version_of(&path.to_string_lossy()).is_some()
        {
            self.walk_python(pid);
        }
        if timing != Timing::BeforeStart {
            self.adopt_ahead(path, pid);
        }
        if !self.checked.insert(path.to_path_buf()) {
            return Ok(());
        }
        let markers = known::markers_for(path);
        let step = self.step_symbol.is_some();
        if !step && self.looked.knows(path, &markers) {
            tracing::debug!(path = %path.display(), "looked at before: nothing to probe");
            return Ok(());
        }
        let elf = match elf::ElfFile::open(path) {
            Ok(elf) => elf,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "not an ELF file: not probed");
                return Ok(());
            }
        };
        // Probed before the command ran: found in leaktracer's own maps, not a traced one.
        let lib_pid = if timing == Timing::BeforeStart {
            0
        } else {
            pid
        };
        let mut roles = Vec::new();
        let defined = elf.defines(&markers);
        if !step
            && !defined.contains(&true)
            && let Some(key) = self.looked.remember(path, &markers)
            && let Err(e) = self.know_file(key)
        {
            tracing::debug!(path = %path.display(), "not told to the kernel side: {e}");
        }
        for set in sets::defined_sets(&markers, &defined) {
            let heap = set.heap();
            if self.no_heap && heap {
                continue;
            }
            if set.role == OBJECTS.role {
                // Only ever attached for one process, in its window; the interpreter's
                // exit is marked in every mode.
                if self.objects.on {
                    self.objects.found.push(path.to_path_buf());
                }
                self.mark_finalize(path, &elf, timing == Timing::AtMap);
                continue;
            }
            if heap && let Some(deferred) = &mut self.heap_deferred {
                deferred.push((path.to_path_buf(), set, lib_pid));
                continue;
            }
            if self.layers.holds_back(set) {
                self.layer_found(path, &elf, set, (lib_pid, timing));
                continue;
            }
            let attached = if heap {
                self.attach_switch_out()
            } else {
                Ok(())
            };
            match attached.and_then(|()| self.attach_first(path, &elf, set, lib_pid)) {
                Ok(()) => roles.push(set.role.into()),
                Err(e) => self.not_probed(path, set.role, &e),
            }
        }
        if let Some(step) = self.step_symbol.clone()
            && let Some(f) = elf.function(&step)
        {
            let at = std::iter::once((f.file_offset, None));
            self.attach_points(path, "step_enter", at, UProbeScope::AllProcesses)?;
            self.attached.push(AttachedFn {
                function: step,
                library: path.to_path_buf(),
                offset: 0,
                reason: "step boundary (--step-symbol)".into(),
            });
            roles.push("step".into());
        }
        self.remember_ahead(path, (&markers, &defined), &roles, timing);
        if !roles.is_empty() {
            tracing::info!(library = %path.display(), ?roles, ?timing, "probed");
            self.libraries.push(Library {
                path: path.to_path_buf(),
                roles,
                timing,
                pid: lib_pid,
            });
        }
        Ok(())
    }

    /// Probes every file with code that `pid` maps now.
    pub fn attach_code_of(&mut self, pid: u32, timing: Timing) -> Result<(), Error> {
        let maps = crate::procfs::ProcMaps::read(pid).ok_or(Error::NoSuchProcess(pid as i32))?;
        maps.paths()
            .try_for_each(|path| self.attach_code(Path::new(&**path), pid, timing))
    }

    /// Native stacks only (`--no-python-stacks`).
    pub fn skip_python(&mut self) {
        self.no_python = true;
    }

    /// Has the kernel side walk `pid`'s Python frames at each event with a stack, when it runs a
    /// CPython whose layout is known.
    fn walk_python(&mut self, pid: u32) {
        let Some(found) = crate::python::interp::detect(pid) else {
            return;
        };
        match crate::python::version::Version::of(&found) {
            Ok(v) => {
                let cfg = tracer_common::PyConfig {
                    runtime: found.runtime,
                    ..v.config
                };
                match self.python.insert(&pid, &cfg, 0) {
                    Ok(()) => tracing::info!(pid, path = %found.path, "Python frames walked"),
                    Err(e) => return tracing::warn!(pid, "Python frames not walked: {e}"),
                }
                if let Err(e) = self.settings_changed() {
                    tracing::warn!(
                        pid,
                        "Python frames not walked for threads already seen: {e}"
                    );
                }
            }
            Err(why) => {
                if self.python_unknown.insert(found.version) {
                    tracing::warn!("{why}: native stacks only for {}", found.path);
                }
            }
        }
    }

    /// Marks training steps at each entry of `symbol` (a C name, or a C++/Rust `path::name`), in
    /// whichever traced file defines it.
    pub fn set_step_symbol(&mut self, symbol: &str) {
        self.step_symbol = Some(symbol.to_string());
        if let Err(e) = self.forget_known_files() {
            tracing::warn!("libraries without probes still known to the kernel side: {e}");
        }
    }

    /// Leaves the heap-level probes out (the malloc family, c10::alloc_cpu): only device memory
    /// and pages are traced, at a fraction of the cost.
    pub fn skip_heap(&mut self) {
        self.no_heap = true;
    }

    /// `--heap sampled`: the kernel side records heap allocations at sample points `mean` bytes
    /// apart on average (tensors all), and frees of recorded blocks only.
    pub fn sample_heap(&mut self, mean: u64) -> Result<(), Error> {
        self.set_setting("HEAP_SAMPLING", mean)?;
        self.heap_sampling = mean;
        Ok(())
    }

    /// `--heap sampled`'s mean interval in bytes; 0 when every allocation is recorded.
    pub fn heap_sampling(&self) -> u64 {
        self.heap_sampling
    }

    /// Sets slot 0 of the kernel side's setting array `name`.
    fn set_setting(&mut self, name: &str, value: u64) -> Result<(), Error> {
        let map = self
            .bpf
            .map_mut(name)
            .ok_or_else(|| anyhow::anyhow!("no {name} map"))?;
        let mut array = aya::maps::Array::<_, u64>::try_from(map)
            .map_err(|e| anyhow::anyhow!("{name} map: {e}"))?;
        array
            .set(0, &value, 0)
            .map_err(|e| anyhow::anyhow!("{name} map: {e}"))?;
        Ok(())
    }

    /// `--heap-after`: heap functions found from now on wait for [`Probes::start_heap`].
    pub fn defer_heap(&mut self) {
        self.heap_deferred = Some(Vec::new());
    }

    /// `--heap-after N` with `--step-symbol`: the thread entering step N is stopped (in a held
    /// process) until the heap probes are in, so that they see all of step N.
    pub fn hold_heap_at_step(&mut self, step: u64) -> Result<(), Error> {
        self.set_setting("HEAP_STEP", step)
    }

    /// `--heap-after`: probes the heap functions found so far (and from now on, as they are
    /// found), `after_s` seconds into tracing. A library that cannot be probed is said and left.
    pub fn start_heap(&mut self, after_s: f64) {
        for (path, set, pid) in self.heap_deferred.take().unwrap_or_default() {
            let attached = elf::ElfFile::open(&path)
                .map_err(|e| Error::Other(e.into()))
                .and_then(|elf| {
                    self.attach_switch_out()?; // every set held back is a heap set
                    self.attach_first(&path, &elf, set, pid)
                });
            if let Err(e) = attached {
                self.not_probed(&path, set.role, &e);
                continue;
            }
            tracing::info!(library = %path.display(), role = set.role, after_s, "heap probes in");
            self.libraries.push(Library {
                path,
                roles: vec![set.role.into()],
                timing: Timing::HeapAfter { after_s },
                pid,
            });
        }
    }

    /// The programs loaded so far: kernel id and name (for [`cost::read`]).
    pub fn loaded_programs(&self) -> Vec<(u32, String)> {
        self.bpf
            .programs()
            .filter_map(|(name, p)| Some((p.info().ok()?.id(), name.to_string())))
            .collect()
    }

    /// Whether heap probes are left out (`--no-heap`).
    pub fn heap_skipped(&self) -> bool {
        self.no_heap
    }

    /// Whether a libc's malloc family is probed (or is to be, with `--heap-after`).
    pub fn has_heap(&self) -> bool {
        let deferred = self.heap_deferred.iter().flatten();
        self.libraries
            .iter()
            .any(|l| l.roles.iter().any(|r| r == HEAP.role))
            || deferred
                .into_iter()
                .any(|(_, set, _)| set.role == HEAP.role)
            || self
                .layers
                .waiting
                .iter()
                .any(|w| w.placed.role == HEAP.role)
    }

    /// Adds `pid` to the kernel's traced set (its children follow automatically). `held`: user
    /// space holds it with ptrace, so the kernel side may stop it for new code.
    pub fn trace_pid(&mut self, pid: u32, held: bool) -> Result<(), Error> {
        let flags = if held {
            TRACED_ON | TRACED_HOLD
        } else {
            TRACED_ON
        };
        self.traced
            .insert(&pid, &flags, 0)
            .map_err(|e| anyhow::anyhow!("adding pid {pid} to the traced map: {e}"))?;
        self.own_process(pid);
        self.choose_unwind(pid);
        Ok(())
    }

    /// After a change to a process's settings in the kernel's maps: threads that looked before it
    /// look again.
    fn settings_changed(&mut self) -> Result<(), Error> {
        self.settings_changed += 1;
        self.set_setting("PROC_GEN", self.settings_changed)
    }

    /// `--unwind`.
    pub fn set_unwind(&mut self, unwind: HeapUnwind) {
        self.unwind = unwind;
    }

    /// Sets how `pid`'s heap stacks are taken, from the executable it runs now (at its exec, at
    /// adoption): `TRACED_CFI` or `TRACED_LEAF` in its traced flags, or neither; and under
    /// `--heap auto` whether its malloc family is traced from the start (layers.rs).
    pub fn choose_unwind(&mut self, pid: u32) {
        let Some(exe) = crate::procfs::executable(pid) else {
            return; // gone
        };
        let traits = *self
            .code_traits
            .entry(exe.clone())
            .or_insert_with(|| frames::CodeTraits::of(&exe));
        let stacks = traits.map_or(frames::HeapStacks::Walk, |t| t.heap_stacks(self.unwind));
        let Ok(flags) = self.traced.get(&pid, 0) else {
            return; // not traced (any more)
        };
        let python = traits.is_some_and(|t| t.python);
        // A command launched is held before its exec, as a copy of leaktracer: its exec decides.
        let before_exec = std::env::current_exe().is_ok_and(|own| own == exe);
        let new = if before_exec {
            stacks.flags(flags)
        } else {
            self.layer_flags(pid, stacks.flags(flags), python)
        };
        if new == flags {
            return;
        }
        // Only while it is traced: an exit may have removed it.
        if self.traced.insert(&pid, &new, BPF_EXIST).is_err() {
            return;
        }
        tracing::info!(pid, exe = %exe.display(), ?traits, ?stacks, "heap stacks");
        if let Err(e) = self.settings_changed() {
            tracing::warn!(pid, "heap stacks of threads already seen not changed: {e}");
        }
    }

    /// Has heap records of `tgid` whose allocator returns to `ip` copy `bytes` of stack.
    pub fn hint_copy(&mut self, tgid: u32, ip: u64, bytes: u32) {
        let key = tracer_common::DeepHintKey { tgid, pad: 0, ip };
        if let Err(e) = self.deep_hints.insert(&key, &bytes, 0) {
            tracing::debug!(tgid, ip, "copy hint not set: {e}");
        }
    }

    /// Stops the kernel side from stopping threads for new code (before the holder goes away).
    pub fn release_holds(&mut self) {
        let pids: Vec<u32> = self.traced.keys().filter_map(Result::ok).collect();
        for pid in pids {
            if let Ok(flags) = self.traced.get(&pid, 0) {
                let _ = self.traced.insert(&pid, &(flags & !TRACED_HOLD), BPF_EXIST);
            }
        }
    }

    /// The functions probed so far and where.
    pub fn attached(&self) -> &[AttachedFn] {
        &self.attached
    }

    /// The libraries probed so far, and when.
    pub fn libraries(&self) -> &[Library] {
        &self.libraries
    }

    pub fn failures(&self) -> &[ProbeFailure] {
        &self.failures
    }

    /// Says and keeps (once per library and role) that `role`'s probes could not go into
    /// `library`: the reports name it, and `check` does not pass a run it could not see whole.
    fn not_probed(&mut self, library: &Path, role: &'static str, e: &Error) {
        tracing::warn!(library = %library.display(), role, error = %e, "not probed: its calls are not traced");
        if !self
            .failures
            .iter()
            .any(|f| f.library == library && f.role == role)
        {
            self.failures.push(ProbeFailure {
                library: library.to_path_buf(),
                role: role.into(),
                error: e.to_string(),
            });
        }
    }

    /// Hands the event ring buffer, the counters and the log buffer to the consumer.
    pub fn take_channels(&mut self) -> Result<KernelChannels, Error> {
        KernelChannels::take(&mut self.bpf, self.heap_sampling)
    }
}

fn program<'a, T>(bpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, Error>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = bpf
        .program_mut(name)
        .ok_or_else(|| anyhow::anyhow!("program {name} missing from the object"))?;
    prog.try_into()
        .map_err(|e| anyhow::anyhow!("program {name}: {e}").into())
}

/// Maps a load failure to the error the user can act on.
fn load_error(e: aya::EbpfError) -> Error {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    let denied = text.contains("Operation not permitted") || text.contains("Permission denied");
    if denied {
        Error::Permission(text)
    } else {
        Error::Kernel(format!("loading the eBPF programs failed: {text}"))
    }
}
