//! `--heap auto`: which layer each layered process gets next, from the verdicts. Its pages (with
//! their Python lines) are traced from the start; when a page-level stack grows as a leak does,
//! its CPU tensors (`--tensors auto`), until its memory holds again or their leak is confirmed
//! (then traced again now and then); when its pages still grow in a way its tensors do not
//! explain, its malloc family; when its pymalloc arenas grow, a window of its Python objects
//! (objects.rs). Each layer costs probe traps that a process whose memory holds never pays, and
//! a leaking one pays for a few seconds.

use std::collections::HashMap;

use super::Owner;

mod heap;
use crate::{
    analysis::TakenOut,
    model::{HeapAsked, Kind, TensorsMode},
    probes::prober::ProbeRequest,
};
use heap::HeapLayer;

/// How often the verdicts are looked at for the next layer of each process.
const ENGAGE_EVERY_S: f64 = 1.0;
/// The growth of a page-level stack that calls for its process's malloc family, over how long at
/// least (from when its tensors were traced, where they were).
const ENGAGE_MIN_BYTES: i64 = 4 << 20;
const ENGAGE_SPAN_S: f64 = 10.0;
/// The growth that calls for its tensors, over how long at least: a tensor leak of a CPU training
/// job grows its pages by megabytes a second, and its tensors cost far less than its mallocs. A
/// brk stack's must also have risen in every window, or by [`ENGAGE_MIN_BYTES`] (see
/// `Analysis::rising_pages`): its tensors traced for [`TENSORS_HOLD_S`] slow a loop by a quarter
/// meanwhile.
const TENSORS_MIN_BYTES: i64 = 256 << 10;
const TENSORS_SPAN_S: f64 = 1.0;
/// How long after its tensors were asked for a process's other layers wait, so that what its
/// tensors explain is known first (the probes go in within a few hundred milliseconds).
const TENSORS_SETTLE_S: f64 = 2.0;
/// How long its tensors are traced at least before they may be taken out again, where neither
/// they nor its pages grow (a verdict needs a few samples).
const TENSORS_HOLD_S: f64 = 3.0;
/// How long its tensors are traced at least before their pages may call for its malloc family
/// (the growth they do not explain is judged a second after the probes went in, over a second
/// at least: `Owner::heap_beyond_traced_tensors`).
const BEYOND_AFTER_S: f64 = 2.0;
/// How long after its tensors were kept as they were, once their leak was confirmed, they are
/// traced again (to tell whether they still leak, or were freed): twice as long each time, up
/// to the most.
const TENSORS_AGAIN_S: f64 = 10.0;
const TENSORS_AGAIN_MOST_S: f64 = 160.0;
/// The growth of a process's page-level stacks, over [`TENSORS_SPAN_S`] at least, that its
/// tensors traced for [`BEYOND_AFTER_S`] do not explain and that calls for its malloc family
/// at once: its pages grow by megabytes a second (a loop keeping each step's autograd nodes).
const UNEXPLAINED_MIN_BYTES: i64 = 1 << 20;

/// `at_s` plus `every_s`, which doubles for the next time, up to [`TENSORS_AGAIN_MOST_S`].
fn doubling(every_s: &mut f64, at_s: f64) -> f64 {
    let when = at_s + *every_s;
    *every_s = (*every_s * 2.0).min(TENSORS_AGAIN_MOST_S);
    when
}

/// The layers asked for, per process.
pub(super) struct Layers {
    /// `--tensors auto`.
    tensors_layered: bool,
    /// `--tensors all`: every CPU tensor traced from the start.
    tensors_all: bool,
    /// Processes whose malloc family the prober was asked to trace.
    heap: HashMap<u32, HeapLayer>,
    /// Processes whose tensors the prober was asked to trace.
    tensors: HashMap<u32, TensorLayer>,
    /// Processes whose tensors were taken out at the last look: forgotten at the next, once
    /// the records made before the probes went are in.
    forget: Vec<u32>,
}

/// A process's tensors as a layer: when they were last asked for (seconds traced), whether the
/// prober traces them now and since when (on the series' axis: probes for one process take a
/// while to go in), where they were taken out last and, while
/// they are kept as they were (their leak confirmed), when they are traced again and how long
/// after the next time.
#[derive(Clone, Copy)]
struct TensorLayer {
    asked_s: f64,
    on_x: f64,
    on: bool,
    off_x: Option<f64>,
    again_s: Option<f64>,
    every_s: f64,
    /// While they are kept: when (on the series' axis) its pages were last looked at, and what
    /// they held then.
    pages_at: Option<(f64, i64)>,
    /// When (on the series' axis) its tensors' leak last grew, by its pages: when it was
    /// confirmed, or when a look at its pages since found it growing (or about when it
    /// stopped).
    stop_x: f64,
    /// Taken out without a leak of theirs (forgotten): not asked for again before then,
    /// however its pages grow, and how long after the next time (twice as long each time, see
    /// [`TENSORS_AGAIN_S`]). Pages that grow while the tensors do not (a leak of the malloc
    /// family, of Python objects) would otherwise call for them every few seconds.
    quiet_until_s: f64,
    quiet_every_s: f64,
    /// Where (on the series' axis) its pages were last seen holding while its tensors were
    /// traced, which had them forgotten: what grew before had stopped growing by then.
    held_from: f64,
}

impl TensorLayer {
    /// Never asked for yet, at `x` on the series' axis.
    fn new(x: f64) -> Self {
        Self {
            asked_s: f64::NEG_INFINITY,
            on_x: x,
            on: false,
            off_x: None,
            again_s: None,
            every_s: TENSORS_AGAIN_S,
            pages_at: None,
            stop_x: x,
            quiet_until_s: f64::NEG_INFINITY,
            quiet_every_s: TENSORS_AGAIN_S,
            held_from: f64::NEG_INFINITY,
        }
    }
}

impl Layers {
    pub(super) fn new(tensors: TensorsMode) -> Self {
        Self {
            tensors_layered: tensors == TensorsMode::Auto,
            tensors_all: tensors == TensorsMode::All,
            heap: HashMap::new(),
            tensors: HashMap::new(),
            forget: Vec::new(),
        }
    }
}

impl Owner {
    /// Asks for the next layer of each process whose memory calls for it. Looked at once a
    /// second at most.
    pub(super) fn engage_layers(&mut self, at_s: f64, x: f64) {
        self.note_tensors(at_s, x);
        // Every sample while a malloc family is traced: each second of it costs the most; and
        // while tensors are traced, whether their pages call for it.
        self.take_out_heap(at_s, x);
        self.heap_beyond_traced_tensors(at_s, x);
        if at_s - self.objects.looked_s < ENGAGE_EVERY_S {
            return;
        }
        self.objects.looked_s = at_s;
        let Some(layers) = &mut self.layers else {
            // `--heap full`: Python objects' windows alone.
            self.object_windows(at_s, x);
            return;
        };
        for pid in std::mem::take(&mut layers.forget) {
            self.ledger.forget_tensors(pid);
        }
        self.engage_tensors(at_s, x);
        self.object_windows(at_s, x);
        self.engage_heap(at_s, x);
        self.heap_beyond_all_tensors(at_s, x);
    }

    /// Whether a leak of `pid`'s tensors has been confirmed: judged one on their chain for
    /// [`crate::analysis::TENSORS_CONFIRM_S`], or kept as it was once it was.
    fn tensors_confirmed(&self, pid: u32) -> bool {
        self.analysis
            .tensors_leak(pid)
            .is_some_and(|span| span >= crate::analysis::TENSORS_CONFIRM_S)
            || self.analysis.kept_leak_rate(pid).is_some()
    }

    /// At the run's end: a malloc family traced again and still undecided (no leak confirmed in
    /// that window, nor its heap held long enough) tells too little; the window before stands.
    pub(super) fn heap_windows_cut_short(&mut self) {
        let Some(layers) = &self.layers else {
            return;
        };
        let open = layers.heap.iter().filter(|(_, h)| h.again && !h.out);
        let pids: Vec<u32> = open.map(|(&pid, _)| pid).collect();
        for pid in pids {
            tracing::info!(pid, "malloc family traced again, undecided at the end");
            self.ledger.heap_window_undecided(pid);
            self.analysis.heap_window_undecided(pid);
        }
    }

    /// Whether a process's tensors or malloc family are traced now, to be judged (samples are
    /// then taken at the finest pace: the program runs slowly until they are taken out).
    pub(super) fn layer_judged(&self) -> bool {
        self.layers
            .as_ref()
            .is_some_and(|l| l.heap.values().any(|h| !h.out) || l.tensors.values().any(|t| t.on))
    }

    /// Takes out `pid`'s tensors with its malloc family, where they were traced under it: kept
    /// as they are where their own leak is confirmed, forgotten where they do not read as a
    /// leak. Where they do, not yet for [`crate::analysis::TENSORS_CONFIRM_S`], they stay
    /// traced until [`Owner::disengage_tensors`] decides (forgotten, a Trainer job's hidden
    /// states kept at 8 MiB/s went unreported in one run of four, its malloc family's leak
    /// confirmed first). Traced again after a leak of theirs was kept, as
    /// [`Owner::disengage_tensors`] would: stopped where it no longer grows; still traced, to be
    /// judged on, where it grows but is not confirmed yet (forgotten, a leak confirmed before
    /// went unreported: an accumulator grown by copying, traced again under a malloc family
    /// that slowed it, had not read as one again by then).
    fn tensors_out_with_heap(&mut self, pid: u32, at_s: f64, x: f64) {
        let on = self
            .layers
            .as_ref()
            .and_then(|l| l.tensors.get(&pid))
            .is_some_and(|t| t.on);
        if !on {
            return;
        }
        let leak = self.analysis.tensors_leak(pid);
        let confirmed = leak.is_some_and(|span| span >= crate::analysis::TENSORS_CONFIRM_S);
        let again = self.analysis.kept_leak_rate(pid).is_some();
        tracing::debug!(pid, leak_s = ?leak, again, "tensors as the malloc family goes out");
        if confirmed {
            self.take_out_tensors(pid, at_s, x, TakenOut::Kept);
        } else if again && !self.analysis.tensors_grew(pid) {
            self.leak_stopped(pid, at_s, x);
        } else if !again && leak.is_none() {
            self.take_out_tensors(pid, at_s, x, TakenOut::Forgotten);
        }
    }

    /// Where the verdicts that call for `pid`'s next layer begin: the warm-up, or when its
    /// tensors were traced (what they explain is known from then on); never, for the first
    /// seconds after they were asked for.
    pub(super) fn judged_from(&self, pid: u32, at_s: f64) -> f64 {
        let warmup = self.config.warmup;
        let Some(t) = self.layers.as_ref().and_then(|l| l.tensors.get(&pid)) else {
            return warmup;
        };
        if at_s - t.asked_s < TENSORS_SETTLE_S {
            return f64::INFINITY;
        }
        self.analysis
            .tensors_first(pid)
            .map_or(warmup, |x| warmup.max(x))
    }

    /// Notes which processes' tensors the prober traces now, and tells the ledger and the
    /// analysis each time they went in.
    fn note_tensors(&mut self, at_s: f64, x: f64) {
        let Some(layers) = &mut self.layers else {
            return;
        };
        let info = self.prober.info.borrow();
        for (pid, t) in layers.tensors.iter_mut() {
            // Not while a taking out is on its way to the prober.
            let on = info.tensors_traced.contains(pid) && t.off_x.is_none();
            if on && !t.on {
                t.on_x = x;
                self.ledger.tensors_traced(*pid, at_s);
                self.analysis.tensors_traced_from(*pid, x);
            }
            t.on = on;
        }
    }

    /// Under layers, each live process's CPU time at the sample at `x`: what the rate of a leak
    /// of tensors kept as they were is counted in, and what tells how much slower a layer made
    /// the program run (analysis/cpu.rs).
    pub(super) fn sample_cpu(&mut self, x: f64) {
        if self.layers.is_none() {
            return;
        }
        let live = self.ledger.procs.values().filter(|p| p.exited_ns.is_none());
        for p in live {
            if let Some(cpu) = crate::procfs::cpu_times(p.pid) {
                self.analysis.sample_cpu(x, p.pid, cpu);
            }
        }
    }

    /// `--tensors auto`: asks for the CPU tensors of each process with a page-level stack (not
    /// an arena's) judged a leak over the later half of the run so far, and since its tensors
    /// were last taken out, and of those kept as they were whose time to be traced again came;
    /// and takes out those of the processes whose memory holds or whose leak is confirmed.
    fn engage_tensors(&mut self, at_s: f64, x: f64) {
        if !self.layers.as_ref().is_some_and(|l| l.tensors_layered) {
            return;
        }
        self.disengage_tensors(at_s, x);
        // Over the later half of the run so far: importing torch grows pages for a second or
        // two as a leak would.
        let half = self.config.warmup.max(x / 2.0);
        // And since they were last taken out.
        let off = |pid: u32| {
            let t = self.layers.as_ref().and_then(|l| l.tensors.get(&pid));
            t.and_then(|t| t.off_x).map_or(half, |o| half.max(o))
        };
        let grown =
            self.analysis
                .rising_pages(off, TENSORS_SPAN_S, TENSORS_MIN_BYTES, ENGAGE_MIN_BYTES);
        let mut pids = self.not_arenas(grown);
        self.kept_pages_held(at_s, x);
        if let Some(l) = &self.layers {
            let due = l.tensors.iter().filter(|(_, t)| t.again_s.is_some());
            pids.extend(due.map(|(&pid, _)| pid));
        }
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|&pid| self.maps_torch(pid));
        let Some(layers) = &mut self.layers else {
            return;
        };
        let due: Vec<u32> = pids
            .into_iter()
            .filter(|&tgid| {
                let t = layers.tensors.get(&tgid);
                // Kept as they were, and not yet time to trace them again; or given up on, and
                // not yet time to look again.
                let waits = t.and_then(|t| t.again_s).is_some_and(|again| at_s < again);
                let quiet = t.is_some_and(|t| t.again_s.is_none() && at_s < t.quiet_until_s);
                !waits && !quiet
            })
            .collect();
        for tgid in due {
            match self.heap_leaked_before(tgid) {
                Some(again_s) if at_s >= again_s => {
                    self.ask_heap(tgid, at_s, x, HeapAsked::BeyondTensors)
                }
                Some(_) => {} // waits for its malloc family's time
                None => self.ask_tensors(tgid, at_s, x),
            }
        }
    }

    /// Asks for `tgid`'s CPU tensors (`at_s` seconds into tracing, `x` on the series' axis),
    /// unless they were asked for already and neither given up nor taken out since.
    fn ask_tensors(&mut self, tgid: u32, at_s: f64, x: f64) {
        if self.traced_whole(tgid) {
            return; // tensors too
        }
        let Some(layers) = &mut self.layers else {
            return;
        };
        let t = layers
            .tensors
            .entry(tgid)
            .or_insert_with(|| TensorLayer::new(x));
        if t.asked_s.is_finite() && (t.on || t.off_x.is_none()) {
            return;
        }
        // Once they are traced, those of the leak kept, and of the stacks held and rising
        // beside it, stay: frees of theirs seen from then on release them (see
        // `Ledger::keep_tensors`).
        if t.again_s.take().is_some() {
            let held = self.analysis.kept_held_stacks(tgid);
            tracing::debug!(
                tgid,
                stacks = held.len(),
                "tensors traced again: those held stay"
            );
            self.ledger.forget_tensors_when_traced(tgid, held);
        }
        (t.asked_s, t.off_x) = (at_s, None);
        self.ledger.layer_asked(tgid);
        let ask = ProbeRequest::EngageTensors {
            tgid,
            after_s: at_s,
        };
        let _ = self.prober.requests.send(ask);
    }

    /// Brings forward the next tracing of the tensors kept as they were of each process whose
    /// pages grew by less than a quarter of what their leak's rate says over [`TENSORS_HOLD_S`]
    /// or more (looked at every so long since they were kept): the leak may have stopped (a
    /// cache that filled for longer than it took to confirm), and only its tensors can tell.
    /// Each look also dates when the leak last grew, by its pages (see
    /// [`Owner::leak_stopped`]). Not where it had stopped when they were kept: the next
    /// tracing is when it will have been quiet for as long as it grew.
    fn kept_pages_held(&mut self, at_s: f64, x: f64) {
        let Some(layers) = &self.layers else {
            return;
        };
        let mut looked: Vec<(u32, i64, Option<f64>)> = Vec::new();
        for (&pid, t) in &layers.tensors {
            let (Some((since, then)), Some(_)) = (t.pages_at, t.again_s) else {
                continue;
            };
            // The least the leak would have grown by: whether its pages held is not to be told
            // from a program that the machine slowed.
            let Some((leaked, _)) = self.analysis.kept_leak_bytes(pid, since, x) else {
                continue;
            };
            if x - since < TENSORS_HOLD_S || self.analysis.kept_leak_stopped(pid) {
                continue;
            }
            let now = self.analysis.pages_now(pid);
            let grown = (now - then).max(0) as f64;
            // Still growing at the leak's rate, or until about when (at that rate).
            let held = grown * 4.0 < leaked;
            let stop = since + (grown / leaked.max(1.0) * (x - since)).min(x - since);
            looked.push((pid, now, held.then_some(stop)));
        }
        let Some(layers) = &mut self.layers else {
            return;
        };
        for (pid, now, held) in looked {
            let Some(t) = layers.tensors.get_mut(&pid) else {
                continue;
            };
            t.pages_at = Some((x, now));
            t.stop_x = held.unwrap_or(x);
            if held.is_some() && t.again_s.is_some_and(|again| again > at_s) {
                tracing::debug!(pid, "pages held since the tensors were kept: traced again");
                t.again_s = Some(at_s);
            }
        }
    }

    /// Whether `pid` maps a library with PyTorch's CPU allocator (one the prober found): the
    /// processes whose tensors can be asked for, and whose other layers then wait for them.
    pub(super) fn maps_torch(&self, pid: u32) -> bool {
        let info = self.prober.info.borrow();
        !info.tensor_libraries.is_empty()
            && crate::procfs::ProcMaps::read(pid)
                .is_some_and(|m| m.maps_any(&info.tensor_libraries))
    }

    /// Takes out the tensors of each process traced for [`TENSORS_HOLD_S`] at least whose
    /// tensors and pages have not grown since (a CPU training job's pages grow for its first
    /// steps, then hold), or whose tensors have been judged a leak on their chain for
    /// [`crate::analysis::TENSORS_CONFIRM_S`] (kept as they are then, and traced again later):
    /// a training loop makes tens of thousands of tensors a second, each two probe traps. Its
    /// pages growing again bring them back. Traced again after a confirmed leak, those whose
    /// leak no longer grows are kept as they were judged, or forgotten (see
    /// [`Owner::leak_stopped`]).
    fn disengage_tensors(&mut self, at_s: f64, x: f64) {
        for (pid, from) in self.tensors_traced_for(at_s, TENSORS_HOLD_S) {
            if self.heap_asked(pid) {
                continue;
            }
            let again = self.analysis.kept_leak_rate(pid).is_some();
            if again && !self.analysis.tensors_grew(pid) {
                self.leak_stopped(pid, at_s, x);
                continue;
            }
            match self.analysis.tensors_leak(pid) {
                Some(span) if span >= crate::analysis::TENSORS_CONFIRM_S => {
                    self.take_out_tensors(pid, at_s, x, TakenOut::Kept)
                }
                Some(_) => {}
                None if self.pages_held(pid, from) => {
                    self.take_out_tensors(pid, at_s, x, TakenOut::Forgotten);
                    let layer = self.layers.as_mut().and_then(|l| l.tensors.get_mut(&pid));
                    if let Some(t) = layer {
                        t.held_from = from;
                    }
                }
                None => {}
            }
        }
    }

    /// The processes whose tensors are traced and were asked for `held_s` ago at least, each
    /// with when the tensors outstanding when the probes went in were all seen (the first
    /// samples after rise to them from nothing): what their pages are judged from.
    fn tensors_traced_for(&self, at_s: f64, held_s: f64) -> Vec<(u32, f64)> {
        let Some(layers) = &self.layers else {
            return Vec::new();
        };
        let traced = layers
            .tensors
            .iter()
            .filter(|(_, t)| t.on && at_s - t.asked_s >= held_s);
        traced
            .map(|(&pid, t)| (pid, t.on_x + crate::analysis::TENSOR_RAMP))
            .collect()
    }

    /// Whether none of `pid`'s page-level stacks (not arenas) grows as a leak from `from` on.
    fn pages_held(&mut self, pid: u32, from: f64) -> bool {
        let pages = self.analysis.growing_pages(
            |p| if p == pid { from } else { f64::INFINITY },
            TENSORS_SPAN_S,
            TENSORS_MIN_BYTES,
        );
        self.not_arenas(pages).is_empty()
    }

    /// The processes (`pid`'s alone, where given) with a page-level stack (not an arena's)
    /// that grows as a leak from `from` on, by [`UNEXPLAINED_MIN_BYTES`] at least, while their
    /// tensors grew by less than half of that.
    fn pages_beyond_tensors(&mut self, pid: Option<u32>, from: f64) -> Vec<u32> {
        let pages =
            self.analysis
                .pages_beyond_tensors(pid, from, TENSORS_SPAN_S, UNEXPLAINED_MIN_BYTES);
        let mut pids = self.not_arenas(pages);
        pids.dedup();
        pids
    }

    /// `pid`'s tensors, traced again after their leak was confirmed, grew no more: the leak
    /// stopped, by its pages about when they last grew at its rate. Until it has been quiet for
    /// as long as it grew (from when its tensors were first traced), it is the leak it was (a
    /// training loop that leaked until it ended, then evaluation, saving and exit): its tensors
    /// are kept as they were judged, and traced again when that time comes. After, it was a
    /// cache that filled: they are forgotten.
    fn leak_stopped(&mut self, pid: u32, at_s: f64, x: f64) {
        let Some(t) = self.layers.as_ref().and_then(|l| l.tensors.get(&pid)) else {
            return;
        };
        let from = self.analysis.tensors_chain_from(pid).unwrap_or(t.stop_x);
        let (grew, quiet) = (t.stop_x - from, x - t.stop_x);
        tracing::debug!(pid, grew, quiet, "a leak of tensors stopped");
        if quiet >= grew {
            self.take_out_tensors(pid, at_s, x, TakenOut::Forgotten);
            return;
        }
        self.take_out_tensors(pid, at_s, x, TakenOut::Stopped(t.stop_x + grew));
        if let Some(t) = self.layers.as_mut().and_then(|l| l.tensors.get_mut(&pid)) {
            t.again_s = Some(at_s + grew - quiet + ENGAGE_EVERY_S);
        }
    }

    /// Takes out `pid`'s tensors at `at_s` (on the series' axis, `x`): those outstanding are
    /// forgotten at the next look (once the records made before the probes went are in), or
    /// kept as they are (their leak confirmed, or stopped) until they are traced again.
    fn take_out_tensors(&mut self, pid: u32, at_s: f64, x: f64, how: TakenOut) {
        tracing::info!(pid, at_s, ?how, "CPU tensors taken out");
        self.analysis.tensors_taken_out(pid, x, how);
        let kept = how != TakenOut::Forgotten;
        if kept {
            self.ledger.keep_tensors(pid, at_s);
        }
        let Some(l) = self.layers.as_mut() else {
            return;
        };
        if !kept {
            l.forget.push(pid);
        }
        if let Some(t) = l.tensors.get_mut(&pid) {
            (t.on, t.off_x) = (false, Some(x));
            if kept {
                t.again_s = Some(doubling(&mut t.every_s, at_s));
                t.pages_at = Some((x, self.analysis.pages_now(pid)));
            } else {
                t.quiet_until_s = doubling(&mut t.quiet_every_s, at_s);
            }
            if how == TakenOut::Kept {
                t.stop_x = x;
            }
        }
        let _ = self
            .prober
            .requests
            .send(ProbeRequest::DisengageTensors { tgid: pid });
    }

    /// The processes of the page-level stacks `grown` that are not arenas of Python objects:
    /// arenas grow without a malloc call or a tensor, and tracing either would cost its traps
    /// and tell nothing of them.
    fn not_arenas(&mut self, grown: Vec<crate::model::GroupKey>) -> Vec<u32> {
        let mut pids: Vec<u32> = grown
            .into_iter()
            .filter(|k| !self.is_arena(k))
            .map(|k| k.pid)
            .collect();
        pids.dedup();
        pids
    }

    /// Whether `key`'s stack maps arenas of CPython's object allocator (an mmap stack, looked at
    /// once, without symbolizing it).
    pub(super) fn is_arena(&mut self, key: &crate::model::GroupKey) -> bool {
        let Some(id) = key.stack.filter(|_| key.kind == Kind::Mmap) else {
            return false;
        };
        if let Some(&known) = self.objects.arena_stacks.get(&id) {
            return known;
        }
        let Some((frames, _)) = self.ledger.stacks.get(id) else {
            return false;
        };
        let arena = crate::symbolize::python_arenas_raw(key.kind, &frames);
        self.objects.arena_stacks.insert(id, arena);
        arena
    }
}
