//! What ends a session, and the clocks it keeps: the launched command's exit (a SIGTERM passed on
//! to it), the attached process's exit, the duration, Ctrl-C or SIGTERM; the owner's tickers.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::{launch, procfs};

/// A periodic tick of the owner's loop.
pub(super) type Ticker = tokio::time::Interval;

/// What the session follows to its end.
pub(super) enum Root {
    /// The launched command: its exit status ends the session.
    Launched,
    Attached {
        duration: Option<f64>,
    },
    /// `serve`: until Ctrl-C or SIGTERM.
    Serve,
}

/// Ticks at once, then every `interval` seconds.
pub(super) fn ticker_now(interval: f64) -> Ticker {
    let mut t = tokio::time::interval(Duration::from_secs_f64(interval));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Ticks every `interval` seconds from now on; never (in effect) when it is 0.
pub(super) fn ticker(interval: f64) -> Ticker {
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
pub(super) async fn interrupted() {
    let mut term = terminate();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated(&mut term) => {}
    }
}

/// SIGTERM, taken from its default action (which would end leaktracer without its report).
fn terminate() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok()
}

/// Resolves at the next SIGTERM; never where it could not be taken.
async fn terminated(term: &mut Option<tokio::signal::unix::Signal>) {
    match term.as_mut() {
        Some(t) => {
            t.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Resolves with the exit code when the session should end: the launched command exits (its
/// status), or for attach: the target exits, the duration passes or Ctrl-C (0).
pub(super) async fn end_of(root: Root, pid: u32, held_exit: Option<oneshot::Receiver<i32>>) -> i32 {
    match root {
        Root::Launched => launched_exit(pid, held_exit).await,
        Root::Serve => {
            interrupted().await;
            0
        }
        Root::Attached { duration } => {
            let limit = duration.map_or(Duration::MAX, Duration::from_secs_f64);
            tokio::select! {
                _ = tokio::time::sleep(limit) => {}
                _ = interrupted() => {}
                _ = exited(pid) => {}
            }
            0
        }
    }
}

/// The launched command's exit code. The hold thread reaps the command when it traces it;
/// otherwise it is waited for here.
async fn launched_exit(pid: u32, held_exit: Option<oneshot::Receiver<i32>>) -> i32 {
    let waiter = async move {
        match held_exit {
            Some(rx) => rx.await.unwrap_or(1),
            None => tokio::task::spawn_blocking(move || launch::wait(pid))
                .await
                .unwrap_or(1),
        }
    };
    tokio::pin!(waiter);
    let mut term = terminate();
    loop {
        tokio::select! {
            code = &mut waiter => break code,
            // The command got the same SIGINT from the terminal; its exit ends the session.
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: waiting for the command to exit"),
            // A SIGTERM is leaktracer's alone (a supervisor's, a CI timeout's): passed on to the
            // command, whose exit ends the session with its final report, as for Ctrl-C.
            _ = terminated(&mut term) => {
                // SAFETY: kill with a plain signal number.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                tracing::info!("SIGTERM: passed to the command; waiting for it to exit");
            }
        }
    }
}

async fn exited(pid: u32) {
    while !procfs::has_exited(pid) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
