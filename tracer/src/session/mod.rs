//! A tracing session: the probes loaded and configured, the target started or found, the history
//! and the explorer opened; then the [`Owner`](owner::Owner) runs the session to its end. Set-up
//! is here; the state and the loop are in owner.rs, what ends a session in ends.rs.

mod ends;
mod output;
mod owner;
mod sampling;
mod ui;

use crate::{
    config::{Config, Target},
    error::Error,
    hold::{self, Hold},
    launch::{self, HeldChild},
    ledger::Ledger,
    model::{HeapAfter, HeapMode, TensorsMode, monotonic_ns},
    probes::{Probes, Timing},
    procfs, report, serve,
    store::{self, Reason},
};

/// Stacks kept in each stored snapshot (at least --top).
const STORED_STACKS: usize = 200;

/// How a session ended: the traced command's exit status (`run`; 0 for `attach`) and the final
/// report.
pub struct Outcome {
    pub exit_code: i32,
    pub last: report::Report,
}

/// Runs a session to its end.
pub fn run(target: Target, config: Config) -> Result<Outcome, Error> {
    if let Target::Attach { pid, .. } = &target {
        check_pid(*pid)?;
    }
    // A launched command that runs a Python interpreter in the end (through env, a #! line…).
    let python = matches!(&target, Target::Launch(argv) if launch::runs_python(argv));
    let mut probes = load_probes(&config, &target, python)?;
    // Held to the end of the session: the statistics stay on while it is.
    let _stats = config
        .probe_cost
        .then(crate::probes::cost::enable)
        .transpose()?;
    // Before the command is started: a history, an address or a report file that cannot be
    // opened stops the session here.
    let ui = config.ui.as_ref().map(ui::listen).transpose()?;
    let history = open_history(&config, &target)?;
    let out = output::Output::open(config.output.as_deref())?;
    let root = start_root(&target)?;
    match &target {
        // The command will most likely map the same libc as leaktracer: probed before it starts.
        // Everything else it maps is probed as it maps it (ingest announces new code).
        Target::Launch(_) | Target::Serve { .. } => {
            probes.attach_code_of(std::process::id(), Timing::BeforeStart)?;
            if let Root::Held(child) = &root {
                probes.launching(python, child.pid());
            }
        }
        Target::Attach { pid, .. } => {
            probes.attach_code_of(*pid as u32, Timing::AlreadyLoaded)?;
            if !probes.has_heap() && !probes.heap_skipped() {
                return Err(Error::NoLibc(*pid));
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("tokio runtime: {e}"))?;
    let command = describe(&target);
    runtime.block_on(owner::trace(
        probes,
        root,
        command,
        (history, out),
        ui,
        config,
    ))
}

/// The eBPF object loaded and set as the configuration says, nothing attached yet but the
/// tracepoints.
fn load_probes(config: &Config, target: &Target, python: bool) -> Result<Probes, Error> {
    let first = Probes::programs_of(&first_roles(config, target, python));
    let mut probes = Probes::load_with_ring(crate::probes::Mode::Full, config.ring_bytes, &first)?;
    if let Some(step) = &config.step_symbol {
        probes.set_step_symbol(step);
    }
    match config.heap.mode {
        HeapMode::Off => probes.skip_heap(),
        HeapMode::Sampled => {
            probes.sample_heap(config.heap.sample_bytes.unwrap_or_default())?;
            probes.window_objects();
            probes.heap_whole_always();
        }
        HeapMode::Full => {
            probes.window_objects();
            probes.heap_whole_always();
        }
        HeapMode::Auto => {
            probes.layer_heap(config.heap.tensors == TensorsMode::Auto);
            probes.window_objects();
        }
    }
    if !matches!(target, Target::Serve { .. }) {
        probes.hold_processes();
    }
    if !config.python_stacks {
        probes.skip_python();
    }
    probes.set_unwind(config.unwind);
    if let Some(after) = config.heap.after {
        probes.defer_heap();
        if let HeapAfter::Steps(step @ 1..) = after {
            probes.hold_heap_at_step(step)?;
        }
    }
    Ok(probes)
}

/// The probe sets a launched command (`python`: a Python one) needs first, whose programs load
/// with the tracepoints': the malloc family where it goes in before the command starts, and for
/// a Python command the CUDA and PyTorch sets it maps while importing torch.
fn first_roles(config: &Config, target: &Target, python: bool) -> Vec<&'static str> {
    if !matches!(target, Target::Launch(_)) {
        return Vec::new();
    }
    let heap = config.heap.after.is_none() && config.heap.mode != HeapMode::Off;
    let mut roles = Vec::new();
    if heap && !(python && config.heap.mode == HeapMode::Auto) {
        roles.push("libc");
    }
    if python {
        roles.extend(["cuda-runtime", "cuda-driver", "torch-cuda"]);
        // Layered tensors' programs load when a process first needs them, not while the
        // interpreter waits at libc10.so's mapping.
        let layered =
            config.heap.mode == HeapMode::Auto && config.heap.tensors == TensorsMode::Auto;
        if config.heap.mode != HeapMode::Off && !layered {
            roles.push("torch-cpu");
        }
    }
    roles
}

/// The traced root process.
enum Root {
    /// The launched command, held before its first instruction until the probes are in.
    Held(HeldChild),
    Attached {
        pid: u32,
        duration: Option<f64>,
    },
    /// No root: processes are adopted as they match.
    Serve {
        filter: serve::Filter,
        scan: f64,
    },
}

impl Root {
    /// The root's pid (0 for `serve`).
    fn pid(&self) -> u32 {
        match self {
            Root::Held(child) => child.pid,
            Root::Attached { pid, .. } => *pid,
            Root::Serve { .. } => 0,
        }
    }
}

/// The session's command line, for the ledger and the history.
fn describe(target: &Target) -> String {
    match target {
        Target::Launch(argv) => argv.join(" "),
        Target::Attach { pid, .. } => procfs::command(*pid as u32).unwrap_or_default(),
        Target::Serve { filter, .. } => serve::describe(filter),
    }
}

fn start_root(target: &Target) -> Result<Root, Error> {
    Ok(match target {
        Target::Launch(argv) => {
            let child = launch::spawn_held(argv)?;
            if crate::probes::elf::is_static_executable(child.program()) == Some(true) {
                tracing::warn!(program = %child.program().display(), "statically linked: its malloc is not libc's; only page-level memory (mmap, brk) will be seen");
            }
            Root::Held(child)
        }
        Target::Attach { pid, duration } => Root::Attached {
            pid: *pid as u32,
            duration: *duration,
        },
        Target::Serve { filter, scan } => Root::Serve {
            filter: filter.clone(),
            scan: *scan,
        },
    })
}

/// The root traced and held (ptrace) where it can be, and registered in the ledger; the hold's
/// handles when there is one.
fn trace_root(
    root: &Root,
    command: String,
    probes: &mut Probes,
    ledger: &mut Ledger,
    hold_tx: tokio::sync::mpsc::Sender<hold::HoldRequest>,
) -> Result<Option<Hold>, Error> {
    let pid = root.pid();
    if pid == 0 {
        return Ok(None);
    }
    let hold = hold::start(pid, hold_tx);
    probes.trace_pid(pid, hold.is_some())?;
    ledger.add_root(pid, command, procfs::allocator_env(pid), monotonic_ns());
    Ok(hold)
}

fn check_pid(pid: i32) -> Result<(), Error> {
    let flags = procfs::flags(pid).ok_or(Error::NoSuchProcess(pid))?;
    if pid <= 0 {
        return Err(Error::NoSuchProcess(pid));
    }
    if procfs::is_kernel_thread_flag(flags) {
        return Err(Error::KernelThread(pid));
    }
    Ok(())
}

/// Starts the run in the history, unless --no-store. A history named with --store that cannot be
/// used is an error; the default one is skipped with a warning (tracing matters more).
fn open_history(config: &Config, target: &Target) -> Result<Option<store::Writer>, Error> {
    let Some(h) = &config.history else {
        return Ok(None);
    };
    let root_pid = match target {
        Target::Attach { pid, .. } => *pid as u32,
        _ => 0,
    };
    let run = store::NewRun {
        mode: config.mode.name(),
        command: describe(target),
        root_pid,
    };
    match store::Writer::start(&h.path, &run, h.retention) {
        Ok(w) => Ok(Some(w)),
        Err(e) if h.named => Err(Error::Store(e.to_string())),
        Err(e) => {
            tracing::warn!("{e}: this run is not stored (--store PATH picks another file)");
            Ok(None)
        }
    }
}

/// Stores the final report and closes the run in the history.
fn close_history(w: store::Writer, last: &report::Report, exit: Option<i32>) {
    w.snapshot(last.clone(), Reason::Exit);
    let (path, run) = (w.path.clone(), w.run);
    let done = w.finish(exit);
    if done.failed > 0 {
        tracing::warn!(failed = done.failed, "snapshots could not be stored");
    }
    crate::say!(
        "leaktracer: run {run} stored in {} ({} snapshots): leaktracer report --run {run}",
        path.display(),
        done.snapshots
    );
}
