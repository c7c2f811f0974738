//! Each traced process's executable mappings, captured while it lives (at exec, at each new code
//! mapping, on a miss), so stacks normalize to (module, file offset) even after it exits. blazesym's
//! own normalizer reads /proc at call time; the snapshot has to outlive the process, so it is kept
//! here.

use std::{collections::HashMap, sync::Arc};

use crate::procfs::ProcMaps;

/// Snapshots per process. Owned by the ingest task.
#[derive(Default)]
pub struct MapsCache {
    by_pid: HashMap<u32, ProcMaps>,
    /// When each process's maps were last re-read because an address was in none of them.
    missed: HashMap<u32, std::time::Instant>,
}

/// Re-reading /proc/PID/maps of a large process (libtorch: thousands of lines) costs a
/// millisecond; addresses in no file (JIT code, frames guessed through code without frame
/// pointers) would cost that on every event. New code is announced by its mmap event (read then);
/// a miss re-reads at most this often.
const MISS_REFRESH: std::time::Duration = std::time::Duration::from_millis(250);

impl MapsCache {
    /// Re-reads the maps of `pid`; keeps the last snapshot when it is gone.
    pub fn refresh(&mut self, pid: u32) {
        if let Some(m) = ProcMaps::read(pid) {
            self.by_pid.insert(pid, m);
        }
    }

    /// Re-reads the maps of `pid` after an address was in none of them, unless that was done
    /// within [`MISS_REFRESH`].
    pub fn refresh_on_miss(&mut self, pid: u32) {
        let now = std::time::Instant::now();
        if self
            .missed
            .get(&pid)
            .is_some_and(|t| now.duration_since(*t) < MISS_REFRESH)
        {
            return;
        }
        self.missed.insert(pid, now);
        self.refresh(pid);
    }

    /// A forked child starts with its parent's mappings.
    pub fn inherit(&mut self, parent: u32, child: u32) {
        if let Some(m) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(child, m);
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
        self.missed.remove(&pid);
    }

    /// Resolves `addr` in `pid`, re-reading the maps if it is not covered (see `refresh_on_miss`).
    pub fn resolve(&mut self, pid: u32, addr: u64) -> Option<(Arc<str>, u64)> {
        if let Some((p, o)) = self.by_pid.get(&pid).and_then(|m| m.resolve(addr)) {
            return Some((p.clone(), o));
        }
        self.refresh_on_miss(pid);
        self.by_pid
            .get(&pid)?
            .resolve(addr)
            .map(|(p, o)| (p.clone(), o))
    }

    pub fn get(&self, pid: u32) -> Option<&ProcMaps> {
        self.by_pid.get(&pid)
    }
}
