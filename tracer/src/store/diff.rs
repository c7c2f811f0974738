//! `leaktracer diff OLD NEW`: what changed between two snapshots (JSON reports written with
//! `--json -o FILE`, from one run or two). Stacks are matched by kind and frames (function, or
//! module and offset), not by pid, so two runs of the same program compare.

use std::{collections::HashMap, fmt::Write as _};

use serde::Serialize;
use serde_json::Value;

use super::Store;
use crate::render::human;

/// One stack's change.
#[derive(Debug, Serialize, PartialEq)]
pub struct StackDelta {
    pub kind: String,
    /// Frames as "function" or "module+offset", innermost first.
    pub frames: Vec<String>,
    pub old_bytes: u64,
    pub new_bytes: u64,
    pub delta_bytes: i64,
    pub old_blocks: u64,
    pub new_blocks: u64,
    /// "grew", "shrank", "same", "new" (only in NEW) or "vanished" (only in OLD).
    pub change: &'static str,
}

/// A report to compare that cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] super::StoreError),
    /// A report file that cannot be read, or is not a leaktracer report, or a bad spec.
    #[error("{0}")]
    Bad(String),
}

/// Reads a snapshot: `run:ID[:N]` from the history at `store` (N: the snapshot's number,
/// negative from the end, the last by default), else `FILE[:N]`, report N (0-based, negative
/// from the end) of a JSON-lines file.
pub fn load(spec: &str, store: &std::path::Path) -> Result<Value, LoadError> {
    if let Some(rest) = spec.strip_prefix("run:") {
        let (run, seq) = match rest.split_once(':') {
            Some((r, n)) => (r, n.parse::<i64>().map_err(|_| bad_run(spec))?),
            None => (rest, -1),
        };
        let run = run.parse::<i64>().map_err(|_| bad_run(spec))?;
        let snap = Store::open_read(store)?.snapshot(run, seq)?;
        return serde_json::to_value(&snap.report).map_err(|e| LoadError::Bad(e.to_string()));
    }
    load_file(spec)
}

fn bad_run(spec: &str) -> LoadError {
    LoadError::Bad(format!("{spec}: a stored snapshot is run:ID or run:ID:N"))
}

fn load_file(spec: &str) -> Result<Value, LoadError> {
    let bad = LoadError::Bad;
    let (path, index) = match spec.rsplit_once(':') {
        Some((p, i)) if i.parse::<i64>().is_ok() => (p, i.parse::<i64>().unwrap_or(-1)),
        _ => (spec, -1),
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("reading {path}: {e}")))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let i = if index < 0 {
        lines.len() as i64 + index
    } else {
        index
    };
    let line = usize::try_from(i)
        .ok()
        .and_then(|i| lines.get(i))
        .ok_or_else(|| {
            bad(format!(
                "{path}: no report {index} (it has {})",
                lines.len()
            ))
        })?;
    let v: Value =
        serde_json::from_str(line).map_err(|e| bad(format!("{path}: not a JSON report: {e}")))?;
    if v["schema"] != crate::report::SCHEMA {
        return Err(bad(format!(
            "{path}: not a leaktracer report (schema {})",
            v["schema"]
        )));
    }
    Ok(v)
}

fn frame_name(f: &Value) -> String {
    match f["function"].as_str() {
        Some(func) => func.to_string(),
        None => format!(
            "{}+{}",
            f["module"].as_str().unwrap_or("?"),
            f["offset"].as_str().unwrap_or("?")
        ),
    }
}

/// (kind, frames) → (bytes, blocks), summed over pids.
fn stacks(report: &Value) -> HashMap<(String, Vec<String>), (u64, u64)> {
    let mut out: HashMap<(String, Vec<String>), (u64, u64)> = HashMap::new();
    for s in report["stacks"].as_array().into_iter().flatten() {
        let kind = s["kind"].as_str().unwrap_or("?").to_string();
        let frames = s["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .map(frame_name)
            .collect();
        let e = out.entry((kind, frames)).or_default();
        e.0 += s["bytes"].as_u64().unwrap_or(0);
        e.1 += s["blocks"].as_u64().unwrap_or(0);
    }
    out
}

/// Every stack of either report with its change, largest change first.
pub fn diff(old: &Value, new: &Value) -> Vec<StackDelta> {
    let (a, b) = (stacks(old), stacks(new));
    let mut keys: Vec<&(String, Vec<String>)> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<StackDelta> = keys
        .into_iter()
        .map(|key| {
            let (o, n) = (a.get(key), b.get(key));
            let (ob, oc) = o.copied().unwrap_or_default();
            let (nb, nc) = n.copied().unwrap_or_default();
            let change = match (o, n) {
                (None, _) => "new",
                (_, None) => "vanished",
                _ if nb > ob => "grew",
                _ if nb < ob => "shrank",
                _ => "same",
            };
            StackDelta {
                kind: key.0.clone(),
                frames: key.1.clone(),
                old_bytes: ob,
                new_bytes: nb,
                delta_bytes: nb as i64 - ob as i64,
                old_blocks: oc,
                new_blocks: nc,
                change,
            }
        })
        .collect();
    out.sort_by(|x, y| {
        y.delta_bytes
            .unsigned_abs()
            .cmp(&x.delta_bytes.unsigned_abs())
            .then(x.frames.cmp(&y.frames))
    });
    out
}

pub fn text(deltas: &[StackDelta], top: usize) -> String {
    let mut s = String::new();
    let grew: i64 = deltas.iter().map(|d| d.delta_bytes).sum();
    let sign = if grew < 0 { "-" } else { "+" };
    let _ = writeln!(
        s,
        "== leaktracer diff: {sign}{} outstanding over {} stacks ==",
        human(grew.unsigned_abs()),
        deltas.len()
    );
    for d in deltas.iter().filter(|d| d.change != "same").take(top) {
        let sign = if d.delta_bytes < 0 { "-" } else { "+" };
        let _ = writeln!(
            s,
            "{sign}{:>10} {:<8} {:<5} {} → {} ({} → {} blocks)",
            human(d.delta_bytes.unsigned_abs()),
            d.change,
            d.kind,
            human(d.old_bytes),
            human(d.new_bytes),
            d.old_blocks,
            d.new_blocks
        );
        for f in d.frames.iter().take(6) {
            let _ = writeln!(s, "      {f}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn report(stacks: serde_json::Value) -> serde_json::Value {
        json!({ "schema": crate::report::SCHEMA, "stacks": stacks })
    }

    #[test]
    fn stacks_match_across_pids_and_changes_are_named() {
        let old = report(json!([
            { "pid": 1, "kind": "heap", "bytes": 100, "blocks": 1, "frames": [{"function": "leak"}] },
            { "pid": 1, "kind": "heap", "bytes": 50, "blocks": 1, "frames": [{"function": "gone"}] },
            { "pid": 1, "kind": "mmap", "bytes": 10, "blocks": 1,
              "frames": [{"module": "/lib/x.so", "offset": "0x10"}] },
        ]));
        let new = report(json!([
            { "pid": 2, "kind": "heap", "bytes": 300, "blocks": 3, "frames": [{"function": "leak"}] },
            { "pid": 2, "kind": "device", "bytes": 7, "blocks": 1, "frames": [{"function": "fresh"}] },
            { "pid": 2, "kind": "mmap", "bytes": 10, "blocks": 1,
              "frames": [{"module": "/lib/x.so", "offset": "0x10"}] },
        ]));
        let d = super::diff(&old, &new);
        let by = |f: &str| d.iter().find(|x| x.frames[0] == f).unwrap();
        assert_eq!((by("leak").delta_bytes, by("leak").change), (200, "grew"));
        assert_eq!(
            (by("gone").delta_bytes, by("gone").change),
            (-50, "vanished")
        );
        assert_eq!((by("fresh").delta_bytes, by("fresh").change), (7, "new"));
        assert_eq!(by("/lib/x.so+0x10").change, "same");
        assert_eq!(d[0].frames[0], "leak", "largest change first");
    }
}
