//! Distributed data parallel on the CPU as its users launch it: `torchrun` starts one interpreter
//! per rank (gloo), each a process of the traced tree. A leak of one rank is that rank's, named at
//! its line; the other rank and the launcher keep nothing.

use serde_json::Value;
use tests::fixture;

use crate::{
    python::{line, python, script},
    pytorch::line_of,
};

/// `check` of `torchrun --standalone --nproc_per_node=2 ddp_train.py 60 [fixed]`: its output,
/// the final report, and what each rank says it kept (by rank: pid, logits kept, bytes of each).
fn torchrun(name: &str, fixed: bool) -> (std::process::Output, tests::report::Report, Vec<Value>) {
    let pydeps = fixture::pydeps();
    let env = format!("PYTHONPATH={}", pydeps.display());
    let (py, path) = (python(), script("ddp_train"));
    let mut argv = vec!["/usr/bin/env", &env, &py, "-m", "torch.distributed.run"];
    argv.extend([
        "--standalone",
        "--nproc_per_node=2",
        path.to_str().unwrap(),
        "60",
    ]);
    if fixed {
        argv.push("fixed");
    }
    let (o, r) = crate::check::check_report(name, &["--no-store"], &argv);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    // The ranks print at once into one pipe: a line may hold both.
    let mut ranks: Vec<Value> = out
        .replace("}{", "}\n{")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["rank"].is_u64())
        .collect();
    ranks.sort_by_key(|v| v["rank"].as_u64());
    assert_eq!(ranks.len(), 2, "{out}");
    (o, r, ranks)
}

#[test]
fn a_ranks_kept_logits_under_torchrun_fail_the_check_at_their_line_in_that_rank_alone() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let (o, r, ranks) = torchrun("ddp", false);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{out}");
    let (leaker, other) = (
        ranks[0]["pid"].as_u64().unwrap(),
        ranks[1]["pid"].as_u64().unwrap(),
    );
    assert_eq!(
        (ranks[0]["kept"].as_u64(), ranks[1]["kept"].as_u64()),
        (Some(60), Some(0))
    );
    let block = ranks[0]["bytes"].as_u64().unwrap();
    assert_eq!(block, 1024 * 10 * 4);
    // Each rank is a process of the tree, under the launcher.
    let pids: Vec<u64> = r
        .processes()
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert!(pids.contains(&leaker) && pids.contains(&other), "{pids:?}");
    let at = line("ddp_train", "# LEAK-SITE");
    let site = format!("<module> (ddp_train.py:{at})");
    let leaks: Vec<&str> = out.lines().filter(|l| l.contains("LEAK ")).collect();
    assert!(!leaks.is_empty(), "{out}");
    for l in &leaks {
        assert!(
            l.ends_with(&site) && l.contains(&format!("pid {leaker}:")),
            "{out}"
        );
    }
    // The kept logits' own stack, the linear layers' outputs (one block of 1024 × 10 floats an
    // epoch for the last; `Sequential` calls all three from one line, so a hidden layer's
    // output of 1024 × 256 floats has the same stack, one at times kept as the tensors were
    // taken out mid-pass): a leak in rank 0, mostly whole logits, no more than were kept.
    // (Each kept logits' graph keeps its ReLUs' outputs too, a leak at the same line on a stack
    // of its own.) Where the interpreter's exit, freeing the list, came while the tensors were
    // traced, the stack is released, judged on what it held: its last window's peak.
    // Nothing of rank 1's at that line leaks.
    let leaking =
        |s: &&Value| s["verdict"]["verdict"] == "leak" && line_of(s, "ddp_train") == Some(at);
    let stacks: Vec<&Value> = r.stacks().iter().filter(leaking).collect();
    assert!(stacks.iter().all(|s| s["pid"] == leaker), "{stacks:?}");
    let linear = |s: &&&Value| {
        let python = s["frames"].as_array().into_iter().flatten();
        let mut python = python.filter(|f| f["module"] == "python");
        s["kind"] == "tensor"
            && python
                .next()
                .is_some_and(|f| f["function"] == "Linear.forward")
    };
    let logits = stacks
        .iter()
        .filter(linear)
        .find_map(|s| logits_held(s, block));
    assert!(logits.is_some_and(|n| n > 0 && n <= 60), "{stacks:?}");
    // The same job keeping nothing: nothing printed, the gate passes.
    let (o, r, ranks) = torchrun("ddp-fixed", true);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(
        (ranks[0]["kept"].as_u64(), ranks[1]["kept"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(!out.contains("LEAK "), "{out}");
    let leaks: Vec<&Value> = r
        .stacks()
        .iter()
        .filter(|s| s["verdict"]["verdict"] == "leak")
        .collect();
    assert!(leaks.is_empty(), "{leaks:?}");
}

/// How many whole logits of `block` bytes tensor stack `s` holds, beside fewer hidden outputs of
/// 1024 × 256 floats: as of the end, or where it was released, at its last window's peak.
fn logits_held(s: &Value, block: u64) -> Option<u64> {
    let hidden = 1024 * 256 * 4;
    let peak = || {
        let windows = s["verdict"]["windows"].as_array()?;
        windows.last()?["peak"].as_u64()
    };
    let bytes = if s["released"] == true {
        peak()?
    } else {
        s["bytes"].as_u64()?
    };
    // Hidden outputs h and logits n: bytes = n × block + h × hidden, h < n.
    (0..=bytes / hidden).find_map(|h| {
        let rest = bytes - h * hidden;
        let n = rest / block;
        (rest % block == 0 && h < n).then_some(n)
    })
}
