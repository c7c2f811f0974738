//! The seeds' leaks on libtorch (the harness), gated by `leaktracer check`: each scenario's leaky
//! variant fails with the leak verdict on the right function (and the right pid when several
//! processes run), its fixed variant passes, and its spikes, steady extras, bounded caches and
//! workers are never called leaks. Each test writes its rows of the scenario table to
//! target/…/scenarios/SCENARIO.txt (scripts/test.sh prints the table).

use std::fmt::Write as _;

use serde_json::Value;
use tests::{fixture, report::Report};

/// A per-step budget well under every seeded leak (the smallest, S4's validation results, keeps a
/// square every third step: 85 KiB/step) and far over any steady stack.
const BUDGET: &str = "32KiB/step";
const STEPS: &str = "24";

/// What a scenario must show.
struct Expect {
    scenario: &'static str,
    /// Functions (last path segment) whose allocations leak in the leaky variant: each must be in
    /// a stack over budget, and every stack over budget must contain one of them.
    leaks: &'static [&'static str],
    /// Functions whose stacks hold memory at the end in the leaky variant, with the verdict each
    /// must have (never leak).
    others: &'static [(&'static str, &'static [&'static str])],
}

fn function_in(stack: &Value, name: &str) -> bool {
    stack["frames"].as_array().into_iter().flatten().any(|f| {
        f["function"].as_str().is_some_and(|n| {
            n.starts_with("harness::scenarios::") && n.ends_with(&format!("::{name}"))
        })
    })
}

fn is_leak(stack: &Value) -> bool {
    stack["verdict"]["verdict"] == "leak"
}

/// `leaktracer check` of `harness SCENARIO --variant VARIANT`: its exit code and final report.
fn check(harness: &std::path::Path, scenario: &str, variant: &str) -> (i32, Report) {
    let out = fixture::target_dir().join(format!("scenario-{scenario}-{variant}.json"));
    let _ = std::fs::remove_file(&out);
    let o = fixture::leaktracer_cmd()
        .args([
            "check",
            "--no-store",
            "--step-symbol",
            "harness_step",
            "--warmup",
            "4",
            "--budget",
            BUDGET,
            "--json",
            "-o",
        ])
        .arg(&out)
        .arg("--")
        .arg(harness)
        .args([scenario, "--variant", variant, "--steps", STEPS])
        .output()
        .expect("leaktracer check");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let report = Report::parse(text.lines().last().unwrap_or_else(|| {
        panic!(
            "no report for {scenario} {variant}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    }))
    .expect("report");
    (o.status.code().unwrap_or(-1), report)
}

/// The table row of one run: the fastest leak of the kinds checked (not the page-level view of
/// the same memory), its function and rate, or "clean".
fn row(scenario: &str, variant: &str, code: i32, r: &Report) -> String {
    let checked = |s: &&Value| is_leak(s) && s["kind"] != "mmap" && s["kind"] != "brk";
    let worst = r.stacks().iter().filter(checked).max_by(|a, b| {
        let slope = |s: &Value| s["verdict"]["slope_bytes_per_s"].as_f64().unwrap_or(0.0);
        slope(a).total_cmp(&slope(b))
    });
    let (verdict, frame, rate) = match worst {
        Some(s) => {
            let frame = s["frames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["function"].as_str())
                .find(|n| n.starts_with("harness::scenarios::"))
                .unwrap_or("?")
                .trim_start_matches("harness::scenarios::")
                .to_string();
            let rate = s["verdict"]["slope_bytes_per_s"].as_f64().unwrap_or(0.0) / 1024.0;
            ("leak", frame, format!("{rate:.1} KiB/step"))
        }
        None => ("clean", "-".to_string(), "-".to_string()),
    };
    format!("{scenario:<4} {variant:<6} exit {code}  {verdict:<6} {frame:<40} {rate}")
}

fn run(e: &Expect) -> Option<(Report, Report)> {
    if !fixture::bpf_available() {
        return None;
    }
    let harness = fixture::harness()?;
    let _x = fixture::exclusive();
    let (code, leaky) = check(&harness, e.scenario, "leaky");
    let (fixed_code, fixed) = check(&harness, e.scenario, "fixed");
    let mut table = String::new();
    let _ = writeln!(table, "{}", row(e.scenario, "leaky", code, &leaky));
    let _ = writeln!(table, "{}", row(e.scenario, "fixed", fixed_code, &fixed));
    print!("{table}");
    let dir = fixture::target_dir().join("scenarios");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{}.txt", e.scenario)), &table).unwrap();

    assert_eq!(
        code, 1,
        "{} leaky must fail the check:\n{table}",
        e.scenario
    );
    let budget = 32.0 * 1024.0;
    let over: Vec<&Value> = leaky
        .stacks()
        .iter()
        .filter(|s| {
            is_leak(s)
                && s["kind"] != "mmap"
                && s["kind"] != "brk"
                && s["verdict"]["slope_bytes_per_s"].as_f64().unwrap() > budget
        })
        .collect();
    for s in &over {
        assert!(
            e.leaks.iter().any(|f| function_in(s, f)),
            "{}: a leak over budget outside {:?}: {s}",
            e.scenario,
            e.leaks
        );
    }
    for f in e.leaks {
        assert!(
            over.iter().any(|s| function_in(s, f)),
            "{}: no leak over budget in {f}",
            e.scenario
        );
    }
    for (f, verdicts) in e.others {
        let stacks: Vec<&Value> = leaky
            .stacks()
            .iter()
            .filter(|s| s["kind"] == "tensor" || s["kind"] == "heap")
            .filter(|s| function_in(s, f) && s["bytes"].as_u64() >= Some(65536))
            .collect();
        assert!(
            !stacks.is_empty(),
            "{}: no stack of {f} holds memory",
            e.scenario
        );
        for s in stacks {
            let v = s["verdict"]["verdict"].as_str().unwrap_or("none");
            assert!(
                verdicts.contains(&v),
                "{}: {f} is {v}, expected one of {verdicts:?}: {s}",
                e.scenario
            );
        }
    }
    assert_eq!(fixed_code, 0, "{} fixed must pass:\n{table}", e.scenario);
    Some((leaky, fixed))
}

#[test]
fn s0_generation_rounds() {
    run(&Expect {
        scenario: "s0",
        leaks: &["embed_batch"],
        others: &[],
    });
}

#[test]
fn s1_train_a2v() {
    run(&Expect {
        scenario: "s1",
        leaks: &["refresh_cached_embedding", "set_postfix"],
        // zero_grad without set_to_none: the gradient stays, constant.
        others: &[("backward_step", &["steady"])],
    });
}

#[test]
fn s2_vision_training_ram() {
    let Some((leaky, _)) = run(&Expect {
        scenario: "s2",
        leaks: &["forward_keep"],
        others: &[("validate", &["spike"]), ("hold_dataset_copy", &["steady"])],
    }) else {
        return;
    };
    // The leak is the trainer's; each worker's dataset copy is its own, not the trainer's.
    let root = leaky.root_pid();
    for s in leaky
        .stacks()
        .iter()
        .filter(|s| is_leak(s) && s["kind"] == "tensor")
    {
        assert_eq!(s["pid"].as_u64(), Some(root), "{s}");
    }
    let workers: Vec<u64> = leaky
        .processes()
        .iter()
        .filter(|p| p["ppid"].as_u64() == Some(root))
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(workers.len(), 2, "two DataLoader workers");
    for w in &workers {
        let copy = leaky
            .stacks()
            .iter()
            .find(|s| {
                s["pid"].as_u64() == Some(*w)
                    && s["kind"] == "heap"
                    && function_in(s, "hold_dataset_copy")
            })
            .unwrap_or_else(|| panic!("worker {w} has no dataset copy"));
        assert_eq!(copy["bytes"], 4 << 20);
    }
}

#[test]
fn s3_compile_workers_and_spikes() {
    let Some((leaky, _)) = run(&Expect {
        scenario: "s3",
        leaks: &["accumulate_metrics"],
        others: &[
            ("validation_spike", &["spike"]),
            ("hold_dataset_copy", &["steady"]),
        ],
    }) else {
        return;
    };
    // Reported in the trainer the wrapper started, not in the wrapper.
    let root = leaky.root_pid();
    let trainer = leaky
        .processes()
        .iter()
        .find(|p| {
            p["command"]
                .as_str()
                .is_some_and(|c| c.ends_with("--trainer"))
        })
        .expect("the trainer process");
    assert_eq!(trainer["ppid"].as_u64(), Some(root), "the wrapper's child");
    let trainer = trainer["pid"].as_u64().unwrap();
    for s in leaky
        .stacks()
        .iter()
        .filter(|s| is_leak(s) && s["kind"] == "tensor")
    {
        assert_eq!(s["pid"].as_u64(), Some(trainer), "{s}");
    }
    let compile_workers = leaky
        .processes()
        .iter()
        .filter(|p| p["ppid"].as_u64() == Some(trainer))
        .count();
    assert_eq!(compile_workers, 2);
}

#[test]
fn s4_refdet_trainer() {
    run(&Expect {
        scenario: "s4",
        leaks: &["validate_epoch", "log_step"],
        others: &[
            ("triplet_batch", &["spike"]),
            ("cache_frame", &["bounded_cache", "steady"]),
        ],
    });
}
