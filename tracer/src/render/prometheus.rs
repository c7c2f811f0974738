//! Prometheus text exposition (format 0.0.4) of a report: what `/metrics` serves and
//! `--prometheus FILE` writes. Totals per process and kind, the report's stacks with their verdicts
//! and slopes, allocator retention, events and every loss counter.

use std::{
    collections::hash_map::DefaultHasher,
    fmt::Write as _,
    hash::{Hash, Hasher},
};

use crate::model::Kind;
use crate::report::{ProcReport, Report, StackReport};

/// Label values escaped as the format requires: backslash, double quote and line feed.
fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A stack's identity across scrapes: a hash of its kind and frames (module and offset).
pub fn stack_id(s: &StackReport) -> String {
    let mut h = DefaultHasher::new();
    s.kind.name().hash(&mut h);
    for f in &s.frames {
        f.module.hash(&mut h);
        f.offset.hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn line(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", esc(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}

pub fn exposition(r: &Report) -> String {
    let mut o = Out(String::new());
    let procs: Vec<(String, &ProcReport)> =
        r.processes.iter().map(|p| (p.pid.to_string(), p)).collect();
    for (name, help, blocks) in [
        (
            "leaktracer_outstanding_bytes",
            "Bytes allocated and not freed, per traced process and kind.",
            false,
        ),
        (
            "leaktracer_outstanding_blocks",
            "Blocks allocated and not freed, per traced process and kind.",
            true,
        ),
    ] {
        o.family(name, "gauge", help);
        for (pid, p) in &procs {
            for k in Kind::ALL {
                let a = p.own.get(k);
                let v = if blocks { a.blocks } else { a.bytes };
                o.line(
                    name,
                    &[("pid", pid), ("command", &p.command), ("kind", k.name())],
                    v as f64,
                );
            }
        }
    }
    o.family(
        "leaktracer_allocator_retention",
        "gauge",
        "1 when page-level memory grows while heap-level bytes do not (allocator retention, not a leak).",
    );
    for (pid, p) in &procs {
        if let Some(ret) = &p.retention {
            o.line(
                "leaktracer_allocator_retention",
                &[("pid", pid)],
                f64::from(u8::from(ret.retention)),
            );
        }
    }
    stacks(&mut o, r);
    o.family(
        "leaktracer_events_total",
        "counter",
        "Allocator events applied.",
    );
    o.line("leaktracer_events_total", &[], r.events as f64);
    o.family(
        "leaktracer_steps_total",
        "counter",
        "Training steps seen (entries of the --step-symbol function).",
    );
    o.line("leaktracer_steps_total", &[], r.steps as f64);
    o.family(
        "leaktracer_lost_total",
        "counter",
        "Events lost or unmatched, by reason (every loss is counted).",
    );
    if let Ok(serde_json::Value::Object(losses)) = serde_json::to_value(&r.losses) {
        for (reason, v) in losses {
            o.line(
                "leaktracer_lost_total",
                &[("reason", &reason)],
                v.as_f64().unwrap_or(0.0),
            );
        }
    }
    o.0
}

fn stacks(o: &mut Out, r: &Report) {
    let per = if r.verdicts_per == "step" {
        "step"
    } else {
        "second"
    };
    let slope = format!("leaktracer_stack_slope_bytes_per_{per}");
    let rows: Vec<(String, String, String, &StackReport)> = r
        .stacks
        .iter()
        .map(|s| (stack_id(s), s.pid.to_string(), s.site(), s))
        .collect();
    let labels = |(id, pid, site, s): &(String, String, String, &StackReport)| {
        let verdict = s.verdict.as_ref().map_or("none", |v| v.verdict.name());
        [
            ("stack", id.clone()),
            ("pid", pid.clone()),
            ("kind", s.kind.name().to_string()),
            ("inherited", s.inherited.to_string()),
            ("site", site.clone()),
            ("verdict", verdict.to_string()),
        ]
    };
    o.family(
        "leaktracer_stack_outstanding_bytes",
        "gauge",
        "Outstanding bytes of the top stacks, with the site and the verdict.",
    );
    for row in &rows {
        let l = labels(row);
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.line("leaktracer_stack_outstanding_bytes", &l, row.3.bytes as f64);
    }
    o.family(
        &slope,
        "gauge",
        "Slope of the stack's floor of outstanding bytes (the leak rate when the verdict is leak).",
    );
    for row in &rows {
        if let Some(v) = &row.3.verdict {
            let l = labels(row);
            let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
            o.line(&slope, &l, v.slope_bytes_per_s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_sample_line_belongs_to_a_declared_family() {
        use crate::report::synthetic::{ledger_with, report_of};
        let (ledger, analysis) = ledger_with(4, 5);
        let r = report_of(&ledger, &analysis, 4);
        let text = exposition(&r);
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            assert!(families.contains(&name), "{l}");
        }
        let stack_lines = text
            .lines()
            .filter(|l| l.starts_with("leaktracer_stack_outstanding_bytes{"))
            .count();
        assert_eq!(stack_lines, 4);
        assert!(
            text.contains(
                "leaktracer_outstanding_bytes{pid=\"1\",command=\"bench\",kind=\"heap\"} "
            )
        );
    }
}
