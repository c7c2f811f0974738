//! A training job as Hugging Face's users write one: transformers' `Trainer` (with accelerate)
//! over the torch wheel, on a CPU, from scripts/setup.sh's .pydeps-hf. Its stacks are some 30
//! Python frames deep where a model allocates, deeper than the first window of the data stack
//! the kernel side reads, and its tensors are traced now and then while its heap layer comes
//! and goes: the leak is still named at the user's line, against what PyTorch says it keeps.

use serde_json::Value;
use tests::fixture;

use crate::{
    python::{line, script},
    pytorch::{check_torch_at, line_of},
};

#[test]
fn hidden_states_kept_by_a_trainers_compute_loss_fail_the_check_at_its_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let (torch, hf) = (
        fixture::pydeps(),
        fixture::pydeps().with_file_name(".pydeps-hf"),
    );
    assert!(
        hf.join("transformers").is_dir(),
        "transformers in {} (scripts/setup.sh installs it)",
        hf.display()
    );
    let path = format!("PYTHONPATH={}:{}", torch.display(), hf.display());
    let vars = [path.as_str(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"];
    let job = |name: &str, options: &[&str], args: &[&str]| {
        let (o, r) = check_torch_at(name, &script("hf_trainer"), &vars, options, args);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            r,
        )
    };
    // Some 25 s of training: long enough for its heap's pages to outgrow what its layers'
    // windows saw leak (its brk heap grows by 1.7 times its bytes in use).
    let (code, out, r) = job("hf-trainer", &[], &["1500"]);
    assert_eq!(code, Some(1), "{out}");
    let at = line("hf_trainer", "# LEAK-SITE");
    let site = format!("Probing.compute_loss (hf_trainer.py:{at})");
    let leaks: Vec<&str> = out.lines().filter(|l| l.contains("LEAK ")).collect();
    assert!(
        leaks
            .iter()
            .any(|l| l.contains("LEAK tensor") && l.ends_with(&site)),
        "{out}"
    );
    // Every leak printed is at that line: the heap's pages are under its tensors and its heap,
    // not a leak of their own at the line that calls the Trainer.
    assert!(leaks.iter().all(|l| l.ends_with(&site)), "{out}");
    let pages = |s: &&Value| s["kind"] == "brk" || s["kind"] == "mmap";
    assert!(
        r.stacks()
            .iter()
            .filter(pages)
            .all(|s| s["verdict"]["verdict"] != "leak"),
        "{out}"
    );
    // The Trainer's set-up maps arenas outside imports for seconds (a traceback's source lines,
    // its sampler's permutation): no objects' window for them, whose every object call would be
    // a probe trap while the tensors and the malloc family are traced.
    assert_eq!(r.object_windows(), 0, "{}", r.0["libraries"]);
    // PyTorch's own figures: the kept hidden states, one storage each.
    let (block, kept) = oracle(&out);
    assert_eq!(block, 16 * 32 * 64 * 4);
    assert_eq!(kept, 1500);
    // What the leaking stacks hold: hidden states, and their LayerNorm's mean and rstd (16 × 32
    // floats each), which its call makes at the same stack: some of those kept (only those made
    // while the tensors were traced are counted), a few of a step's made as they were kept.
    let (bytes, blocks) = r.sum(|s| leaking(s, at));
    let stats = 16 * 32 * 4;
    let states = (bytes - blocks * stats) / (block - stats);
    assert_eq!(
        states * block + (blocks - states) * stats,
        bytes,
        "{bytes} in {blocks}"
    );
    assert!(
        states > 0 && states <= kept && blocks - states < states,
        "{states} of {blocks}"
    );
    for s in r.stacks().iter().filter(|s| leaking(s, at)) {
        assert_eq!(s["truncated"], false);
        let mut python = s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["module"] == "python");
        assert!(
            python
                .clone()
                .all(|f| !f["function"].as_str().unwrap().starts_with("<code"))
        );
        assert_eq!(python.next_back().unwrap()["function"], "<module>");
    }
    // Every tensor traced from the start: the leaking stack holds exactly what PyTorch says is
    // kept.
    let (code, out, r) = job("hf-trainer-all", &["--tensors", "all"], &["300"]);
    assert_eq!(code, Some(1), "{out}");
    let (block, kept) = oracle(&out);
    assert_eq!(r.sum(|s| leaking(s, at)), (kept * block, kept));
    // The same job keeping a float of each hidden state: nothing kept, nothing printed.
    let (code, out, r) = job("hf-trainer-fixed", &[], &["600", "fixed"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(oracle(&out), (0, 600));
    assert!(!out.contains("LEAK "), "{out}");
    assert!(r.stacks().iter().all(|s| s["verdict"]["verdict"] != "leak"));
}

/// What the script says the kept tensors are: (bytes of each one's storage, how many).
fn oracle(out: &str) -> (u64, u64) {
    let v: Value = out
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("the script's accounting");
    (
        v["block_bytes"].as_u64().unwrap(),
        v["kept_blocks"].as_u64().unwrap(),
    )
}

/// Whether `s` is a tensor stack judged leaking whose innermost frame of the fixture is at `line`.
fn leaking(s: &Value, line: u64) -> bool {
    s["kind"] == "tensor"
        && s["verdict"]["verdict"] == "leak"
        && line_of(s, "hf_trainer") == Some(line)
}

/// A training job as Lightning's users write one (`pl_train.py`: a LightningModule fit by
/// Lightning's Trainer, from scripts/setup.sh's .pydeps-pl), whose training_step keeps each
/// step's loss in a list, as Lightning's docs keep `training_step_outputs`: the losses' graphs
/// hold their nodes, malloc'd by the forward line. `check` fails first at that line, on heap
/// stacks, and at no other; the same job keeping each loss's value passes.
#[test]
fn losses_kept_by_a_lightning_modules_training_step_fail_the_check_at_its_forward_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let pl = fixture::pydeps().with_file_name(".pydeps-pl");
    assert!(
        pl.join("lightning").is_dir(),
        "lightning in {} (scripts/setup.sh installs it)",
        pl.display()
    );
    let path = format!(
        "PYTHONPATH={}:{}",
        fixture::pydeps().display(),
        pl.display()
    );
    let job = |name: &str, args: &[&str]| {
        let (o, r) = check_torch_at(name, &script("pl_train"), &[path.as_str()], &[], args);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            r,
        )
    };
    let (code, out, r) = job("pl-train", &["150"]);
    assert_eq!(code, Some(1), "{out}");
    let at = line("pl_train", "# LEAK-SITE");
    let site = format!("Net.training_step (pl_train.py:{at})");
    let leaks: Vec<&str> = out.lines().filter(|l| l.contains("LEAK ")).collect();
    assert!(
        leaks.first().is_some_and(|l| l.contains("LEAK heap")),
        "{out}"
    );
    assert!(
        !leaks.is_empty() && leaks.iter().all(|l| l.ends_with(&site)),
        "{out}"
    );
    // Its nodes are made at several stacks of that line; those of the leak's pace are judged one.
    let heap_at_site = |s: &&Value| s["kind"] == "heap" && line_of(s, "pl_train") == Some(at);
    assert!(
        r.stacks()
            .iter()
            .filter(heap_at_site)
            .any(|s| s["verdict"]["verdict"] == "leak"),
        "{out}"
    );
    let not_losses = ["nested_calls", "untraced_frees", "thread_exit_frees"];
    for (loss, n) in r.losses().as_object().unwrap() {
        assert!(not_losses.contains(&loss.as_str()) || n == 0, "{loss}: {n}");
    }
    let (code, out, r) = job("pl-train-fixed", &["100", "fixed"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("LEAK "), "{out}");
    assert!(r.stacks().iter().all(|s| s["verdict"]["verdict"] != "leak"));
}
