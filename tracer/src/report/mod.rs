//! The report model: the ledger's aggregates with symbolized stacks and the analysis's verdicts
//! (schema `leaktracer.report/1`, documented in docs/report-schema.md). It is the JSON that tools
//! read, the payload the history stores and the API serves, and what `check` judges; `render`
//! turns it into text and the export formats.

use std::{borrow::Cow, collections::HashMap};

use serde::{Deserialize, Serialize};
use tracer_common::Counter;

use crate::{
    analysis::{Analysis, Evidence, Retention, Verdict},
    ledger::{Group, Ledger, Mismatches, Process},
    model::{GroupKey, HeapAsked, HeapTracing, Kind},
    probes::{AttachedFn, Library, ProbeFailure},
    symbolize::{SymFrame, Symbolizer},
};

mod device;
mod pages;
mod site;
mod sites;

pub use site::{made_by_import, site_of};
#[cfg(test)]
pub(crate) use sites::by_site;
pub use sites::{Finding, leak_sites};
pub mod synthetic;

pub use device::{DeviceFailure, DeviceSummary, GpuProcess, GpuReport};
pub use pages::Pages;

pub const SCHEMA: &str = "leaktracer.report/1";

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Amount {
    pub bytes: u64,
    pub blocks: u64,
}

/// Bytes and blocks per kind.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KindTotals {
    pub heap: Amount,
    pub mmap: Amount,
    pub brk: Amount,
    pub tensor: Amount,
    pub device: Amount,
    pub managed: Amount,
    pub pinned: Amount,
    pub torch_block: Amount,
    /// Python objects sampled in their window (estimated).
    #[serde(default)]
    pub object: Amount,
}

impl KindTotals {
    pub fn get(&self, kind: Kind) -> Amount {
        let mut copy = *self;
        *copy.slot(kind)
    }

    fn slot(&mut self, kind: Kind) -> &mut Amount {
        match kind {
            Kind::Heap => &mut self.heap,
            Kind::Mmap => &mut self.mmap,
            Kind::Brk => &mut self.brk,
            Kind::Tensor => &mut self.tensor,
            Kind::Device => &mut self.device,
            Kind::Managed => &mut self.managed,
            Kind::Pinned => &mut self.pinned,
            Kind::TorchBlock => &mut self.torch_block,
            Kind::Object => &mut self.object,
        }
    }

    fn add(&mut self, kind: Kind, bytes: u64, blocks: u64) {
        let a = self.slot(kind);
        a.bytes += bytes;
        a.blocks += blocks;
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcReport {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub command: String,
    pub exited: bool,
    pub execs: u32,
    /// Memory the process allocated itself.
    pub own: KindTotals,
    /// Memory copied from the parent at fork and still outstanding in this process.
    pub inherited: KindTotals,
    pub mismatches: Mismatches,
    pub device: DeviceSummary,
    /// Heap-level vs page-level growth: allocator retention when pages grow and the heap does not.
    pub retention: Option<Retention>,
    /// Allocator settings in its environment (PYTORCH_CUDA_ALLOC_CONF…), as [name, value].
    pub allocator_env: Vec<(String, String)>,
    /// Its malloc family was traced (blocks seen). False under `--heap auto` for a Python process
    /// whose pages never called for it, and under `--heap off`: its heap is seen as pages only.
    #[serde(default = "malloc_traced_before")]
    pub malloc_traced: bool,
    /// `--tensors auto`, where its CPU tensors were traced for a while: whether they are now
    /// (`traced`), were taken out when its memory held (`taken_out`, their outstanding ones
    /// forgotten), or once their leak was confirmed (`kept`: their outstanding ones kept as they
    /// were at `tensors_as_of_s`, which stays while they are traced again). Absent where they
    /// were traced all along, or never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<crate::ledger::TensorLayer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors_as_of_s: Option<f64>,
    /// Where they are `traced`: since when (seconds into tracing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors_since_s: Option<f64>,
    /// Why its malloc family was asked for (`--heap auto`), where it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_asked: Option<HeapAsked>,
    /// Where its malloc family was traced (`--heap auto`) and taken out once its leak was
    /// confirmed: when (seconds into tracing). Its heap stacks are as they were then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_as_of_s: Option<f64>,
    /// Where it was taken out because its heap held (no leak of it in the seconds it was
    /// traced, while its pages grew), not for a confirmed leak.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heap_held: bool,
    /// Times its malloc family was traced again after it was taken out, its pages growing on:
    /// its heap stacks are judged on the last of those windows.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub heap_again: u32,
    /// The most its pages (brk and mmap, sampled) rose above what they were when its malloc
    /// family was taken out, where it was: how far a confirmed heap leak went on untraced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages_after_heap_bytes: Option<u64>,
    /// How much slower its own code ran while its malloc family was traced as a layer, in the
    /// window its heap stacks are judged on, than around it (its user CPU time a second): their
    /// rates are multiplied by it, to be the program's untraced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_slowdown: Option<f64>,
    /// Its Python objects' window (`--heap auto`, its arenas grew): the sites sampled, those
    /// that keep first, then the most made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<Vec<ObjectLine>>,
}

/// A site's Python objects in its process's window (its stacks together): bytes made in the
/// window's first half and, of those, bytes still held at its end (estimates from samples), and
/// whether it keeps them (a quarter or more, and enough samples): the leak of the arenas is
/// reported on those that keep. Of what it kept, `imported_bytes` was made by a library's import
/// (the module's state), which does not count as kept.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObjectLine {
    pub site: String,
    pub made_bytes: u64,
    pub kept_bytes: u64,
    #[serde(default)]
    pub imported_bytes: u64,
    pub keeps: bool,
}

/// The sites shown of a window, at most.
const OBJECT_LINES: usize = 12;

/// Reports stored before `malloc_traced` traced every process's malloc family, or none.
fn malloc_traced_before() -> bool {
    true
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StackReport {
    pub pid: u32,
    pub kind: Kind,
    pub inherited: bool,
    pub bytes: u64,
    pub blocks: u64,
    pub oldest_age_s: f64,
    /// Allocator functions behind these blocks (malloc, calloc, mmap…).
    pub allocators: Vec<Cow<'static, str>>,
    /// The capture hit the depth limit: outer frames are missing.
    pub truncated: bool,
    /// Leak, spike, bounded cache or steady, with the evidence; null until enough samples.
    pub verdict: Option<Evidence>,
    /// Final report: this stack leaked while it was sampled and holds nothing now (what leaked
    /// was released at teardown). Listed after the outstanding stacks, whatever --top says.
    #[serde(default)]
    pub released: bool,
    /// Pages the allocator mapped for these blocks (its heap's growth, large blocks' mappings):
    /// page-level memory this stack explains, shown here rather than as stacks of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<Pages>,
    /// The analysis's key of this stack's group (not serialized: the live API finds its series).
    #[serde(skip)]
    pub group: Option<GroupKey>,
    pub frames: Vec<SymFrame>,
}

/// Everything lost or mismatched, kernel and user side. Shown in every report.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Losses {
    pub ringbuf_full: u64,
    pub pending_full: u64,
    pub traced_full: u64,
    pub stack_errors: u64,
    pub return_without_entry: u64,
    pub stack_table_full: u64,
    pub undecodable: u64,
    pub unmatched_frees: u64,
    pub unmatched_unmap_bytes: u64,
    pub reused_addresses: u64,
    /// Frees, in a process whose tensors or malloc family went in late (`--heap auto`), of blocks
    /// made before, or missed while their probes went in: not a loss.
    #[serde(default)]
    pub untraced_frees: u64,
    /// Frees glibc made of its own as threads exited (their caches given back): not a loss.
    #[serde(default)]
    pub thread_exit_frees: u64,
    /// CUDA frees, releases and unmaps of something no traced call returned.
    pub unmatched_device_frees: u64,
    /// SIGSTOPs for probing new code that the kernel refused to send (that code was probed late).
    pub stop_failed: u64,
    /// `--heap sampled`: recorded blocks the kernel's sampled-address table had no room for
    /// (their frees are not matched).
    #[serde(default)]
    pub sampled_full: u64,
    /// Not a loss: allocator calls made inside another (realloc → malloc), accounted by the outer.
    pub nested_calls: u64,
}

/// One table's fill: `used` entries of `capacity`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapFill {
    pub name: Cow<'static, str>,
    pub used: u64,
    pub capacity: u64,
    /// The most entries held at once, where that is tracked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
}

fn map_fill(ledger: &Ledger) -> Vec<MapFill> {
    let fill = |name: &'static str, used: u64, capacity: u64| MapFill {
        name: name.into(),
        used,
        capacity,
        peak: None,
    };
    let live = ledger
        .procs
        .values()
        .filter(|p| p.exited_ns.is_none())
        .count() as u64;
    vec![
        fill(
            "traced processes",
            live,
            u64::from(tracer_common::MAX_TRACED),
        ),
        MapFill {
            peak: Some(ledger.fill.stacks_peak),
            ..fill(
                "distinct stacks",
                ledger.fill.stacks,
                crate::ingest::STACK_CAPACITY as u64,
            )
        },
        fill(
            "sampled blocks",
            ledger.fill.sampled,
            u64::from(tracer_common::MAX_SAMPLED),
        ),
    ]
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub schema: Cow<'static, str>,
    #[serde(rename = "final")]
    pub final_report: bool,
    pub elapsed_s: f64,
    /// Sum of `own` over all processes.
    pub totals: KindTotals,
    pub processes: Vec<ProcReport>,
    pub stacks: Vec<StackReport>,
    pub losses: Losses,
    /// Entries in use in the tables that drop what does not fit (each overflow is also a loss).
    #[serde(default)]
    pub map_fill: Vec<MapFill>,
    /// Device memory traced vs what the driver reports.
    pub gpu: GpuReport,
    /// CUDA allocation calls that failed (out of memory, invalid arguments), with their stacks.
    pub device_failures: Vec<DeviceFailure>,
    pub probes: Vec<AttachedFn>,
    /// Libraries probed, and when (a library probed late may have made calls not seen).
    pub libraries: Vec<Library>,
    /// Probe sets that could not be attached: those libraries' calls of that role are not
    /// traced.
    #[serde(default)]
    pub probe_failures: Vec<ProbeFailure>,
    pub events: u64,
    /// What verdict slopes are per: "second", or "step" with --step-symbol.
    pub verdicts_per: Cow<'static, str>,
    /// Step boundaries seen (entries of the step function).
    pub steps: u64,
    /// What was traced of the heap.
    #[serde(default)]
    pub heap: HeapTracing,
    /// `--probe-cost`: leaktracer's programs' runs and kernel time, the costliest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_cost: Vec<crate::probes::cost::ProgramCost>,
    /// leaktracer's own peak resident memory so far (its VmHWM), in bytes.
    #[serde(default)]
    pub tracer_peak_rss_bytes: u64,
    /// The outstanding stacks past `--top` that `stacks` leaves out (none judged a leak).
    #[serde(default)]
    pub unlisted: Unlisted,
}

/// Stacks left out of a report's list, and what they hold per kind: the list's bytes and these
/// add up to the processes' totals.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Unlisted {
    pub stacks: u64,
    pub totals: KindTotals,
}

impl Unlisted {
    fn add(&mut self, kind: Kind, bytes: u64, blocks: u64) {
        self.stacks += 1;
        self.totals.add(kind, bytes, blocks);
    }
}

impl Report {
    /// Keeps the first `top` stacks, and every later one judged a leak (a leak that teardown
    /// left small is still the answer the run was for).
    pub fn keep_top(&mut self, top: usize) {
        let mut i = 0;
        let unlisted = &mut self.unlisted;
        self.stacks.retain(|s| {
            i += 1;
            let keep = i <= top
                || s.verdict
                    .as_ref()
                    .is_some_and(|v| v.verdict == Verdict::Leak);
            if !keep {
                unlisted.add(s.kind, s.bytes, s.blocks);
            }
            keep
        });
    }
}

/// What the report needs besides the ledger.
pub struct Context<'a> {
    pub final_report: bool,
    pub elapsed_s: f64,
    pub now_ns: u64,
    pub top: usize,
    pub probes: &'a [AttachedFn],
    pub libraries: &'a [Library],
    pub failures: &'a [ProbeFailure],
    pub nvml: &'a crate::gpu::Sample,
    pub analysis: &'a Analysis,
    /// Seconds (or steps) of warm-up left out of verdicts.
    pub warmup_s: f64,
    /// Verdicts are sampled per step (`--step-symbol`), not per second.
    pub per_step: bool,
    pub heap: HeapTracing,
    pub probe_cost: Vec<crate::probes::cost::ProgramCost>,
}

pub fn build(ledger: &Ledger, sym: &mut Symbolizer, cx: &Context<'_>) -> Report {
    let groups = ledger.groups();
    let mut processes: Vec<ProcReport> = ledger
        .procs
        .values()
        .map(|p| ProcReport {
            retention: cx.analysis.retention(p.pid, cx.warmup_s),
            objects: object_lines(ledger, sym, cx, p.pid),
            heap_slowdown: cx.analysis.heap_slowdown(p.pid),
            ..proc_report(p)
        })
        .collect();
    for g in &groups {
        if let Some(p) = processes.iter_mut().find(|p| p.pid == g.pid) {
            let t = if g.inherited {
                &mut p.inherited
            } else {
                &mut p.own
            };
            t.add(g.kind, g.bytes, g.blocks);
        }
    }
    let mut totals = KindTotals::default();
    for p in &processes {
        for k in Kind::ALL {
            let a = p.own.get(k);
            totals.add(k, a.bytes, a.blocks);
        }
    }
    let mut folded = pages::Folded::of(&groups);
    let heaps = heap_bytes(&processes);
    let (mut stacks, unlisted) = outstanding_stacks(ledger, sym, cx, &groups, &heaps, &mut folded);
    if cx.final_report {
        let outstanding = groups.iter().map(Group::key).collect();
        let mut released = cx.analysis.released_leaks(&outstanding, cx.warmup_s);
        folded.add_heap(released.iter().map(|(k, _)| *k));
        released.retain(|(k, _)| !folded.explains(k));
        for (key, evidence) in released {
            let g = Group::empty(key, cx.now_ns);
            stacks.push(StackReport {
                verdict: Some(evidence),
                released: true,
                group: Some(key),
                ..stack_report(ledger, sym, &g, cx.now_ns)
            });
        }
    }
    let gpu = device::gpu(&processes, cx.nvml.clone());
    Report {
        schema: SCHEMA.into(),
        final_report: cx.final_report,
        elapsed_s: cx.elapsed_s,
        totals,
        processes,
        stacks,
        losses: losses(ledger),
        map_fill: map_fill(ledger),
        gpu,
        device_failures: device::failures(ledger, sym),
        probes: cx.probes.to_vec(),
        libraries: cx.libraries.to_vec(),
        probe_failures: cx.failures.to_vec(),
        events: ledger.events,
        verdicts_per: if cx.per_step { "step" } else { "second" }.into(),
        steps: ledger.steps,
        heap: cx.heap,
        probe_cost: cx.probe_cost.clone(),
        tracer_peak_rss_bytes: crate::procfs::own_status_bytes("VmHWM"),
        unlisted,
    }
}

/// The outstanding stacks, largest first, `cx.top` of them, with their verdicts, and what the
/// others hold; page-level groups that a heap-level stack explains are that stack's `pages`, not
/// stacks of their own.
fn outstanding_stacks(
    ledger: &Ledger,
    sym: &mut Symbolizer,
    cx: &Context<'_>,
    groups: &[Group],
    heaps: &HashMap<u32, u64>,
    folded: &mut pages::Folded,
) -> (Vec<StackReport>, Unlisted) {
    // The top stacks by bytes; in the final report also every other one judged a leak: what a
    // teardown left of it may be small (the pages the allocator kept, the block it did not free).
    let judge = |g: &Group| {
        let e = if cx.final_report {
            cx.analysis.judge_final(&g.key(), cx.warmup_s)
        } else {
            cx.analysis.judge(&g.key(), cx.warmup_s)
        }?;
        // Windows on seconds: the blocks' ages tell a working set from memory kept (a Python
        // object stack's blocks are its window's samples, not what it holds).
        let age = cx.now_ns.saturating_sub(g.oldest_ns) as f64 / 1e9;
        let timed = !cx.per_step && g.kind != Kind::Object;
        let heap = heaps.get(&g.pid).copied().unwrap_or(0);
        let small = g.kind == Kind::Brk
            && crate::analysis::a_large_heaps_small_rise(&e, heap)
            && !(cx.final_report
                && cx
                    .analysis
                    .grew_on_after_late_tensors(&g.key(), cx.warmup_s));
        let stepped = crate::analysis::working_set(&e, age, cx.elapsed_s)
            || crate::analysis::rose_once_within_swing(&e, age, cx.elapsed_s);
        Some(match (stepped && timed) || small {
            true => Evidence {
                verdict: Verdict::Steady,
                ..e
            },
            false => e,
        })
    };
    let mut shown: Vec<(&Group, Option<Evidence>)> = Vec::new();
    let mut unlisted = Unlisted::default();
    let candidates = groups.iter().filter(|g| !folded.explains(&g.key()));
    for (i, g) in candidates.enumerate() {
        if i < cx.top {
            shown.push((g, judge(g)));
        } else if cx.final_report
            && let Some(v) = judge(g).filter(|v| v.verdict == Verdict::Leak)
        {
            shown.push((g, Some(v)));
        } else {
            unlisted.add(g.kind, g.bytes, g.blocks);
        }
    }
    let stacks = shown
        .into_iter()
        .map(|(g, verdict)| StackReport {
            verdict,
            group: Some(g.key()),
            pages: folded.take(&g.key()),
            ..stack_report(ledger, sym, g, cx.now_ns)
        })
        .collect();
    (stacks, unlisted)
}

/// Each process's heap: the bytes its brk stacks hold, its own and those inherited at fork.
fn heap_bytes(processes: &[ProcReport]) -> HashMap<u32, u64> {
    let brk = |t: &KindTotals| t.get(Kind::Brk).bytes;
    processes
        .iter()
        .map(|p| (p.pid, brk(&p.own) + brk(&p.inherited)))
        .collect()
}

/// `pid`'s window of Python objects, its stacks named by their sites.
fn object_lines(
    ledger: &Ledger,
    sym: &mut Symbolizer,
    cx: &Context<'_>,
    pid: u32,
) -> Option<Vec<ObjectLine>> {
    let lines = cx.analysis.object_lines(pid)?;
    let site = |sym: &mut Symbolizer, stack| {
        let key = GroupKey {
            pid,
            stack,
            kind: Kind::Object,
            inherited: false,
        };
        stack_report(ledger, sym, &Group::empty(key, cx.now_ns), cx.now_ns).site()
    };
    // One row per site: the objects a line makes are of several types, each its own stack.
    let mut rows: Vec<ObjectLine> = Vec::new();
    for (l, keeps) in lines {
        let site = site(sym, l.stack);
        let imported = if l.imported { l.kept } else { 0 };
        match rows.iter_mut().find(|r| r.site == site) {
            Some(r) => {
                (r.made_bytes, r.kept_bytes) = (r.made_bytes + l.made, r.kept_bytes + l.kept);
                r.imported_bytes += imported;
            }
            None => rows.push(ObjectLine {
                site,
                made_bytes: l.made,
                kept_bytes: l.kept,
                imported_bytes: imported,
                keeps,
            }),
        }
    }
    rows.truncate(OBJECT_LINES);
    Some(rows)
}

fn proc_report(p: &Process) -> ProcReport {
    ProcReport {
        pid: p.pid,
        ppid: p.ppid,
        command: p.command.clone(),
        exited: p.exited_ns.is_some(),
        execs: p.execs,
        own: KindTotals::default(),
        inherited: KindTotals::default(),
        mismatches: p.mismatches,
        device: DeviceSummary::of(p),
        retention: None,
        allocator_env: p.allocator_env.clone(),
        malloc_traced: p.malloc_seen,
        tensors: p.tensor_layer,
        tensors_as_of_s: p.tensors_as_of_s,
        heap_asked: p.heap_asked,
        heap_as_of_s: p.heap_as_of_s,
        heap_held: p.heap_held,
        heap_again: p.heap_again,
        pages_after_heap_bytes: p
            .heap_as_of_s
            .map(|_| p.pages_most_after_heap - p.pages_at_heap_out),
        heap_slowdown: None,
        tensors_since_s: p.tensors_since_s,
        objects: None,
    }
}

fn stack_report(ledger: &Ledger, sym: &mut Symbolizer, g: &Group, now_ns: u64) -> StackReport {
    let (frames, truncated) = match g.stack.and_then(|id| ledger.stacks.get(id)) {
        Some((frames, truncated)) => (sym.stack(&frames), truncated),
        None => (Vec::new(), false),
    };
    StackReport {
        pid: g.pid,
        kind: g.kind,
        inherited: g.inherited,
        bytes: g.bytes,
        blocks: g.blocks,
        oldest_age_s: now_ns.saturating_sub(g.oldest_ns) as f64 / 1e9,
        allocators: g.funcs.iter().map(|f| f.name().into()).collect(),
        truncated,
        verdict: None,
        released: false,
        pages: Vec::new(),
        group: None,
        frames,
    }
}

fn losses(ledger: &Ledger) -> Losses {
    let k = &ledger.kernel;
    let mut l = Losses {
        ringbuf_full: k.get(Counter::RingbufFull),
        pending_full: k.get(Counter::PendingFull),
        traced_full: k.get(Counter::TracedFull),
        stack_errors: k.get(Counter::StackErrors),
        return_without_entry: k.get(Counter::ReturnWithoutEntry),
        nested_calls: k.get(Counter::Nested),
        stop_failed: k.get(Counter::StopFailed),
        sampled_full: k.get(Counter::SampledFull),
        stack_table_full: ledger.ingest.stack_table_full,
        undecodable: ledger.ingest.undecodable,
        ..Losses::default()
    };
    for p in ledger.procs.values() {
        l.unmatched_frees += p.mismatches.unmatched_frees;
        l.unmatched_unmap_bytes += p.mismatches.unmatched_unmap_bytes;
        l.reused_addresses += p.mismatches.reused_addresses;
        l.untraced_frees += p.mismatches.untraced_frees;
        l.thread_exit_frees += p.mismatches.thread_exit_frees;
        l.unmatched_device_frees += p.device.unmatched_frees;
    }
    l
}

/// For `skip_serializing_if`: a count of nothing.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tracer_common::AllocFn;

    use super::synthetic::report_of;
    use crate::{
        analysis::{Analysis, Verdict},
        ingest::{Event, Input, What},
        ledger::Ledger,
        model::{Frame, Kind, StackId},
    };

    fn event(func: AllocFn, what: What) -> Input {
        Input::Event(Event {
            tgid: 1,
            tid: 0,
            ts_ns: 1,
            func: Some(func),
            stack: Some(StackId::new(7)),
            what,
        })
    }

    /// Stacks past `--top`, when the report is built and when it is cut later, are counted with
    /// what they hold: the list and the rest add up to the total.
    #[test]
    fn stacks_left_out_are_counted_with_their_bytes() {
        let (ledger, analysis) = super::synthetic::ledger_with(10, 1);
        let mut r = report_of(&ledger, &analysis, 6);
        assert_eq!(r.stacks.len(), 6);
        assert_eq!(r.unlisted.stacks, 4);
        assert_eq!(
            r.unlisted.totals.heap,
            super::Amount {
                bytes: 256,
                blocks: 4
            }
        );
        r.keep_top(2);
        assert_eq!(r.unlisted.stacks, 8);
        let listed: u64 = r.stacks.iter().map(|s| s.bytes).sum();
        assert_eq!(listed + r.unlisted.totals.heap.bytes, r.totals.heap.bytes);
        assert_eq!(r.totals.heap.bytes, 640);
    }

    /// A stack that leaked 4 KiB per sample and was freed at the end is still in the final
    /// report, as released, with its leak verdict.
    #[test]
    fn a_leak_released_at_teardown_is_still_reported() {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "t".into(), Vec::new(), 0);
        let frames: Arc<[Frame]> = [Frame {
            module: None,
            offset: 0x10,
            addr: 0x10,
        }]
        .into();
        ledger.apply(Input::Stack {
            id: StackId::new(7),
            frames,
            truncated: false,
        });
        let mut analysis = Analysis::default();
        for i in 0..12u64 {
            let (addr, size) = (0x1000 * (i + 1), 4096);
            ledger.apply(event(AllocFn::Malloc, What::Alloc { addr, size }));
            analysis.sample(i as f64, &ledger, &ledger.group_bytes());
        }
        for i in 0..12u64 {
            let addr = 0x1000 * (i + 1);
            ledger.apply(event(AllocFn::Free, What::Free { addr }));
        }
        let r = report_of(&ledger, &analysis, 10);
        assert_eq!(r.stacks.len(), 1);
        let s = &r.stacks[0];
        assert!(s.released);
        assert_eq!((s.bytes, s.blocks), (0, 0));
        assert_eq!(s.verdict.as_ref().unwrap().verdict, Verdict::Leak);
    }

    /// The brk pages malloc grew inside a stack's calls are that stack's pages, not a stack of
    /// their own; a direct brk from another stack stands on its own.
    #[test]
    fn pages_the_heap_explains_are_folded_into_its_stack() {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "t".into(), Vec::new(), 0);
        for id in [7, 8] {
            let frames: Arc<[Frame]> = [Frame {
                module: None,
                offset: id,
                addr: id,
            }]
            .into();
            ledger.apply(Input::Stack {
                id: StackId::new(id as u32),
                frames,
                truncated: false,
            });
        }
        let on = |stack: u32, func: AllocFn, what: What| {
            Input::Event(Event {
                tgid: 1,
                tid: 0,
                ts_ns: 1,
                func: Some(func),
                stack: Some(StackId::new(stack)),
                what,
            })
        };
        ledger.apply(on(7, AllocFn::Brk, What::Brk { result: 0x10_0000 }));
        ledger.apply(on(7, AllocFn::Brk, What::Brk { result: 0x12_1000 }));
        ledger.apply(on(
            7,
            AllocFn::Malloc,
            What::Alloc {
                addr: 0x10_0010,
                size: 100_000,
            },
        ));
        ledger.apply(on(8, AllocFn::Brk, What::Brk { result: 0x13_1000 }));
        let r = report_of(&ledger, &Analysis::default(), 10);
        let kinds: Vec<Kind> = r.stacks.iter().map(|s| s.kind).collect();
        assert_eq!(kinds, [Kind::Heap, Kind::Brk], "{:?}", r.stacks);
        assert_eq!(
            r.stacks[0].pages,
            [super::Pages {
                kind: Kind::Brk,
                bytes: 0x2_1000,
                blocks: 1
            }]
        );
        assert_eq!((r.stacks[1].bytes, r.stacks[1].pages.len()), (0x1_0000, 0));
        assert_eq!(r.totals.brk.bytes, 0x3_1000, "the totals count every page");
    }
}
