//! The single owner of tracing state: processes and their outstanding allocations, the stack table,
//! and every loss counter. Fed in order by ingest; queried for aggregates by the report.

mod blocks;
mod device;
mod process;
mod regions;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Serialize;
use tracer_common::{AllocFn, EventKind};

pub use device::{Device, Failure};
pub use process::{Mismatches, Process, page_up};

use crate::ingest::{Decoded, Input, KernelCounters, StackId, StackTable};

/// Where a piece of memory came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub stack: Option<StackId>,
    pub ts_ns: u64,
    pub func: Option<AllocFn>,
    /// Copied from the parent at fork.
    pub inherited: bool,
}

/// The level an allocation was seen at.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Heap,
    Mmap,
    Brk,
    /// CPU tensor memory from PyTorch's allocator (c10::alloc_cpu), a part of the heap told apart.
    Tensor,
    /// CUDA device memory (cudaMalloc*, cuMemAlloc*, cuMemCreate).
    Device,
    /// CUDA managed (unified) memory.
    Managed,
    /// Page-locked host memory from CUDA (cudaMallocHost, cudaHostAlloc, cuMemHostAlloc…).
    Pinned,
    /// Blocks PyTorch's CUDA caching allocator handed out (tensors), inside the segments it
    /// reserved (which are `Device`): device minus these is what the cache holds.
    TorchBlock,
}

impl Kind {
    /// The kind of a block returned by `func`.
    pub fn of(func: Option<AllocFn>) -> Self {
        use AllocFn::*;
        match func {
            Some(C10AllocCpu) => Self::Tensor,
            Some(TorchCudaMalloc) => Self::TorchBlock,
            Some(CudaMallocManaged) => Self::Managed,
            Some(CudaMallocHost | CudaHostAlloc | CuMemAllocHost | CuMemHostAlloc) => Self::Pinned,
            Some(f) if f.is_cuda() => Self::Device,
            _ => Self::Heap,
        }
    }

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Heap => "heap",
            Kind::Mmap => "mmap",
            Kind::Brk => "brk",
            Kind::Tensor => "tensor",
            Kind::Device => "device",
            Kind::Managed => "managed",
            Kind::Pinned => "pinned",
            Kind::TorchBlock => "torch_block",
        }
    }

    /// Every kind, in report order.
    pub const ALL: [Kind; 8] = [
        Kind::Heap,
        Kind::Mmap,
        Kind::Brk,
        Kind::Tensor,
        Kind::Device,
        Kind::Managed,
        Kind::Pinned,
        Kind::TorchBlock,
    ];
}

/// Outstanding memory of one (process, stack, kind, inherited) group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub pid: u32,
    pub stack: Option<StackId>,
    pub kind: Kind,
    pub inherited: bool,
    pub bytes: u64,
    pub blocks: u64,
    pub oldest_ns: u64,
    pub funcs: Vec<AllocFn>,
}

/// Losses seen outside the kernel.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct IngestLosses {
    pub stack_table_full: u64,
    pub undecodable: u64,
}

/// All tracing state.
#[derive(Default)]
pub struct Ledger {
    pub procs: BTreeMap<u32, Process>,
    pub stacks: StackTable,
    pub kernel: KernelCounters,
    pub ingest: IngestLosses,
    /// How full the tables that can overflow were, last ingest said.
    pub fill: crate::ingest::Fill,
    pub events: u64,
    /// Step boundaries seen (entries of the `--step-symbol` function).
    pub steps: u64,
}

const CLONE_VM: u64 = 0x100;
const MAP_ANONYMOUS: u64 = 0x20;

impl Ledger {
    /// Registers a root process (the launched command or the attached pid).
    pub fn add_root(&mut self, pid: u32, command: String, env: Vec<(String, String)>, now_ns: u64) {
        let p = self.procs.entry(pid).or_insert_with(|| Process {
            allocator_env: env,
            ..Process::new(pid, None, command.clone(), now_ns)
        });
        // Adopted by `serve` after its first events arrived: those named no command.
        if p.command.is_empty() {
            p.command = command;
        }
    }

    pub fn apply(&mut self, input: Input) {
        match input {
            Input::Stack {
                id,
                frames,
                truncated,
            } => self.stacks.insert(id, frames, truncated),
            Input::Event(ev) => self.apply_event(ev),
            Input::Kernel(k) => self.kernel = k,
            Input::Fill(f) => self.fill = f,
            Input::IngestLoss {
                stack_table_full,
                undecodable,
            } => {
                self.ingest = IngestLosses {
                    stack_table_full,
                    undecodable,
                }
            }
        }
    }

    fn apply_event(&mut self, ev: Decoded) {
        self.events += 1;
        if ev.kind == EventKind::Step {
            self.steps += 1;
            return;
        }
        if ev.kind == EventKind::Fork {
            return self.fork(&ev);
        }
        let origin = Origin {
            stack: ev.stack,
            ts_ns: ev.ts_ns,
            func: ev.func,
            inherited: false,
        };
        let p = self.procs.entry(ev.tgid).or_insert_with(|| {
            Process::new(
                ev.tgid,
                None,
                ev.command.clone().unwrap_or_default(),
                ev.ts_ns,
            )
        });
        let cuda = ev.func.filter(|f| f.is_cuda() || f.is_torch_cuda());
        match ev.kind {
            // Consumed by ingest: never applied.
            EventKind::PyFrames | EventKind::HeapAlloc | EventKind::Frees => {}
            EventKind::Alloc if cuda.is_some() => p.device.alloc(ev.addr, ev.size, origin),
            EventKind::Free if let Some(f) = cuda => p.device.free(f, ev.old_addr),
            EventKind::AllocFailed => {
                let func = ev.func.unwrap_or(AllocFn::CudaMalloc);
                p.device.failed(ev.stack, func, ev.aux as u32, ev.size)
            }
            EventKind::DeviceMap => p.device.map(ev.addr, ev.size, ev.aux),
            EventKind::DeviceUnmap => p.device.unmap(ev.old_addr),
            EventKind::Alloc => p.alloc(ev.addr, ev.size, origin),
            EventKind::Free => p.free(ev.old_addr),
            EventKind::Realloc => p.realloc(ev.old_addr, ev.addr, ev.size, origin),
            EventKind::Mmap => {
                let (anon, no_access) = (ev.aux & MAP_ANONYMOUS != 0, ev.aux >> 32 == 0);
                p.mmap(ev.addr, ev.size, anon, no_access, origin)
            }
            EventKind::Mprotect => p.mprotect(ev.old_addr, ev.old_size, ev.aux),
            EventKind::Munmap => p.munmap(ev.old_addr, ev.old_size),
            EventKind::Mremap => p.mremap(ev.old_addr, ev.old_size, ev.addr, ev.size),
            EventKind::Brk => p.brk(ev.addr, origin),
            EventKind::Exec => p.exec(ev.command, ev.env),
            EventKind::Exit => p.exited_ns = Some(ev.ts_ns),
            EventKind::Fork | EventKind::Step => {}
        }
    }

    fn fork(&mut self, ev: &Decoded) {
        let child = ev.aux as u32;
        let shares_vm = ev.size & CLONE_VM != 0;
        let proc = match self.procs.get(&ev.tgid) {
            Some(parent) if !shares_vm => {
                Process::forked_from(parent, child, ev.command.clone(), ev.ts_ns)
            }
            Some(parent) => Process::new(child, Some(parent.pid), parent.command.clone(), ev.ts_ns),
            None => Process::new(
                child,
                Some(ev.tgid),
                ev.command.clone().unwrap_or_default(),
                ev.ts_ns,
            ),
        };
        self.procs.insert(child, proc);
    }

    /// Outstanding memory grouped by (process, stack, kind, inherited), largest first.
    /// Outstanding bytes per group, unsorted: what sampling needs, without the rest of a Group.
    pub fn group_bytes(&self) -> Vec<(crate::analysis::GroupKey, u64)> {
        let mut acc: rustc_hash::FxHashMap<(u32, Option<StackId>, Kind, bool), u64> =
            rustc_hash::FxHashMap::default();
        for p in self.procs.values() {
            p.for_each_live(|kind, bytes, o| {
                *acc.entry((p.pid, o.stack, kind, o.inherited)).or_default() += bytes;
            });
        }
        acc.into_iter().collect()
    }

    pub fn groups(&self) -> Vec<Group> {
        let mut acc: rustc_hash::FxHashMap<(u32, Option<StackId>, Kind, bool), Group> =
            rustc_hash::FxHashMap::default();
        for p in self.procs.values() {
            p.for_each_live(|kind, bytes, o| {
                let g = acc
                    .entry((p.pid, o.stack, kind, o.inherited))
                    .or_insert_with(|| Group {
                        pid: p.pid,
                        stack: o.stack,
                        kind,
                        inherited: o.inherited,
                        bytes: 0,
                        blocks: 0,
                        oldest_ns: o.ts_ns,
                        funcs: Vec::new(),
                    });
                g.bytes += bytes;
                g.blocks += 1;
                g.oldest_ns = g.oldest_ns.min(o.ts_ns);
                if let Some(f) = o.func
                    && !g.funcs.contains(&f)
                {
                    g.funcs.push(f);
                }
            });
        }
        let mut groups: Vec<Group> = acc.into_values().collect();
        groups.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.pid.cmp(&b.pid))
                .then(a.stack.cmp(&b.stack))
        });
        groups
    }
}
