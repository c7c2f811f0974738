//! Loading the eBPF object, attaching its programs, and owning the links for the tracer's
//! lifetime. Also the checks that turn a missing privilege or kernel feature into a clear error.

pub mod elf;
pub mod placement;
pub mod tracefs;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{TracePoint, UProbe, uprobe::UProbeScope},
};
use iced_x86::Register;
use serde::Serialize;

use crate::error::Error;

/// Whether the programs do the work or are empty (the probe floor, for the benchmark).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Full,
    Bare,
}

/// One heap function as probed: where, and why there.
#[derive(Clone, Debug, Serialize)]
pub struct AttachedFn {
    pub function: String,
    pub library: PathBuf,
    pub offset: u64,
    pub reason: &'static str,
}

/// A heap function leaktracer probes: its name, entry program and argument registers.
struct HeapFn {
    name: &'static str,
    entry: &'static str,
    args: &'static [Register],
    returns: bool,
}

const fn heap_fn(
    name: &'static str,
    entry: &'static str,
    args: &'static [Register],
    returns: bool,
) -> HeapFn {
    HeapFn {
        name,
        entry,
        args,
        returns,
    }
}

const RDI: &[Register] = &[Register::RDI];
const RDI_RSI: &[Register] = &[Register::RDI, Register::RSI];
const RDI_RSI_RDX: &[Register] = &[Register::RDI, Register::RSI, Register::RDX];

const HEAP_FNS: &[HeapFn] = &[
    heap_fn("malloc", "malloc_enter", RDI, true),
    heap_fn("calloc", "calloc_enter", RDI_RSI, true),
    heap_fn("realloc", "realloc_enter", RDI_RSI, true),
    heap_fn("reallocarray", "reallocarray_enter", RDI_RSI_RDX, true),
    heap_fn("posix_memalign", "posix_memalign_enter", RDI_RSI_RDX, true),
    heap_fn("aligned_alloc", "aligned_alloc_enter", RDI_RSI, true),
    heap_fn("memalign", "memalign_enter", RDI_RSI, true),
    heap_fn("valloc", "valloc_enter", RDI, true),
    heap_fn("pvalloc", "pvalloc_enter", RDI, true),
    heap_fn("free", "free_enter", RDI, false),
    // Syscall wrappers probed so their page-level events carry the caller's stack.
    heap_fn("sbrk", "sbrk_enter", &[], true),
    heap_fn("mremap", "mremap_wrapper_enter", &[], true),
];

/// (program, category, tracepoint)
const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("mmap_enter", "syscalls", "sys_enter_mmap"),
    ("mmap_exit", "syscalls", "sys_exit_mmap"),
    ("munmap_enter", "syscalls", "sys_enter_munmap"),
    ("munmap_exit", "syscalls", "sys_exit_munmap"),
    ("mprotect_enter", "syscalls", "sys_enter_mprotect"),
    ("mprotect_exit", "syscalls", "sys_exit_mprotect"),
    ("mremap_enter", "syscalls", "sys_enter_mremap"),
    ("mremap_exit", "syscalls", "sys_exit_mremap"),
    ("brk_enter", "syscalls", "sys_enter_brk"),
    ("brk_exit", "syscalls", "sys_exit_brk"),
    ("task_newtask", "task", "task_newtask"),
    ("process_exec", "sched", "sched_process_exec"),
    ("process_exit", "sched", "sched_process_exit"),
];

/// The loaded eBPF object and everything attached from it. Dropping it detaches all probes.
pub struct Probes {
    bpf: Ebpf,
    mode: Mode,
    traced: BpfHashMap<MapData, u32, u32>,
    attached: Vec<AttachedFn>,
    libraries: Vec<PathBuf>,
}

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Root of /sys, overridable so the tests can show the errors of a kernel without BTF or uprobes.
fn sysfs() -> PathBuf {
    std::env::var_os("LEAKTRACER_SYSFS").map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// `LEAKTRACER_PROBE_AT_ENTRY=1` puts every probe at offset 0 (to measure what placement saves).
fn probe_at_entry() -> bool {
    std::env::var("LEAKTRACER_PROBE_AT_ENTRY").is_ok_and(|v| v == "1")
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
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let need = (1u64 << 39) | (1 << 38) | (1 << 21);
    cap_eff & need == need
}

impl Probes {
    /// Loads the object with the tracepoint field offsets of this kernel and attaches the page-level
    /// and process tracepoints. Heap probes come with [`Probes::attach_heap`].
    pub fn load(mode: Mode) -> Result<Self, Error> {
        check_environment()?;
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
            .load(OBJECT)
            .map_err(load_error)?;
        let traced = BpfHashMap::try_from(
            bpf.take_map("TRACED")
                .ok_or_else(|| anyhow::anyhow!("no TRACED map"))?,
        )
        .map_err(|e| anyhow::anyhow!("TRACED map: {e}"))?;
        let mut probes = Self {
            bpf,
            mode,
            traced,
            attached: Vec::new(),
            libraries: Vec::new(),
        };
        if mode == Mode::Full {
            probes.attach_tracepoints()?;
        }
        Ok(probes)
    }

    fn attach_tracepoints(&mut self) -> Result<(), Error> {
        for (prog, category, name) in TRACEPOINTS {
            let tp: &mut TracePoint = program(&mut self.bpf, prog)?;
            tp.load().map_err(|e| load_error(e.into()))?;
            tp.attach(category, name).map_err(|e| {
                Error::Kernel(format!("attaching tracepoint {category}:{name}: {e}"))
            })?;
        }
        Ok(())
    }

    /// Probes the malloc family in `library` (a libc), for every process, filtered in the kernel.
    pub fn attach_heap(&mut self, library: &Path) -> Result<(), Error> {
        if self.libraries.iter().any(|l| l == library) {
            return Ok(());
        }
        let elf = elf::ElfFile::open(library)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", library.display()))?;
        let mut seen_addrs = Vec::new();
        for f in HEAP_FNS {
            let Some(func) = elf.function(f.name) else {
                tracing::warn!(function = f.name, library = %library.display(), "symbol not found: not probed");
                continue;
            };
            if seen_addrs.contains(&func.addr) {
                // An alias (glibc's aligned_alloc is memalign): one probe already covers it.
                continue;
            }
            seen_addrs.push(func.addr);
            let place = if probe_at_entry() {
                placement::Placement {
                    offset: 0,
                    reason: "LEAKTRACER_PROBE_AT_ENTRY set",
                }
            } else {
                placement::choose(&func.code, func.addr, f.args)
            };
            tracing::info!(
                function = f.name,
                offset = place.offset,
                reason = place.reason,
                "probe placement"
            );
            self.attach_fn(library, f, place.offset)?;
            self.attached.push(AttachedFn {
                function: f.name.into(),
                library: library.to_path_buf(),
                offset: place.offset,
                reason: place.reason,
            });
        }
        self.libraries.push(library.to_path_buf());
        Ok(())
    }

    /// Probes the malloc family in every libc mapped by `pid`; fails when it maps none.
    pub fn attach_libc_of(&mut self, pid: u32) -> Result<(), Error> {
        let maps = crate::ingest::maps::ProcMaps::read(pid);
        let libcs = maps.map(|m| m.libraries("libc.so")).unwrap_or_default();
        if libcs.is_empty() {
            return Err(Error::NoLibc(pid as i32));
        }
        libcs
            .iter()
            .try_for_each(|lib| self.attach_heap(Path::new(&**lib)))
    }

    fn attach_fn(&mut self, library: &Path, f: &HeapFn, offset: u64) -> Result<(), Error> {
        let (entry, ret) = match self.mode {
            Mode::Full => (f.entry, "alloc_return"),
            Mode::Bare => ("bare_enter", "bare_return"),
        };
        let mut points = vec![(entry, f.name)];
        if f.returns {
            points.push((ret, f.name));
        }
        for (prog, sym) in points {
            let up: &mut UProbe = program(&mut self.bpf, prog)?;
            if up.fd().is_err() {
                up.load().map_err(|e| load_error(e.into()))?;
            }
            let at = aya::programs::uprobe::UProbeAttachLocation::SymbolOffset(sym, offset);
            up.attach([at], library, UProbeScope::AllProcesses)
                .map_err(|e| {
                    Error::Kernel(format!(
                        "attaching uprobe {prog} to {sym}+{offset} in {}: {e}",
                        library.display()
                    ))
                })?;
        }
        Ok(())
    }

    /// Adds `pid` to the kernel's traced set (its children follow automatically).
    pub fn trace_pid(&mut self, pid: u32) -> Result<(), Error> {
        self.traced
            .insert(&pid, &1, 0)
            .map_err(|e| anyhow::anyhow!("adding pid {pid} to the traced map: {e}").into())
    }

    /// The heap functions probed so far and where.
    pub fn attached(&self) -> &[AttachedFn] {
        &self.attached
    }

    /// Hands the event ring buffer, the counters and the log buffer to the consumer.
    pub fn take_channels(&mut self) -> Result<crate::ingest::KernelChannels, Error> {
        crate::ingest::KernelChannels::take(&mut self.bpf)
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
