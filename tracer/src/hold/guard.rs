//! The guard: a second process that lets the traced job go on when leaktracer ends without
//! letting it go itself (killed, out of memory, an internal error).
//!
//! A thread the kernel side stopped for new code waits in its signal-delivery stop until the hold
//! thread resumes it with the SIGSTOP suppressed. If leaktracer dies then, the kernel detaches
//! the thread, and the thread may take that SIGSTOP (on 6.18 some runs it does, some runs the stop
//! is dropped): the job stops with no one to continue it, and a training run would hang there,
//! untraced. The guard is started when the root is seized and waits on a pipe that only
//! leaktracer writes: one byte when its holds have ended as they should, end of file when it died
//! holding them. Then, until a moment after leaktracer is gone (its tracees are detached as it
//! exits, after its files are closed), it continues every stopped process of the root's tree, and
//! says so.

use std::{
    io::{Read, Write},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

/// The name of the hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "hold-guard";

/// How long the guard goes on once leaktracer is gone and nothing more was found stopped: a
/// detached thread delivers its SIGSTOP the next time it runs, within milliseconds.
const AFTER: Duration = Duration::from_secs(1);

/// The longest the guard waits for leaktracer's end once its pipe is closed (a leaktracer that
/// closed it and lives on is not dying).
const MOST: Duration = Duration::from_secs(60);

/// The running guard, owned by the hold thread.
pub struct Guard {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Guard {
    /// Starts the guard for `root`'s tree; None, with a warning, when it cannot be started.
    pub fn start(root: u32) -> Option<Self> {
        let started = Command::new("/proc/self/exe")
            .args([
                SUBCOMMAND,
                &root.to_string(),
                &std::process::id().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn();
        match started {
            Ok(mut child) => Some(Self {
                pipe: child.stdin.take(),
                child,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "no guard for the traced job: if leaktracer is killed while it holds a thread, that thread stays stopped");
                None
            }
        }
    }

    /// The holds have ended: the guard ends without acting.
    pub fn release(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(b"1");
        }
        let _ = self.child.wait();
    }
}

impl Drop for Guard {
    /// Not released (the hold thread unwinding): the pipe stays open until leaktracer's end, which
    /// is when the guard must act, not before.
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            std::mem::forget(pipe);
        }
    }
}

/// The guard's process: waits on its standard input, then, if leaktracer (`tracer`, its parent)
/// died holding `root`'s tree, continues the tree's stopped processes. Returns its exit code.
pub fn watch(root: u32, tracer: u32) -> i32 {
    let mut byte = [0u8; 1];
    if matches!(std::io::stdin().read(&mut byte), Ok(1)) {
        return 0;
    }
    let start = Instant::now();
    // Once leaktracer is gone: when a process was last found stopped (or when it went). Its probes
    // may outlive it by a moment (their links are released after its exit), stopping more.
    let mut last: Option<Instant> = None;
    let mut continued: Vec<u32> = Vec::new();
    while last.is_none_or(|l| l.elapsed() < AFTER) && start.elapsed() < MOST {
        let now = continue_stopped(root);
        // SAFETY: getppid has no preconditions. Reparented: leaktracer has exited (its tracees
        // are detached before its children are handed on).
        let gone = unsafe { libc::getppid() } as u32 != tracer;
        if gone && (last.is_none() || !now.is_empty()) {
            last = Some(Instant::now());
        }
        continued.extend(now);
        std::thread::sleep(Duration::from_millis(10));
    }
    continued.sort_unstable();
    continued.dedup();
    if let Some(first) = continued.first() {
        let (n, others) = (continued.len(), continued.len() > 1);
        crate::say!(
            "leaktracer: ended while holding the traced job; continued what it left stopped: {n} process{} (pid {first}{})",
            if others { "es" } else { "" },
            if others { " and others" } else { "" }
        );
    }
    0
}

/// Sends SIGCONT to each process of `root`'s tree that is stopped; those it continued.
fn continue_stopped(root: u32) -> Vec<u32> {
    crate::procfs::tree(root)
        .into_iter()
        .filter(|&p| crate::procfs::state(p) == Some('T'))
        // SAFETY: kill with a plain signal number.
        .filter(|&p| unsafe { libc::kill(p as libc::pid_t, libc::SIGCONT) } == 0)
        .collect()
}
