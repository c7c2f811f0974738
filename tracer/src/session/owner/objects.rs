//! `--heap auto`: the window of a process's Python objects. When a process's pymalloc arenas grow
//! as a leak does, its object allocator is sampled for [`WINDOW_S`] (probes/objects.rs), once; at
//! the window's end, what each stack made in its first half and still holds is handed to the
//! analysis, which reports the leak on the stacks that keep their objects.

use std::collections::{HashMap, HashSet};

use super::Owner;
use crate::{
    ledger::KeptLine,
    model::{GroupKey, Kind, StackId, monotonic_ns},
    probes::prober::ProbeRequest,
};

/// How long a process's objects are sampled: every call of its object allocator is a probe trap
/// meanwhile (a pure-Python service runs about fifty times slower), so the window is short and
/// comes once. Objects made in its first half and still held at its end are kept.
pub const WINDOW_S: f64 = 1.0;
/// A window whose probes never recorded an object (they could not be attached) is given up after
/// this.
const GIVE_UP_S: f64 = 10.0;
/// Arena growth that calls for the window, over how long at least (the later half of the run so
/// far: an interpreter's start-up grows its arenas steadily for a second or two, then holds).
const MIN_BYTES: i64 = 2 << 20;
const SPAN_S: f64 = 2.0;

/// The windows asked for, and those open: (pid, when it is given up without an object).
#[derive(Default)]
pub(super) struct ObjectWindows {
    asked: HashSet<u32>,
    open: Vec<(u32, u64)>,
    /// Processes whose window was judged: their arena stacks are looked for at each look.
    judged: Vec<u32>,
    /// Whether each mmap stack seen maps arenas (`Owner::is_arena`).
    pub(super) arena_stacks: HashMap<StackId, bool>,
}

impl Owner {
    /// Closes the windows due: looked at every sample, so that a window lasts no longer than it
    /// must (the program runs slowly meanwhile).
    pub(super) fn close_object_windows(&mut self) {
        if self.objects.open.is_empty() {
            return;
        }
        let now = monotonic_ns();
        let ledger = &self.ledger;
        let (due, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.objects.open)
            .into_iter()
            .partition(|&(pid, give_up)| {
                let window = ledger.procs.get(&pid).and_then(|p| p.objects.as_ref());
                match window.and_then(|w| w.end_ns()) {
                    Some(end) => end <= now,
                    None => give_up <= now,
                }
            });
        self.objects.open = open;
        for (pid, _) in due {
            self.close_objects(pid);
        }
    }

    /// Opens a window for each process whose arenas leak (judged so, not explained by its
    /// tensors), and finds the arena stacks made since in those judged. Looked at with the
    /// malloc family's engagement.
    pub(super) fn object_windows(&mut self, at_s: f64) {
        let now = monotonic_ns();
        for pid in self.objects.judged.clone() {
            let arenas = self.arenas_of(pid);
            self.analysis.more_arenas(pid, arenas);
        }
        let warmup = self.config.warmup;
        let grown = self.analysis.growing_arenas(warmup, SPAN_S, MIN_BYTES);
        for pid in grown {
            if !self.objects.asked.insert(pid) {
                continue;
            }
            // Opened in the ledger first: the first samples may come before the probes answer.
            self.ledger.open_objects(pid, (WINDOW_S / 2.0 * 1e9) as u64);
            let give_up = now + (GIVE_UP_S * 1e9) as u64;
            self.objects.open.push((pid, give_up));
            let ask = ProbeRequest::EngageObjects {
                tgid: pid,
                after_s: at_s,
            };
            let _ = self.prober.requests.send(ask);
        }
    }

    /// One sample of each process's arenas, all its arena stacks together (`--heap auto`).
    pub(super) fn sample_arenas(&mut self, x: f64, groups: &[(GroupKey, u64)]) {
        if self.engaged.is_none() {
            return;
        }
        let mut sums: rustc_hash::FxHashMap<u32, u64> = Default::default();
        for (key, bytes) in groups {
            if self.is_arena(key) {
                *sums.entry(key.pid).or_default() += bytes;
            }
        }
        self.analysis.sample_arenas(x, &sums);
    }

    /// Ends `pid`'s window: the probes go, and what its stacks kept goes to the analysis, unless
    /// the process ended meanwhile (an interpreter's exit frees what its modules held, which is
    /// not what the program did).
    fn close_objects(&mut self, pid: u32) {
        let _ = self
            .prober
            .requests
            .send(ProbeRequest::DisengageObjects { tgid: pid });
        let Some(p) = self
            .ledger
            .procs
            .get(&pid)
            .filter(|p| p.exited_ns.is_none())
        else {
            tracing::info!(
                pid,
                "Python objects' window not judged: the process ended in it"
            );
            return;
        };
        let kept = p.kept_objects();
        let lines = self.by_site(kept);
        let arenas = self.arenas_of(pid);
        tracing::info!(
            pid,
            stacks = lines.len(),
            arenas = arenas.len(),
            "Python objects' window closed"
        );
        self.analysis.objects_sampled(pid, arenas, lines);
        self.objects.judged.push(pid);
    }

    /// Each stack with the number of its site: stacks of one site (the objects of several types
    /// one line makes) are judged together.
    fn by_site(&mut self, kept: Vec<KeptLine>) -> Vec<(KeptLine, u32)> {
        let mut sites: Vec<String> = Vec::new();
        let mut lines = Vec::with_capacity(kept.len());
        for l in kept {
            let frames = l.stack.and_then(|id| self.ledger.stacks.get(id));
            let frames = frames.map_or_else(Vec::new, |(f, _)| self.sym.stack(f));
            let site = crate::report::site_of(&frames);
            let n = sites.iter().position(|s| *s == site).unwrap_or_else(|| {
                sites.push(site);
                sites.len() - 1
            });
            lines.push((l, n as u32));
        }
        lines
    }

    /// The arena stacks of `pid` with a series.
    fn arenas_of(&mut self, pid: u32) -> Vec<GroupKey> {
        let mmaps = self.analysis.tracked(pid, Kind::Mmap);
        mmaps.into_iter().filter(|k| self.is_arena(k)).collect()
    }
}
