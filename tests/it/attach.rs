//! `attach` to a running process: what it allocates from then on is exact, what it frees from
//! before is counted as unmatched, and the session ends when the target exits.

use std::process::{Command, Stdio};

use serde_json::Value;

use tests::fixture;

#[test]
fn attach_sees_what_happens_after_it_and_counts_earlier_frees() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("attach_target");
    let mut target = Command::new(&bin).stdout(Stdio::piped()).spawn().unwrap();
    fixture::wait_ready(&mut target);
    let tracer = fixture::attach(target.id(), "attach");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(target.id() as i32, libc::SIGUSR1) };
    assert!(target.wait().unwrap().success());
    let (code, log, r) = tracer.finish();
    assert_eq!(code, Some(0), "attach ends with the target: {log}");
    assert_eq!(r.site("heap", 0, "leak_after_attach"), (7000, 7));
    assert_eq!(
        r.site("heap", 0, "before_attach"),
        (0, 0),
        "allocated before attaching: unseen"
    );
    let p = r.process(target.id() as u64);
    assert_eq!(
        p["mismatches"]["unmatched_frees"], 3,
        "the 3 early blocks freed after attach"
    );
    assert_eq!(p["exited"], true);
}

/// `attach` to a PyTorch training job already running, started untraced as a job that creeps
/// toward its OOM is (`torch_train.py 200`: each epoch's validation logits kept with their
/// graphs): the interpreter and libtorch were mapped before, the tensors made before are not
/// seen. Its pages grow, its tensors are traced, and the leak is named at its line, its Python
/// frames walked in the running interpreter; what the leaking stacks hold is PyTorch's shapes:
/// each epoch's logits (1024 × 10 floats) and the two ReLU outputs its graph keeps
/// (1024 × 256 floats each; one or two more or fewer where the probes came or went in the
/// middle of a validation pass). Where its tensors are traced again before it ends, the logits the
/// interpreter frees at its exit are seen freed (the stack is `released`, still a leak), while
/// the ReLU outputs the kept graphs hold outlive it.
#[test]
fn attach_to_a_running_pytorch_job_names_its_leak_at_its_line() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let (path, site) = crate::pytorch::bench_script("torch_train");
    let path = path.display().to_string();
    // Says it is ready once torch is imported, then runs the script, its own output let go.
    let start = format!(
        "import os, runpy, sys, torch; print('ready', flush=True); \
         os.dup2(os.open(os.devnull, os.O_WRONLY), 1); sys.argv = [{path:?}, '200']; \
         runpy.run_path({path:?}, run_name='__main__')"
    );
    let mut job = Command::new(crate::python::python())
        .args(["-c", &start])
        .env("PYTHONPATH", fixture::pydeps())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    fixture::wait_ready(&mut job);
    // Into its training loop.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let tracer = fixture::attach(job.id(), "attach-torch");
    assert!(job.wait().unwrap().success());
    let (code, log, r) = tracer.finish();
    assert_eq!(code, Some(0), "attach ends with the job: {log}");
    let leaking: Vec<&Value> = r
        .stacks()
        .iter()
        .filter(|s| s["verdict"]["verdict"] == "leak")
        .collect();
    // The innermost frame of the script is the marked line.
    let at_site = |s: &&Value| {
        s["frames"].as_array().is_some_and(|frames| {
            frames
                .iter()
                .find(|f| f["module"] == "python" && f["file"] == path.as_str())
                .is_some_and(|f| f["line"] == site)
        })
    };
    assert!(!leaking.is_empty(), "{log}");
    let brief: Vec<String> = leaking.iter().map(|s| brief(s)).collect();
    assert!(
        leaking.iter().all(|s| s["kind"] == "tensor" && at_site(s)),
        "{brief:#?}"
    );
    let stack_of = |f: &str| {
        let mut at = leaking
            .iter()
            .filter(|s| crate::python::python_top(s).is_some_and(|(func, _, _)| func == f));
        let one = at.next().unwrap_or_else(|| {
            let tensors = r.stacks().iter().filter(|s| s["kind"] == "tensor");
            let all: Vec<String> = tensors.map(self::brief).collect();
            panic!("no {f} stack judged a leak; the tensor stacks: {all:#?}")
        });
        assert!(at.next().is_none(), "{brief:#?}");
        *one
    };
    let (logits, relu) = (stack_of("Linear.forward"), stack_of("relu"));
    let held = |s: &Value| (s["bytes"].as_u64().unwrap(), s["blocks"].as_u64().unwrap());
    // The ReLU outputs the kept graphs hold outlive the interpreter's exit.
    let (relu_bytes, relu_blocks) = held(relu);
    assert!(relu_blocks > 0, "{brief:#?}");
    assert_eq!(relu_bytes, relu_blocks * 1024 * 256 * 4);
    if logits["released"] == true {
        // Its tensors were traced again before the job ended: the logits the interpreter freed
        // at its exit were seen freed (traced still as it ended, or kept again after the frees
        // were seen). What the stack held at each window's least was whole logits (its peaks
        // hold the hidden layers' outputs too, a step's temporaries).
        let p = r.process(r.root_pid());
        assert_eq!(held(logits), (0, 0));
        let windows = logits["verdict"]["windows"].as_array().unwrap();
        assert!(!windows.is_empty());
        let last = windows.last().map(|w| w["t1_s"].as_f64().unwrap());
        let kept_after = p["tensors_as_of_s"]
            .as_f64()
            .is_some_and(|as_of| last.is_some_and(|t1| t1 <= as_of));
        assert!(
            p["tensors_since_s"].is_f64() || kept_after,
            "{p} {brief:#?}"
        );
        for w in windows {
            assert_eq!(w["floor"].as_u64().unwrap() % (1024 * 10 * 4), 0, "{w}");
        }
    } else {
        // Whole logits, and at most one hidden layer's output (1024 × 256 floats) of a pass
        // under way when the tensors were kept as they were: a step's temporary whose free
        // came after the probes went out.
        let (bytes, all) = held(logits);
        let (logit, hidden) = (1024 * 10 * 4, 1024 * 256 * 4);
        let in_flight = (0..=1).find(|&k| bytes == all.saturating_sub(k) * logit + k * hidden);
        let Some(in_flight) = in_flight else {
            panic!("not whole logits: {brief:#?}")
        };
        let blocks = all - in_flight;
        // Two ReLU outputs a logit, give or take the validation passes the probes came or went
        // in the middle of: a pass under way when they went in has its logit seen and one or
        // both of its ReLU outputs not; one under way when the tensors were kept as they were,
        // one or two ReLU outputs seen and not its logit (made after the probes went out).
        assert!(
            ((2 * blocks).saturating_sub(2)..=2 * blocks + 2).contains(&relu_blocks),
            "{brief:#?}"
        );
    }
    // Frees of tensors made before the attach are not losses; the pages mapped before it and
    // unmapped after are counted apart.
    let not_losses = [
        "nested_calls",
        "untraced_frees",
        "thread_exit_frees",
        "unmatched_unmap_bytes",
    ];
    for (loss, n) in r.losses().as_object().unwrap() {
        assert!(not_losses.contains(&loss.as_str()) || n == 0, "{loss}: {n}");
    }
}

/// A leaking stack in a line: its kind, what it holds, why, and its Python frames.
fn brief(s: &Value) -> String {
    let python: Vec<String> = s["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["module"] == "python")
        .take(4)
        .map(|f| format!("{} {}:{}", f["function"], f["file"], f["line"]))
        .collect();
    format!(
        "{} {} B in {} blocks ({}): {}",
        s["kind"],
        s["bytes"],
        s["blocks"],
        s["verdict"],
        python.join(" < ")
    )
}
