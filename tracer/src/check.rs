//! `leaktracer check`: the CI gate. Runs the command under the tracer and fails when a stack leaks
//! faster than the budget: a leak verdict (the floor rises window after window) with a floor slope
//! over the budget, in the kinds asked for. Writes JUnit XML for CI systems on request.
//!
//! Exit codes: 0 clean, 1 a leak over budget, 2 leaktracer's own failure (bad arguments, no
//! privileges, kernel support missing, a library whose allocation calls it could not probe), 3 the
//! command itself failed and nothing leaked over budget.

use std::{fmt::Write as _, path::Path};

pub use crate::report::Finding;
use crate::{
    model::Kind,
    probes::ProbeFailure,
    render::{held, human},
    report::{Report, StackReport},
};

pub mod exit {
    pub const CLEAN: i32 = 0;
    pub const LEAK: i32 = 1;
    pub const TOOL: i32 = 2;
    pub const COMMAND_FAILED: i32 = 3;
}

/// A leak budget in bytes per second, or per step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub bytes_per_s: f64,
    pub per_step: bool,
}

/// A gate that cannot be set up as asked.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("budget {text:?}: {why}")]
    Budget { text: String, why: String },
    #[error("unknown kind {name:?} (one of {known})")]
    Kind { name: String, known: String },
    #[error("writing {}: {source}", path.display())]
    Junit {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Parses "10MiB/min", "512KiB/s", "1GB/h" or "1MiB/step" (which needs --step-symbol).
pub fn parse_budget(text: &str) -> Result<Budget, GateError> {
    let bad = |why: String| GateError::Budget {
        text: text.into(),
        why,
    };
    let (amount, per) = text
        .split_once('/')
        .ok_or_else(|| bad("expected AMOUNT/PERIOD, e.g. 10MiB/min".into()))?;
    let seconds = match per.trim() {
        "s" | "sec" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "step" => 1.0,
        other => {
            return Err(bad(format!("unknown period {other:?} (s, min, h, step)")));
        }
    };
    Ok(Budget {
        bytes_per_s: parse_bytes(amount.trim())
            .ok_or_else(|| bad(format!("bad amount {amount:?} (e.g. 512KiB, 10MiB, 1GB)")))?
            / seconds,
        per_step: per.trim() == "step",
    })
}

fn parse_bytes(s: &str) -> Option<f64> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let unit_bytes = match unit.trim() {
        "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    (n.is_finite() && n >= 0.0).then_some(n * unit_bytes)
}

/// Parses "heap,device" into kinds. By default every kind allocated by a call (heap, tensor and
/// the CUDA kinds), not the page-level ones: mmap and brk made inside malloc are the same memory
/// as its blocks, and would report each heap leak a second time.
pub fn parse_kinds(names: &[String]) -> Result<Vec<Kind>, GateError> {
    if names.is_empty() {
        return Ok(Kind::ALL
            .into_iter()
            .filter(|k| !matches!(k, Kind::Mmap | Kind::Brk))
            .collect());
    }
    names
        .iter()
        .map(|n| {
            Kind::ALL
                .into_iter()
                .find(|k| k.name() == n.trim())
                .ok_or_else(|| {
                    let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                    GateError::Kind {
                        name: n.clone(),
                        known: known.join(", "),
                    }
                })
        })
        .collect()
}

/// Every leaking stack of the checked kinds, the ones over budget first. `pages_of_untraced`:
/// also the page-level stacks (mmap, brk) of processes whose malloc family was not traced, whose
/// heap leaks are seen there only, and the arenas of CPython's object allocator in every process
/// (Python objects, which the malloc family never sees).
pub fn findings<'a>(
    report: &'a Report,
    budget: Budget,
    kinds: &[Kind],
    pages_of_untraced: bool,
) -> Vec<Finding<'a>> {
    let untraced: std::collections::HashSet<u32> = report
        .processes
        .iter()
        .filter(|p| pages_of_untraced && !p.malloc_traced)
        .map(|p| p.pid)
        .collect();
    let checked = |s: &StackReport| {
        kinds.contains(&s.kind)
            || (matches!(s.kind, Kind::Mmap | Kind::Brk) && untraced.contains(&s.pid))
            || (pages_of_untraced && s.python_arenas())
    };
    let mut out = crate::report::leak_sites(report, checked);
    for f in &mut out {
        f.over = f.slope > budget.bytes_per_s;
    }
    out.sort_by(|a, b| b.over.cmp(&a.over).then(b.slope.total_cmp(&a.slope)));
    out
}

/// What the gate knows of the run besides its stacks.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    /// The command's own exit status.
    pub command_status: i32,
    /// Probe sets that could not go in: the run was not seen whole.
    pub unprobed: &'a [ProbeFailure],
}

/// The check's exit code: a leak over budget wins; then a run not seen whole (leaktracer's own
/// failure: no pass it could not vouch for), then the command's own failure.
pub fn exit_code(findings: &[Finding<'_>], run: Run<'_>) -> i32 {
    if findings.iter().any(|f| f.over) {
        exit::LEAK
    } else if !run.unprobed.is_empty() {
        exit::TOOL
    } else if run.command_status != 0 {
        exit::COMMAND_FAILED
    } else {
        exit::CLEAN
    }
}

/// The human summary printed after the run.
pub fn summary(findings: &[Finding<'_>], budget: Budget, run: Run<'_>) -> String {
    let mut s = String::new();
    let over: Vec<&Finding<'_>> = findings.iter().filter(|f| f.over).collect();
    let budget_text = format!("{}/{}", human(budget.bytes_per_s as u64), unit(budget));
    if over.is_empty() {
        let _ = writeln!(
            s,
            "leaktracer check: no stack leaks faster than {budget_text}"
        );
    } else {
        let _ = writeln!(
            s,
            "leaktracer check: {} site(s) leak faster than {budget_text}:",
            over.len()
        );
    }
    for f in findings {
        let _ = writeln!(
            s,
            "  {} {} {}/{}, {}, pid {}: {}",
            if f.over {
                "LEAK"
            } else {
                "leak (under budget)"
            },
            f.stack.kind.name(),
            human(f.slope.max(0.0) as u64),
            unit(budget),
            held(f),
            f.stack.pid,
            f.stack.site()
        );
    }
    for f in run.unprobed {
        let _ = writeln!(
            s,
            "leaktracer check: {f}: its calls were not traced, so the check cannot pass ({})",
            f.error
        );
    }
    if run.command_status != 0 {
        let _ = writeln!(
            s,
            "leaktracer check: the command itself failed with status {}",
            run.command_status
        );
    }
    s
}

/// JUnit XML: one testcase per leaking site (failed when over budget), one per library that could
/// not be probed (failed), plus one for the command's own exit status.
pub fn junit(findings: &[Finding<'_>], budget: Budget, run: Run<'_>) -> String {
    let esc = |t: &str| quick_xml::escape::escape(t).into_owned();
    let command_status = run.command_status;
    let failures = findings.iter().filter(|f| f.over).count()
        + run.unprobed.len()
        + usize::from(command_status != 0);
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuite name=\"leaktracer check\" tests=\"{}\" failures=\"{failures}\">",
        findings.len() + run.unprobed.len() + 1
    );
    for f in findings {
        let name = format!(
            "{} {} pid {}",
            f.stack.kind.name(),
            f.stack.site(),
            f.stack.pid
        );
        let _ = write!(
            x,
            "  <testcase classname=\"leaktracer.{}\" name=\"{}\"",
            f.stack.kind.name(),
            esc(&name)
        );
        if f.over {
            let msg = format!(
                "leaks {}/{u}, over the budget of {}/{u}",
                human(f.slope.max(0.0) as u64),
                human(budget.bytes_per_s as u64),
                u = unit(budget)
            );
            let frames: Vec<String> = f
                .stack
                .frames
                .iter()
                .map(|fr| fr.function.clone().unwrap_or_else(|| "??".into()))
                .collect();
            let _ = writeln!(
                x,
                ">\n    <failure message=\"{}\">{}</failure>\n  </testcase>",
                esc(&msg),
                esc(&frames.join("\n"))
            );
        } else {
            let _ = writeln!(x, "/>");
        }
    }
    for f in run.unprobed {
        let name = format!("{} ({})", f.library.display(), f.role);
        let msg = format!("not probed: its calls were not traced ({})", f.error);
        let _ = writeln!(
            x,
            "  <testcase classname=\"leaktracer.probes\" name=\"{}\">\n    <failure message=\"{}\"/>\n  </testcase>",
            esc(&name),
            esc(&msg)
        );
    }
    let _ = write!(
        x,
        "  <testcase classname=\"leaktracer.command\" name=\"exit status\""
    );
    if command_status != 0 {
        let _ = writeln!(
            x,
            ">\n    <failure message=\"the command failed with status {command_status}\"/>\n  </testcase>"
        );
    } else {
        let _ = writeln!(x, "/>");
    }
    x.push_str("</testsuite>\n");
    x
}

fn unit(b: Budget) -> &'static str {
    if b.per_step { "step" } else { "s" }
}

/// Writes the JUnit file.
pub fn write_junit(path: &Path, xml: &str) -> Result<(), GateError> {
    std::fs::write(path, xml).map_err(|source| GateError::Junit {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::Verdict, report::by_site};

    #[test]
    fn budgets_parse_to_bytes_per_second() {
        assert_eq!(
            parse_budget("60MiB/min").unwrap().bytes_per_s,
            1024.0 * 1024.0
        );
        assert_eq!(
            parse_budget("512KiB/s").unwrap().bytes_per_s,
            512.0 * 1024.0
        );
        assert_eq!(parse_budget("3.6GB/h").unwrap().bytes_per_s, 1e6);
        assert!(
            parse_budget("10MiB")
                .unwrap_err()
                .to_string()
                .contains("AMOUNT/PERIOD")
        );
        assert!(
            parse_budget("10 parsecs/s")
                .unwrap_err()
                .to_string()
                .contains("bad amount")
        );
        let step = parse_budget("1MiB/step").unwrap();
        assert!(step.per_step && step.bytes_per_s == 1024.0 * 1024.0);
        assert!(!parse_budget("1MiB/s").unwrap().per_step);
        assert!(
            parse_budget("1MiB/fortnight")
                .unwrap_err()
                .to_string()
                .contains("unknown period")
        );
    }

    #[test]
    fn kinds_parse_by_report_name() {
        assert_eq!(
            parse_kinds(&["heap".into(), "device".into()]).unwrap(),
            [Kind::Heap, Kind::Device]
        );
        let default = parse_kinds(&[]).unwrap();
        assert_eq!(default.len(), Kind::ALL.len() - 2);
        assert!(!default.contains(&Kind::Brk) && !default.contains(&Kind::Mmap));
        assert!(
            parse_kinds(&["vram".into()])
                .unwrap_err()
                .to_string()
                .contains("unknown kind")
        );
    }

    #[test]
    fn a_leak_over_budget_wins_then_a_run_not_seen_whole_then_the_commands_failure() {
        let run = |command_status, unprobed| Run {
            command_status,
            unprobed,
        };
        let failure = [ProbeFailure {
            library: "/lib/libcudart.so.13".into(),
            role: "cuda-runtime".into(),
            error: "attaching 9 point(s): EBUSY".into(),
        }];
        assert_eq!(exit_code(&[], run(0, &[])), exit::CLEAN);
        assert_eq!(exit_code(&[], run(7, &[])), exit::COMMAND_FAILED);
        assert_eq!(exit_code(&[], run(0, &failure)), exit::TOOL);
        assert_eq!(exit_code(&[], run(7, &failure)), exit::TOOL);
        let stack = leaking(Kind::Tensor, 21, "alloc_cpu", 8_000.0);
        let over = [Finding {
            stack: &stack,
            released: 0,
            slope: 8_000.0,
            over: true,
            growth: 0,
            bytes: stack.bytes,
            blocks: stack.blocks,
            stacks: 1,
        }];
        assert_eq!(exit_code(&over, run(7, &failure)), exit::LEAK);
        let budget = Budget {
            bytes_per_s: 1.0,
            per_step: false,
        };
        let text = summary(&[], budget, run(0, &failure));
        assert!(
            text.contains("/lib/libcudart.so.13 could not be probed for cuda-runtime")
                && text.contains("EBUSY"),
            "{text}"
        );
        let xml = junit(&[], budget, run(0, &failure));
        assert!(
            xml.contains("tests=\"2\" failures=\"1\"")
                && xml.contains(
                    "classname=\"leaktracer.probes\" name=\"/lib/libcudart.so.13 (cuda-runtime)\""
                ),
            "{xml}"
        );
    }

    /// A leaking stack of `kind` in pid 1 at `line` of a Python script, leaking `slope` B/s.
    fn leaking(kind: Kind, line: u32, native: &str, slope: f64) -> StackReport {
        let frame = |function: &str, file: Option<&str>, line: Option<u32>, module: &str| {
            crate::symbolize::SymFrame {
                address: "0x0".into(),
                function: Some(function.into()),
                file: file.map(Into::into),
                line,
                module: Some(module.into()),
                offset: "0x0".into(),
            }
        };
        StackReport {
            pid: 1,
            kind,
            inherited: false,
            bytes: 4096,
            blocks: 4,
            oldest_age_s: 1.0,
            allocators: Vec::new(),
            truncated: false,
            verdict: Some(crate::analysis::Evidence {
                verdict: Verdict::Leak,
                confidence: 1.0,
                growth_bytes: (slope * 10.0) as i64,
                slope_bytes_per_s: slope,
                windows: Vec::new(),
            }),
            released: false,
            pages: Vec::new(),
            group: None,
            frames: vec![
                frame(native, None, None, "libpython3.11.so"),
                frame(
                    "step",
                    Some("/job/train.py"),
                    Some(line),
                    crate::symbolize::PYTHON_MODULE,
                ),
            ],
        }
    }

    #[test]
    fn a_sites_stacks_of_a_kind_are_one_finding_over_the_budget_each_is_under() {
        // Released at the end: its blocks freed by the program's teardown.
        let released = |line: u32, slope: f64| StackReport {
            released: true,
            bytes: 0,
            blocks: 0,
            ..leaking(Kind::Tensor, line, "alloc_cpu", slope)
        };
        let stacks = [
            leaking(Kind::Object, 21, "dict_new", 10_000.0),
            leaking(Kind::Object, 21, "unicode_new", 9_000.0),
            leaking(Kind::Object, 17, "long_new", 5_000.0),
            released(21, 1_000.0),
            leaking(Kind::Tensor, 21, "alloc_cpu", 8_000.0),
            leaking(Kind::Tensor, 21, "alloc_cpu", 7_000.0),
            released(30, 2_000.0),
        ];
        let budget = Budget {
            bytes_per_s: 17_000.0,
            per_step: false,
        };
        let leaks = stacks.iter().map(|s| Finding {
            stack: s,
            released: usize::from(s.released),
            slope: s.verdict.as_ref().unwrap().slope_bytes_per_s,
            over: false,
            growth: s.verdict.as_ref().unwrap().growth_bytes,
            bytes: s.bytes,
            blocks: s.blocks,
            stacks: 1,
        });
        let found = by_site(leaks);
        let got: Vec<(Kind, f64, i64, u64, bool)> = found
            .iter()
            .map(|f| (f.stack.kind, f.slope, f.growth, f.blocks, f.stack.released))
            .collect();
        assert_eq!(
            got,
            vec![
                (Kind::Object, 19_000.0, 190_000, 8, false),
                (Kind::Object, 5_000.0, 50_000, 4, false),
                (Kind::Tensor, 16_000.0, 160_000, 8, false),
                (Kind::Tensor, 2_000.0, 20_000, 0, true),
            ],
            "by site and kind, what the teardown freed with what it did not"
        );
        let run = Run {
            command_status: 0,
            unprobed: &[],
        };
        let text = summary(&found, budget, run);
        assert!(
            text.contains("~185.5 KiB of arenas, 8 sampled objects held")
                && text.contains("8.0 KiB outstanding in 8 blocks of 3 stacks (1 released at the end), pid 1: step (train.py:21)")
                && text.contains("2.0 KiB/s, released at the end, pid 1: step (train.py:30)"),
            "{text}"
        );
    }
}
