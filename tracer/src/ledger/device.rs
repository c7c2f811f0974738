//! One process's CUDA memory: blocks from the runtime and driver allocators (device, managed,
//! pinned host), physical handles of the virtual memory management API (cuMemCreate, the bytes that
//! count) with where they are mapped (cuMemMap), and the calls that failed. Device memory is not
//! inherited across fork (a CUDA context does not survive it) and ends with exec.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use tracer_common::AllocFn;

use super::{Origin, blocks::Block};
use crate::model::StackId;

/// A cuMemMap of (part of) a physical handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
}

/// Failed allocation calls with one (stack, function, error code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub stack: Option<StackId>,
    pub func: AllocFn,
    pub code: u32,
    pub calls: u64,
    /// Bytes asked for, summed over the calls.
    pub bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Device {
    /// cudaMalloc*, cudaHostAlloc, cuMemAlloc*, cuMemHostAlloc… by address.
    pub blocks: FxHashMap<u64, Block>,
    /// cuMemCreate handles by handle value.
    pub handles: FxHashMap<u64, Block>,
    /// PyTorch caching-allocator blocks by address (a segment's first block shares its address).
    pub torch_blocks: FxHashMap<u64, Block>,
    /// cuMemMap'd ranges by device address.
    pub mapped: BTreeMap<u64, Mapping>,
    pub failures: Vec<Failure>,
    /// Frees (or releases, unmaps) of something no traced call returned.
    pub unmatched_frees: u64,
}

impl Device {
    /// The table `func`'s blocks live in.
    fn table(&mut self, func: AllocFn) -> &mut FxHashMap<u64, Block> {
        match func {
            AllocFn::CuMemCreate | AllocFn::CuMemRelease => &mut self.handles,
            AllocFn::TorchCudaMalloc | AllocFn::TorchCudaFree => &mut self.torch_blocks,
            _ => &mut self.blocks,
        }
    }

    pub fn alloc(&mut self, addr: u64, size: u64, origin: Origin) {
        let table = self.table(origin.func.unwrap_or(AllocFn::CudaMalloc));
        table.insert(addr, Block { size, origin });
    }

    /// A successful free of `addr` by `func` (a handle for cuMemRelease); the freed block's
    /// stack.
    pub fn free(&mut self, func: AllocFn, addr: u64) -> Option<StackId> {
        let table = self.table(func);
        let Some(block) = table.remove(&addr) else {
            self.unmatched_frees += 1;
            return None;
        };
        block.origin.stack
    }

    pub fn failed(&mut self, stack: Option<StackId>, func: AllocFn, code: u32, bytes: u64) {
        match self
            .failures
            .iter_mut()
            .find(|f| f.stack == stack && f.func == func && f.code == code)
        {
            Some(f) => {
                f.calls += 1;
                f.bytes += bytes;
            }
            None => self.failures.push(Failure {
                stack,
                func,
                code,
                calls: 1,
                bytes,
            }),
        }
    }

    pub fn map(&mut self, addr: u64, size: u64, handle: u64) {
        self.mapped.insert(addr, Mapping { size, handle });
    }

    pub fn unmap(&mut self, addr: u64) {
        if self.mapped.remove(&addr).is_none() {
            self.unmatched_frees += 1;
        }
    }

    /// Bytes of device address space mapped onto physical handles right now.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped.values().map(|m| m.size).sum()
    }
}
