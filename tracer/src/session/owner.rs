//! The session's owner: the one holder of the ledger, the analysis and everything built from them.
//! [`trace`] wires the tasks (ingest, prober, hold, API) to it; its loop only dispatches, each
//! event to one method.

use std::{collections::HashSet, sync::Arc, time::Instant};

use tokio::sync::{mpsc, watch};

use super::{
    Outcome, Root, STORED_STACKS,
    ends::{self, Ticker},
    output::Output,
    ui::Ui,
};
use crate::{
    analysis::Analysis,
    api::{self, Published, views::Timeline},
    config::Config,
    error::Error,
    gpu::GpuView,
    hold::Hold,
    ingest::{self, Batch, Input, What},
    ledger::Ledger,
    model::{HeapAfter, monotonic_ns, now_unix_ns},
    probes::{
        Probes,
        prober::{ProbeRequest, Prober},
    },
    procfs, render, report, serve,
    store::{self, Reason},
    symbolize::Symbolizer,
};

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
    on_demand: tokio::signal::unix::Signal,
    report_tick: Ticker,
    sample_tick: Ticker,
    ui_tick: Ticker,
    snapshot_tick: Ticker,
    scan_tick: Ticker,
}

/// Wires the session's tasks and runs it to its end.
pub(super) async fn trace(
    mut probes: Probes,
    root: Root,
    command: String,
    history: Option<store::Writer>,
    ui: Option<Ui>,
    config: Config,
) -> Result<Outcome, Error> {
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
    let hold = super::trace_root(&root, command, &mut probes, &mut ledger, hold_tx)?;
    let prober = Prober::spawn(probes).map_err(|e| anyhow::anyhow!("prober thread: {e}"))?;
    let (maps_tx, maps_rx) = mpsc::unbounded_channel();
    let ingest = tokio::spawn(ingest::run(
        channels,
        tx,
        hold_rx,
        prober.requests.clone(),
        maps_rx,
        stop_rx,
    ));
    let root_pid = root.pid();
    if let Some(w) = &history
        && root_pid != 0
    {
        w.set_root_pid(root_pid);
    }
    let (scan, root) = match root {
        Root::Held(child) => {
            child.release()?;
            (0.0, ends::Root::Launched)
        }
        Root::Attached { duration, .. } => (0.0, ends::Root::Attached { duration }),
        Root::Serve { filter, scan } => (scan, ends::Root::Serve(filter)),
    };
    if root_pid != 0 {
        tracing::info!(pid = root_pid, "tracing");
    }
    let (hold_stop, root_exit) = match hold {
        Some(Hold { root_exit, stop }) => (Some(stop), Some(root_exit)),
        None => (None, None),
    };
    let (done_tx, adopted) = mpsc::unbounded_channel();
    let adopt = match &root {
        ends::Root::Serve(filter) => Some(Adopt {
            filter: filter.clone(),
            asked: HashSet::new(),
            maps_tx,
            done_tx,
        }),
        _ => None,
    };
    let end = ends::end_of(root, root_pid, root_exit);
    let live = ui.map(|ui| serve_ui(ui, history.as_ref())).transpose()?;
    let inbox = Inbox {
        report_tick: ends::ticker(config.interval),
        sample_tick: ends::ticker(if config.per_step() {
            0.0
        } else {
            config.sample
        }),
        ui_tick: if live.is_some() {
            // The first tick is immediate: the API has a report from the start.
            ends::ticker_now(1.0)
        } else {
            ends::ticker(0.0)
        },
        snapshot_tick: ends::ticker(match (&history, &config.history) {
            (Some(_), Some(h)) => h.snapshot,
            _ => 0.0,
        }),
        scan_tick: if adopt.is_some() {
            ends::ticker_now(scan)
        } else {
            ends::ticker(0.0)
        },
        batches,
        adopted,
        on_demand,
    };
    let mut owner = Owner {
        out: Output::open(config.output.as_deref())?,
        heap_after: config.heap.after,
        started: Instant::now(),
        ledger,
        analysis: Analysis::default(),
        sym: Symbolizer::default(),
        gpus: GpuView::open(),
        prober,
        history,
        live,
        adopt,
        config,
    };
    let mut inbox = inbox;
    let exit_code = owner.dispatch(&mut inbox, end).await?;
    // The run is over: the holds end, ingest drains what is left, then the final report.
    if let Some(h) = hold_stop {
        owner.prober.end_holds();
        let _ = h.send(());
    }
    let _ = stop_tx.send(true);
    while let Some(batch) = inbox.batches.recv().await {
        owner.on_batch(batch);
    }
    ingest
        .await
        .map_err(|e| anyhow::anyhow!("ingest task: {e}"))??;
    owner.end(exit_code).await
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
    async fn dispatch(
        &mut self,
        inbox: &mut Inbox,
        end: impl std::future::Future<Output = i32>,
    ) -> Result<i32, Error> {
        tokio::pin!(end);
        let heap_sleep =
            tokio::time::sleep(std::time::Duration::from_secs_f64(match self.heap_after {
                Some(HeapAfter::Seconds(s)) => s,
                _ => 0.0,
            }));
        tokio::pin!(heap_sleep);
        let code = loop {
            tokio::select! {
                Some(batch) = inbox.batches.recv() => self.on_batch(batch),
                () = &mut heap_sleep, if matches!(self.heap_after, Some(HeapAfter::Seconds(_))) => {
                    self.start_heap()
                }
                _ = inbox.sample_tick.tick() => self.sample(),
                _ = inbox.report_tick.tick() => self.print_report()?,
                _ = inbox.ui_tick.tick() => self.publish(false),
                _ = inbox.snapshot_tick.tick() => self.snapshot(Reason::Periodic),
                Some(()) = inbox.on_demand.recv() => self.snapshot(Reason::OnDemand),
                _ = inbox.scan_tick.tick() => self.scan(),
                Some((pid, adopted)) = inbox.adopted.recv() => self.adopted(pid, adopted),
                code = &mut end => break code,
            }
        };
        Ok(code)
    }

    /// Applies a batch in order, sampling at each step boundary in it (per-step verdicts) and
    /// putting the heap probes in at the step `--heap-after` names.
    fn on_batch(&mut self, batch: Batch) {
        let per_step = self.config.per_step();
        for input in batch {
            let step = matches!(&input, Input::Event(e) if e.what == What::Step);
            self.ledger.apply(input);
            if step && per_step {
                self.sample();
            }
        }
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

    /// One sample of every group for the verdicts: at the step count, or the seconds traced.
    fn sample(&mut self) {
        let x = if self.config.per_step() {
            self.ledger.steps as f64
        } else {
            self.started.elapsed().as_secs_f64()
        };
        self.analysis
            .sample(x, &self.ledger, &self.ledger.group_bytes());
    }

    fn report(&mut self, top: usize, final_report: bool) -> report::Report {
        let info = self.prober.info.borrow().clone();
        let cx = report::Context {
            final_report,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            now_ns: monotonic_ns(),
            top,
            probes: &info.attached,
            libraries: &info.libraries,
            nvml: &self.gpus.sample(),
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

    /// `--interval`: a report to the output.
    fn print_report(&mut self) -> Result<(), Error> {
        let r = self.report(self.config.top, false);
        self.out.write(&r, self.config.json)
    }

    /// `--ui`: the latest report to the API.
    fn publish(&mut self, final_report: bool) {
        if self.live.is_none() {
            return;
        }
        let r = self.report(self.stored_top(), final_report);
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
        let r = self.report(self.stored_top(), false);
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
                eprintln!("leaktracer: tracing {pid} ({command})");
                let env = procfs::allocator_env(pid);
                self.ledger.add_root(pid, command, env, monotonic_ns());
            }
            Err(e) => tracing::warn!(pid, "not traced: {e}"),
        }
    }

    /// The final report: published, stored, exported and printed; the probes detached.
    async fn end(mut self, exit_code: i32) -> Result<Outcome, Error> {
        self.warn_unmet();
        if !self.config.per_step() {
            self.sample();
        }
        let mut last = self.report(self.stored_top(), true);
        self.publish_report(last.clone());
        if let Some(w) = self.history.take() {
            let exit = (self.config.mode != crate::config::RunMode::Attach
                && self.config.mode != crate::config::RunMode::Serve)
                .then_some(exit_code);
            super::close_history(w, &last, exit);
        }
        render::export::write(&last, &self.config.exports, now_unix_ns())
            .map_err(|e| anyhow::anyhow!(e))?;
        last.stacks.truncate(self.config.top);
        self.out.write(&last, self.config.json)?;
        self.prober.finish().detach_in_background();
        if self.live.is_some() && self.config.ui.as_ref().is_some_and(|u| u.keep_serving) {
            eprintln!(
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
