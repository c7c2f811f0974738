//! What memory is: the [`Kind`] an allocation was seen at, and the [`GroupKey`] that names one
//! group of outstanding memory (process, stack, kind, inherited) in every stage.

use serde::Serialize;
use tracer_common::AllocFn;

use super::StackId;

/// The level an allocation was seen at.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
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
    #[serde(alias = "torchblock")]
    TorchBlock,
    /// Python objects from CPython's object allocator (pymalloc), inside its arenas (which are
    /// `Mmap`): sampled in a bounded window, estimated bytes.
    Object,
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
            Some(f) if f.is_object() => Self::Object,
            _ => Self::Heap,
        }
    }

    /// The kind's name in reports (the same as its serialized name: one name everywhere).
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
            Kind::Object => "object",
        }
    }

    /// Every kind, in report order.
    pub const ALL: [Kind; 9] = [
        Kind::Heap,
        Kind::Mmap,
        Kind::Brk,
        Kind::Tensor,
        Kind::Device,
        Kind::Managed,
        Kind::Pinned,
        Kind::TorchBlock,
        Kind::Object,
    ];
}

/// One group of outstanding memory: a process's blocks of one kind from one stack, its own or
/// inherited at fork. The ledger sums by it, the analysis keeps a series per it, the report and
/// the API name a stack's series by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub pid: u32,
    pub stack: Option<StackId>,
    pub kind: Kind,
    pub inherited: bool,
}

#[cfg(test)]
mod tests {
    use super::Kind;

    #[test]
    fn a_kind_has_one_name_in_reports_totals_and_json() {
        for k in Kind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
            assert_eq!(serde_json::from_value::<Kind>(k.name().into()).unwrap(), k);
        }
        let old: Kind = serde_json::from_value("torchblock".into()).unwrap();
        assert_eq!(
            old,
            Kind::TorchBlock,
            "histories stored before keep loading"
        );
    }
}
