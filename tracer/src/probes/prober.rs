//! The thread that owns the probes while a session runs. Ingest tells it about code the traced
//! processes map; it probes what allocates and then lets a held thread go. Probing can be slow
//! (a large library's symbol tables; the kernel's uprobe lock, which another leaktracer detaching
//! its probes may hold for seconds), so it happens here and not on the path that feeds the ledger:
//! events keep flowing while a library is probed.

use std::{
    path::Path,
    sync::{Arc, mpsc},
    thread,
};

use tokio::sync::watch;

use crate::{
    error::Error,
    model::monotonic_ns,
    probes::{AttachedFn, Library, ProbeFailure, Probes, Timing},
};

/// What ingest asks of the prober, in the order it must happen.
#[derive(Debug)]
pub enum ProbeRequest {
    /// A file with executable pages that `tgid` mapped at `mapped_ns`, seen for the first time.
    /// `held`: the mapping thread is stopped until the next [`ProbeRequest::Release`] for it.
    Code {
        tgid: u32,
        path: Arc<str>,
        mapped_ns: u64,
        held: bool,
    },
    /// `tgid` has exec'd: its heap stacks are taken as its new executable needs (`--unwind`).
    Exec { tgid: u32 },
    /// `tgid` has exited.
    Exit { tgid: u32 },
    /// The process `parent` forked `child` (held until the next [`ProbeRequest::Release`], where
    /// forks are held).
    Forked { parent: u32, child: u32 },
    /// Heap records of `tgid` whose allocator returns to `ip` are to copy `bytes` of stack.
    CopyHint { tgid: u32, ip: u64, bytes: u32 },
    /// Everything asked before is done: the held thread may go on. `ours` says whether its
    /// SIGSTOP came from the kernel side (and is to be suppressed).
    Release {
        ours: bool,
        done: mpsc::Sender<bool>,
    },
    /// Stop the kernel side from stopping threads (the holder is going away); answers when done.
    EndHolds(mpsc::Sender<()>),
    /// `--heap-after`: probe the heap functions now (once; later asks do nothing).
    StartHeap,
    /// `--heap auto`: trace the malloc family of `tgid` from now on, `after_s` seconds into
    /// tracing, if it is a layered process whose malloc family is not traced yet.
    EngageHeap { tgid: u32, after_s: f64 },
    /// `--heap auto --tensors auto`: trace the CPU tensors of `tgid` from now on, `after_s`
    /// seconds into tracing, if it is a layered process that maps PyTorch's CPU allocator and
    /// whose tensors are not traced yet (the libraries then list it, `timing: engaged`).
    EngageTensors { tgid: u32, after_s: f64 },
    /// `--tensors auto`: the memory of `tgid` holds: its CPU tensors are no longer traced.
    DisengageTensors { tgid: u32 },
    /// `--heap auto`: the leak of `tgid`'s malloc family was confirmed: it is no longer traced.
    DisengageHeap { tgid: u32 },
    /// `--heap auto`: sample the Python objects of `tgid` from now on, `after_s` seconds into
    /// tracing (its arenas grow), until [`ProbeRequest::DisengageObjects`].
    EngageObjects { tgid: u32, after_s: f64 },
    /// The window of `tgid`'s Python objects is over.
    DisengageObjects { tgid: u32 },
    /// `serve`: probe the code a running process has mapped, then trace it; answers with the pid
    /// and whether it worked.
    Adopt {
        pid: u32,
        done: tokio::sync::mpsc::UnboundedSender<(u32, Result<(), Error>)>,
    },
}

/// What the probes are, for reports.
#[derive(Clone, Debug, Default)]
pub struct ProbesInfo {
    pub attached: Vec<AttachedFn>,
    pub libraries: Vec<Library>,
    /// Probe sets that could not be attached.
    pub failures: Vec<ProbeFailure>,
    /// Leaktracer's programs loaded so far: kernel id and name.
    pub programs: Vec<(u32, String)>,
    /// `--tensors auto`: the layered processes whose CPU tensors are traced now.
    pub tensors_traced: Vec<u32>,
    /// `--tensors auto`: the libraries with PyTorch's CPU allocator found so far.
    pub tensor_libraries: Vec<std::path::PathBuf>,
    /// `--heap auto`: the processes whose malloc family is traced whole (native ones, while no
    /// Python process is traced), not a layer.
    pub heap_whole: Vec<u32>,
}

/// The running prober.
pub struct Prober {
    pub requests: mpsc::Sender<ProbeRequest>,
    pub info: watch::Receiver<Arc<ProbesInfo>>,
    thread: thread::JoinHandle<Probes>,
}

impl Prober {
    pub fn spawn(probes: Probes) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let (info_tx, info) = watch::channel(Arc::new(info_of(&probes)));
        let thread = thread::Builder::new()
            .name("prober".into())
            .spawn(move || serve(probes, &rx, &info_tx))?;
        Ok(Self {
            requests: tx,
            info,
            thread,
        })
    }

    /// Turns the kernel side's stops off and waits until it is done.
    pub fn end_holds(&self) {
        let (done, rx) = mpsc::channel();
        if self.requests.send(ProbeRequest::EndHolds(done)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Waits for every sender to go (ingest ended) and takes the probes back.
    pub fn finish(self) -> Probes {
        drop(self.requests);
        self.thread.join().expect("prober thread")
    }
}

fn info_of(probes: &Probes) -> ProbesInfo {
    ProbesInfo {
        attached: probes.attached().to_vec(),
        libraries: probes.libraries().to_vec(),
        failures: probes.failures().to_vec(),
        programs: probes.loaded_programs(),
        tensors_traced: probes.tensors_traced(),
        tensor_libraries: probes.tensor_libraries(),
        heap_whole: probes.heap_whole(),
    }
}

/// How long the prober waits without a request before it loads the layers' programs ahead: the
/// libraries a job maps as it imports come as requests, some holding the mapping thread.
const PRELOAD_IDLE: std::time::Duration = std::time::Duration::from_millis(200);

/// How long the prober waits without a request before the work it puts off while a job may be
/// held for a mapping: the interpreters' exits' probes (finalize.rs) and the libraries probed
/// ahead (ahead.rs), whose registrations wait for an RCU grace period (11–25 ms after a quiet
/// spell). A Python job's start maps its interpreter, libc and libm within a few milliseconds,
/// each held for; then it runs for tens of milliseconds before its imports map more.
const QUIET: std::time::Duration = std::time::Duration::from_millis(8);

fn serve(
    mut probes: Probes,
    rx: &mpsc::Receiver<ProbeRequest>,
    info: &watch::Sender<Arc<ProbesInfo>>,
) -> Probes {
    let started = std::time::Instant::now();
    let counts = |p: &Probes| {
        let layers = p.tensor_libraries().len();
        let failed = p.failures().len();
        let whole = p.heap_whole();
        (
            p.libraries().len(),
            p.attached().len(),
            layers,
            failed,
            whole,
        )
    };
    let mut told = counts(&probes);
    let mut last_request = std::time::Instant::now();
    loop {
        // What the reports and the session's layers know of the probes follows every change.
        let now = counts(&probes);
        if now != told {
            told = now;
            info.send_replace(Arc::new(info_of(&probes)));
        }
        let quiet = last_request + QUIET;
        let finalize = probes.finalize_due().map(|at_most| at_most.min(quiet));
        let ahead = probes.ahead_due().then_some(quiet);
        let now = std::time::Instant::now();
        if finalize.is_some_and(|due| due <= now) {
            probes.attach_after_release();
        }
        if ahead.is_some_and(|due| due <= now) {
            probes.attach_ahead();
        }
        if probes.preload_due() && last_request.elapsed() >= PRELOAD_IDLE {
            probes.preload_layers();
        }
        // Waits for a request, or until the layers' programs are due to be loaded, the exits
        // found while threads were held to be marked (finalize.rs) or libraries to be probed
        // ahead (ahead.rs).
        let preload = probes.preload_due().then(|| last_request + PRELOAD_IDLE);
        let due = [preload, finalize, ahead];
        let req = match due.into_iter().flatten().min() {
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(due) => rx.recv_timeout(due.saturating_duration_since(std::time::Instant::now())),
        };
        match req {
            Ok(req) => {
                last_request = std::time::Instant::now();
                handle(&mut probes, req, started, info);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    probes
}

/// Does what one request asks.
fn handle(
    probes: &mut Probes,
    req: ProbeRequest,
    started: std::time::Instant,
    info: &watch::Sender<Arc<ProbesInfo>>,
) {
    match req {
        ProbeRequest::Code {
            tgid,
            path,
            mapped_ns,
            held,
        } => {
            let timing = if held {
                Timing::AtMap
            } else {
                let late_ns = monotonic_ns().saturating_sub(mapped_ns);
                Timing::Late {
                    late_ms: late_ns as f64 / 1e6,
                }
            };
            if let Err(e) = probes.attach_code(Path::new(&*path), tgid, timing) {
                tracing::warn!(library = %path, error = %e, "not probed");
            }
            let ms = monotonic_ns().saturating_sub(mapped_ns) as f64 / 1e6;
            tracing::debug!(library = %path, held, ms, "code looked at");
        }
        ProbeRequest::Exec { tgid } => probes.choose_unwind(tgid),
        ProbeRequest::Exit { tgid } => probes.exited(tgid),
        ProbeRequest::Forked { parent, child } => probes.forked(parent, child),
        ProbeRequest::CopyHint { tgid, ip, bytes } => probes.hint_copy(tgid, ip, bytes),
        ProbeRequest::Release { ours, done } => {
            let _ = done.send(ours);
        }
        ProbeRequest::EngageHeap { tgid, after_s } => {
            probes.engage_heap(tgid, after_s);
            info.send_replace(Arc::new(info_of(probes)));
        }
        ProbeRequest::EngageTensors { tgid, after_s } => {
            if probes.engage_tensors(tgid, after_s) {
                info.send_replace(Arc::new(info_of(probes)));
            }
        }
        ProbeRequest::EngageObjects { tgid, after_s } => {
            if probes.engage_objects(tgid, after_s) {
                info.send_replace(Arc::new(info_of(probes)));
            }
        }
        ProbeRequest::DisengageObjects { tgid } => probes.disengage_objects(tgid),
        ProbeRequest::DisengageHeap { tgid } => {
            probes.disengage_heap(tgid);
            info.send_replace(Arc::new(info_of(probes)));
        }
        ProbeRequest::DisengageTensors { tgid } => {
            probes.disengage_tensors(tgid);
            info.send_replace(Arc::new(info_of(probes)));
        }
        ProbeRequest::StartHeap => {
            probes.start_heap(started.elapsed().as_secs_f64());
            info.send_replace(Arc::new(info_of(probes)));
        }
        ProbeRequest::EndHolds(done) => {
            probes.release_holds();
            let _ = done.send(());
        }
        ProbeRequest::Adopt { pid, done } => {
            let before = probes.libraries().len();
            let result = probes
                .attach_code_of(pid, Timing::AlreadyLoaded)
                .and_then(|()| probes.trace_pid(pid, false));
            if probes.libraries().len() != before {
                info.send_replace(Arc::new(info_of(probes)));
            }
            let _ = done.send((pid, result));
        }
    }
}
