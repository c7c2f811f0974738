//! The malloc family as a layer of `--heap auto` (layers.rs): asked for where a process's pages
//! grow beyond what its tensors explain, or for ten seconds with no layer below; taken out once
//! its leak is confirmed, or its heap held; asked for again while its pages grow on.

use super::{BEYOND_AFTER_S, ENGAGE_MIN_BYTES, ENGAGE_SPAN_S, Owner, TENSORS_HOLD_S, doubling};
use crate::{model::HeapAsked, probes::prober::ProbeRequest};

/// How long a leak of its heap must have been judged one before a process's malloc family is
/// taken out, its heap stacks kept as they were: every malloc and free is a probe trap (a
/// training job keeping each step's loss runs two to five times slower while they are traced).
/// Its samples are taken 50 ms apart meanwhile, so a second is twenty of them.
const HEAP_CONFIRM_S: f64 = 1.0;
/// The same, where a leak of the process's tensors was confirmed: the heap leaking beside it is
/// what else the leak keeps (a Trainer job's kept hidden states hold their autograd nodes), and
/// each second of the window slows its loop about threefold. Ten samples.
const HEAP_CONFIRM_BESIDE_TENSORS_S: f64 = 0.5;
/// How long a process's malloc family is traced at least, without a leak of its heap, before
/// it is taken out as it is: its pages grew while its heap held (the allocator's retention).
/// The probes go in within half a second, and the heap outstanding before them is not seen:
/// its first samples rise to the working set, then hold.
const HEAP_HOLD_S: f64 = 5.0;
/// How long after a process's malloc family was taken out it may be traced again, where its
/// pages go on growing (over [`ENGAGE_SPAN_S`] since, by [`ENGAGE_MIN_BYTES`], as asked for the
/// first time): twice as long each time, up to
/// [`TENSORS_AGAIN_MOST_S`](super::TENSORS_AGAIN_MOST_S). A leak of its heap may have stopped or
/// another begun; each window costs about what the first one did.
const HEAP_AGAIN_S: f64 = 10.0;

/// A process's malloc family as a layer: when it was last asked for, whether that was again
/// after a take-out, and since when its heap has leaked without a break (seconds traced), until
/// it is taken out. Out: where it went (on the series' axis), when it may be asked for again
/// while its pages grow on, and how long after that the time after (see [`HEAP_AGAIN_S`]).
#[derive(Clone, Copy)]
pub(super) struct HeapLayer {
    pub(super) asked_s: f64,
    pub(super) leak_since: Option<f64>,
    pub(super) out: bool,
    pub(super) again: bool,
    /// Taken out last with its leak confirmed (not because its heap held).
    pub(super) leaked: bool,
    pub(super) out_x: f64,
    pub(super) again_s: f64,
    pub(super) every_s: f64,
}

impl Owner {
    /// Takes out the malloc family of each process whose heap has leaked for
    /// [`HEAP_CONFIRM_S`], or has not leaked in [`HEAP_HOLD_S`]: its heap stacks are judged as
    /// they were then.
    pub(super) fn take_out_heap(&mut self, at_s: f64, x: f64) {
        let Some(layers) = &self.layers else {
            return;
        };
        let traced: Vec<(u32, HeapLayer)> = layers
            .heap
            .iter()
            .filter(|(_, h)| !h.out)
            .map(|(&pid, &h)| (pid, h))
            .collect();
        for (pid, mut h) in traced {
            let leaks = self.analysis.heap_leaks(pid, self.config.warmup);
            h.leak_since = leaks.then(|| h.leak_since.unwrap_or(at_s));
            let confirm = if self.tensors_confirmed(pid) {
                HEAP_CONFIRM_BESIDE_TENSORS_S
            } else {
                HEAP_CONFIRM_S
            };
            let confirmed = h.leak_since.is_some_and(|s| at_s - s >= confirm);
            let held = !leaks && at_s - h.asked_s >= HEAP_HOLD_S;
            if confirmed || held {
                let _ = self
                    .prober
                    .requests
                    .send(ProbeRequest::DisengageHeap { tgid: pid });
                self.ledger.heap_taken_out(pid, at_s, held);
                self.analysis.heap_taken_out(pid, x);
                (h.out, h.out_x, h.leaked) = (true, x, confirmed);
                h.again_s = doubling(&mut h.every_s, at_s);
                tracing::info!(pid, at_s, held, "malloc family taken out");
                self.tensors_out_with_heap(pid, at_s, x);
            }
            if let Some(layers) = &mut self.layers {
                layers.heap.insert(pid, h);
            }
        }
    }

    /// Asks for the malloc family of each process whose tensors have been traced for
    /// [`BEYOND_AFTER_S`] and whose pages grow, not by its tensors, from when those outstanding
    /// were all seen: the next layer, which its tensors stay under (a block of posix_memalign's
    /// is a tensor's where tensors are traced) and go out with. Looked at every sample: each
    /// second of the tensors' window slows a training loop by a quarter, and the malloc
    /// family's window that follows it must wait for it.
    pub(super) fn heap_beyond_traced_tensors(&mut self, at_s: f64, x: f64) {
        for (pid, from) in self.tensors_traced_for(at_s, BEYOND_AFTER_S) {
            if !self.heap_asked(pid) && !self.pages_beyond_tensors(Some(pid), from).is_empty() {
                self.ask_heap(pid, at_s, x, HeapAsked::BeyondTensors);
            }
        }
    }

    /// Asks for the malloc family of each process with a page-level stack judged a leak that its
    /// tensors do not explain (the prober leaves out all but the layered processes whose malloc
    /// family is not traced now): the first time, or again after its take-out, judged since.
    pub(super) fn engage_heap(&mut self, at_s: f64, x: f64) {
        // Where its malloc family was taken out, its pages since then; where its pages were
        // last seen holding while its tensors were traced, since then (a no-leak transformer
        // job's heap top, up by 10 MiB over 20 s as longer sequences came and holding through
        // its tensors' second window, had its malloc family traced for 5 s after it).
        let start = |pid: u32| {
            let layers = self.layers.as_ref();
            let out = layers.and_then(|l| l.heap.get(&pid));
            let held = layers
                .and_then(|l| l.tensors.get(&pid))
                .map(|t| t.held_from);
            let from = self
                .judged_from(pid, at_s)
                .max(held.unwrap_or(f64::NEG_INFINITY));
            out.filter(|h| h.out).map_or(from, |h| from.max(h.out_x))
        };
        let grown = self
            .analysis
            .unexplained_pages(start, ENGAGE_SPAN_S, ENGAGE_MIN_BYTES);
        let pids = self.not_arenas(grown);
        // Its tensors first, where they are layered and it maps PyTorch.
        let waits = |o: &Self, pid: u32| {
            let Some(layers) = &o.layers else {
                return false;
            };
            let asked = layers
                .tensors
                .get(&pid)
                .is_some_and(|t| t.asked_s.is_finite());
            layers.tensors_layered && !asked && o.maps_torch(pid)
        };
        for pid in pids {
            if !waits(self, pid) {
                self.ask_heap(pid, at_s, x, HeapAsked::Unexplained);
            }
        }
    }

    /// `--tensors all`: every CPU tensor is traced from the start, so the pages of a process
    /// whose tensors held bytes (PyTorch's), growing beyond its tensors over the later half of the run so far,
    /// call for its malloc family at once, as where its tensors are a layer
    /// ([`Owner::disengage_tensors`]); not before that path could ask for it at the soonest
    /// (a second of growth past the start-up, then its tensors traced [`TENSORS_HOLD_S`]).
    /// Else a leak of autograd nodes, pages that grow while the tensors hold, waited for the
    /// 10 s of [`Owner::engage_heap`], and a 100-epoch job that keeps its losses ended first.
    pub(super) fn heap_beyond_all_tensors(&mut self, at_s: f64, x: f64) {
        let all = self.layers.as_ref().is_some_and(|l| l.tensors_all);
        if !all || at_s < 2.0 * TENSORS_HOLD_S {
            return;
        }
        let from = self.config.warmup.max(x / 2.0);
        for pid in self.pages_beyond_tensors(None, from) {
            if self.analysis.held_tensors(pid) {
                self.ask_heap(pid, at_s, x, HeapAsked::BeyondTensors);
            }
        }
    }

    /// Whether `tgid`'s malloc family is traced whole, as under `--heap full` (a native
    /// process's, its probes firing for every process): never a layer, asked for or taken out
    /// (taken out, it would be judged as of then while its probes fired on).
    pub(super) fn traced_whole(&self, tgid: u32) -> bool {
        self.prober.info.borrow().heap_whole.contains(&tgid)
    }

    /// Asks for `tgid`'s malloc family (`at_s` seconds into tracing, `x` on the series' axis,
    /// `why`): the first time, or again where it was taken out and its time to be traced again
    /// came.
    pub(super) fn ask_heap(&mut self, tgid: u32, at_s: f64, x: f64, why: HeapAsked) {
        if self.traced_whole(tgid) {
            return;
        }
        let Some(layers) = &mut self.layers else {
            return;
        };
        let h = layers.heap.entry(tgid).or_insert(HeapLayer {
            asked_s: f64::NAN,
            leak_since: None,
            out: true,
            again: false,
            leaked: false,
            out_x: 0.0,
            again_s: 0.0,
            every_s: HEAP_AGAIN_S,
        });
        if !h.out || at_s < h.again_s {
            return;
        }
        let again = h.asked_s.is_finite();
        (h.asked_s, h.leak_since, h.out, h.again) = (at_s, None, false, again);
        // The prober traces its tensors under it (a block of posix_memalign's is a tensor's
        // where they are traced): asked for with it, they go out with it. Unasked, they stayed
        // traced after it, unknown here, until pages that grew asked for them and they held
        // (two minutes at a time on a 30-minute job).
        if layers.tensors_layered && self.maps_torch(tgid) {
            self.ask_tensors(tgid, at_s, x);
        }
        if again {
            tracing::info!(tgid, at_s, "malloc family asked for again: pages grow on");
            self.heap_traced_again(tgid, x);
        } else {
            tracing::info!(tgid, at_s, ?why, "malloc family asked for");
            self.ledger.heap_asked(tgid, why);
            self.analysis.heap_asked(tgid, x);
        }
        let ask = ProbeRequest::EngageHeap {
            tgid,
            after_s: at_s,
        };
        let _ = self.prober.requests.send(ask);
    }

    /// `tgid`'s malloc family asked for again at `x` (on the series' axis): the blocks of its
    /// leak's stacks stay, and its heap is judged from then on.
    pub(super) fn heap_traced_again(&mut self, tgid: u32, x: f64) {
        let leaks = self.analysis.heap_leak_stacks(tgid, self.config.warmup);
        self.ledger.heap_traced_again(tgid, |s| leaks.contains(&s));
        self.analysis.heap_traced_again(tgid, x);
    }

    /// When `tgid`'s pages that grow on call for its malloc family (which brings its tensors
    /// with it), not for its tensors first: where its heap leaked when it was last traced and
    /// its tensors did not (they are not kept as a leak of theirs), at its time to be traced
    /// again. Its tensors' window before it, two seconds at a quarter slower, told last time
    /// that they do not explain its pages; pages that grow before that time wait for it.
    pub(super) fn heap_leaked_before(&self, tgid: u32) -> Option<f64> {
        let layers = self.layers.as_ref()?;
        let kept = layers
            .tensors
            .get(&tgid)
            .is_some_and(|t| t.again_s.is_some());
        let heap = layers.heap.get(&tgid).filter(|h| h.out && h.leaked);
        heap.filter(|_| !kept).map(|h| h.again_s)
    }

    /// Whether `pid`'s malloc family was asked for and is not taken out yet.
    pub(super) fn heap_asked(&self, pid: u32) -> bool {
        let layers = self.layers.as_ref();
        layers.is_some_and(|l| l.heap.get(&pid).is_some_and(|h| !h.out))
    }
}
