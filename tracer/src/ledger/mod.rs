//! The single owner of tracing state: processes and their outstanding allocations, the stack table,
//! and every loss counter. Fed in order by ingest; queried for aggregates by the report.

mod blocks;
mod device;
mod dips;
mod objects;
mod process;
mod regions;
mod stacks;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Serialize;
use tracer_common::AllocFn;

pub use device::{Device, Failure};
pub use objects::KeptLine;
pub use process::{Mismatches, Process, TensorLayer, page_up};
pub use stacks::StackTable;

use crate::{
    ingest::{Event, Fill, Input, KernelCounters, What},
    model::{GroupKey, HeapAsked, Kind, StackId},
};

/// Where a piece of memory came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub stack: Option<StackId>,
    pub ts_ns: u64,
    pub func: Option<AllocFn>,
    /// Copied from the parent at fork.
    pub inherited: bool,
}

/// Outstanding memory of one (process, stack, kind, inherited) group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub pid: u32,
    pub stack: Option<StackId>,
    pub kind: Kind,
    pub inherited: bool,
    pub bytes: u64,
    pub blocks: u64,
    pub oldest_ns: u64,
    pub funcs: Vec<AllocFn>,
}

impl Group {
    /// The group's identity across samples.
    pub fn key(&self) -> GroupKey {
        GroupKey {
            pid: self.pid,
            stack: self.stack,
            kind: self.kind,
            inherited: self.inherited,
        }
    }

    /// A group of `key` holding nothing, as old as `oldest_ns`.
    pub fn empty(key: GroupKey, oldest_ns: u64) -> Self {
        Group {
            pid: key.pid,
            stack: key.stack,
            kind: key.kind,
            inherited: key.inherited,
            bytes: 0,
            blocks: 0,
            oldest_ns,
            funcs: Vec::new(),
        }
    }
}

impl Origin {
    /// The group a block of `kind` from this origin belongs to in process `pid`.
    pub fn key(&self, pid: u32, kind: Kind) -> GroupKey {
        GroupKey {
            pid,
            stack: self.stack,
            kind,
            inherited: self.inherited,
        }
    }
}

/// Losses seen outside the kernel.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct IngestLosses {
    pub stack_table_full: u64,
    pub undecodable: u64,
}

/// All tracing state.
#[derive(Default)]
pub struct Ledger {
    pub procs: BTreeMap<u32, Process>,
    pub stacks: StackTable,
    pub kernel: KernelCounters,
    pub ingest: IngestLosses,
    /// How full the tables that can overflow were, last ingest said.
    pub fill: Fill,
    pub events: u64,
    /// Step boundaries seen (entries of the `--step-symbol` function).
    pub steps: u64,
    /// `--heap sampled`'s mean interval in bytes (0: every heap block is recorded): a recorded
    /// block counts for more than its size (`ingest::unsampled`).
    pub heap_sampling: u64,
    /// Per stack (indexed by its number): allocations and frees of blocks (heap, tensors, device
    /// memory) made at it so far, which tells the analysis whether a stack's flat stretch is a
    /// cache at work or a stack the program stopped using.
    activity: Vec<u32>,
}

impl Ledger {
    /// Opens the window of `pid`'s Python objects (probes/objects.rs), from its first object.
    pub fn open_objects(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.objects = Some(objects::ObjectWindow::default());
        }
    }

    /// `pid`'s CPU tensors or its malloc family are asked for, where they were not traced from
    /// its start (`--heap auto`): their records may come from now on, and frees of blocks made
    /// before.
    pub fn layer_asked(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.layer_late = true;
        }
    }

    /// `pid`'s malloc family is asked for the first time, `why` (`--heap auto`).
    pub fn heap_asked(&mut self, pid: u32, why: HeapAsked) {
        self.layer_asked(pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.heap_asked.get_or_insert(why);
        }
    }

    /// `pid`'s CPU tensors are traced from now on, `at_s` seconds into tracing, where they were
    /// not before (`--tensors auto`). Traced again after they were kept, when they last were
    /// stays told.
    pub fn tensors_traced(&mut self, pid: u32, at_s: f64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if let Some(held) = p.tensors_held_on_trace.take() {
                p.forget_kept_tensors_but(|s| held.contains(&s));
            }
            p.tensor_layer = Some(TensorLayer::Traced);
            p.tensors_since_s = Some(at_s);
        }
    }

    /// `pid`'s CPU tensors are no longer traced, `at_s` seconds into tracing, once their leak
    /// was confirmed: those outstanding are kept as they are, to be reported as of then. Traced
    /// again, those of its leak stay (see [`Ledger::forget_tensors_but`]): a free of one of them
    /// releases it; one whose free was not seen (made before now) goes when a new block takes
    /// its address.
    pub fn keep_tensors(&mut self, pid: u32, at_s: f64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            (p.tensor_layer, p.tensors_as_of_s) = (Some(TensorLayer::Kept), Some(at_s));
            p.tensors_since_s = None;
            p.keep_made(Kind::Tensor);
        }
    }

    /// `pid`'s malloc family is no longer traced, `at_s` seconds into tracing, once its leak was
    /// confirmed: its heap blocks outstanding stay as they are (their frees will not be seen),
    /// to be reported as of then.
    pub fn heap_taken_out(&mut self, pid: u32, at_s: f64, held: bool) {
        if let Some(p) = self.procs.get_mut(&pid) {
            (p.heap_as_of_s, p.heap_held) = (Some(at_s), held);
            p.pages_at_heap_out = p.pages_bytes();
            p.pages_most_after_heap = p.pages_at_heap_out;
            p.keep_made(Kind::Heap);
            if p.heap_retraced {
                (p.heap_retraced, p.heap_again) = (false, p.heap_again + 1);
                p.heap_aside.clear();
            }
        }
    }

    /// `pid`'s malloc family is traced again, its pages having grown since it was taken out:
    /// its heap blocks of the stacks `keep` picks (its leak's, likely held still) stay as they
    /// were; the others, whose frees went unseen meanwhile, are set aside (forgotten once this
    /// window decides, back where it does not). A block kept whose free was not seen goes when
    /// a new block takes its address. Until it is taken out again, the window before stands
    /// (`heap_as_of_s`).
    pub fn heap_traced_again(&mut self, pid: u32, keep: impl Fn(Option<StackId>) -> bool) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        // Kept are all its heap blocks now, as for its tensors (see
        // [`Ledger::forget_tensors_when_traced`]): those made after the take-out, before the
        // probes went out, had their frees unseen too.
        p.keep_made(Kind::Heap);
        p.heap_retraced = true;
        p.displaced.clear();
        p.set_heap_aside(keep);
    }

    /// `pid`'s malloc family, traced again, was still undecided when the run ended: the window
    /// before stands, and its heap is as it was then.
    pub fn heap_window_undecided(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.heap_retraced = false;
            p.heap_aside_back();
        }
    }

    /// One sample of the pages of each live process whose malloc family was taken out.
    pub fn sample_pages_after_heap(&mut self) {
        let taken_out = self.procs.values_mut();
        for p in taken_out.filter(|p| p.heap_as_of_s.is_some() && p.exited_ns.is_none()) {
            p.pages_most_after_heap = p.pages_most_after_heap.max(p.pages_bytes());
        }
    }

    /// `pid`'s CPU tensors are no longer traced: those outstanding are forgotten (their frees
    /// will not be seen, and tensors as they were last seen would stay forever).
    pub fn forget_tensors(&mut self, pid: u32) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        (p.tensor_layer, p.tensors_as_of_s) = (Some(TensorLayer::TakenOut), None);
        p.tensors_since_s = None;
        self.forget_tensors_but(pid, |_| false);
    }

    /// `pid`'s CPU tensors kept as they were are asked for again: once they are traced, those
    /// kept at stacks other than `held` are forgotten ([`Ledger::forget_tensors_but`]). Not
    /// before: a process that ends first (a retrace asked for just before the end) is reported
    /// with its tensors as they were kept. Kept are all it holds now: those made after the keep,
    /// before their probes went out, were untraced too (a backward pass's gradients made then,
    /// their frees unseen, stayed through every later span as a stack held and rising).
    pub fn forget_tensors_when_traced(&mut self, pid: u32, held: Vec<Option<StackId>>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.tensors_held_on_trace = Some(held);
            p.keep_made(Kind::Tensor);
        }
    }

    /// Forgets `pid`'s outstanding CPU tensors but those at the stacks `leaks` picks: traced
    /// again after they were kept as they were, the tensors of a leak are likely held still, and
    /// those of other stacks (a step's, outstanding as they were kept) likely freed unseen.
    pub fn forget_tensors_but(&mut self, pid: u32, leaks: impl Fn(Option<StackId>) -> bool) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.forget_but(Kind::Tensor, leaks);
        }
    }

    /// Registers a root process (the launched command or the attached pid).
    pub fn add_root(&mut self, pid: u32, command: String, env: Vec<(String, String)>, now_ns: u64) {
        let p = self.procs.entry(pid).or_insert_with(|| Process {
            allocator_env: env,
            ..Process::new(pid, None, command.clone(), now_ns)
        });
        // Adopted by `serve` after its first events arrived: those named no command.
        if p.command.is_empty() {
            p.command = command;
        }
    }

    pub fn apply(&mut self, input: Input) {
        match input {
            Input::Stack {
                id,
                frames,
                truncated,
            } => self.stacks.insert(id, frames, truncated),
            Input::Event(ev) => self.apply_event(ev),
            Input::Kernel(k) => self.kernel = k,
            Input::Fill(f) => self.fill = f,
            Input::IngestLoss {
                stack_table_full,
                undecodable,
            } => {
                self.ingest = IngestLosses {
                    stack_table_full,
                    undecodable,
                }
            }
        }
    }

    fn apply_event(&mut self, ev: Event) {
        self.events += 1;
        match ev.what {
            What::Step => self.steps += 1,
            What::Fork {
                child,
                shares_vm,
                command,
            } => self.fork(ev.tgid, child, shares_vm, command, ev.ts_ns),
            What::ThreadExit => self.process(ev.tgid, ev.ts_ns).thread_exited(ev.tid),
            What::Finalize => self.process(ev.tgid, ev.ts_ns).finalizing(ev.ts_ns),
            what => {
                let origin = Origin {
                    stack: ev.stack,
                    ts_ns: ev.ts_ns,
                    func: ev.func,
                    inherited: false,
                };
                let allocates = matches!(what, What::Alloc { .. } | What::Realloc { .. });
                let sampling = self.heap_sampling;
                let p = self.process(ev.tgid, ev.ts_ns);
                let unmatched = p.mismatches.unmatched_frees;
                let released = p.apply(what, origin, sampling);
                let unmatched = p.mismatches.unmatched_frees - unmatched;
                p.thread_event(ev.tid, allocates, unmatched);
                let made = if allocates { ev.stack } else { None };
                for stack in [made, released].into_iter().flatten() {
                    self.touch(stack);
                }
            }
        }
    }

    fn touch(&mut self, stack: StackId) {
        let i = stack.get() as usize;
        if i >= self.activity.len() {
            self.activity.resize(i + 1, 0);
        }
        self.activity[i] = self.activity[i].wrapping_add(1);
    }

    /// The least `key` (holding `bytes` now) held since the last sample, where it is a stack of
    /// CPU tensors (their makes and frees seen one by one) or of the brk heap's pages (its top
    /// grown and trimmed); `bytes` elsewhere. Not heap blocks: a level kept per stack for every
    /// malloc and free slowed ingest enough, in the test binary, to shift when a Python objects'
    /// window closed.
    pub fn least_since_sample(&self, key: &GroupKey, bytes: u64) -> u64 {
        // Looked up only for those two kinds: every group is asked at every sample.
        let p = || self.procs.get(&key.pid);
        let dip = match (key.kind, key.stack) {
            (Kind::Tensor, Some(stack)) => p().map_or(0, |p| p.dips.dip(&stack)),
            (Kind::Brk, stack) => p().map_or(0, |p| p.brk_dips.dip(&(stack, key.inherited))),
            _ => return bytes,
        };
        bytes.saturating_sub(dip)
    }

    /// A sample was taken of every group: what each holds at its least is told from now on.
    pub fn sampled(&mut self) {
        self.procs.values_mut().for_each(|p| {
            p.dips.sampled();
            p.brk_dips.sampled();
        });
    }

    /// Allocations and frees made at `stack` so far (wrapping): a stack whose count did not
    /// change between two samples was not used in between.
    pub fn activity(&self, stack: Option<StackId>) -> u32 {
        stack.map_or(0, |s| {
            self.activity.get(s.get() as usize).copied().unwrap_or(0)
        })
    }

    /// The process `tgid`, registered at its first event when it was not seen being born.
    fn process(&mut self, tgid: u32, ts_ns: u64) -> &mut Process {
        self.procs
            .entry(tgid)
            .or_insert_with(|| Process::new(tgid, None, String::new(), ts_ns))
    }

    fn fork(
        &mut self,
        tgid: u32,
        child: u32,
        shares_vm: bool,
        command: Option<String>,
        ts_ns: u64,
    ) {
        let proc = match self.procs.get(&tgid) {
            Some(parent) if !shares_vm => Process::forked_from(parent, child, command, ts_ns),
            Some(parent) => Process::new(child, Some(parent.pid), parent.command.clone(), ts_ns),
            None => Process::new(child, Some(tgid), command.unwrap_or_default(), ts_ns),
        };
        self.procs.insert(child, proc);
    }

    /// Outstanding memory grouped by (process, stack, kind, inherited), largest first.
    /// Outstanding bytes per group, unsorted: what sampling needs, without the rest of a Group.
    pub fn group_bytes(&self) -> Vec<(GroupKey, u64)> {
        let mut acc: rustc_hash::FxHashMap<GroupKey, u64> = rustc_hash::FxHashMap::default();
        for p in self.procs.values() {
            p.for_each_live(|kind, bytes, o| *acc.entry(o.key(p.pid, kind)).or_default() += bytes);
        }
        acc.into_iter().collect()
    }

    pub fn groups(&self) -> Vec<Group> {
        let mut acc: rustc_hash::FxHashMap<GroupKey, Group> = rustc_hash::FxHashMap::default();
        for p in self.procs.values() {
            p.for_each_live(|kind, bytes, o| {
                let key = o.key(p.pid, kind);
                let g = acc.entry(key).or_insert_with(|| Group::empty(key, o.ts_ns));
                g.bytes += bytes;
                g.blocks += 1;
                g.oldest_ns = g.oldest_ns.min(o.ts_ns);
                if let Some(f) = o.func
                    && !g.funcs.contains(&f)
                {
                    g.funcs.push(f);
                }
            });
        }
        let mut groups: Vec<Group> = acc.into_values().collect();
        groups.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.pid.cmp(&b.pid))
                .then(a.stack.cmp(&b.stack))
        });
        groups
    }
}
