//! The JSON report (schema leaktracer.report/1) as the tests read it.

use anyhow::Context as _;
use serde_json::Value;

/// One parsed report.
#[derive(Clone, Debug)]
pub struct Report(pub Value);

impl Report {
    pub fn parse(line: &str) -> anyhow::Result<Self> {
        let v: Value = serde_json::from_str(line).context("report is not JSON")?;
        anyhow::ensure!(
            v["schema"] == "leaktracer.report/1",
            "unexpected schema {}",
            v["schema"]
        );
        Ok(Self(v))
    }

    pub fn stacks(&self) -> &[Value] {
        self.0["stacks"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn processes(&self) -> &[Value] {
        self.0["processes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn process(&self, pid: u64) -> &Value {
        self.processes()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("no process {pid}"))
    }

    /// The root process (no parent among the traced).
    pub fn root_pid(&self) -> u64 {
        self.processes()
            .iter()
            .find(|p| p["ppid"].is_null())
            .and_then(|p| p["pid"].as_u64())
            .expect("root process")
    }

    /// The first traced process whose parent is `ppid`.
    pub fn child_of(&self, ppid: u64) -> &Value {
        self.processes()
            .iter()
            .find(|p| p["ppid"] == ppid)
            .unwrap_or_else(|| panic!("no child of {ppid}"))
    }

    /// Sums (bytes, blocks) over the stacks matching `filter`.
    pub fn sum(&self, filter: impl Fn(&Value) -> bool) -> (u64, u64) {
        self.stacks()
            .iter()
            .filter(|s| filter(s))
            .fold((0, 0), |(b, n), s| {
                (
                    b + s["bytes"].as_u64().unwrap(),
                    n + s["blocks"].as_u64().unwrap(),
                )
            })
    }

    /// Runs of leaktracer's program `name` in `probe_cost` (`--probe-cost`; 0 when it never ran).
    pub fn program_runs(&self, name: &str) -> u64 {
        self.0["probe_cost"]
            .as_array()
            .and_then(|cost| cost.iter().find(|p| p["program"] == name))
            .and_then(|p| p["calls"].as_u64())
            .unwrap_or(0)
    }

    /// (bytes, blocks) of `kind` whose frame `index` is `function` (own memory, not inherited).
    pub fn site(&self, kind: &str, index: usize, function: &str) -> (u64, u64) {
        self.sum(|s| {
            s["kind"] == kind && s["inherited"] == false && frame_fn(s, index) == Some(function)
        })
    }

    /// The probed library whose path ends with `name`.
    pub fn library(&self, name: &str) -> &Value {
        self.0["libraries"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["path"].as_str().is_some_and(|p| p.ends_with(name)))
            .unwrap_or_else(|| panic!("{name} not probed: {}", self.0["libraries"]))
    }

    /// The names of the functions the report lists as probed.
    pub fn probed(&self) -> Vec<&str> {
        let probes = self.0["probes"].as_array().into_iter().flatten();
        probes.filter_map(|p| p["function"].as_str()).collect()
    }

    pub fn losses(&self) -> &Value {
        &self.0["losses"]
    }

    /// How many Python objects' windows were opened: the object allocator's libraries probed.
    pub fn object_windows(&self) -> usize {
        self.0["libraries"].as_array().map_or(0, |l| {
            l.iter()
                .filter(|l| l["roles"][0] == "python-objects")
                .count()
        })
    }
}

/// The function name of frame `index` of a stack entry.
pub fn frame_fn(stack: &Value, index: usize) -> Option<&str> {
    stack["frames"].get(index)?["function"].as_str()
}

/// Index of the first frame naming `function`.
pub fn frame_index(stack: &Value, function: &str) -> Option<usize> {
    stack["frames"]
        .as_array()?
        .iter()
        .position(|f| f["function"] == function)
}
