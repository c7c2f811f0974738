//! Holding traced processes at exit. A process's mappings vanish the moment it exits, and a short
//! program can finish before ingest has read the events of its last libraries. The traced root is
//! seized with ptrace (PTRACE_O_TRACEEXIT, children followed through fork/vfork), so each process
//! stops at the start of its exit with its memory intact; ingest captures its mappings and drains
//! its events, then it goes on. Nothing else is intercepted: signals are passed through, group stops
//! are left alone (PTRACE_LISTEN), the real parent sees nothing. When the tracer ends, the kernel
//! detaches every tracee.

use std::{sync::mpsc as std_mpsc, thread, time::Duration};

use tokio::sync::{mpsc, oneshot};

/// A request to ingest: capture `pid` (stopped at exit) and answer when done.
pub type HoldRequest = (u32, std_mpsc::Sender<()>);

/// Longest a process is held if ingest does not answer.
const MAX_HOLD: Duration = Duration::from_secs(5);

/// The running hold thread.
pub struct Hold {
    /// The root's exit status, when the root is our child (`run`).
    pub root_exit: oneshot::Receiver<i32>,
    /// Send to end the thread; the kernel then detaches the tracees still alive.
    pub stop: std_mpsc::Sender<()>,
}

/// Seizes `root` and starts the hold thread. `None` when ptrace is not possible (already traced,
/// not permitted): tracing goes on without exit holds.
pub fn start(root: u32, requests: mpsc::Sender<HoldRequest>) -> Option<Hold> {
    let (seized_tx, seized_rx) = std_mpsc::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = std_mpsc::channel();
    thread::Builder::new()
        .name("exit-hold".into())
        .spawn(move || {
            let ok = seize(root);
            let _ = seized_tx.send(ok);
            if ok {
                serve(root, &requests, exit_tx, &stop_rx);
            }
        })
        .ok()?;
    match seized_rx.recv() {
        Ok(true) => Some(Hold {
            root_exit: exit_rx,
            stop: stop_tx,
        }),
        _ => None,
    }
}

fn seize(pid: u32) -> bool {
    let opts = libc::PTRACE_O_TRACEEXIT | libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK;
    // SAFETY: ptrace on a pid with no memory arguments.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            0,
            opts as libc::c_long,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(pid, error = %e, "cannot hold processes at exit (ptrace); short-lived processes may lose symbols");
    }
    r == 0
}

fn serve(
    root: u32,
    requests: &mpsc::Sender<HoldRequest>,
    exit_tx: oneshot::Sender<i32>,
    stop: &std_mpsc::Receiver<()>,
) {
    let mut exit_tx = Some(exit_tx);
    loop {
        if stop.try_recv().is_ok() {
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
fn on_stop(pid: u32, status: i32, requests: &mpsc::Sender<HoldRequest>) {
    let event = (status >> 16) & 0xff;
    let sig = libc::WSTOPSIG(status);
    let (request, data) = match event {
        libc::PTRACE_EVENT_EXIT => {
            let (tx, rx) = std_mpsc::channel();
            if requests.blocking_send((pid, tx)).is_ok() && rx.recv_timeout(MAX_HOLD).is_err() {
                tracing::warn!(pid, "ingest did not capture the exiting process in time");
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
        0 => (libc::PTRACE_CONT, sig), // signal-delivery stop: deliver it
        _ => (libc::PTRACE_CONT, 0),   // fork/vfork events, new tracee's first stop
    };
    // SAFETY: resuming a tracee in ptrace-stop.
    unsafe { libc::ptrace(request, pid as libc::pid_t, 0, data as libc::c_long) };
}
