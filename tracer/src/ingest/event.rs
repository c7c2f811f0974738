//! What ingest hands the ledger: typed events, in order. The kernel's records overload their fields
//! (`aux` is mmap's flags and protection, a fork's child, a CUDA error code, a handle); they are
//! read here, once, so nothing downstream knows the ABI.

use std::sync::Arc;

use tracer_common::{AllocFn, EventKind, MAPPED_BY_ALLOCATOR};

use crate::{
    model::{Frame, StackId},
    probes::KernelCounters,
};

/// Something that happened in a traced process.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub tgid: u32,
    /// The thread, where the record names it (0 where not).
    pub tid: u32,
    /// The kernel's monotonic clock at the event.
    pub ts_ns: u64,
    /// The function called, where the event is a call (malloc, cudaMalloc, mmap…).
    pub func: Option<AllocFn>,
    /// The call's stack, where one was taken.
    pub stack: Option<StackId>,
    pub what: What,
}

/// The events, each with what it means.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// A block of `size` bytes at `addr`: from the malloc family, a CPU tensor or a CUDA
    /// allocation (the kind follows the function). Under `--heap sampled` a heap block's size
    /// is the bytes it stands for.
    Alloc {
        addr: u64,
        size: u64,
    },
    /// The block at `addr` released (free, cudaFree, the caching allocator's free…).
    Free {
        addr: u64,
    },
    /// realloc: `old` (0: none) became `addr` (0: freed or failed) of `size` bytes.
    Realloc {
        old: u64,
        addr: u64,
        size: u64,
    },
    /// A CUDA allocation of `size` bytes that failed with error `code`.
    AllocFailed {
        code: u32,
        size: u64,
    },
    /// cuMemMap: `size` bytes at `addr` backed by physical allocation `handle`.
    DeviceMap {
        addr: u64,
        size: u64,
        handle: u64,
    },
    /// cuMemUnmap of the range at `addr`.
    DeviceUnmap {
        addr: u64,
    },
    /// A new mapping of `len` bytes; `no_access`: PROT_NONE (reserved address space).
    Mmap {
        addr: u64,
        len: u64,
        anonymous: bool,
        no_access: bool,
        /// Made inside an allocator call: anonymous and without access, an allocator's heap
        /// reserved (glibc's thread arenas).
        by_allocator: bool,
    },
    /// mprotect: `no_access` turns memory back into reserved address space.
    Mprotect {
        addr: u64,
        len: u64,
        no_access: bool,
    },
    Munmap {
        addr: u64,
        len: u64,
    },
    Mremap {
        old: u64,
        old_len: u64,
        addr: u64,
        len: u64,
    },
    /// The program break moved to `result`.
    Brk {
        result: u64,
    },
    /// A new process `child` (`shares_vm`: a thread-like clone that shares the address space),
    /// with its command line read while it lived.
    Fork {
        child: u32,
        shares_vm: bool,
        command: Option<String>,
    },
    /// A new program image, with its command line and allocator settings.
    Exec {
        command: Option<String>,
        env: Option<Vec<(String, String)>>,
    },
    Exit,
    /// A thread of the process exited (not its last), after its frees.
    ThreadExit,
    /// An entry of the `--step-symbol` function.
    Step,
    /// The interpreter began its exit (`Py_FinalizeEx`).
    Finalize,
}

impl What {
    /// An event of the page level (mmap, munmap, mprotect, mremap, brk).
    pub fn is_page_level(&self) -> bool {
        matches!(
            self,
            What::Mmap { .. }
                | What::Mprotect { .. }
                | What::Munmap { .. }
                | What::Mremap { .. }
                | What::Brk { .. }
        )
    }
}

/// A raw record's fields, as the kernel sent them (the size already scaled when sampled).
pub(super) struct Raw {
    pub kind: EventKind,
    pub addr: u64,
    pub size: u64,
    pub old_addr: u64,
    pub old_size: u64,
    pub aux: u64,
}

const CLONE_VM: u64 = 0x100;
const MAP_ANONYMOUS: u64 = 0x20;

impl Raw {
    /// The event this record means; `None` for records ingest consumes itself (Python frames,
    /// heap records and batched frees are decoded into other events first).
    pub fn what(
        &self,
        command: Option<String>,
        env: Option<Vec<(String, String)>>,
    ) -> Option<What> {
        Some(match self.kind {
            EventKind::PyFrames
            | EventKind::HeapAlloc
            | EventKind::HeapAllocLeaf
            | EventKind::Frees => return None,
            EventKind::Alloc => What::Alloc {
                addr: self.addr,
                size: self.size,
            },
            EventKind::Free => What::Free {
                addr: self.old_addr,
            },
            EventKind::Realloc => What::Realloc {
                old: self.old_addr,
                addr: self.addr,
                size: self.size,
            },
            EventKind::AllocFailed => What::AllocFailed {
                code: self.aux as u32,
                size: self.size,
            },
            EventKind::DeviceMap => What::DeviceMap {
                addr: self.addr,
                size: self.size,
                handle: self.aux,
            },
            EventKind::DeviceUnmap => What::DeviceUnmap {
                addr: self.old_addr,
            },
            EventKind::Mmap => What::Mmap {
                addr: self.addr,
                len: self.size,
                anonymous: self.aux & MAP_ANONYMOUS != 0,
                // The protection is in bits 32..40; PROT_NONE is 0.
                no_access: (self.aux >> 32) & 0xff == 0,
                by_allocator: self.aux & MAPPED_BY_ALLOCATOR != 0,
            },
            EventKind::Mprotect => What::Mprotect {
                addr: self.old_addr,
                len: self.old_size,
                no_access: self.aux == 0,
            },
            EventKind::Munmap => What::Munmap {
                addr: self.old_addr,
                len: self.old_size,
            },
            EventKind::Mremap => What::Mremap {
                old: self.old_addr,
                old_len: self.old_size,
                addr: self.addr,
                len: self.size,
            },
            EventKind::Brk => What::Brk { result: self.addr },
            EventKind::Fork => What::Fork {
                child: self.aux as u32,
                shares_vm: self.size & CLONE_VM != 0,
                command,
            },
            EventKind::Exec => What::Exec { command, env },
            EventKind::Exit => What::Exit,
            EventKind::ThreadExit => What::ThreadExit,
            EventKind::Step => What::Step,
            EventKind::Finalize => What::Finalize,
        })
    }
}

/// Entries in use in the tables that drop what does not fit.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fill {
    /// Distinct stacks interned by ingest, now and at most.
    pub stacks: u64,
    pub stacks_peak: u64,
    /// `--heap sampled`: recorded blocks in the kernel's table (SAMPLED).
    pub sampled: u64,
}

/// What ingest sends to the ledger, in order.
#[derive(Debug)]
pub enum Input {
    /// A stack seen for the first time; always precedes the first event that uses it.
    Stack {
        id: StackId,
        frames: Arc<[Frame]>,
        truncated: bool,
    },
    Event(Event),
    Kernel(KernelCounters),
    /// User-space losses counted by ingest.
    IngestLoss {
        stack_table_full: u64,
        undecodable: u64,
    },
    /// How full the tables that can overflow are.
    Fill(Fill),
}

/// Inputs are sent in batches: one channel operation per drained chunk, not per event.
pub type Batch = Vec<Input>;
