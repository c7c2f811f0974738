//! Holding traced processes with ptrace at the two moments user space must act before they go on.
//!
//! - **Exit.** A process's mappings vanish the moment it exits, and a short program can finish
//!   before ingest has read the events of its last libraries. With PTRACE_O_TRACEEXIT each process
//!   stops at the start of its exit with its memory intact; ingest captures its mappings and drains
//!   its events, then it goes on.
//! - **New code.** When a held process maps executable pages of a file or execs, the kernel side
//!   sends the thread a SIGSTOP (`TRACED_HOLD`). Its signal-delivery stop comes here first: ingest
//!   drains the events up to that mapping, the session probes the library if it allocates (CUDA,
//!   PyTorch, a libc), and the thread resumes with the signal suppressed, before it ran one
//!   instruction of the new code. A SIGSTOP the kernel side did not send is delivered as usual.
//!
//! The root is seized (PTRACE_SEIZE), its threads and children followed through clone, fork and
//! vfork. Nothing else is intercepted: other signals are passed through, group stops are left
//! alone (PTRACE_LISTEN), the real parent sees nothing. When the tracer ends, the kernel detaches
//! every tracee; should it end while holding one, [`guard`] lets the job go on.

pub mod guard;

use std::{sync::mpsc as std_mpsc, thread, time::Duration};

use tokio::sync::{mpsc, oneshot};

/// Why a thread is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// The process (its thread group leader) is exiting.
    Exit,
    /// The thread got a SIGSTOP, maybe sent for new code.
    Stop,
}

/// A request to ingest and the session: act on the held thread, then answer whether the stop was
/// the kernel side's own (its SIGSTOP is then suppressed).
#[derive(Debug)]
pub struct HoldRequest {
    pub tid: u32,
    pub tgid: u32,
    pub reason: HoldReason,
    pub done: std_mpsc::Sender<bool>,
}

/// Longest a process is held if ingest does not answer. Ingest answers once it has applied every
/// event before the stop: after a start-up burst (libtorch makes a million allocator calls in
/// seconds) that backlog takes seconds to work through, so the limit is generous; it is only a
/// guard against a stalled consumer leaving the job stopped.
const MAX_HOLD: Duration = Duration::from_secs(30);

/// The running hold thread.
pub struct Hold {
    /// The root's exit status, when the root is our child (`run`).
    pub root_exit: oneshot::Receiver<i32>,
    /// Ends the thread; the kernel then detaches the tracees still alive.
    pub stop: Stopper,
}

/// The hold thread's end.
pub struct Stopper {
    tx: std_mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

impl Stopper {
    /// Tells the thread to end: the session has turned the kernel side's stops off (it serves a
    /// moment longer, for a stop sent just before).
    pub fn stop(&self) {
        let _ = self.tx.send(());
    }

    /// Waits for the thread's end, its guard released: leaktracer does not exit before, or the
    /// guard would take it for a death while holding.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Seizes `root` and starts the hold thread. `None` when ptrace is not possible (already traced,
/// not permitted): tracing goes on without exit holds.
pub fn start(root: u32, requests: mpsc::Sender<HoldRequest>) -> Option<Hold> {
    let (seized_tx, seized_rx) = std_mpsc::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = std_mpsc::channel();
    let thread = thread::Builder::new()
        .name("exit-hold".into())
        .spawn(move || {
            let ok = seize(root);
            let guard = ok.then(|| guard::Guard::start(root)).flatten();
            let _ = seized_tx.send(ok);
            if ok {
                serve(root, &requests, exit_tx, &stop_rx);
            }
            if let Some(g) = guard {
                g.release();
            }
        })
        .ok()?;
    match seized_rx.recv() {
        Ok(true) => Some(Hold {
            root_exit: exit_rx,
            stop: Stopper {
                tx: stop_tx,
                thread,
            },
        }),
        _ => None,
    }
}

/// Seizes every thread of `pid` (threads made later are followed through clone). Threads that
/// appear while listing are picked up by listing again until nothing new shows.
fn seize(pid: u32) -> bool {
    let mut seized: Vec<u32> = Vec::new();
    loop {
        let threads = crate::procfs::threads(pid);
        let new: Vec<u32> = threads
            .into_iter()
            .filter(|t| !seized.contains(t))
            .collect();
        if new.is_empty() {
            return !seized.is_empty();
        }
        for tid in new {
            if let Err(e) = seize_one(tid) {
                if seized.is_empty() {
                    tracing::warn!(pid, error = %e, "cannot hold the traced processes (ptrace): libraries loaded later are probed late, short-lived processes may lose symbols");
                    return false;
                }
                tracing::debug!(tid, error = %e, "thread not seized (gone?)");
            }
            seized.push(tid);
        }
    }
}

fn seize_one(tid: u32) -> std::io::Result<()> {
    let opts = libc::PTRACE_O_TRACEEXIT
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE;
    // SAFETY: ptrace on a thread id with no memory arguments.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            tid as libc::pid_t,
            0,
            opts as libc::c_long,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn serve(
    root: u32,
    requests: &mpsc::Sender<HoldRequest>,
    exit_tx: oneshot::Sender<i32>,
    stop: &std_mpsc::Receiver<()>,
) {
    let mut exit_tx = Some(exit_tx);
    let mut stopping: Option<std::time::Instant> = None;
    loop {
        if stopping.is_none() && stop.try_recv().is_ok() {
            // The session has turned the kernel side's stops off; a SIGSTOP it sent just before
            // may still arrive: serve a little longer so that it is not left to stop the process.
            stopping = Some(std::time::Instant::now());
        }
        if stopping.is_some_and(|t| t.elapsed() > Duration::from_millis(100)) {
            return;
        }
        let mut status = 0;
        // SAFETY: waitpid for any tracee or child of this thread.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
        if pid == 0 {
            thread::sleep(Duration::from_millis(2));
            continue;
        }
        if pid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)
                && exit_tx.is_none()
            {
                return;
            }
            thread::sleep(Duration::from_millis(10));
            continue;
        }
        let pid = pid as u32;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if pid == root
                && let Some(tx) = exit_tx.take()
            {
                let _ = tx.send(crate::launch::exit_code(status));
            }
            continue;
        }
        if libc::WIFSTOPPED(status) {
            on_stop(pid, status, requests);
        }
    }
}

/// Handles one ptrace stop and resumes the tracee.
fn on_stop(tid: u32, status: i32, requests: &mpsc::Sender<HoldRequest>) {
    let event = (status >> 16) & 0xff;
    let sig = libc::WSTOPSIG(status);
    let (request, data) = match event {
        libc::PTRACE_EVENT_EXIT => {
            // Only the whole process's exit matters: other threads go at once.
            let tgid = crate::procfs::tgid_of(tid);
            if tgid == Some(tid) {
                ask(tid, tid, HoldReason::Exit, requests);
            }
            (libc::PTRACE_CONT, 0)
        }
        libc::PTRACE_EVENT_STOP
            if matches!(
                sig,
                libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
            ) =>
        {
            (libc::PTRACE_LISTEN, 0) // a real group stop: leave it stopped
        }
        0 if sig == libc::SIGSTOP => {
            let tgid = crate::procfs::tgid_of(tid).unwrap_or(tid);
            let ours = ask(tid, tgid, HoldReason::Stop, requests);
            (libc::PTRACE_CONT, if ours { 0 } else { sig })
        }
        0 => (libc::PTRACE_CONT, sig), // signal-delivery stop: deliver it
        _ => (libc::PTRACE_CONT, 0),   // fork/vfork/clone events, new tracee's first stop
    };
    // SAFETY: resuming a tracee in ptrace-stop.
    unsafe { libc::ptrace(request, tid as libc::pid_t, 0, data as libc::c_long) };
}

/// Sends a request and waits for its answer (at most [`MAX_HOLD`]); logs how long the thread
/// was held.
fn ask(tid: u32, tgid: u32, reason: HoldReason, requests: &mpsc::Sender<HoldRequest>) -> bool {
    let t = std::time::Instant::now();
    let ours = answer(tid, tgid, reason, requests);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(tid, ?reason, ours, ms, "thread held");
    ours
}

fn answer(tid: u32, tgid: u32, reason: HoldReason, requests: &mpsc::Sender<HoldRequest>) -> bool {
    let (done, rx) = std_mpsc::channel();
    let req = HoldRequest {
        tid,
        tgid,
        reason,
        done,
    };
    // Unanswered, a stop is taken for the kernel side's: swallowing a user's SIGSTOP is the lesser
    // harm next to leaving a training job stopped with nobody to continue it.
    if requests.blocking_send(req).is_err() {
        return true;
    }
    rx.recv_timeout(MAX_HOLD).unwrap_or_else(|_| {
        tracing::warn!(tid, ?reason, "held thread not handled in time: resuming it");
        true
    })
}
