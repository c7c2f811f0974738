//! A tracing session: probes loaded and attached, the ingest task feeding the ledger, reports out.
//! The loop here is the ledger's only owner: inputs, report ticks and the end condition are
//! handled in one `select!`, nothing else touches the state.

use std::{
    fs::File,
    io::Write,
    path::Path,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use crate::{
    analysis::Analysis,
    cli::ReportArgs,
    error::Error,
    gpu::GpuView,
    hold::{self, Hold},
    ingest,
    launch::{self, HeldChild},
    ledger::Ledger,
    probes::prober::{ProbeRequest, Prober, ProbesInfo},
    probes::{Mode, Probes, Timing},
    report, serve,
    store::{self, Reason},
    symbolize::Symbolizer,
};

/// Stacks kept in each stored snapshot (at least --top).
const STORED_STACKS: usize = 200;

/// What to trace.
pub enum Target {
    Launch(Vec<String>),
    Attach {
        pid: i32,
        duration: Option<f64>,
    },
    /// `serve`: every process the filter matches, looked for every `scan` seconds, until Ctrl-C.
    Serve {
        filter: serve::Filter,
        scan: f64,
    },
}

/// Nanoseconds on the clock bpf_ktime_get_ns() uses.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How a session ended: the traced command's exit status (`run`; 0 for `attach`) and the final
/// report.
pub struct Outcome {
    pub exit_code: i32,
    pub last: report::Report,
}

/// Runs a session to its end.
pub fn run(target: Target, args: ReportArgs) -> Result<Outcome, Error> {
    if let Target::Attach { pid, .. } = &target {
        check_pid(*pid)?;
    }
    let mut probes = Probes::load_with_ring(Mode::Full, args.ring_mb << 20)?;
    if let Some(step) = &args.step_symbol {
        probes.set_step_symbol(step);
    }
    match args.heap_mode() {
        crate::cli::HeapMode::Off => probes.skip_heap(),
        crate::cli::HeapMode::Sampled => probes.sample_heap(args.sample_bytes)?,
        crate::cli::HeapMode::Full => {}
    }
    if args.no_python_stacks {
        probes.skip_python();
    }
    if let Some(after) = args.heap_after {
        probes.defer_heap();
        if args.step_symbol.is_some() && after > 0.0 {
            probes.hold_heap_at_step(after.ceil() as u64)?;
        }
    }
    // Held to the end of the session: the statistics stay on while it is.
    let _stats = args
        .probe_cost
        .then(crate::probes::cost::enable)
        .transpose()?;
    // Before the command is started: a history or an address that cannot be opened stops the
    // session here.
    let ui = args
        .ui
        .as_deref()
        .map(|a| listen(a, args.ui_token.as_deref(), args.web_dir.as_deref()))
        .transpose()?;
    let history = open_history(&args, &target)?;
    let (root, command) = match &target {
        Target::Launch(argv) => {
            let child = launch::spawn_held(argv)?;
            if crate::probes::elf::is_static_executable(child.program()) == Some(true) {
                tracing::warn!(program = %child.program().display(), "statically linked: its malloc is not libc's; only page-level memory (mmap, brk) will be seen");
            }
            (Root::Held(Some(child)), argv.join(" "))
        }
        Target::Attach { pid, duration } => {
            let command = ingest::read_command(*pid as u32).unwrap_or_default();
            (
                Root::Attached {
                    pid: *pid as u32,
                    duration: *duration,
                },
                command,
            )
        }
        Target::Serve { filter, scan } => (
            Root::Serve {
                filter: filter.clone(),
                scan: *scan,
            },
            serve::describe(filter),
        ),
    };
    match &target {
        // The command will most likely map the same libc as leaktracer: probed before it starts.
        // Everything else it maps is probed as it maps it (ingest announces new code).
        Target::Launch(_) | Target::Serve { .. } => {
            probes.attach_code_of(std::process::id(), Timing::BeforeStart)?
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
    runtime.block_on(trace(probes, root, command, history, ui, args))
}

/// The traced root process.
enum Root {
    Held(Option<HeldChild>),
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

fn check_pid(pid: i32) -> Result<(), Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|_| Error::NoSuchProcess(pid))?;
    // Field 9 (after the parenthesized comm) holds the flags; PF_KTHREAD = 0x00200000.
    let flags = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6))
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    if pid <= 0 {
        return Err(Error::NoSuchProcess(pid));
    }
    if flags & 0x0020_0000 != 0 {
        return Err(Error::KernelThread(pid));
    }
    Ok(())
}

async fn trace(
    mut probes: Probes,
    mut root: Root,
    command: String,
    history: Option<store::Writer>,
    ui: Option<Ui>,
    args: ReportArgs,
) -> Result<Outcome, Error> {
    let channels = probes.take_channels()?;
    // SIGUSR1 stores a snapshot now; handled before anything is traced, so it never kills us.
    let mut on_demand =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .map_err(|e| anyhow::anyhow!("SIGUSR1 handler: {e}"))?;
    // Decoded batches waiting for the ledger: the kernel's ring is the buffer for bursts, this
    // only smooths (64 × 1024 events: a few MiB).
    let (tx, mut rx) = mpsc::channel(64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hold_tx, hold_rx) = mpsc::channel(64);
    let started = Instant::now();
    let mut ledger = Ledger::default();
    let (root_pid, hold, held_child) = match &mut root {
        Root::Held(child) => {
            let child = child.take().expect("held child present");
            let hold = hold::start(child.pid, hold_tx);
            probes.trace_pid(child.pid, hold.is_some())?;
            let env = ingest::read_allocator_env(child.pid);
            ledger.add_root(child.pid, command, env, monotonic_ns());
            (child.pid, hold, Some(child))
        }
        Root::Attached { pid, .. } => {
            let hold = hold::start(*pid, hold_tx);
            probes.trace_pid(*pid, hold.is_some())?;
            let env = ingest::read_allocator_env(*pid);
            ledger.add_root(*pid, command, env, monotonic_ns());
            (*pid, hold, None)
        }
        Root::Serve { .. } => (0, None, None),
    };
    let prober = Prober::spawn(probes).map_err(|e| anyhow::anyhow!("prober thread: {e}"))?;
    let (maps_tx, maps_rx) = tokio::sync::mpsc::unbounded_channel();
    let ingest = tokio::spawn(ingest::run(
        channels,
        tx,
        hold_rx,
        prober.requests.clone(),
        maps_rx,
        stop_rx,
    ));
    if let Some(w) = &history
        && root_pid != 0
    {
        w.set_root_pid(root_pid);
    }
    if let Some(child) = held_child {
        child.release()?;
    }
    if root_pid != 0 {
        tracing::info!(pid = root_pid, "tracing");
    }
    // serve: processes are looked for every --scan seconds and adopted by the prober.
    let (adopted_tx, mut adopted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut asked = std::collections::HashSet::new();
    let (filter, mut scan_tick) = match &root {
        Root::Serve { filter, scan } => (Some(filter.clone()), ticker_now(*scan)),
        _ => (None, ticker(0.0)),
    };
    let stored_top = args.top.max(STORED_STACKS);
    let mut out = Output::open(&args)?;
    let mut sym = Symbolizer::default();
    let gpus = GpuView::open();
    let (hold, root_exit) = match hold {
        Some(Hold { root_exit, stop }) => (Some(stop), Some(root_exit)),
        None => (None, None),
    };
    let mut end = Box::pin(end_of(&root, root_pid, root_exit));
    let mut tick = ticker(args.interval);
    // --ui: the API reads the latest report, published here every second.
    let (live_tx, live_rx) = tokio::sync::watch::channel(None);
    let mut timeline = crate::api::views::Timeline::default();
    let mut ui_tick = if ui.is_some() {
        // The first tick is immediate: the API has a report from the start.
        let mut t = tokio::time::interval(Duration::from_secs(1));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    } else {
        ticker(0.0)
    };
    if let Some(Ui {
        listener,
        token,
        web,
    }) = ui
    {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
        let state = crate::api::ApiState {
            live: live_rx,
            store: history.as_ref().map(|w| w.path.clone()),
            token: token.map(Into::into),
            web,
        };
        tokio::spawn(crate::api::serve(listener, state));
    }
    // Per step (at each step boundary) or per time (every --sample seconds).
    let per_step = args.step_symbol.is_some();
    let mut sample_tick = ticker(if per_step { 0.0 } else { args.sample });
    let mut analysis = Analysis::default();
    let sample = |analysis: &mut Analysis, ledger: &Ledger| {
        let x = if per_step {
            ledger.steps as f64
        } else {
            started.elapsed().as_secs_f64()
        };
        analysis.sample(x, ledger, &ledger.group_bytes());
    };
    // Applies a batch in order, sampling at each step boundary in it.
    let apply = |analysis: &mut Analysis, ledger: &mut Ledger, batch: ingest::Batch| {
        for input in batch {
            let step = matches!(&input, ingest::Input::Event(e) if e.kind == tracer_common::EventKind::Step);
            ledger.apply(input);
            if step && per_step {
                sample(analysis, ledger);
            }
        }
    };
    let report =
        |ledger: &Ledger, analysis: &Analysis, sym: &mut Symbolizer, top: usize, final_report| {
            let info = prober.info.borrow().clone();
            let cx = Sources {
                probes: &info,
                gpus: &gpus,
                analysis,
            };
            make_report(ledger, sym, &args, &cx, started, top, final_report)
        };
    let mut snapshot_tick = ticker(if history.is_some() {
        args.history.snapshot
    } else {
        0.0
    });
    let store =
        |ledger: &Ledger, analysis: &Analysis, sym: &mut Symbolizer, reason: Reason| match &history
        {
            Some(w) => w.snapshot(report(ledger, analysis, sym, stored_top, false), reason),
            None => tracing::warn!("snapshot asked for, but no history is kept (--no-store)"),
        };
    // --heap-after: the heap probes go in after S seconds, or at step S with --step-symbol.
    let mut heap_after = args.heap_after;
    let heap_sleep = tokio::time::sleep(Duration::from_secs_f64(heap_after.unwrap_or(0.0)));
    tokio::pin!(heap_sleep);
    let start_heap = |heap_after: &mut Option<f64>| {
        *heap_after = None;
        let _ = prober.requests.send(ProbeRequest::StartHeap);
    };
    let exit_code = loop {
        tokio::select! {
            Some(batch) = rx.recv() => {
                apply(&mut analysis, &mut ledger, batch);
                if per_step && heap_after.is_some_and(|s| ledger.steps as f64 >= s) {
                    start_heap(&mut heap_after);
                }
            }
            () = &mut heap_sleep, if !per_step && heap_after.is_some() => start_heap(&mut heap_after),
            _ = sample_tick.tick() => sample(&mut analysis, &ledger),
            _ = tick.tick() => {
                out.write(&report(&ledger, &analysis, &mut sym, args.top, false), args.json)?
            }
            _ = ui_tick.tick() => {
                let r = report(&ledger, &analysis, &mut sym, stored_top, false);
                timeline.record(&r);
                let published = crate::api::Published::new(r, &analysis, &timeline);
                let _ = live_tx.send(Some(std::sync::Arc::new(published)));
            }
            _ = snapshot_tick.tick() => store(&ledger, &analysis, &mut sym, Reason::Periodic),
            Some(()) = on_demand.recv() => store(&ledger, &analysis, &mut sym, Reason::OnDemand),
            _ = scan_tick.tick() => {
                if let Some(filter) = &filter {
                    asked.extend(ledger.procs.keys().copied());
                    for pid in serve::scan(filter, &asked) {
                        asked.insert(pid);
                        let _ = maps_tx.send(pid);
                        let done = adopted_tx.clone();
                        let _ = prober.requests.send(ProbeRequest::Adopt { pid, done });
                    }
                }
            }
            Some((pid, adopted)) = adopted_rx.recv() => match adopted {
                Ok(()) => {
                    let command = ingest::read_command(pid).unwrap_or_default();
                    eprintln!("leaktracer: tracing {pid} ({command})");
                    let env = ingest::read_allocator_env(pid);
                    ledger.add_root(pid, command, env, monotonic_ns());
                }
                Err(e) => tracing::warn!(pid, "not traced: {e}"),
            },
            code = &mut end => break code,
        }
    };
    if let Some(h) = hold {
        prober.end_holds();
        let _ = h.send(());
    }
    let _ = stop_tx.send(true);
    while let Some(batch) = rx.recv().await {
        apply(&mut analysis, &mut ledger, batch);
    }
    if let Some(after) = heap_after {
        let unit = if per_step { "steps" } else { "s" };
        tracing::warn!(
            "the heap was never traced: the run ended before --heap-after {after} {unit}"
        );
    }
    if per_step && ledger.steps == 0 {
        tracing::warn!(
            symbol = args.step_symbol.as_deref().unwrap_or_default(),
            "the step symbol was never called (or not found in the traced code): no per-step verdicts"
        );
    }
    ingest
        .await
        .map_err(|e| anyhow::anyhow!("ingest task: {e}"))??;
    if !per_step {
        sample(&mut analysis, &ledger);
    }
    let mut last = report(&ledger, &analysis, &mut sym, stored_top, true);
    if args.ui.is_some() {
        timeline.record(&last);
        let published = crate::api::Published::new(last.clone(), &analysis, &timeline);
        let _ = live_tx.send(Some(std::sync::Arc::new(published)));
    }
    if let Some(w) = history {
        w.snapshot(last.clone(), Reason::Exit);
        let exit = matches!(root, Root::Held(_)).then_some(exit_code);
        let (path, run) = (w.path.clone(), w.run);
        let done = w.finish(exit);
        if done.failed > 0 {
            tracing::warn!(failed = done.failed, "snapshots could not be stored");
        }
        eprintln!(
            "leaktracer: run {run} stored in {} ({} snapshots): leaktracer report --run {run}",
            path.display(),
            done.snapshots
        );
    }
    report::export::write(&last, &args.exports, store::now_unix_ns())
        .map_err(|e| anyhow::anyhow!(e))?;
    last.stacks.truncate(args.top);
    out.write(&last, args.json)?;
    prober.finish().detach_in_background();
    if args.keep_serving {
        eprintln!(
            "leaktracer: the run ended; the explorer keeps serving its final report until Ctrl-C"
        );
        interrupted().await;
    }
    Ok(Outcome { exit_code, last })
}

/// The explorer's socket, the token requests must carry (required off loopback) and where its
/// page comes from.
pub struct Ui {
    listener: std::net::TcpListener,
    token: Option<String>,
    web: crate::api::assets::Web,
}

/// Binds the explorer's address and prints its URL. Off loopback a token is required: the one
/// given (--ui-token) or a new random one, printed in the URL.
fn listen(addr: &str, token: Option<&str>, web_dir: Option<&Path>) -> Result<Ui, Error> {
    let web = match web_dir {
        Some(d) => crate::api::assets::Web::dir(d).map_err(Error::Usage)?,
        None => crate::api::assets::Web::Embedded,
    };
    let sock: std::net::SocketAddr = addr.parse().map_err(|_| {
        Error::Usage(format!(
            "--ui: {addr:?} is not an address like 127.0.0.1:7878"
        ))
    })?;
    let token = match token {
        Some(t) if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) => {
            return Err(Error::Usage(
                "--ui-token must be at least 16 printable characters, no spaces".into(),
            ));
        }
        Some(t) => Some(t.to_string()),
        None if sock.ip().is_loopback() => None,
        None => Some(crate::api::new_token().map_err(|e| anyhow::anyhow!("--ui: {e}"))?),
    };
    let listener = std::net::TcpListener::bind(sock)
        .map_err(|e| anyhow::anyhow!("--ui: cannot listen on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
    let query = token
        .as_deref()
        .map(|t| format!("?token={t}"))
        .unwrap_or_default();
    eprintln!("leaktracer: explorer at http://{bound}/{query} (API under /api/v1)");
    Ok(Ui {
        listener,
        token,
        web,
    })
}

/// Starts the run in the history, unless --no-store. A history named with --store that cannot be
/// used is an error; the default one is skipped with a warning (tracing matters more).
fn open_history(args: &ReportArgs, target: &Target) -> Result<Option<store::Writer>, Error> {
    let Some(path) = args.history.path() else {
        return Ok(None);
    };
    let (mode, command, root_pid) = match target {
        Target::Launch(argv) if args.check => ("check", argv.join(" "), 0),
        Target::Launch(argv) => ("run", argv.join(" "), 0),
        Target::Serve { filter, .. } => ("serve", serve::describe(filter), 0),
        Target::Attach { pid, .. } => (
            "attach",
            ingest::read_command(*pid as u32).unwrap_or_default(),
            *pid as u32,
        ),
    };
    let run = store::NewRun {
        mode,
        command,
        root_pid,
    };
    match store::Writer::start(&path, &run, args.history.retention()) {
        Ok(w) => Ok(Some(w)),
        Err(e) if args.history.store.is_some() => Err(Error::Store(e)),
        Err(e) => {
            tracing::warn!("{e}: this run is not stored (--store PATH picks another file)");
            Ok(None)
        }
    }
}

/// Ticks at once, then every `interval` seconds.
fn ticker_now(interval: f64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_secs_f64(interval));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

fn ticker(interval: f64) -> tokio::time::Interval {
    let period = if interval > 0.0 {
        Duration::from_secs_f64(interval)
    } else {
        Duration::from_secs(365 * 86400)
    };
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Resolves at Ctrl-C or SIGTERM.
async fn interrupted() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Resolves with the exit code when the session should end: the launched command exits (its
/// status), or for attach: the target exits, the duration passes or Ctrl-C (0).
async fn end_of(
    root: &Root,
    pid: u32,
    held_exit: Option<tokio::sync::oneshot::Receiver<i32>>,
) -> i32 {
    match root {
        Root::Held(_) => {
            // The hold thread reaps the command when it traces it; otherwise wait here.
            let waiter = async move {
                match held_exit {
                    Some(rx) => rx.await.unwrap_or(1),
                    None => tokio::task::spawn_blocking(move || launch::wait(pid))
                        .await
                        .unwrap_or(1),
                }
            };
            tokio::pin!(waiter);
            loop {
                tokio::select! {
                    code = &mut waiter => break code,
                    // The command got the same SIGINT from the terminal; its exit ends the session.
                    _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: waiting for the command to exit"),
                }
            }
        }
        Root::Serve { .. } => {
            interrupted().await;
            0
        }
        Root::Attached { duration, .. } => {
            let limit = duration.map_or(Duration::MAX, Duration::from_secs_f64);
            tokio::select! {
                _ = tokio::time::sleep(limit) => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = exited(pid) => {}
            }
            0
        }
    }
}

async fn exited(pid: u32) {
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a report is built from besides the ledger.
struct Sources<'a> {
    probes: &'a ProbesInfo,
    gpus: &'a GpuView,
    analysis: &'a Analysis,
}

fn make_report(
    ledger: &Ledger,
    sym: &mut Symbolizer,
    args: &ReportArgs,
    src: &Sources<'_>,
    started: Instant,
    top: usize,
    final_report: bool,
) -> report::Report {
    let cx = report::Context {
        final_report,
        elapsed_s: started.elapsed().as_secs_f64(),
        now_ns: monotonic_ns(),
        top,
        probes: &src.probes.attached,
        libraries: &src.probes.libraries,
        nvml: &src.gpus.sample(),
        analysis: src.analysis,
        warmup_s: args.warmup,
        per_step: args.step_symbol.is_some(),
        heap: args.heap_tracing(),
        probe_cost: if args.probe_cost {
            crate::probes::cost::read(&src.probes.programs)
        } else {
            Vec::new()
        },
    };
    report::build(ledger, sym, &cx)
}

/// Where reports go.
enum Output {
    Stdout,
    File(File),
}

impl Output {
    fn open(args: &ReportArgs) -> Result<Self, Error> {
        Ok(match &args.output {
            None => Self::Stdout,
            Some(p) => {
                Self::File(File::create(p).map_err(|e| {
                    anyhow::anyhow!("cannot write report file {}: {e}", p.display())
                })?)
            }
        })
    }

    fn write(&mut self, r: &report::Report, json: bool) -> Result<(), Error> {
        let text = if json {
            let mut s = serde_json::to_string(r).map_err(|e| anyhow::anyhow!("{e}"))?;
            s.push('\n');
            s
        } else {
            report::text(r)
        };
        let res = match self {
            Self::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
            Self::File(f) => f.write_all(text.as_bytes()),
        };
        res.map_err(|e| anyhow::anyhow!("writing the report: {e}").into())
    }
}
