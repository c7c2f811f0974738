//! The CUDA side of a report: failed allocation calls with their stacks and error names, and each
//! process's device-memory bookkeeping.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use tracer_common::AllocFn;

use super::ProcReport;
use crate::{
    gpu::Sample,
    ledger::{Failure, Ledger, Process},
    symbolize::{SymFrame, Symbolizer},
};

/// Device memory traced through CUDA calls beside what the driver reports (NVML).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuReport {
    pub nvml: Sample,
    /// Traced processes with device memory, traced or seen by NVML.
    pub processes: Vec<GpuProcess>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// Device memory outstanding from traced CUDA calls (device kind: blocks and physical handles).
    pub traced_bytes: u64,
    /// Managed memory outstanding (resident on the GPU or not; NVML may count part of it).
    pub managed_bytes: u64,
    /// Of the device memory, what PyTorch's caching allocator has handed out (blocks: tensors);
    /// the rest of its segments is cache.
    pub torch_block_bytes: u64,
    /// What NVML says the process holds on its GPUs; null without NVML. For a process that has
    /// exited, the last figure taken while it lived.
    pub nvml_bytes: Option<u64>,
    /// When NVML's figure was taken, in seconds since the session began; null without NVML.
    #[serde(default)]
    pub nvml_at_s: Option<f64>,
    /// The process's traced device memory when NVML's figure was taken.
    #[serde(default)]
    pub nvml_traced_bytes: Option<u64>,
    /// NVML minus traced, both when NVML's figure was taken: the CUDA context, fragmentation,
    /// allocations leaktracer did not see.
    pub unexplained_bytes: Option<i64>,
}

pub fn gpu(processes: &[ProcReport], nvml: Sample) -> GpuReport {
    let processes = processes
        .iter()
        .filter_map(|p| {
            let reading = nvml.reading_for(p.pid, p.exited);
            let nvml_bytes = reading.map(|r| r.bytes);
            let (traced, managed) = (p.own.device.bytes, p.own.managed.bytes);
            let seen = traced > 0 || managed > 0 || nvml_bytes.is_some_and(|b| b > 0);
            seen.then(|| GpuProcess {
                pid: p.pid,
                traced_bytes: traced,
                managed_bytes: managed,
                torch_block_bytes: p.own.torch_block.bytes,
                nvml_bytes,
                nvml_at_s: reading.map(|r| r.at_s),
                nvml_traced_bytes: reading.map(|r| r.traced_bytes),
                unexplained_bytes: reading.map(|r| r.bytes as i64 - r.traced_bytes as i64),
            })
        })
        .collect();
    GpuReport { nvml, processes }
}

/// One (process, stack, function, error) of failed device allocations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceFailure {
    pub pid: u32,
    pub function: Cow<'static, str>,
    pub code: u32,
    /// The error's name (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY…).
    pub error: String,
    pub calls: u64,
    /// Bytes asked for, summed over the calls.
    pub bytes: u64,
    pub frames: Vec<SymFrame>,
}

/// A process's device memory beyond its blocks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// Device address space mapped onto physical handles (cuMemMap) right now.
    pub mapped_bytes: u64,
    /// Frees, releases and unmaps of something no traced call returned.
    pub unmatched_frees: u64,
}

impl DeviceSummary {
    pub fn of(p: &Process) -> Self {
        Self {
            mapped_bytes: p.device.mapped_bytes(),
            unmatched_frees: p.device.unmatched_frees,
        }
    }
}

pub fn failures(ledger: &Ledger, sym: &mut Symbolizer) -> Vec<DeviceFailure> {
    let mut out: Vec<DeviceFailure> = ledger
        .procs
        .values()
        .flat_map(|p| p.device.failures.iter().map(move |f| (p.pid, f)))
        .map(|(pid, f)| failure(ledger, sym, pid, f))
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    out
}

fn failure(ledger: &Ledger, sym: &mut Symbolizer, pid: u32, f: &Failure) -> DeviceFailure {
    let frames = f
        .stack
        .and_then(|id| ledger.stacks.get(id))
        .map(|(frames, _)| sym.stack(&frames))
        .unwrap_or_default();
    DeviceFailure {
        pid,
        function: f.func.name().into(),
        code: f.code,
        error: error_name(f.func, f.code),
        calls: f.calls,
        bytes: f.bytes,
        frames,
    }
}

/// The name of a CUDA error code: cudaError_t for runtime calls, CUresult for driver calls.
pub fn error_name(func: AllocFn, code: u32) -> String {
    let runtime = func.name().starts_with("cuda");
    let name = match (runtime, code) {
        (true, 1) => "cudaErrorInvalidValue",
        (true, 2) => "cudaErrorMemoryAllocation",
        (true, 3) => "cudaErrorInitializationError",
        (true, 35) => "cudaErrorInsufficientDriver",
        (true, 100) => "cudaErrorNoDevice",
        (true, 101) => "cudaErrorInvalidDevice",
        (true, 700) => "cudaErrorIllegalAddress",
        (true, 999) => "cudaErrorUnknown",
        (false, 1) => "CUDA_ERROR_INVALID_VALUE",
        (false, 2) => "CUDA_ERROR_OUT_OF_MEMORY",
        (false, 3) => "CUDA_ERROR_NOT_INITIALIZED",
        (false, 4) => "CUDA_ERROR_DEINITIALIZED",
        (false, 100) => "CUDA_ERROR_NO_DEVICE",
        (false, 101) => "CUDA_ERROR_INVALID_DEVICE",
        (false, 201) => "CUDA_ERROR_INVALID_CONTEXT",
        (false, 999) => "CUDA_ERROR_UNKNOWN",
        _ => return format!("error {code}"),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    use tracer_common::AllocFn;

    #[test]
    fn errors_are_named_by_api() {
        assert_eq!(
            super::error_name(AllocFn::CudaMalloc, 2),
            "cudaErrorMemoryAllocation"
        );
        assert_eq!(
            super::error_name(AllocFn::CuMemCreate, 2),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(super::error_name(AllocFn::CuMemAlloc, 77), "error 77");
    }
}
