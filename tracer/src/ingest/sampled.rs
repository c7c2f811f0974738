//! `--heap sampled`: the kernel side remembers each recorded heap block (`SAMPLED`, keyed by
//! process and address) to send only their frees. Blocks still allocated when their process exits
//! or execs would stay there for good; ingest keeps the recorded blocks per process and removes a
//! process's keys when it goes.

use std::collections::{HashMap, HashSet};

use aya::maps::MapData;
use tracer_common::{Event, EventKind, SampledKey};

/// The recorded blocks of each process, and the kernel's table of them.
#[derive(Default)]
pub struct SampledBlocks {
    map: Option<aya::maps::HashMap<MapData, SampledKey, u64>>,
    by_tgid: HashMap<u32, HashSet<u64>>,
}

impl SampledBlocks {
    pub fn new(map: aya::maps::HashMap<MapData, SampledKey, u64>) -> Self {
        Self {
            map: Some(map),
            by_tgid: HashMap::new(),
        }
    }

    /// Follows an allocator event (every one sent in sampled mode is of a recorded block).
    pub fn observe(&mut self, kind: EventKind, ev: &Event) {
        let blocks = self.by_tgid.entry(ev.tgid).or_default();
        match kind {
            EventKind::Alloc => {
                blocks.insert(ev.addr);
            }
            EventKind::Realloc => {
                blocks.remove(&ev.old_addr);
                if ev.addr != 0 {
                    blocks.insert(ev.addr);
                }
            }
            EventKind::Free => {
                blocks.remove(&ev.old_addr);
            }
            _ => {}
        }
    }

    /// A process exited or replaced its image: its blocks are gone from the kernel's table too.
    pub fn forget(&mut self, tgid: u32) {
        let (Some(blocks), Some(map)) = (self.by_tgid.remove(&tgid), self.map.as_mut()) else {
            return;
        };
        for addr in blocks {
            let _ = map.remove(&SampledKey {
                tgid: u64::from(tgid),
                addr,
            });
        }
    }

    /// Recorded blocks held (the kernel's table fill).
    pub fn held(&self) -> usize {
        self.by_tgid.values().map(HashSet::len).sum()
    }
}
