//! `leaktracer bench`: ns per malloc+free pair on a tight loop, in one run: untraced, with empty
//! programs at the same probe points (the floor: what the kernel's uprobe machinery costs), with
//! leaktracer's programs (`--heap full` with the plain frame-pointer walk, with the walk and leaf
//! words (`auto` on this binary), with the loop below a 6000-byte frame, with stacks copied and
//! unwound by call-frame information (`--unwind cfi`), and `--heap sampled`), with leaktracer's
//! programs but `free` probed at its first instruction (the
//! single-step cost that probe placement removes), and with bcc's memleak on the same workload
//! when it is installed. Figures are printed, never asserted.

use std::time::Instant;

use crate::{
    config::{self as session_config, RunMode, Target},
    error::Error,
    launch,
    model::thread_cpu_ns,
    probes::{Mode, Probes},
    session,
};

/// Pins the calling thread (and what it spawns later) to one CPU.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The CPUs online, whatever this thread's affinity (the workload is started from the benchmark
/// pinned to CPU 0, and must still find the others).
fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// What one run of the workload measured, per pair: wall-clock time and the thread's CPU time
/// (user and kernel, where the probes run). The CPU time leaves out what other tasks take from the
/// workload's CPU (kernel threads, reclaim), which on a small shared machine swings the wall clock
/// by a third from run to run.
#[derive(Clone, Copy, Debug)]
pub struct PairCost {
    pub wall_ns: f64,
    pub cpu_ns: f64,
}

impl std::fmt::Display for PairCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.wall_ns, self.cpu_ns)
    }
}

impl std::str::FromStr for PairCost {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut it = s.split_whitespace().map(str::parse::<f64>);
        match (it.next(), it.next(), it.next()) {
            (Some(Ok(wall_ns)), Some(Ok(cpu_ns)), None) => Ok(Self { wall_ns, cpu_ns }),
            _ => Err(format!("expected two numbers, got {s:?}")),
        }
    }
}

/// The loop the workload runs: `pairs` malloc(64)+free pairs; returns the cost per pair. It runs
/// on the last CPU, the tracer on the others, so that the comparison measures the probes, not the
/// scheduler sharing one CPU between the workload and the tracer's own threads. It runs on a
/// thread of its own, whose stack holds a few small frames as a C program's `main` would, not the
/// CLI's: with `big_frame`, below a function with a 6000-byte frame, which a walk of the stack
/// copies in two reads instead of one.
pub fn workload(pairs: u64, big_frame: bool) -> PairCost {
    std::thread::spawn(move || {
        pin_to(cpus() - 1);
        if big_frame {
            below_big_frame(pairs)
        } else {
            pair_loop(pairs)
        }
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

#[inline(never)]
fn below_big_frame(pairs: u64) -> PairCost {
    let mut pad = [0u8; 6000];
    std::hint::black_box(&mut pad);
    let cost = pair_loop(pairs);
    std::hint::black_box(&pad);
    cost
}

#[inline(never)]
fn pair_loop(pairs: u64) -> PairCost {
    let start = Instant::now();
    let cpu = thread_cpu_ns();
    for _ in 0..pairs {
        // SAFETY: plain libc allocation and release; black_box keeps the pair from being elided.
        unsafe {
            let p = std::hint::black_box(libc::malloc(64));
            libc::free(p);
        }
    }
    let cpu = thread_cpu_ns() - cpu;
    PairCost {
        wall_ns: start.elapsed().as_nanos() as f64 / pairs as f64,
        cpu_ns: cpu as f64 / pairs as f64,
    }
}

/// One configuration of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Untraced,
    Floor,
    Leaktracer,
    Leaf,
    Cfi,
    BigFrame,
    Sampled,
    FreeAtEntry,
    Memleak,
}

impl Config {
    fn label(self) -> &'static str {
        match self {
            Config::Untraced => "untraced",
            Config::Floor => "bare probes (floor)",
            Config::Leaktracer => "leaktracer (--heap full)",
            Config::Leaf => "leaktracer, walk + leaf words",
            Config::Cfi => "leaktracer --unwind cfi",
            Config::BigFrame => "leaktracer, below a 6000-byte frame",
            Config::Sampled => "leaktracer --heap sampled",
            Config::FreeAtEntry => "leaktracer, free probed at +0",
            Config::Memleak => "bcc memleak (memleak-bpfcc -p)",
        }
    }
}

/// Runs every configuration `rounds` times and prints the medians with their ratios.
pub fn run(pairs: u64, rounds: usize) -> Result<i32, Error> {
    crate::probes::detach_in_foreground();
    if cpus() > 1 {
        pin_to(0); // before any thread starts: the tracer's threads inherit it
    }
    let memleak = memleak::find();
    if memleak.is_none() {
        crate::tell!(
            "bcc memleak: not installed (scripts/bench.sh installs it): its row is left out"
        );
    }
    let mut configs = vec![
        Config::Untraced,
        Config::Floor,
        Config::Leaktracer,
        Config::Leaf,
        Config::Cfi,
        Config::BigFrame,
        Config::Sampled,
        Config::FreeAtEntry,
    ];
    if memleak.is_some() {
        configs.push(Config::Memleak);
    }
    let mut results: Vec<(Config, Vec<PairCost>)> =
        configs.iter().map(|c| (*c, Vec::new())).collect();
    for _ in 0..rounds {
        for (config, samples) in &mut results {
            samples.push(measure(*config, pairs, memleak.as_deref())?);
        }
    }
    crate::tell!("ns per malloc(64)+free pair, {pairs} pairs, median of {rounds} rounds:");
    table("wall clock", &results, |c| c.wall_ns);
    table(
        "the workload thread's CPU time (user + kernel; without time other tasks took)",
        &results,
        |c| c.cpu_ns,
    );
    Ok(0)
}

/// One table of the comparison, from one of the two clocks.
fn table(title: &str, results: &[(Config, Vec<PairCost>)], clock: impl Fn(&PairCost) -> f64) {
    let samples = |c: Config| -> Option<Vec<f64>> {
        let (_, s) = results.iter().find(|(k, _)| *k == c)?;
        let mut v: Vec<f64> = s.iter().map(&clock).collect();
        v.sort_by(f64::total_cmp);
        Some(v)
    };
    let median = |c: Config| samples(c).and_then(|v| v.get(v.len() / 2).copied());
    crate::tell!(" {title}:");
    for (c, s) in results {
        let all: Vec<String> = s.iter().map(|s| format!("{:.1}", clock(s))).collect();
        crate::tell!(
            "  {:<36} {:>10.1}   [{}]",
            c.label(),
            median(*c).unwrap_or(f64::NAN),
            all.join(", ")
        );
    }
    let ratio = |label: &str, num: Option<f64>, den: Option<f64>| {
        if let (Some(n), Some(d)) = (num, den) {
            crate::tell!("  {label:<46} {:>6.2}x", n / d);
        }
    };
    let untraced = median(Config::Untraced);
    let added = |c: Config| Some(median(c)? - untraced?);
    let floor = median(Config::Floor);
    let lt = median(Config::Leaktracer);
    let rows = [
        ("leaktracer / floor", lt, floor),
        (
            "leaktracer below a 6000-byte frame / floor",
            median(Config::BigFrame),
            floor,
        ),
        ("leaktracer sampled / floor", median(Config::Sampled), floor),
        (
            "leaktracer --unwind cfi / floor",
            median(Config::Cfi),
            floor,
        ),
        (
            "leaktracer walk + leaf words / floor",
            median(Config::Leaf),
            floor,
        ),
        (
            "(leaf - untraced) / (leaktracer - untraced)",
            added(Config::Leaf),
            added(Config::Leaktracer),
        ),
        (
            "(cfi - untraced) / (leaktracer - untraced)",
            added(Config::Cfi),
            added(Config::Leaktracer),
        ),
        (
            "(leaktracer - untraced) / (floor - untraced)",
            added(Config::Leaktracer),
            added(Config::Floor),
        ),
        (
            "free at +0 / chosen offset",
            median(Config::FreeAtEntry),
            lt,
        ),
        ("memleak / floor", median(Config::Memleak), floor),
        (
            "(leaktracer - untraced) / (memleak - untraced)",
            added(Config::Leaktracer),
            added(Config::Memleak),
        ),
        (
            "(leaktracer sampled - untraced) / (memleak - untraced)",
            added(Config::Sampled),
            added(Config::Memleak),
        ),
    ];
    for (label, num, den) in rows {
        ratio(label, num, den);
    }
}

fn measure(
    config: Config,
    pairs: u64,
    memleak: Option<&std::path::Path>,
) -> Result<PairCost, Error> {
    let out = std::env::temp_dir().join(format!("leaktracer-bench-{}.txt", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("own executable: {e}"))?;
    let mut argv = vec![
        exe.display().to_string(),
        "bench-workload".into(),
        pairs.to_string(),
        out.display().to_string(),
    ];
    if config == Config::BigFrame {
        argv.push("--big-frame".into());
    }
    let at_entry = if config == Config::FreeAtEntry {
        "1"
    } else {
        "0"
    };
    // SAFETY: single-threaded here; read by Probes::attach_heap.
    unsafe { std::env::set_var("LEAKTRACER_PROBE_AT_ENTRY", at_entry) };
    match config {
        Config::Untraced => {
            let child = launch::spawn_held(&argv)?;
            let pid = child.release()?;
            launch::wait(pid);
        }
        Config::Floor => bare(&argv)?,
        Config::Memleak => memleak::run(memleak.expect("found"), &argv)?,
        Config::Leaktracer
        | Config::Leaf
        | Config::Cfi
        | Config::BigFrame
        | Config::FreeAtEntry
        | Config::Sampled => {
            let mut flags = vec!["--top", "1", "--json", "-o", "/dev/null", "--no-store"];
            match config {
                Config::Sampled => flags.extend(["--heap", "sampled"]),
                // The frame-pointer walk, whatever `auto` would choose for this binary.
                Config::Cfi => flags.extend(["--unwind", "cfi"]),
                // `auto` on this binary, built with frame pointers: the walk with leaf words.
                Config::Leaf => flags.extend(["--unwind", "auto"]),
                _ => flags.extend(["--unwind", "fp"]),
            }
            let config = session_config::Config::from_flags(&flags, RunMode::Run)?;
            session::run(Target::Launch(argv), config)?;
        }
    }
    let text =
        std::fs::read_to_string(&out).map_err(|e| anyhow::anyhow!("bench workload result: {e}"))?;
    let _ = std::fs::remove_file(&out);
    text.trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("bench workload result {text:?}: {e}").into())
}

/// The workload with empty programs at the same points as leaktracer's.
fn bare(argv: &[String]) -> Result<(), Error> {
    let mut probes = Probes::load(Mode::Bare)?;
    let child = launch::spawn_held(argv)?;
    probes.attach_code_of(std::process::id(), crate::probes::Timing::BeforeStart)?;
    let pid = child.release()?;
    launch::wait(pid);
    drop(probes);
    Ok(())
}

/// bcc's memleak, the peer: attached to the held workload before it runs.
mod memleak {
    use std::{
        io::{BufRead, BufReader},
        path::{Path, PathBuf},
        process::{Command, Stdio},
    };

    use crate::{error::Error, launch};

    /// `memleak-bpfcc` on the PATH.
    pub fn find() -> Option<PathBuf> {
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| Path::new(d).join("memleak-bpfcc"))
            .find(|p| p.is_file())
    }

    /// Runs the workload `argv` under `memleak -p`, started once memleak has attached.
    pub fn run(memleak: &Path, argv: &[String]) -> Result<(), Error> {
        let child = launch::spawn_held(argv)?;
        let pid = child.pid();
        let mut ml = Command::new(memleak)
            .args(["-p", &pid.to_string(), "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", memleak.display()))?;
        let mut out = BufReader::new(ml.stdout.take().expect("piped"));
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = ml.kill();
                return Err(anyhow::anyhow!("memleak exited before attaching").into());
            }
            if line.starts_with("Attaching to pid") {
                break;
            }
        }
        // memleak says so just before it attaches its twenty-odd probes: give it the time.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let pid = child.release()?;
        launch::wait(pid);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(ml.id() as i32, libc::SIGINT) };
        let _ = ml.wait();
        Ok(())
    }
}
