//! The session's owner: the one holder of the ledger, the analysis and everything built from them.
//! [`trace`] wires the tasks (ingest, prober, hold, API) to it; its loop only dispatches, each
//! event to one method.

mod layers;
mod objects;

use std::{collections::HashSet, sync::Arc, time::Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::{
    Outcome, Root, STORED_STACKS,
    ends::{self, Ticker},
    output::Output,
    sampling::SampleClock,
    ui::Ui,
};
use crate::{
    analysis::Analysis,
    api::{self, Published, views::Timeline},
    config::Config,
    error::Error,
    gpu::GpuView,
    ingest::{self, Batch, Input, What},
    ledger::Ledger,
    model::{HeapAfter, HeapMode, monotonic_ns, now_unix_ns, thread_cpu_ns},
    probes::{
        Probes,
        prober::{ProbeRequest, Prober},
    },
    procfs, render, report, serve,
    store::{self, Reason},
    symbolize::Symbolizer,
};

/// When the symbols of the stacks held are first looked up, if no report has done so: off the
/// end's path, where a short job's final report found none cached (`import torch`'s took 35–48 ms,
/// most of it inflating libc's separate debug files; 3.5–5 ms once warmed).
const WARM_SYMBOLS_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// `--ui`: where the latest report is published for the API, and the totals over time.
type LiveReport = (watch::Sender<Option<Arc<Published>>>, Timeline);

/// A `serve` adoption's answer: the pid and whether it is traced now.
type Adopted = (u32, Result<(), Error>);

/// The session's state, each piece with its one owner: this.
struct Owner {
    config: Config,
    started: Instant,
    ledger: Ledger,
    analysis: Analysis,
    sym: Symbolizer,
    gpus: GpuView,
    prober: Prober,
    out: Output,
    history: Option<store::Writer>,
    /// `--ui`: the latest report, published for the API, and the totals over time.
    live: Option<LiveReport>,
    /// `--heap-after` while the heap probes are not in yet.
    heap_after: Option<HeapAfter>,
    /// `--heap auto`: the layers asked for, per process.
    layers: Option<layers::Layers>,
    /// `--heap auto`: the windows of Python objects asked for and open.
    objects: objects::ObjectWindows,
    /// `serve`: what to adopt, the pids asked about, and where ingest and the prober are told.
    adopt: Option<Adopt>,
}

struct Adopt {
    filter: serve::Filter,
    asked: HashSet<u32>,
    maps_tx: mpsc::UnboundedSender<u32>,
    done_tx: mpsc::UnboundedSender<Adopted>,
}

/// Everything the owner waits on.
struct Inbox {
    batches: mpsc::Receiver<Batch>,
    adopted: mpsc::UnboundedReceiver<Adopted>,
    /// SIGUSR1.
    on_demand: tokio::signal::unix::Signal,
    ticks: Ticks,
}

/// The owner's periodic work; a tick that is not wanted never comes.
struct Ticks {
    report: Ticker,
    sample: SampleClock,
    ui: Ticker,
    snapshot: Ticker,
    scan: Ticker,
}

/// Wires the session's tasks and runs it to its end.
pub(super) async fn trace(
    mut probes: Probes,
    root: Root,
    command: String,
    (history, out): (Option<store::Writer>, Output),
    ui: Option<Ui>,
    config: Config,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let channels = probes.take_channels()?;
    // SIGUSR1 stores a snapshot now; handled before anything is traced, so it never kills us.
    let on_demand = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(|e| anyhow::anyhow!("SIGUSR1 handler: {e}"))?;
    // Decoded batches waiting for the ledger: the kernel's ring is the buffer for bursts, this
    // only smooths (64 × 1024 events: a few MiB).
    let (tx, batches) = mpsc::channel(64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hold_tx, hold_rx) = mpsc::channel(64);
    let mut ledger = Ledger::default();
    ledger.heap_sampling = probes.heap_sampling();
    let hold = super::trace_root(&root, command, &mut probes, &mut ledger, hold_tx)?;
    let prober = Prober::spawn(probes).map_err(|e| anyhow::anyhow!("prober thread: {e}"))?;
    let (maps_tx, maps_rx) = mpsc::unbounded_channel();
    let requests = prober.requests.clone();
    let ingest = tokio::spawn(ingest::run(
        channels, tx, hold_rx, requests, maps_rx, stop_rx,
    ));
    let (hold_stop, root_exit) = hold.map(|h| (h.stop, h.root_exit)).unzip();
    let (end, serve) = release_root(root, history.as_ref(), root_exit)?;
    let live = ui.map(|ui| serve_ui(ui, history.as_ref())).transpose()?;
    let (adopted_tx, adopted) = mpsc::unbounded_channel();
    let mut inbox = Inbox {
        batches,
        adopted,
        on_demand,
        ticks: Ticks::new(&config, history.is_some(), live.is_some(), serve.as_ref()),
    };
    let mut owner = Owner {
        out,
        heap_after: config.heap.after,
        layers: (config.heap.mode == HeapMode::Auto)
            .then(|| layers::Layers::new(config.heap.tensors)),
        objects: objects::ObjectWindows::opened(config.heap.mode),
        started,
        ledger,
        analysis: Analysis::default(),
        sym: Symbolizer::default(),
        gpus: GpuView::open(),
        prober,
        history,
        live,
        adopt: serve.map(|(_, filter)| Adopt {
            filter,
            asked: HashSet::new(),
            maps_tx,
            done_tx: adopted_tx,
        }),
        config,
    };
    let exit_code = owner.dispatch(&mut inbox, end).await?;
    tracing::debug!("the command has exited");
    // The run is over: the holds end, ingest drains what is left, then the final report.
    if let Some(h) = &hold_stop {
        owner.prober.end_holds();
        h.stop();
    }
    tracing::debug!("holds ended");
    let _ = stop_tx.send(true);
    while let Some(batch) = inbox.batches.recv().await {
        owner.on_batch(batch);
    }
    tracing::debug!("events drained");
    owner.warn_unmet();
    ingest
        .await
        .map_err(|e| anyhow::anyhow!("ingest task: {e}"))??;
    if let Some(h) = hold_stop {
        let _ = tokio::task::spawn_blocking(move || h.join()).await;
    }
    owner.end(exit_code).await
}

/// The end of the session, resolving with its exit code.
type End = std::pin::Pin<Box<dyn std::future::Future<Output = i32> + Send>>;

/// The root let go (the launched command released to run): what ends the session, and for
/// `serve` the scan interval and the filter of what to adopt.
fn release_root(
    root: Root,
    history: Option<&store::Writer>,
    root_exit: Option<oneshot::Receiver<i32>>,
) -> Result<(End, Option<(f64, serve::Filter)>), Error> {
    let root_pid = root.pid();
    if let Some(w) = history
        && root_pid != 0
    {
        w.set_root_pid(root_pid);
    }
    let (serve, ends) = match root {
        Root::Held(child) => {
            child.release()?;
            (None, ends::Root::Launched)
        }
        Root::Attached { duration, .. } => (None, ends::Root::Attached { duration }),
        Root::Serve { filter, scan } => (Some((scan, filter)), ends::Root::Serve),
    };
    if root_pid != 0 {
        tracing::info!(pid = root_pid, "tracing");
    }
    Ok((Box::pin(ends::end_of(ends, root_pid, root_exit)), serve))
}

impl Ticks {
    fn new(
        config: &Config,
        stored: bool,
        live: bool,
        serve: Option<&(f64, serve::Filter)>,
    ) -> Self {
        let every = |on: bool, s: f64| ends::ticker(if on { s } else { 0.0 });
        let snapshot = config.history.as_ref().map_or(0.0, |h| h.snapshot);
        Ticks {
            report: ends::ticker(config.interval),
            sample: SampleClock::new((!config.per_step()).then_some(config.sample)),
            // The first tick is immediate: the API has a report from the start.
            ui: if live {
                ends::ticker_now(1.0)
            } else {
                every(false, 0.0)
            },
            snapshot: every(stored, snapshot),
            scan: match serve {
                Some((scan, _)) => ends::ticker_now(*scan),
                None => every(false, 0.0),
            },
        }
    }
}

/// Starts the API on the explorer's socket; the sender it reads published reports from.
fn serve_ui(ui: Ui, history: Option<&store::Writer>) -> Result<LiveReport, Error> {
    let listener =
        tokio::net::TcpListener::from_std(ui.listener).map_err(|e| anyhow::anyhow!("--ui: {e}"))?;
    let (live_tx, live_rx) = watch::channel(None);
    let state = api::ApiState {
        live: live_rx,
        store: history.map(|w| w.path.clone()),
        token: ui.token.map(Into::into),
        web: ui.web,
    };
    tokio::spawn(api::serve(listener, state));
    Ok((live_tx, Timeline::default()))
}

impl Owner {
    /// The loop: each event to its handler, until the session's end resolves with an exit code.
    async fn dispatch(&mut self, inbox: &mut Inbox, mut end: End) -> Result<i32, Error> {
        let heap_sleep =
            tokio::time::sleep(std::time::Duration::from_secs_f64(match self.heap_after {
                Some(HeapAfter::Seconds(s)) => s,
                _ => 0.0,
            }));
        tokio::pin!(heap_sleep);
        let warm = tokio::time::sleep(WARM_SYMBOLS_AFTER);
        tokio::pin!(warm);
        let mut warmed = false;
        let code = loop {
            tokio::select! {
                Some(batch) = inbox.batches.recv() => {
                    self.on_batch(batch);
                    self.start_heap_at_step();
                }
                () = &mut heap_sleep, if matches!(self.heap_after, Some(HeapAfter::Seconds(_))) => {
                    self.start_heap()
                }
                () = &mut warm, if !warmed => {
                    warmed = true;
                    self.warm_symbols();
                }
                () = inbox.ticks.sample.due() => {
                    let wall = Instant::now();
                    let cost = self.sample();
                    let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
                    tracing::debug!(cost_ms = cost.as_secs_f64() * 1e3, wall_ms, "sample");
                    let elapsed_s = self.started.elapsed().as_secs_f64();
                    inbox.ticks.sample.taken(elapsed_s, cost, self.layer_judged());
                }
                _ = inbox.ticks.report.tick() => self.print_report()?,
                _ = inbox.ticks.ui.tick() => self.publish(),
                _ = inbox.ticks.snapshot.tick() => self.snapshot(Reason::Periodic),
                Some(()) = inbox.on_demand.recv() => self.snapshot(Reason::OnDemand),
                _ = inbox.ticks.scan.tick() => self.scan(),
                Some((pid, adopted)) = inbox.adopted.recv() => self.adopted(pid, adopted),
                code = &mut end => break code,
            }
        };
        Ok(code)
    }

    /// Applies a batch in order, sampling at each step boundary in it (per-step verdicts).
    fn on_batch(&mut self, batch: Batch) {
        let per_step = self.config.per_step();
        for input in batch {
            let step = matches!(&input, Input::Event(e) if e.what == What::Step);
            self.ledger.apply(input);
            if step && per_step {
                self.sample();
            }
        }
    }

    /// `--heap-after N` with steps: the heap probes go in once step N is reached.
    fn start_heap_at_step(&mut self) {
        if let Some(HeapAfter::Steps(n)) = self.heap_after
            && self.ledger.steps >= n
        {
            self.start_heap();
        }
    }

    fn start_heap(&mut self) {
        self.heap_after = None;
        let _ = self.prober.requests.send(ProbeRequest::StartHeap);
    }

    /// One sample of every group for the verdicts (at the step count, or the seconds traced),
    /// then what follows from it: object windows closed, layers engaged. Returns the CPU time the
    /// sample itself took, what sets the pace of samples: a window's closing now and then (tens
    /// of ms), or the scheduler running the program meanwhile on a busy machine (a wall time ten
    /// times that), would leave seconds of a short run unsampled.
    fn sample(&mut self) -> std::time::Duration {
        let cpu_ns = thread_cpu_ns();
        let groups = self.ledger.group_bytes();
        let at_s = self.started.elapsed().as_secs_f64();
        self.gpus.observe(at_s, |pid| device_bytes(&groups, pid));
        let x = if self.config.per_step() {
            self.ledger.steps as f64
        } else {
            self.started.elapsed().as_secs_f64()
        };
        self.analysis.sample(x, &self.ledger, &groups);
        self.sample_cpu(x);
        self.ledger.sampled();
        self.ledger.sample_pages_after_heap();
        self.sample_pages(x, &groups);
        let cost = std::time::Duration::from_nanos(thread_cpu_ns().saturating_sub(cpu_ns));
        self.close_object_windows(x);
        self.engage_layers(at_s, x);
        cost
    }

    /// Looks up the symbols of the stacks a report would list now, and forgets the report: the
    /// symbolizer keeps them (see [`WARM_SYMBOLS_AFTER`]).
    fn warm_symbols(&mut self) {
        let t = Instant::now();
        let _ = self.report(self.config.top, false);
        tracing::debug!(
            ms = t.elapsed().as_secs_f64() * 1e3,
            "symbols looked up ahead"
        );
    }

    fn report(&mut self, top: usize, final_report: bool) -> report::Report {
        let info = self.prober.info.borrow().clone();
        let groups = self.ledger.group_bytes();
        let cx = report::Context {
            final_report,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            now_ns: monotonic_ns(),
            top,
            probes: &info.attached,
            libraries: &info.libraries,
            failures: &info.failures,
            nvml: &self
                .gpus
                .sample(self.started.elapsed().as_secs_f64(), |pid| {
                    device_bytes(&groups, pid)
                }),
            analysis: &self.analysis,
            warmup_s: self.config.warmup,
            per_step: self.config.per_step(),
            heap: self.config.heap,
            probe_cost: if self.config.probe_cost {
                crate::probes::cost::read(&info.programs)
            } else {
                Vec::new()
            },
        };
        report::build(&self.ledger, &mut self.sym, &cx)
    }

    fn stored_top(&self) -> usize {
        self.config.top.max(STORED_STACKS)
    }

    /// Stacks in a periodic snapshot: as many as the output's reports, at most `check`'s
    /// ([`crate::config::CHECK_TOP`]), at least [`STORED_STACKS`].
    fn snapshot_top(&self) -> usize {
        self.config
            .top
            .clamp(STORED_STACKS, crate::config::CHECK_TOP)
    }

    /// `--interval`: a report to the output.
    fn print_report(&mut self) -> Result<(), Error> {
        let r = self.report(self.config.top, false);
        self.out.write(&r, self.config.json)
    }

    /// `--ui`: the latest report to the API.
    fn publish(&mut self) {
        if self.live.is_none() {
            return;
        }
        let r = self.report(self.stored_top(), false);
        self.publish_report(r);
    }

    fn publish_report(&mut self, r: report::Report) {
        if let Some((tx, timeline)) = &mut self.live {
            timeline.record(&r);
            let published = Published::new(r, &self.analysis, timeline);
            let _ = tx.send(Some(Arc::new(published)));
        }
    }

    /// A snapshot to the history (periodic, or asked for with SIGUSR1).
    fn snapshot(&mut self, reason: Reason) {
        if self.history.is_none() {
            return tracing::warn!("snapshot asked for, but no history is kept (--no-store)");
        }
        let r = self.report(self.snapshot_top(), false);
        if let Some(w) = &self.history {
            w.snapshot(r, reason);
        }
    }

    /// `serve`: processes that match now are handed to the prober for adoption.
    fn scan(&mut self) {
        let Some(a) = &mut self.adopt else {
            return;
        };
        a.asked.extend(self.ledger.procs.keys().copied());
        for pid in serve::scan(&a.filter, &a.asked) {
            a.asked.insert(pid);
            let _ = a.maps_tx.send(pid);
            let done = a.done_tx.clone();
            let _ = self.prober.requests.send(ProbeRequest::Adopt { pid, done });
        }
    }

    /// The prober's answer to an adoption.
    fn adopted(&mut self, pid: u32, adopted: Result<(), Error>) {
        match adopted {
            Ok(()) => {
                let command = procfs::command(pid).unwrap_or_default();
                crate::say!("leaktracer: tracing {pid} ({command})");
                let env = procfs::allocator_env(pid);
                self.ledger.add_root(pid, command, env, monotonic_ns());
            }
            Err(e) => tracing::warn!(pid, "not traced: {e}"),
        }
    }

    /// The final report: published, stored, exported and printed; the probes detached.
    async fn end(mut self, exit_code: i32) -> Result<Outcome, Error> {
        let t = std::time::Instant::now();
        let ms = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1e3;
        if !self.config.per_step() {
            self.sample();
        }
        self.heap_windows_cut_short();
        let mut last = self.report(self.stored_top(), true);
        tracing::debug!(ms = ms(t), "final report made");
        self.publish_report(last.clone());
        if let Some(w) = self.history.take() {
            let exit = (self.config.mode != crate::config::RunMode::Attach
                && self.config.mode != crate::config::RunMode::Serve)
                .then_some(exit_code);
            super::close_history(w, &last, exit);
        }
        render::export::write(&last, &self.config.exports, now_unix_ns())
            .map_err(|e| anyhow::anyhow!(e))?;
        last.keep_top(self.config.top);
        self.out.write(&last, self.config.json)?;
        tracing::debug!(ms = ms(t), "final report written");
        self.prober.finish().detach_in_background();
        tracing::debug!(ms = ms(t), "probes let go");
        if self.live.is_some() && self.config.ui.as_ref().is_some_and(|u| u.keep_serving) {
            crate::say!(
                "leaktracer: the run ended; the explorer keeps serving its final report until Ctrl-C"
            );
            ends::interrupted().await;
        }
        Ok(Outcome { exit_code, last })
    }

    /// Warnings for what the options asked and the run never reached.
    fn warn_unmet(&self) {
        match self.heap_after {
            Some(HeapAfter::Seconds(s)) => {
                tracing::warn!("the heap was never traced: the run ended before --heap-after {s} s")
            }
            Some(HeapAfter::Steps(n)) => tracing::warn!(
                "the heap was never traced: the run ended before --heap-after {n} steps"
            ),
            None => {}
        }
        if self.config.per_step() && self.ledger.steps == 0 {
            tracing::warn!(
                symbol = self.config.step_symbol.as_deref().unwrap_or_default(),
                "the step symbol was never called (or not found in the traced code): no per-step verdicts"
            );
        }
    }
}

/// A process's own traced device memory, from the ledger's group sums.
fn device_bytes(groups: &[(crate::model::GroupKey, u64)], pid: u32) -> u64 {
    groups
        .iter()
        .filter(|(k, _)| k.pid == pid && k.kind == crate::model::Kind::Device && !k.inherited)
        .map(|(_, b)| b)
        .sum()
}
