//! `harness bench --leaktracer PATH`: leaktracer's overhead on each scenario: the training loop's
//! time and the whole process's wall time (libtorch's start-up included: a million allocator calls
//! before the first step) of the leaky variant untraced and traced in each heap mode (`--heap
//! full`, `sampled`, `off`: device memory and pages only; and full from the first step on, with
//! `--heap-after`), side by side, the median of `--rounds` runs each; then the loop's CPU time
//! (every thread's, user and kernel: where the probes run, without the time other tasks take from
//! this small machine's CPUs). Each run starts once no leaktracer is left: one that has finished
//! still unregisters its uprobes for a few seconds, and until then every malloc on the machine
//! traps.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

const SCENARIOS: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];

/// `--heap full` with the heap probes put in at the first step: start-up untraced.
const FROM_STEP_1: &[&str] = &[
    "--heap",
    "full",
    "--step-symbol",
    "harness_step",
    "--heap-after",
    "1",
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Waits (up to a minute) until no process is named `leaktracer`.
fn settle() {
    let running = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "leaktracer")
            })
    };
    let start = Instant::now();
    while running() && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// What one run measured, in seconds: the whole process by the wall clock, its training loop by
/// the wall clock and in CPU time.
#[derive(Clone, Copy)]
struct Run {
    wall: f64,
    loop_wall: f64,
    loop_cpu: f64,
}

/// A BPF program's runs and kernel time (ns) during the training loop, by its name.
type ProgramTime = (String, u64, u64);

/// Runs `cmd`, which must succeed, and reads what its training loop took (and, when the harness
/// was asked to, what each BPF program took meanwhile).
fn timed(cmd: &mut Command) -> anyhow::Result<(Run, Vec<ProgramTime>)> {
    settle();
    let file = std::env::temp_dir().join(format!("harness-loop-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let t = Instant::now();
    let status = cmd
        .env("HARNESS_LOOP_FILE", &file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("starting a benchmark run")?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    let wall = t.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&file).context("the loop's time")?;
    let _ = std::fs::remove_file(&file);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let mut it = first.split_whitespace().map(str::parse::<f64>);
    let run = match (it.next(), it.next()) {
        (Some(Ok(loop_wall)), Some(Ok(loop_cpu))) => Run {
            wall,
            loop_wall,
            loop_cpu,
        },
        _ => bail!("the loop's time: expected two numbers, got {text:?}"),
    };
    let programs = lines
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("program"), Some(name), Some(runs), Some(ns)) => {
                    Some((name.to_string(), runs.parse().ok()?, ns.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect();
    Ok((run, programs))
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
        "median of {rounds}, {steps} steps (leaky variant): the training loop's seconds, and in \
         brackets the whole process's (libtorch's start-up included)"
    );
    println!(
        "{:<4} {:>18} {:>28} {:>28} {:>28} {:>28}",
        "", "untraced", "--heap full", "--heap sampled", "--heap off", "full from step 1"
    );
    let cell = |r: Run, b: Run| {
        format!(
            "{:.3}s {:+.1}% [{:.1}s {:+.0}%]",
            r.loop_wall,
            (r.loop_wall / b.loop_wall - 1.0) * 100.0,
            r.wall,
            (r.wall / b.wall - 1.0) * 100.0
        )
    };
    let cpu_cell = |r: Run, b: Run| {
        format!(
            "{:.3}s {:+.1}%",
            r.loop_cpu,
            (r.loop_cpu / b.loop_cpu - 1.0) * 100.0
        )
    };
    let mut cpu_rows = Vec::new();
    let mut base_cpu = Vec::new();
    for s in SCENARIOS {
        let mut m: [Vec<Run>; 5] = Default::default();
        for _ in 0..rounds {
            m[0].push(timed(Command::new(&harness).args(args(s)))?.0);
            m[1].push(timed(&mut traced(&["--heap", "full"], s))?.0);
            m[2].push(timed(&mut traced(&["--heap", "sampled"], s))?.0);
            m[3].push(timed(&mut traced(&["--heap", "off"], s))?.0);
            m[4].push(timed(&mut traced(FROM_STEP_1, s))?.0);
        }
        let [base, full, sampled, off, late] = m.map(|v| Run {
            wall: median(v.iter().map(|x| x.wall).collect()),
            loop_wall: median(v.iter().map(|x| x.loop_wall).collect()),
            loop_cpu: median(v.iter().map(|x| x.loop_cpu).collect()),
        });
        base_cpu.push(base.loop_cpu);
        println!(
            "{s:<4} {:>18} {:>28} {:>28} {:>28} {:>28}",
            format!("{:.3}s [{:.1}s]", base.loop_wall, base.wall),
            cell(full, base),
            cell(sampled, base),
            cell(off, base),
            cell(late, base)
        );
        cpu_rows.push(format!(
            "{s:<4} {:>18} {:>28} {:>28} {:>28} {:>28}",
            format!("{:.3}s", base.loop_cpu),
            cpu_cell(full, base),
            cpu_cell(sampled, base),
            cpu_cell(off, base),
            cpu_cell(late, base)
        ));
    }
    println!("the training loop's CPU time (every thread, user + kernel), median of {rounds}:");
    for row in cpu_rows {
        println!("{row}");
    }
    println!(
        "kernel time in leaktracer's programs under --heap off (one run, --probe-cost; the probe \
         traps not included), over the whole run (start-up included) and over the training loop \
         alone, against the loop's untraced CPU time:"
    );
    for (s, base) in SCENARIOS.iter().zip(base_cpu) {
        let file = std::env::temp_dir().join(format!("harness-cost-{}.json", std::process::id()));
        let mut c = Command::new(leaktracer);
        c.args([
            "run",
            "--no-store",
            "--json",
            "--probe-cost",
            "--heap",
            "off",
            "-o",
        ])
        .arg(&file)
        .arg("--")
        .arg(&harness)
        .args(args(s))
        .env("HARNESS_PROGRAM_TIME", "1");
        let (_, during_loop) = timed(&mut c)?;
        let whole = probe_cost(&file)?;
        let _ = std::fs::remove_file(&file);
        // The loop's figures: the programs that ran while the loop did, leaktracer's told by
        // their names in its report (the kernel keeps 15 characters of a name).
        let ours = |name: &str| whole.iter().any(|(n, _, _)| n.starts_with(name));
        let (runs, ns) = during_loop
            .iter()
            .filter(|(name, _, _)| ours(name))
            .fold((0, 0), |(r, t), (_, runs, ns)| (r + runs, t + ns));
        let (wruns, wns) = whole
            .iter()
            .fold((0, 0), |(r, t), (_, runs, ns)| (r + runs, t + ns));
        let pct = |ns: u64| ns as f64 / 1e9 / base * 100.0;
        println!(
            "{s:<4} whole run {wruns} runs {:.2} ms {:.3}%   loop {runs} runs {:.2} ms {:.3}%   of \
             {base:.3}s",
            wns as f64 / 1e6,
            pct(wns),
            ns as f64 / 1e6,
            pct(ns),
        );
    }
    Ok(String::new())
}

/// Each program's name, runs and nanoseconds in the final report's `probe_cost`.
fn probe_cost(report: &Path) -> anyhow::Result<Vec<ProgramTime>> {
    let text = std::fs::read_to_string(report).context("the traced run's report")?;
    let last = text.lines().last().context("no report")?;
    let r: serde_json::Value = serde_json::from_str(last).context("the report's JSON")?;
    let programs = r["probe_cost"]
        .as_array()
        .context("no probe_cost in the report")?;
    Ok(programs
        .iter()
        .filter_map(|p| {
            Some((
                p["program"].as_str()?.to_string(),
                p["calls"].as_u64()?,
                p["ns"].as_u64()?,
            ))
        })
        .collect())
}
