//! The kernel's channels to user space, taken from the loaded object: the event ring, the
//! per-CPU counters, the log buffer and the tables ingest reads (sampled blocks, stopped threads).

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{COUNTERS, Counter};

use super::ring;
use crate::error::Error;

/// Kernel-side counters summed over CPUs, indexed like [`Counter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters(pub [u64; COUNTERS as usize]);

impl KernelCounters {
    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }
}

/// The kernel's event ring buffer, counters and log buffer, taken from the loaded object.
pub struct KernelChannels {
    pub(crate) events: ring::Ring,
    pub(crate) stats: PerCpuArray<MapData, u64>,
    pub(crate) logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// `--heap sampled`: the mean sampling interval in bytes (0: every allocation is recorded).
    pub(crate) heap_sampling: u64,
    pub(crate) sampled: aya::maps::HashMap<MapData, tracer_common::SampledKey, u64>,
    /// Threads the kernel side stopped for new code (STOPS).
    pub(crate) stops: aya::maps::HashMap<MapData, u32, u32>,
}

impl KernelChannels {
    pub(crate) fn take(bpf: &mut aya::Ebpf, heap_sampling: u64) -> Result<Self, Error> {
        let mut map = |name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| anyhow::anyhow!("map {name} missing"))
        };
        let events = match map("EVENTS")? {
            aya::maps::Map::RingBuf(m) => {
                ring::Ring::new(m).map_err(|e| anyhow::anyhow!("EVENTS: {e}"))?
            }
            _ => return Err(anyhow::anyhow!("EVENTS is not a ring buffer").into()),
        };
        let stats =
            PerCpuArray::try_from(map("STATS")?).map_err(|e| anyhow::anyhow!("STATS: {e}"))?;
        let sampled = aya::maps::HashMap::try_from(map("SAMPLED")?)
            .map_err(|e| anyhow::anyhow!("SAMPLED: {e}"))?;
        let stops = aya::maps::HashMap::try_from(map("STOPS")?)
            .map_err(|e| anyhow::anyhow!("STOPS: {e}"))?;
        let logger = match aya_log::EbpfLogger::init(bpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(error = %e, "no eBPF log buffer");
                None
            }
        };
        Ok(Self {
            events,
            stats,
            logger,
            heap_sampling,
            sampled,
            stops,
        })
    }
}

impl KernelChannels {
    pub(crate) fn counters(stats: &PerCpuArray<MapData, u64>) -> KernelCounters {
        let mut out = KernelCounters::default();
        for (i, slot) in out.0.iter_mut().enumerate() {
            if let Ok(values) = stats.get(&(i as u32), 0) {
                *slot = values.iter().sum();
            }
        }
        out
    }
}
