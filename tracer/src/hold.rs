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
    /// A traced process forked or vforked the process `tid` (the parent's process is `tgid`):
    /// the child has not run yet, and does not until this is answered. Only while
    /// [`hold_forks`] is on: native processes traced whole are traced through probes of their
    /// own, which a child must have before its first instruction.
    Fork,
}

/// Whether new processes wait at their parent's fork until the session has seen them.
static HOLD_FORKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Holds new processes at their parent's fork ([`HoldReason::Fork`]), or no longer.
pub fn hold_forks(on: bool) {
    HOLD_FORKS.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn forks_held() -> bool {
    HOLD_FORKS.load(std::sync::atomic::Ordering::Relaxed)
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
    /// moment longer, for a stop sent just before, unless no tracee is left).
    pub fn stop(&self) {
        let _ = self.tx.send(());
        self.wake();
    }

    /// Waits for the thread's end, its guard released: leaktracer does not exit before, or the
    /// guard would take it for a death while holding. The thread waits for its tracees in a
    /// blocking `waitpid`: it is woken until it has ended (a wake sent just before it blocked
    /// would be lost).
    pub fn join(self) {
        while !self.thread.is_finished() {
            self.wake();
            thread::sleep(Duration::from_millis(2));
        }
        let _ = self.thread.join();
    }

    /// Interrupts the thread's `waitpid` (EINTR).
    fn wake(&self) {
        use std::os::unix::thread::JoinHandleExt;
        if !self.thread.is_finished() {
            // SAFETY: the thread has not been joined, so its pthread_t is valid; the signal's
            // handler does nothing (installed by `start`).
            unsafe { libc::pthread_kill(self.thread.as_pthread_t(), wake_signal()) };
        }
    }
}

/// The signal that interrupts the hold thread's blocking `waitpid`.
fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

/// Installs a handler that does nothing for [`wake_signal`], without SA_RESTART, so that it
/// interrupts a blocking system call instead of ending the process.
fn install_wake_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn nothing(_: libc::c_int) {}
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler that touches nothing is valid; the mask is
        // emptied before use.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(wake_signal(), &action, std::ptr::null_mut());
        }
    });
}

/// Seizes `root` and starts the hold thread. `None` when ptrace is not possible (already traced,
/// not permitted): tracing goes on without exit holds.
pub fn start(root: u32, requests: mpsc::Sender<HoldRequest>) -> Option<Hold> {
    let (seized_tx, seized_rx) = std_mpsc::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = std_mpsc::channel();
    install_wake_handler();
    let thread = thread::Builder::new()
        .name("exit-hold".into())
        .spawn(move || {
            let seized = seize(root);
            let ok = !seized.is_empty();
            let guard = ok.then(|| guard::Guard::start(root)).flatten();
            let _ = seized_tx.send(ok);
            if ok {
                let tracees = seized.into_iter().collect();
                serve(root, tracees, &requests, exit_tx, &stop_rx);
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
/// appear while listing are picked up by listing again until nothing new shows. Returns the
/// threads seized, none when the first could not be.
fn seize(pid: u32) -> Vec<u32> {
    let mut seized: Vec<u32> = Vec::new();
    loop {
        let threads = crate::procfs::threads(pid);
        let new: Vec<u32> = threads
            .into_iter()
            .filter(|t| !seized.contains(t))
            .collect();
        if new.is_empty() {
            return seized;
        }
        for tid in new {
            if let Err(e) = seize_one(tid) {
                if seized.is_empty() {
                    tracing::warn!(pid, error = %e, "cannot hold the traced processes (ptrace): libraries loaded later are probed late, short-lived processes may lose symbols");
                    return seized;
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

/// How long the thread serves once told to stop while tracees live: a SIGSTOP the kernel side
/// sent just before its stops were turned off may still arrive.
const STOPPING: Duration = Duration::from_millis(100);

/// Waits for the tracees' stops and exits until told to stop. `tracees`: the threads and
/// processes traced now (seized, then followed through clone and fork, until their death is
/// reported).
fn serve(
    root: u32,
    mut tracees: std::collections::HashSet<u32>,
    requests: &mpsc::Sender<HoldRequest>,
    exit_tx: oneshot::Sender<i32>,
    stop: &std_mpsc::Receiver<()>,
) {
    let mut exit_tx = Some(exit_tx);
    let mut stopping: Option<std::time::Instant> = None;
    // New tracees whose first stop came before their parent's fork or clone event: they wait
    // for it, where forks are held.
    let mut early = std::collections::HashSet::new();
    loop {
        if stopping.is_none() && stop.try_recv().is_ok() {
            stopping = Some(std::time::Instant::now());
            resume_all(&mut early);
        }
        // With no tracee left, no stop can come.
        if stopping.is_some_and(|t| t.elapsed() > STOPPING || tracees.is_empty()) {
            return;
        }
        // Blocking until told to stop (the stopper's signal interrupts it), polled after.
        let flags = libc::__WALL | if stopping.is_some() { libc::WNOHANG } else { 0 };
        let mut status = 0;
        // SAFETY: waitpid for any tracee or child of this thread.
        let pid = unsafe { libc::waitpid(-1, &mut status, flags) };
        if pid == 0 {
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::ECHILD) if exit_tx.is_none() => return,
                _ => thread::sleep(Duration::from_millis(10)),
            }
            continue;
        }
        let pid = pid as u32;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            tracees.remove(&pid);
            // A parent gone before its fork's event stop (killed): its child goes on.
            resume_orphans(&mut early, &tracees);
            if pid == root
                && let Some(tx) = exit_tx.take()
            {
                let _ = tx.send(crate::launch::exit_code(status));
            }
            continue;
        }
        if libc::WIFSTOPPED(status) {
            let first = tracees.insert(pid);
            if first
                && stopping.is_none()
                && forks_held()
                && event_of(status) == libc::PTRACE_EVENT_STOP
            {
                early.insert(pid);
                continue;
            }
            if let Some(new) = on_stop(pid, status, requests) {
                tracees.insert(new);
                if early.remove(&new) {
                    resume(new, libc::PTRACE_CONT, 0);
                }
            }
        }
    }
}

/// The ptrace event of a stop's status (0 for a signal-delivery stop).
fn event_of(status: i32) -> i32 {
    (status >> 16) & 0xff
}

/// Resumes a tracee in ptrace-stop.
fn resume(tid: u32, request: libc::c_uint, sig: i32) {
    // SAFETY: resuming a tracee in ptrace-stop; no memory arguments.
    unsafe { libc::ptrace(request, tid as libc::pid_t, 0, sig as libc::c_long) };
}

/// Resumes the new tracees waiting for their parent's event.
fn resume_all(early: &mut std::collections::HashSet<u32>) {
    for tid in early.drain() {
        resume(tid, libc::PTRACE_CONT, 0);
    }
}

/// Resumes the new tracees waiting for the event of a parent that is no longer traced (they
/// were handed to another when it died).
fn resume_orphans(
    early: &mut std::collections::HashSet<u32>,
    tracees: &std::collections::HashSet<u32>,
) {
    let orphans: Vec<u32> = early
        .iter()
        .copied()
        .filter(|&t| crate::procfs::ppid_of(t).is_none_or(|p| !tracees.contains(&p)))
        .collect();
    for tid in orphans {
        early.remove(&tid);
        resume(tid, libc::PTRACE_CONT, 0);
    }
}

/// Handles one ptrace stop and resumes the tracee. Returns the new tracee of a clone, fork or
/// vfork event.
fn on_stop(tid: u32, status: i32, requests: &mpsc::Sender<HoldRequest>) -> Option<u32> {
    let event = event_of(status);
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
    let new = matches!(
        event,
        libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK
    )
    .then(|| event_message(tid))
    .flatten();
    // A forked child runs once its own first stop is resumed, after this: the session has seen
    // it by then.
    if let Some(child) = new
        && forks_held()
        && matches!(event, libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK)
    {
        let parent = crate::procfs::tgid_of(tid).unwrap_or(tid);
        ask(child, parent, HoldReason::Fork, requests);
    }
    resume(tid, request, data);
    new
}

/// The event message of a tracee in an event stop: the new thread's or process's id for clone,
/// fork and vfork.
fn event_message(tid: u32) -> Option<u32> {
    let mut message: libc::c_ulong = 0;
    // SAFETY: PTRACE_GETEVENTMSG writes one unsigned long to the address given.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid as libc::pid_t,
            0,
            &mut message as *mut libc::c_ulong,
        )
    };
    (r == 0).then_some(message as u32)
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
