//! Every heap mode but `off`: the window of a process's Python objects. When a process's pymalloc
//! arenas grow as a leak does, its object allocator is sampled (probes/objects.rs), once, for as
//! long as it takes to tell which stacks keep their objects: [`MIN_S`] at least, [`MAX_S`] at most
//! (longer for a slow leak not yet told, [`LONGEST_S`]). What each stack made in the window's first
//! half and still holds at its end is handed to the analysis, which reports the leak on the stacks
//! that keep their objects.

use std::collections::{HashMap, HashSet};

use super::Owner;
use crate::{
    analysis::{KEPT_MIN, kept_by_imports, kept_by_keepers, undecided_keeper},
    ledger::KeptLine,
    model::{GroupKey, HeapMode, Kind, StackId, monotonic_ns},
    probes::prober::ProbeRequest,
};

/// How long a window lasts at least: every call of the object allocator is a probe trap
/// meanwhile (a pure-Python service runs about fifty times slower), so the window is short and
/// comes once. Objects made in its first half and still held at its end are kept.
pub const MIN_S: f64 = 1.0;
/// How long it lasts at most: a slow leak (a training loop that logs a dict of metrics every
/// step) keeps a few KiB of objects in a second of the slowed program, fewer than the judgement
/// needs; its window goes on until the sites that keep have kept [`SURE_BYTES`], or this long.
pub const MAX_S: f64 = 5.0;
/// How long it lasts at most where a site has kept half what the judgement needs, at a keeper's
/// share, by [`MAX_S`] (`analysis::undecided_keeper`): it goes on until that site kept enough or
/// no longer keeps its share. A loop logging a dict of metrics every step, 60 times slower in
/// the window (every object call a trap), kept 5.3 KiB of the 8 it needed at 5 s: the check
/// then passed, or named the arenas' line (two runs in four).
const LONGEST_S: f64 = 15.0;
/// Kept bytes, of the keeping sites together, that end a window before [`MAX_S`]
/// (`Owner::look_at_window`): twice what the judgement needs of one site, so that more of the
/// window would hardly change it.
const SURE_BYTES: u64 = 2 * KEPT_MIN;
/// How much longer than at the look that first saw what each site kept a window must have gone
/// before what they keep now tells whether it grows with the window (a leak keeps what it made
/// in the first half, which lengthens with it) or not (temporaries, CPython's free lists).
const GROWN_AFTER: f64 = 1.5;
/// A window whose probes never recorded an object (they could not be attached) is given up after
/// this.
const GIVE_UP_S: f64 = 10.0;
/// Arena growth that calls for the window, over how long at least (the later half of the run so
/// far: an interpreter's start-up grows its arenas steadily for a second or two, then holds).
const MIN_BYTES: i64 = 2 << 20;
const SPAN_S: f64 = 2.0;
/// The span in a process that maps PyTorch, whose tensors the cheaper layer traces: its set-up
/// maps arenas outside imports for seconds after `import torch` (a Hugging Face Trainer's: a
/// traceback's source lines read by a lazy CUDA call at 3.2 s, its sampler's permutation at
/// 5.0 s, while transformers' imports still filled arenas), then holds. Over the 2-s span such a
/// job's window opened at 5 s in three runs of three, and every object call was a probe trap
/// for the next five seconds, as its tensors and then its malloc family were traced: its loop
/// ran 1.5× its untraced time. An object leak in such a job is sampled 12 s into it at the
/// soonest.
const TORCH_SPAN_S: f64 = 6.0;

/// The windows asked for, and those open.
#[derive(Default)]
pub(super) struct ObjectWindows {
    /// Windows are opened (every heap mode but `off`: the malloc family never sees the small
    /// objects pymalloc hands out, only the arenas they fill, named by whichever line needed a
    /// new one).
    pub(super) on: bool,
    /// When the verdicts were last looked at for the layers and windows, in seconds traced.
    pub(super) looked_s: f64,
    asked: HashSet<u32>,
    open: Vec<OpenWindow>,
    /// Processes whose window was judged: their arena stacks are looked for at each look.
    judged: Vec<u32>,
    /// Whether each mmap stack seen maps arenas (`Owner::is_arena`).
    pub(super) arena_stacks: HashMap<StackId, bool>,
    /// Whether each stack looked at was made by a library's import (`Owner::is_import`).
    import_stacks: HashMap<StackId, bool>,
    /// Each stack's site, as a window's looks found it (`Owner::site_of`).
    sites: HashMap<StackId, String>,
}

impl ObjectWindows {
    /// None opened yet; any at all under `mode`?
    pub(super) fn opened(mode: HeapMode) -> Self {
        Self {
            on: mode != HeapMode::Off,
            ..Self::default()
        }
    }
}

/// A window open: its process, when it was asked for, when it is given up without an object,
/// and what its stacks kept at the last look, with their sites (what it is judged on when the
/// process exits before it closes).
struct OpenWindow {
    pid: u32,
    /// When it was asked for, on the series' axis.
    from_x: f64,
    give_up_ns: u64,
    latest: Option<Vec<(KeptLine, u32)>>,
    /// What each site kept at the first look that saw them, and how long the window had gone
    /// then (seconds).
    early: Option<(f64, HashMap<String, u64>)>,
}

/// What becomes of an open window at a look.
enum Look {
    Open(Option<Vec<(KeptLine, u32)>>),
    Close(Option<Vec<(KeptLine, u32)>>),
}

impl Owner {
    /// Looks at the open windows, closing those that can tell (or can no longer): looked at every
    /// sample, so that a window lasts no longer than it must (the program runs slowly meanwhile).
    pub(super) fn close_object_windows(&mut self, x: f64) {
        if self.objects.open.is_empty() {
            return;
        }
        let now = monotonic_ns();
        for mut w in std::mem::take(&mut self.objects.open) {
            match self.look_at_window(&mut w, now) {
                Look::Open(latest) => {
                    w.latest = latest;
                    self.objects.open.push(w);
                }
                Look::Close(kept) => self.close_objects(w.pid, (w.from_x, x), kept),
            }
        }
    }

    /// Whether `w` stays open (with what its stacks keep so far) or closes (with what it is
    /// judged on; nothing when it cannot be). Once the interpreter began its exit, on what its
    /// stacks held at that point (the ledger took it then): the teardown makes objects it
    /// never frees (the modules' clearing, exit handlers), which would read as kept. At an
    /// exit without that point (`os._exit`), its last look before. It has seen enough when the
    /// sites that keep kept [`SURE_BYTES`] together; sites, not stacks: one line's dict and its
    /// strings are stacks of their own, and a stack of tuples that CPython's free list holds on
    /// to keeps a quarter of what it made while its line's other stacks keep nothing. Or when
    /// libraries' imports kept
    /// as much: the arenas grew with modules (a GPU job imports for seconds after its start),
    /// and every object they make is a probe trap while the window is open.
    fn look_at_window(&mut self, w: &mut OpenWindow, now: u64) -> Look {
        let Some(p) = self.ledger.procs.get(&w.pid) else {
            return Look::Close(None);
        };
        let window = p.objects.as_ref();
        if let (Some(from), Some((at, kept))) = (
            window.and_then(|o| o.started_ns()),
            window.and_then(|o| o.at_exit()).cloned(),
        ) {
            return Look::Close(Some(self.judged_at(w, at.saturating_sub(from), kept)));
        }
        if p.finalized_ns.is_some() {
            // Opened, or its first object made, as the interpreter exited: only the teardown's.
            return Look::Close(None);
        }
        if p.exited_ns.is_some() {
            // Not what it holds now: the interpreter's exit freed what its modules held.
            return Look::Close(w.latest.take());
        }
        let Some(from) = window.and_then(|o| o.started_ns()) else {
            return if now >= w.give_up_ns {
                Look::Close(None)
            } else {
                Look::Open(None)
            };
        };
        let elapsed_s = now.saturating_sub(from) as f64 / 1e9;
        if elapsed_s < MIN_S {
            return Look::Open(None);
        }
        let kept = p.kept_objects(now);
        let lines = self.judged_at(w, now.saturating_sub(from), kept);
        let sure = |kept: u64| kept >= SURE_BYTES;
        let undecided = elapsed_s < LONGEST_S && undecided_keeper(&lines);
        let out_of_time = elapsed_s >= MAX_S && !undecided;
        if sure(kept_by_keepers(&lines)) || sure(kept_by_imports(&lines)) || out_of_time {
            Look::Close(Some(lines))
        } else {
            Look::Open(Some(lines))
        }
    }

    /// What `w`'s stacks `kept` `elapsed_ns` into it, by site, each site's growth told.
    fn judged_at(
        &mut self,
        w: &mut OpenWindow,
        elapsed_ns: u64,
        kept: Vec<KeptLine>,
    ) -> Vec<(KeptLine, u32)> {
        let (mut lines, sites) = self.by_site(kept);
        grown_sites(w, elapsed_ns as f64 / 1e9, &mut lines, &sites);
        lines
    }

    /// Opens a window for each process whose arenas leak (judged so, not explained by its
    /// tensors), and finds the arena stacks made since in those judged. Looked at with the
    /// malloc family's engagement. Not once the process's interpreter began its exit, or it
    /// exited: the window would see only the teardown's objects (which maps an arena of its
    /// own, without a Python frame, in a CPU training job's last tenth of a second, which called
    /// for a window in half its runs).
    pub(super) fn object_windows(&mut self, at_s: f64, x: f64) {
        let now = monotonic_ns();
        for pid in self.objects.judged.clone() {
            let arenas = self.arenas_of(pid);
            self.analysis.more_arenas(pid, arenas);
        }
        let start = |pid: u32| self.judged_from(pid, at_s);
        let grown = self.analysis.growing_arenas(start, SPAN_S, MIN_BYTES);
        let grown_long = self.analysis.growing_arenas(start, TORCH_SPAN_S, MIN_BYTES);
        let grown: Vec<u32> = grown
            .into_iter()
            .filter(|pid| grown_long.contains(pid) || !self.maps_torch(*pid))
            .collect();
        for pid in grown {
            let ending = self
                .ledger
                .procs
                .get(&pid)
                .is_none_or(|p| p.finalized_ns.is_some() || p.exited_ns.is_some());
            if ending || !self.objects.asked.insert(pid) {
                continue;
            }
            tracing::debug!(pid, x, "Python objects' window asked for");
            // Opened in the ledger first: the first samples may come before the probes answer.
            self.ledger.open_objects(pid);
            self.objects.open.push(OpenWindow {
                pid,
                from_x: x,
                give_up_ns: now + (GIVE_UP_S * 1e9) as u64,
                latest: None,
                early: None,
            });
            let ask = ProbeRequest::EngageObjects {
                tgid: pid,
                after_s: at_s,
            };
            let _ = self.prober.requests.send(ask);
        }
    }

    /// One pass over the page-level stacks of a sample: each new one made by a library's import
    /// is told to the analysis (each looked at once), and where windows are opened each
    /// process's arenas are sampled, all its arena stacks together.
    pub(super) fn sample_pages(&mut self, x: f64, groups: &[(GroupKey, u64)]) {
        let windows = self.objects.on;
        let mut arenas = Vec::new();
        for (key, bytes) in groups {
            let Some(id) = key
                .stack
                .filter(|_| matches!(key.kind, Kind::Brk | Kind::Mmap))
            else {
                continue;
            };
            // Each stack looked at once.
            if !self.objects.import_stacks.contains_key(&id) {
                if self.is_import(id) {
                    self.analysis.imported(id);
                } else if windows && self.is_arena(key) {
                    self.log_program_arena(id, x);
                }
            }
            if windows && self.is_arena(key) {
                arenas.push((*key, *bytes));
            }
        }
        if windows {
            self.analysis.sample_arenas(x, &arenas);
        }
    }

    /// Says at debug level where an arena stack mapped outside imports was made (its Python
    /// frames, innermost first): such arenas call for a window.
    fn log_program_arena(&self, id: StackId, x: f64) {
        let Some((frames, _)) = self.ledger.stacks.get(id) else {
            return;
        };
        let python: Vec<String> = frames
            .iter()
            .filter_map(|f| f.as_python())
            .map(|(file, function, line)| format!("{function} ({file}:{line:?})"))
            .collect();
        tracing::debug!(x, frames = python.len(), python = ?python, "an arena mapped outside imports");
    }

    /// Whether stack `id` was made while a library's module was imported
    /// ([`crate::report::made_by_import`]), from its Python frames (no symbolizing).
    fn is_import(&mut self, id: StackId) -> bool {
        if let Some(&known) = self.objects.import_stacks.get(&id) {
            return known;
        }
        let imported = self.ledger.stacks.get(id).is_some_and(|(frames, _)| {
            crate::report::made_by_import(
                frames
                    .iter()
                    .filter_map(|f| f.as_python())
                    .map(|(file, function, _)| (file, function)),
            )
        });
        self.objects.import_stacks.insert(id, imported);
        imported
    }

    /// Ends `pid`'s window: the probes go, and what its stacks kept goes to the analysis, unless
    /// there is nothing to judge (the process ended before the window's first look, or no object
    /// was recorded).
    fn close_objects(&mut self, pid: u32, span: (f64, f64), lines: Option<Vec<(KeptLine, u32)>>) {
        let _ = self
            .prober
            .requests
            .send(ProbeRequest::DisengageObjects { tgid: pid });
        let Some(lines) = lines else {
            tracing::info!(pid, "Python objects' window not judged: nothing to judge");
            return;
        };
        let arenas = self.arenas_of(pid);
        tracing::info!(
            pid,
            stacks = lines.len(),
            arenas = arenas.len(),
            from = span.0,
            to = span.1,
            "Python objects' window closed"
        );
        self.analysis.objects_sampled(pid, span, arenas, lines);
        self.objects.judged.push(pid);
    }

    /// Each stack with the number of its site: stacks of one site (the objects of several types
    /// one line makes) are judged together; and the sites, by number.
    fn by_site(&mut self, kept: Vec<KeptLine>) -> (Vec<(KeptLine, u32)>, Vec<String>) {
        let mut sites: Vec<String> = Vec::new();
        let mut numbers: HashMap<String, u32> = HashMap::new();
        let mut lines = Vec::with_capacity(kept.len());
        for mut l in kept {
            l.imported = l.stack.is_some_and(|id| self.is_import(id));
            let site = self.site_of(l.stack);
            let n = *numbers.entry(site).or_insert_with_key(|site| {
                sites.push(site.clone());
                (sites.len() - 1) as u32
            });
            lines.push((l, n));
        }
        (lines, sites)
    }

    /// The site of stack `id`, found once: a window looks at its stacks every sample.
    fn site_of(&mut self, id: Option<StackId>) -> String {
        if let Some(site) = id.and_then(|id| self.objects.sites.get(&id)) {
            return site.clone();
        }
        let frames = id.and_then(|id| self.ledger.stacks.get(id));
        let frames = frames.map_or_else(Vec::new, |(f, _)| {
            // The site is a Python frame where there is one: the native ones are left
            // unsymbolized.
            let python: Vec<_> = f
                .iter()
                .filter(|f| f.as_python().is_some())
                .cloned()
                .collect();
            self.sym.stack(if python.is_empty() { &f } else { &python })
        });
        let site = crate::report::site_of(&frames);
        if let Some(id) = id {
            self.objects.sites.insert(id, site.clone());
        }
        site
    }

    /// The arena stacks of `pid` with a series.
    fn arenas_of(&mut self, pid: u32) -> Vec<GroupKey> {
        let mmaps = self.analysis.tracked(pid, Kind::Mmap);
        mmaps.into_iter().filter(|k| self.is_arena(k)).collect()
    }
}

/// Marks the stacks of each site whose kept bytes grew with window `w` (`elapsed_s` long now),
/// from what they kept at the first look that saw them: by half what a leak's would at least
/// (a leak keeps what it made in the first half, which grows with the window), and by half of
/// [`KEPT_MIN`]. The first look with kept objects is remembered.
fn grown_sites(
    w: &mut OpenWindow,
    elapsed_s: f64,
    lines: &mut [(KeptLine, u32)],
    sites: &[String],
) {
    let mut kept: HashMap<String, u64> = HashMap::new();
    for (l, site) in lines.iter().filter(|(l, _)| !l.imported) {
        *kept.entry(sites[*site as usize].clone()).or_default() += l.kept;
    }
    let Some((then_s, before)) = &w.early else {
        if kept.values().any(|&k| k > 0) {
            w.early = Some((elapsed_s, kept));
        }
        return;
    };
    let ratio = elapsed_s / then_s;
    if ratio < GROWN_AFTER {
        return;
    }
    let grew = |site: &String| {
        let (now, then) = (kept[site], before.get(site).copied().unwrap_or(0));
        let half_a_leaks = then as f64 * (1.0 + (ratio - 1.0) / 2.0);
        now as f64 >= half_a_leaks && now.saturating_sub(then) >= KEPT_MIN / 2
    };
    let rose = |site: &String| kept[site] > before.get(site).copied().unwrap_or(0);
    let told: HashMap<&String, (bool, bool)> =
        kept.keys().map(|s| (s, (grew(s), rose(s)))).collect();
    for (l, site) in lines.iter_mut() {
        let (grows, rising) = told
            .get(&sites[*site as usize])
            .copied()
            .unwrap_or_default();
        (l.grows, l.rising) = (!l.imported && grows, !l.imported && rising);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sites_kept_bytes_grow_with_a_leaks_window_not_with_a_free_lists() {
        const K: u64 = 1 << 10;
        let sites = vec!["leak".to_string(), "free list".to_string()];
        let mut w = OpenWindow {
            pid: 1,
            from_x: 0.0,
            give_up_ns: 0,
            latest: None,
            early: None,
        };
        let mut look = |s: f64, leak: u64, held: u64| {
            let line = |kept: u64| KeptLine {
                kept,
                made: 100 * kept,
                ..KeptLine::default()
            };
            let mut lines = vec![(line(leak), 0), (line(held), 1)];
            grown_sites(&mut w, s, &mut lines, &sites);
            lines.iter().map(|(l, _)| l.grows).collect::<Vec<_>>()
        };
        // The first look that sees them is remembered; too soon after, nothing is told.
        assert_eq!(look(1.0, 20 * K, 20 * K), [false, false]);
        assert_eq!(look(1.2, 24 * K, 20 * K), [false, false]);
        // Twice as long: the leak keeps twice as much; the free list a little more.
        assert_eq!(look(2.0, 40 * K, 21 * K), [true, false]);
    }
}
