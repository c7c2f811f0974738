//! What the NVIDIA driver says each process holds on its GPUs (NVML, through nvml-wrapper), to set
//! beside what leaktracer traced through CUDA calls. The difference is memory no traced call
//! explains: the CUDA context, the allocator's fragmentation, libraries that allocate without the
//! runtime or driver calls leaktracer probes. Without libnvidia-ml (no driver, no GPU) every report
//! says "NVML unavailable" and why; nothing else changes.

use std::collections::BTreeMap;

use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};
use serde::Serialize;

/// NVML opened once per session.
pub struct GpuView {
    nvml: Result<Nvml, String>,
}

/// One GPU's memory as NVML reports it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// One NVML reading.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Sample {
    pub available: bool,
    /// Why NVML could not be used, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub devices: Vec<GpuDevice>,
    /// Device memory per pid, summed over GPUs (compute and graphics contexts).
    #[serde(skip)]
    pub per_pid: BTreeMap<u32, u64>,
}

impl GpuView {
    pub fn open() -> Self {
        let nvml = Nvml::init().map_err(|e| e.to_string());
        if let Err(e) = &nvml {
            tracing::info!(reason = %e, "NVML unavailable: device memory is not reconciled");
        }
        Self { nvml }
    }

    pub fn sample(&self) -> Sample {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(reason) => {
                return Sample {
                    reason: Some(reason.clone()),
                    ..Sample::default()
                };
            }
        };
        match read(nvml) {
            Ok(s) => s,
            Err(e) => Sample {
                reason: Some(format!("NVML query failed: {e}")),
                ..Sample::default()
            },
        }
    }
}

fn read(nvml: &Nvml) -> Result<Sample, nvml_wrapper::error::NvmlError> {
    let mut s = Sample {
        available: true,
        ..Sample::default()
    };
    for index in 0..nvml.device_count()? {
        let dev = nvml.device_by_index(index)?;
        let mem = dev.memory_info()?;
        s.devices.push(GpuDevice {
            index,
            name: dev.name().unwrap_or_default(),
            used_bytes: mem.used,
            total_bytes: mem.total,
        });
        let procs = dev.running_compute_processes()?;
        let graphics = dev.running_graphics_processes().unwrap_or_default();
        for p in procs.into_iter().chain(graphics) {
            if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                *s.per_pid.entry(p.pid).or_default() += bytes;
            }
        }
    }
    Ok(s)
}
