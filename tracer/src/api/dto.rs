//! What the API answers: its own types, built from reports, so the wire format does not move when
//! the ledger or the report change. Strings from traced programs pass through as JSON strings:
//! the page renders them as text.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    model::Kind,
    render::prometheus::stack_id,
    report::{Report, StackReport},
};

/// Bytes per kind, only kinds that hold something.
pub type Bytes = BTreeMap<&'static str, u64>;

fn bytes_of(t: &crate::report::KindTotals) -> Bytes {
    Kind::ALL
        .into_iter()
        .map(|k| (k.name(), t.get(k).bytes))
        .filter(|(_, b)| *b > 0)
        .collect()
}

#[derive(Debug, Serialize)]
pub struct Health {
    /// A report has been published (false only in the first moments of a session).
    pub live: bool,
    /// The session's last report: the traced program has ended.
    #[serde(rename = "final")]
    pub final_report: bool,
    /// What slopes are per: "second" or "step".
    pub per: String,
    pub elapsed_s: f64,
    pub events: u64,
    pub steps: u64,
    /// Every loss counter by reason; `dropped` sums the ones that lose events.
    pub losses: BTreeMap<String, u64>,
    pub dropped: u64,
    /// How full the tables that drop what does not fit are.
    pub map_fill: Vec<FillDto>,
    pub libraries: Vec<LibraryDto>,
    /// Probe sets that could not go in: those libraries' calls are not traced.
    pub probe_failures: Vec<crate::probes::ProbeFailure>,
    /// What the heap figures are (sampled estimates, not traced, traced late); empty when every
    /// allocation is traced from the start.
    pub heap: Vec<String>,
    /// `--probe-cost`: leaktracer's programs' runs and kernel time, the costliest first.
    pub probe_cost: Vec<crate::probes::cost::ProgramCost>,
    /// How many stacks the report lists (`--top`, and every leak), and those it leaves out:
    /// how many, with their bytes and blocks per kind.
    pub stacks_listed: usize,
    pub unlisted: crate::report::Unlisted,
}

#[derive(Debug, Serialize)]
pub struct FillDto {
    pub name: String,
    pub used: u64,
    pub capacity: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct LibraryDto {
    pub path: String,
    pub roles: Vec<String>,
    pub when: String,
}

impl Health {
    pub fn of(r: Option<&Report>) -> Self {
        let Some(r) = r else {
            return Self {
                live: false,
                final_report: false,
                per: "second".into(),
                elapsed_s: 0.0,
                events: 0,
                steps: 0,
                losses: BTreeMap::new(),
                dropped: 0,
                map_fill: Vec::new(),
                libraries: Vec::new(),
                probe_failures: Vec::new(),
                heap: Vec::new(),
                probe_cost: Vec::new(),
                stacks_listed: 0,
                unlisted: Default::default(),
            };
        };
        let losses: BTreeMap<String, u64> = match serde_json::to_value(&r.losses) {
            Ok(serde_json::Value::Object(m)) => m
                .into_iter()
                .map(|(k, v)| (k, v.as_u64().unwrap_or(0)))
                .collect(),
            _ => BTreeMap::new(),
        };
        let l = &r.losses;
        let dropped = l.ringbuf_full
            + l.pending_full
            + l.traced_full
            + l.stack_errors
            + l.stack_table_full
            + l.undecodable
            + l.sampled_full;
        Self {
            live: true,
            final_report: r.final_report,
            per: r.verdicts_per.to_string(),
            elapsed_s: r.elapsed_s,
            events: r.events,
            steps: r.steps,
            losses,
            dropped,
            map_fill: r
                .map_fill
                .iter()
                .map(|f| FillDto {
                    name: f.name.to_string(),
                    used: f.used,
                    capacity: f.capacity,
                    peak: f.peak,
                })
                .collect(),
            libraries: r
                .libraries
                .iter()
                .map(|l| LibraryDto {
                    path: l.path.display().to_string(),
                    roles: l.roles.iter().map(|r| r.to_string()).collect(),
                    when: serde_json::to_value(l.timing)
                        .ok()
                        .and_then(|v| v["when"].as_str().map(str::to_owned))
                        .unwrap_or_default(),
                })
                .collect(),
            probe_failures: r.probe_failures.clone(),
            heap: crate::render::heap_notes(r),
            probe_cost: r.probe_cost.clone(),
            stacks_listed: r.stacks.len(),
            unlisted: r.unlisted,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ProcessDto {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub command: String,
    pub exited: bool,
    pub bytes: Bytes,
    pub inherited: Bytes,
    /// The allocator keeps memory nothing holds (fragmentation).
    pub retention: bool,
}

pub fn processes(r: &Report) -> Vec<ProcessDto> {
    r.processes
        .iter()
        .map(|p| ProcessDto {
            pid: p.pid,
            ppid: p.ppid,
            command: p.command.clone(),
            exited: p.exited,
            bytes: bytes_of(&p.own),
            inherited: bytes_of(&p.inherited),
            retention: p.retention.as_ref().is_some_and(|r| r.retention),
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct StackDto {
    /// Stable across updates: kind and frames, and the pid.
    pub id: String,
    pub pid: u32,
    pub kind: &'static str,
    pub inherited: bool,
    pub bytes: u64,
    pub blocks: u64,
    pub oldest_age_s: f64,
    /// A [`crate::analysis::Verdict`]'s name; null until enough samples.
    pub verdict: Option<&'static str>,
    /// Bytes per second, or per step when the report is per step.
    pub slope: Option<f64>,
    pub confidence: Option<f64>,
    pub released: bool,
    /// The first frame in the program's own code, with file and line.
    pub site: String,
    /// Pages the allocator mapped for these blocks, by page kind (brk, mmap).
    pub pages: Bytes,
}

pub fn stack_key(s: &StackReport) -> String {
    format!(
        "{}-{}{}",
        stack_id(s),
        s.pid,
        if s.inherited { "i" } else { "" }
    )
}

pub fn stack(s: &StackReport) -> StackDto {
    StackDto {
        id: stack_key(s),
        pid: s.pid,
        kind: s.kind.name(),
        inherited: s.inherited,
        bytes: s.bytes,
        blocks: s.blocks,
        oldest_age_s: s.oldest_age_s,
        verdict: s.verdict.as_ref().map(|v| v.verdict.name()),
        slope: s.verdict.as_ref().map(|v| v.slope_bytes_per_s),
        confidence: s.verdict.as_ref().map(|v| v.confidence),
        released: s.released,
        site: s.site(),
        pages: s.pages.iter().map(|p| (p.kind.name(), p.bytes)).collect(),
    }
}

#[derive(Debug, Serialize)]
pub struct FrameDto {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    pub offset: String,
}

#[derive(Debug, Serialize)]
pub struct StackDetail {
    #[serde(flatten)]
    pub stack: StackDto,
    /// Innermost first.
    pub frames: Vec<FrameDto>,
    /// The verdict's windows: floor and peak per window.
    pub windows: Vec<WindowDto>,
}

#[derive(Debug, Serialize)]
pub struct WindowDto {
    pub t0: f64,
    pub t1: f64,
    pub floor: u64,
    pub peak: u64,
}

pub fn detail(s: &StackReport) -> StackDetail {
    StackDetail {
        stack: stack(s),
        frames: s
            .frames
            .iter()
            .map(|f| FrameDto {
                function: f.function.clone(),
                file: f.file.clone(),
                line: f.line,
                module: f.module.clone(),
                offset: f.offset.clone(),
            })
            .collect(),
        windows: s
            .verdict
            .iter()
            .flat_map(|v| &v.windows)
            .map(|w| WindowDto {
                t0: w.t0_s,
                t1: w.t1_s,
                floor: w.floor,
                peak: w.peak,
            })
            .collect(),
    }
}

/// One point of a sampled series: the span it covers (seconds or steps), the least and most
/// outstanding bytes in it and the last value (old points are merged pairwise).
#[derive(Clone, Debug, Serialize)]
pub struct PointDto {
    pub t0: f64,
    pub t1: f64,
    pub min: u64,
    pub max: u64,
    pub last: u64,
}

pub fn point(p: &crate::analysis::series::Point) -> PointDto {
    PointDto {
        t0: p.t0,
        t1: p.t1,
        min: p.min,
        max: p.max,
        last: p.last,
    }
}

/// A process's series: heap-level bytes (heap and tensors) and the allocator's brk heap.
#[derive(Debug, Serialize)]
pub struct ProcessSeries {
    pub heap: Vec<PointDto>,
    pub brk: Vec<PointDto>,
}

/// What each live update (SSE) carries: enough to refresh the header and decide to re-fetch.
#[derive(Debug, Serialize)]
pub struct Update {
    #[serde(rename = "final")]
    pub final_report: bool,
    pub elapsed_s: f64,
    pub events: u64,
    pub steps: u64,
    pub totals: Bytes,
    pub leaks: usize,
    pub dropped: u64,
}

pub fn update(r: &Report) -> Update {
    Update {
        final_report: r.final_report,
        elapsed_s: r.elapsed_s,
        events: r.events,
        steps: r.steps,
        totals: bytes_of(&r.totals),
        leaks: r
            .stacks
            .iter()
            .filter(|s| {
                s.verdict
                    .as_ref()
                    .is_some_and(|v| v.verdict.name() == "leak")
            })
            .count(),
        dropped: Health::of(Some(r)).dropped,
    }
}
