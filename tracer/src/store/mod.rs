//! History in embedded SQLite (rusqlite, bundled): runs, their processes, stacks with symbolized
//! frames, snapshots and verdicts. WAL journal: a snapshot is one transaction, and once committed
//! it survives the writer being killed. Retention is bounded by age and size (see `Retention`).
//!
//! The session owns a `Writer` (a thread owning the connection, fed by messages); `report --run`
//! and `diff` (diff.rs: two snapshots compared) read the file through `Store`.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::{model::now_unix, report::Report};

pub mod diff;
mod error;
mod read;
mod write;
mod writer;

pub use error::StoreError;
pub use read::{RunRow, SnapshotRow, runs_text, when};
pub use writer::Writer;

/// Bumped when the tables change; an older file is refused with a clear message, not misread.
const SCHEMA_VERSION: i64 = 1;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_unix REAL NOT NULL,
    ended_unix REAL,
    mode TEXT NOT NULL,
    command TEXT NOT NULL,
    root_pid INTEGER NOT NULL,
    exit_code INTEGER
);
CREATE TABLE IF NOT EXISTS processes (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    pid INTEGER NOT NULL,
    ppid INTEGER,
    command TEXT NOT NULL,
    PRIMARY KEY (run_id, pid)
);
CREATE TABLE IF NOT EXISTS stacks (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    frames TEXT NOT NULL,
    UNIQUE (run_id, key)
);
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    taken_unix REAL NOT NULL,
    reason TEXT NOT NULL,
    header TEXT NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE TABLE IF NOT EXISTS snapshot_stacks (
    snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    stack_id INTEGER NOT NULL REFERENCES stacks(id) ON DELETE CASCADE,
    pid INTEGER NOT NULL,
    inherited INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    blocks INTEGER NOT NULL,
    oldest_age_s REAL NOT NULL,
    allocators TEXT NOT NULL,
    truncated INTEGER NOT NULL,
    PRIMARY KEY (snapshot_id, rank)
);
CREATE TABLE IF NOT EXISTS verdicts (
    snapshot_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    confidence REAL NOT NULL,
    growth_bytes INTEGER NOT NULL,
    slope REAL NOT NULL,
    evidence TEXT NOT NULL,
    PRIMARY KEY (snapshot_id, rank),
    FOREIGN KEY (snapshot_id, rank) REFERENCES snapshot_stacks(snapshot_id, rank) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS snapshots_run ON snapshots(run_id, seq);
CREATE INDEX IF NOT EXISTS stacks_run ON stacks(run_id);
";

/// How much history is kept: runs older than `max_age_days` go, then the oldest runs until the
/// file's used pages fit in `max_bytes` (the running session's own run is thinned last).
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub max_age_days: f64,
    pub max_bytes: u64,
}

impl Default for Retention {
    /// 30 days, 1 GiB.
    fn default() -> Self {
        Self {
            max_age_days: 30.0,
            max_bytes: 1 << 30,
        }
    }
}

/// Why a snapshot was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Every --snapshot seconds.
    Periodic,
    /// SIGUSR1 to leaktracer (or an API request).
    OnDemand,
    /// The session's end.
    Exit,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Self::Periodic => "periodic",
            Self::OnDemand => "on_demand",
            Self::Exit => "exit",
        }
    }
}

/// A run as the writer starts it.
#[derive(Clone, Debug)]
pub struct NewRun {
    /// run, attach or check.
    pub mode: &'static str,
    pub command: String,
    pub root_pid: u32,
}

/// The history file leaktracer uses when none is given: $LEAKTRACER_DB, else
/// $XDG_DATA_HOME/leaktracer/history.db, else ~/.local/share/leaktracer/history.db.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("LEAKTRACER_DB") {
        return p.into();
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/var/lib"));
    base.join("leaktracer/history.db")
}

/// An open history file.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens (creating it and its directory if needed) for writing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unusable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let conn = Connection::open(path).map_err(|e| open_error(path, &e))?;
        let store = Self {
            conn,
            path: path.to_owned(),
        };
        store.setup(true)?;
        Ok(store)
    }

    /// Opens an existing file for reading only.
    pub fn open_read(path: &Path) -> Result<Self, StoreError> {
        if !path.exists() {
            return Err(StoreError::Unusable(format!(
                "no history at {} (runs are stored there by `run`, `attach` and `check`; --store picks another file)",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| open_error(path, &e))?;
        let store = Self {
            conn,
            path: path.to_owned(),
        };
        store.setup(false)?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn setup(&self, write: bool) -> Result<(), StoreError> {
        let fail = StoreError::sql(&self.path);
        self.conn
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(fail)?;
        self.conn
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(fail)?;
        if write {
            // Must precede the first table for a new file; a no-op on an existing one.
            self.conn
                .pragma_update(None, "auto_vacuum", "INCREMENTAL")
                .map_err(fail)?;
            let mode: String = self
                .conn
                .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
                .map_err(fail)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Unusable(format!(
                    "history {}: WAL journal not available (got {mode})",
                    self.path.display()
                )));
            }
            // In WAL mode NORMAL keeps every commit across a crash of this process; only a power
            // loss may undo the last ones.
            self.conn
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(fail)?;
            self.conn.execute_batch(TABLES).map_err(fail)?;
            self.conn
                .execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )
                .map_err(fail)?;
        }
        let version: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| {
                StoreError::Unusable(format!(
                    "{} is not a leaktracer history: {e}",
                    self.path.display()
                ))
            })?;
        match version.as_deref().and_then(|v| v.parse::<i64>().ok()) {
            Some(SCHEMA_VERSION) => Ok(()),
            Some(v) => Err(StoreError::Unusable(format!(
                "{} holds history schema {v}; this leaktracer reads schema {SCHEMA_VERSION}",
                self.path.display()
            ))),
            None => Err(StoreError::Unusable(format!(
                "{} is not a leaktracer history",
                self.path.display()
            ))),
        }
    }

    /// Removes runs past the retention limits, never `keep` (the running session's run); if
    /// that run alone is over the size limit, its oldest periodic snapshots go. Returns the runs
    /// and snapshots removed.
    pub fn enforce(
        &mut self,
        limits: Retention,
        keep: Option<i64>,
    ) -> Result<(u64, u64), StoreError> {
        let fail = |source| StoreError::Sql {
            context: "history retention".into(),
            source,
        };
        let keep = keep.unwrap_or(-1);
        let cutoff = now_unix() - limits.max_age_days * 86400.0;
        let mut runs = self
            .conn
            .execute(
                "DELETE FROM runs WHERE started_unix < ?1 AND id != ?2",
                params![cutoff, keep],
            )
            .map_err(fail)? as u64;
        let mut snapshots = 0;
        while self.used_bytes().map_err(fail)? > limits.max_bytes {
            let oldest: Option<i64> = self
                .conn
                .query_row(
                    "SELECT id FROM runs WHERE id != ?1 ORDER BY started_unix, id LIMIT 1",
                    params![keep],
                    |r| r.get(0),
                )
                .optional()
                .map_err(fail)?;
            if let Some(id) = oldest {
                self.conn
                    .execute("DELETE FROM runs WHERE id = ?1", params![id])
                    .map_err(fail)?;
                runs += 1;
                continue;
            }
            // Only the running session is left: drop the older half of its periodic snapshots.
            let n = self
                .conn
                .execute(
                    "DELETE FROM snapshots WHERE id IN (SELECT id FROM snapshots
                     WHERE run_id = ?1 AND reason = 'periodic' ORDER BY seq
                     LIMIT (SELECT (COUNT(*) + 1) / 2 FROM snapshots
                            WHERE run_id = ?1 AND reason = 'periodic'))",
                    params![keep],
                )
                .map_err(fail)? as u64;
            snapshots += n;
            if n == 0 {
                break;
            }
        }
        if runs + snapshots > 0 {
            self.conn
                .execute_batch("PRAGMA incremental_vacuum;")
                .map_err(fail)?;
        }
        Ok((runs, snapshots))
    }

    /// Bytes in pages that hold data (the file minus its free list).
    fn used_bytes(&self) -> rusqlite::Result<u64> {
        let q = |pragma: &str| -> rusqlite::Result<u64> {
            self.conn
                .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get::<_, i64>(0))
                .map(|v| v.max(0) as u64)
        };
        Ok((q("page_count")? - q("freelist_count")?) * q("page_size")?)
    }
}

fn open_error(path: &Path, e: &rusqlite::Error) -> StoreError {
    StoreError::Unusable(format!("cannot open history {}: {e}", path.display()))
}

/// The key a stack is stored under in its run: kind and frames (module+offset, stable across
/// processes of one binary), so the same stack in two snapshots is one row.
fn stack_key(s: &crate::report::StackReport) -> String {
    let mut key = s.kind.name().to_string();
    for f in &s.frames {
        key.push('|');
        key.push_str(f.module.as_deref().unwrap_or("?"));
        key.push('+');
        key.push_str(&f.offset);
    }
    key
}

/// A stored snapshot read back: the report as it was taken.
pub struct Snapshot {
    pub run: i64,
    pub seq: i64,
    pub reason: String,
    pub taken_unix: f64,
    pub report: Report,
}

#[cfg(test)]
mod tests;
