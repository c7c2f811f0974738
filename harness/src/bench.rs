//! `harness bench --leaktracer PATH`: leaktracer's overhead on each scenario, as whole-process wall
//! time (libtorch's start-up included: a million allocator calls before the first step) of the
//! leaky variant untraced and traced in each heap mode (`--heap full`, `sampled`, `off`: device
//! memory and pages only), side by side, the median of `--rounds` runs each.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

const SCENARIOS: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds `cmd` takes, which must succeed.
fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
    let t = Instant::now();
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("starting a benchmark run")?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(leaktracer: &Path, steps: u64, rounds: usize) -> anyhow::Result<String> {
    let harness = std::env::current_exe().context("own executable")?;
    let args = |s: &str| -> Vec<String> {
        vec![
            s.into(),
            "--variant".into(),
            "leaky".into(),
            "--steps".into(),
            steps.to_string(),
        ]
    };
    let traced = |extra: &[&str], s: &str| {
        let mut c = Command::new(leaktracer);
        c.args(["run", "--no-store", "-o", "/dev/null"])
            .args(extra)
            .arg("--")
            .arg(&harness)
            .args(args(s));
        c
    };
    println!(
        "wall time per run, median of {rounds}, {steps} steps (leaky variant, libtorch start-up included):"
    );
    println!(
        "{:<4} {:>10} {:>20} {:>20} {:>20}",
        "", "untraced", "--heap full", "--heap sampled", "--heap off"
    );
    let pct = |t: f64, base: f64| format!("{t:.2}s ({:+.1}%)", (t / base - 1.0) * 100.0);
    for s in SCENARIOS {
        let mut m = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..rounds {
            m[0].push(timed(Command::new(&harness).args(args(s)))?);
            m[1].push(timed(&mut traced(&["--heap", "full"], s))?);
            m[2].push(timed(&mut traced(&["--heap", "sampled"], s))?);
            m[3].push(timed(&mut traced(&["--heap", "off"], s))?);
        }
        let [base, full, sampled, off] = m.map(median);
        println!(
            "{s:<4} {base:>9.2}s {:>20} {:>20} {:>20}",
            pct(full, base),
            pct(sampled, base),
            pct(off, base)
        );
    }
    Ok(String::new())
}
