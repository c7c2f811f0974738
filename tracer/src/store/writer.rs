//! The session's history writer: a thread owning the connection, so a slow disk never stalls the
//! ledger's loop. It takes reports as messages and commits each as one snapshot.

use std::{
    path::Path,
    sync::mpsc,
    thread::{self, JoinHandle},
};

use super::{NewRun, Reason, Retention, Store, StoreError};
use crate::report::Report;

/// Snapshots between retention checks during a long run.
const ENFORCE_EVERY: u64 = 32;

enum Msg {
    RootPid(u32),
    Snapshot(Box<Report>, Reason),
    End(Option<i32>),
}

/// What the writer did, for the session's last words.
#[derive(Debug, Default)]
pub struct Written {
    pub snapshots: u64,
    /// Snapshots that could not be stored (each was logged).
    pub failed: u64,
}

pub struct Writer {
    pub run: i64,
    pub path: std::path::PathBuf,
    tx: mpsc::Sender<Msg>,
    thread: JoinHandle<Written>,
}

impl Writer {
    /// Opens the history, applies retention and starts the run; errors here are the user's to see
    /// (a path that cannot be written, a file that is not a history).
    pub fn start(path: &Path, run: &NewRun, limits: Retention) -> Result<Self, StoreError> {
        let mut store = Store::open(path)?;
        let (runs, _) = store.enforce(limits, None)?;
        if runs > 0 {
            tracing::info!(runs, "history: removed runs past retention");
        }
        let id = store.begin_run(run)?;
        let (tx, rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("history".into())
            .spawn(move || write_loop(store, id, limits, rx))
            .map_err(StoreError::Thread)?;
        Ok(Self {
            run: id,
            path: path.to_owned(),
            tx,
            thread,
        })
    }

    /// Records the root pid of a launched command (known once it is started).
    pub fn set_root_pid(&self, pid: u32) {
        let _ = self.tx.send(Msg::RootPid(pid));
    }

    /// Queues a snapshot.
    pub fn snapshot(&self, report: Report, reason: Reason) {
        let _ = self.tx.send(Msg::Snapshot(Box::new(report), reason));
    }

    /// Ends the run and waits until everything queued is committed.
    pub fn finish(self, exit_code: Option<i32>) -> Written {
        let _ = self.tx.send(Msg::End(exit_code));
        drop(self.tx);
        self.thread.join().unwrap_or_default()
    }
}

fn write_loop(mut store: Store, run: i64, limits: Retention, rx: mpsc::Receiver<Msg>) -> Written {
    let mut done = Written::default();
    for msg in rx {
        match msg {
            Msg::Snapshot(mut report, reason) => match store.add_snapshot(run, reason, &mut report)
            {
                Ok(seq) => {
                    done.snapshots += 1;
                    tracing::debug!(run, seq, reason = reason.name(), "snapshot stored");
                    if done.snapshots % ENFORCE_EVERY == 0
                        && let Err(e) = store.enforce(limits, Some(run))
                    {
                        tracing::warn!("{e}");
                    }
                }
                Err(e) => {
                    done.failed += 1;
                    tracing::warn!("{e}");
                }
            },
            Msg::RootPid(pid) => {
                if let Err(e) = store.set_root_pid(run, pid) {
                    tracing::warn!("{e}");
                }
            }
            Msg::End(code) => {
                if let Err(e) = store.end_run(run, code) {
                    tracing::warn!("{e}");
                }
            }
        }
    }
    done
}
