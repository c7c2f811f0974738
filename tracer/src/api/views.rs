//! What the page draws beyond the report's rows: the timeline of outstanding bytes by kind (kept
//! by the session, one point per publication), the flamegraph tree of outstanding bytes, and the
//! list of a run's stored snapshots.

use serde::Serialize;

use crate::{
    model::Kind,
    report::{Report, StackReport},
};

/// Points kept at most; past it every other point is dropped and points are taken half as often,
/// so a long run keeps its whole span at a coarser grain.
const MAX_POINTS: usize = 1800;

#[derive(Clone, Debug)]
pub struct TimePoint {
    pub t: f64,
    pub steps: u64,
    pub leaks: u32,
    pub bytes: [u64; Kind::ALL.len()],
}

/// Outstanding bytes by kind over the session, owned by the session's loop.
#[derive(Debug)]
pub struct Timeline {
    points: Vec<TimePoint>,
    /// Publications per point.
    stride: u32,
    skipped: u32,
}

impl Default for Timeline {
    fn default() -> Self {
        Self {
            points: Vec::new(),
            stride: 1,
            skipped: 0,
        }
    }
}

impl Timeline {
    /// Records `r` (every publication; kept one in `stride`). The last report is always kept.
    pub fn record(&mut self, r: &Report) {
        self.skipped += 1;
        if self.skipped < self.stride && !r.final_report {
            return;
        }
        self.skipped = 0;
        if self.points.len() >= MAX_POINTS {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
        }
        self.points.push(TimePoint {
            t: r.elapsed_s,
            steps: r.steps,
            leaks: r.stacks.iter().filter(|s| is_leak(s)).count() as u32,
            bytes: Kind::ALL.map(|k| r.totals.get(k).bytes),
        });
    }

    pub fn points(&self) -> &[TimePoint] {
        &self.points
    }
}

fn is_leak(s: &StackReport) -> bool {
    s.verdict
        .as_ref()
        .is_some_and(|v| v.verdict.name() == "leak")
}

/// The timeline as columns, as charting libraries take it: kinds that never held anything are
/// left out.
#[derive(Debug, Serialize)]
pub struct TimelineDto {
    pub t: Vec<f64>,
    pub steps: Vec<u64>,
    pub leaks: Vec<u32>,
    pub kinds: std::collections::BTreeMap<&'static str, Vec<u64>>,
}

pub fn timeline(points: &[TimePoint]) -> TimelineDto {
    let kinds = Kind::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| points.iter().any(|p| p.bytes[*i] > 0))
        .map(|(i, k)| (k.name(), points.iter().map(|p| p.bytes[i]).collect()))
        .collect();
    TimelineDto {
        t: points.iter().map(|p| p.t).collect(),
        steps: points.iter().map(|p| p.steps).collect(),
        leaks: points.iter().map(|p| p.leaks).collect(),
        kinds,
    }
}

/// A node of the flamegraph: a frame, the bytes outstanding under it (itself included) and the
/// part of them in stacks judged leaks.
#[derive(Debug, Serialize)]
pub struct FlameNode {
    pub name: String,
    /// file:line, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loc: Option<String>,
    pub value: u64,
    pub leak: u64,
    pub children: Vec<FlameNode>,
}

impl FlameNode {
    fn new(name: String, loc: Option<String>) -> Self {
        Self {
            name,
            loc,
            value: 0,
            leak: 0,
            children: Vec::new(),
        }
    }

    fn child(&mut self, name: String, loc: Option<String>) -> &mut FlameNode {
        let i = match self
            .children
            .iter()
            .position(|c| c.name == name && c.loc == loc)
        {
            Some(i) => i,
            None => {
                self.children.push(FlameNode::new(name, loc));
                self.children.len() - 1
            }
        };
        &mut self.children[i]
    }

    fn add(&mut self, s: &StackReport) {
        self.value += s.bytes;
        if is_leak(s) {
            self.leak += s.bytes;
        }
    }
}

/// The outstanding bytes of `r`'s stacks as a tree, outermost frame at the root; stacks of every
/// kind are split by kind first.
pub fn flamegraph(r: &Report, kind: Option<&str>, pid: Option<u32>) -> FlameNode {
    let mut root = FlameNode::new("all".into(), None);
    let stacks = r
        .stacks
        .iter()
        .filter(|s| kind.is_none_or(|k| s.kind.name() == k) && pid.is_none_or(|p| s.pid == p));
    for s in stacks {
        root.add(s);
        let mut node = if kind.is_none() {
            let n = root.child(s.kind.name().to_string(), None);
            n.add(s);
            n
        } else {
            &mut root
        };
        for f in s.frames.iter().rev() {
            let name = match (&f.function, &f.module) {
                (Some(func), _) => func.clone(),
                (None, Some(m)) => format!("{}+{}", basename(m), f.offset),
                (None, None) => f.offset.clone(),
            };
            let loc = f.file.as_ref().map(|file| match f.line {
                Some(l) => format!("{file}:{l}"),
                None => file.clone(),
            });
            node = node.child(name, loc);
            node.add(s);
        }
    }
    root
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
