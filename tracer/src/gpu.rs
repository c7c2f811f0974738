//! What the NVIDIA driver says each process holds on its GPUs (NVML, through nvml-wrapper), to set
//! beside what leaktracer traced through CUDA calls. The difference is memory no traced call
//! explains: the CUDA context, the allocator's fragmentation, libraries that allocate without the
//! runtime or driver calls leaktracer probes. Without libnvidia-ml (no driver, no GPU) every report
//! says "NVML unavailable" and why; nothing else changes.

use std::collections::BTreeMap;

use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};
use serde::Serialize;

/// NVML opened once per session, and each process's last reading.
pub struct GpuView {
    nvml: Result<Nvml, String>,
    /// Per pid: NVML's last figure for it, from the last reading that listed it.
    lived: BTreeMap<u32, Reading>,
    /// When NVML was last read (seconds into the session).
    read_at_s: Option<f64>,
}

/// What NVML said a process held, what leaktracer had traced of its device memory then, and
/// when (seconds into the session).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Reading {
    pub bytes: u64,
    pub traced_bytes: u64,
    pub at_s: f64,
}

/// How often NVML is read while the session runs, at most.
const EVERY_S: f64 = 1.0;

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
    /// Per pid: the last reading that listed it, this one or an earlier one (a process that has
    /// exited is in none after its exit: its figure is the last taken while it lived).
    #[serde(skip)]
    pub lived: BTreeMap<u32, Reading>,
    /// When this reading was taken (seconds into the session).
    #[serde(skip)]
    pub at_s: f64,
}

impl Sample {
    /// NVML's figure for `pid` and when it was taken: now while it lives (0 when NVML does not
    /// list it), the last reading while it lived once it has `exited`. None without NVML.
    pub fn reading_for(&self, pid: u32, exited: bool) -> Option<Reading> {
        if !self.available {
            return None;
        }
        let listed = self.per_pid.contains_key(&pid);
        Some(match self.lived.get(&pid) {
            // Listed now, this reading's; gone, its last.
            Some(last) if listed || exited => *last,
            _ => Reading {
                bytes: 0,
                traced_bytes: 0,
                at_s: self.at_s,
            },
        })
    }
}

impl GpuView {
    pub fn open() -> Self {
        let nvml = shuts_down().and_then(|()| Nvml::init().map_err(|e| e.to_string()));
        if let Err(e) = &nvml {
            tracing::info!(reason = %e, "NVML unavailable: device memory is not reconciled");
        }
        Self {
            nvml,
            lived: BTreeMap::new(),
            read_at_s: None,
        }
    }

    /// Reads NVML on the session's sampling tick, at most once per [`EVERY_S`], so that a
    /// process's figure is known after it exits (NVML lists only live processes). `traced`:
    /// a process's traced device bytes now.
    pub fn observe(&mut self, at_s: f64, traced: impl Fn(u32) -> u64) {
        let due = self.read_at_s.is_none_or(|t| at_s - t >= EVERY_S);
        if self.nvml.is_ok() && due {
            self.sample(at_s, traced);
        }
    }

    /// A reading now, `at_s` seconds into the session, with every process's last one.
    pub fn sample(&mut self, at_s: f64, traced: impl Fn(u32) -> u64) -> Sample {
        let mut s = self.read();
        s.at_s = at_s;
        if s.available {
            self.read_at_s = Some(at_s);
            for (&pid, &bytes) in &s.per_pid {
                let traced_bytes = traced(pid);
                let reading = Reading {
                    bytes,
                    traced_bytes,
                    at_s,
                };
                self.lived.insert(pid, reading);
            }
            s.lived = self.lived.clone();
        }
        s
    }

    fn read(&self) -> Sample {
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

/// NVML's library, where the loader finds one, defines `nvmlShutdown`: nvml-wrapper looks up
/// every other function before it calls it, but calls that one unchecked when it lets go, and
/// panics where it is missing (a stand-in or partial stub on the loader's path). Such a library
/// is taken as no NVML.
fn shuts_down() -> Result<(), String> {
    const LIBRARY: &std::ffi::CStr = c"libnvidia-ml.so.1";
    // SAFETY: dlopen of the library nvml-wrapper loads next; its handle is closed below.
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Ok(()); // nvml-wrapper says why
    }
    // SAFETY: a symbol looked up in the handle just opened, then the handle closed.
    let found = unsafe {
        let f = libc::dlsym(handle, c"nvmlShutdown".as_ptr());
        libc::dlclose(handle);
        !f.is_null()
    };
    if found {
        Ok(())
    } else {
        Err("libnvidia-ml.so.1 has no nvmlShutdown: not NVML's library".into())
    }
}

fn read(nvml: &Nvml) -> Result<Sample, nvml_wrapper::error::NvmlError> {
    // (`lived` and `at_s` are the view's to fill.)
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

#[cfg(test)]
mod tests {
    use super::{Reading, Sample};

    #[test]
    fn an_exited_process_keeps_the_figure_taken_while_it_lived() {
        let mut s = Sample {
            available: true,
            at_s: 30.0,
            ..Sample::default()
        };
        let reading = |bytes, traced_bytes, at_s| Reading {
            bytes,
            traced_bytes,
            at_s,
        };
        s.per_pid.insert(7, 1 << 20);
        s.lived.insert(7, reading(1 << 20, 1 << 19, 30.0));
        s.lived.insert(9, reading(1850 << 20, 572 << 20, 28.0));
        let live = reading(1 << 20, 1 << 19, 30.0);
        assert_eq!(s.reading_for(7, false), Some(live));
        let last = reading(1850 << 20, 572 << 20, 28.0);
        assert_eq!(
            s.reading_for(9, true),
            Some(last),
            "exited: its last reading"
        );
        let none = reading(0, 0, 30.0);
        assert_eq!(
            s.reading_for(9, false),
            Some(none),
            "alive, not listed now: 0"
        );
        assert_eq!(s.reading_for(11, true), Some(none), "never listed");
        let off = Sample::default();
        assert_eq!(off.reading_for(9, true), None, "no NVML");
    }
}
