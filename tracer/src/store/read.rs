//! Reading history back: the list of runs, and any snapshot as the report it was.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{Snapshot, Store, StoreError};
use crate::report::{Report, StackReport};

/// One run in `report --list`.
#[derive(Debug, Serialize)]
pub struct RunRow {
    pub id: i64,
    pub started_unix: f64,
    /// None while running, or when leaktracer was killed before the end.
    pub ended_unix: Option<f64>,
    pub mode: String,
    pub command: String,
    pub root_pid: u32,
    pub exit_code: Option<i32>,
    pub snapshots: u64,
    /// Time of the last stored snapshot.
    pub last_snapshot_unix: Option<f64>,
}

/// One stored snapshot of a run, without its stacks.
#[derive(Debug, Serialize)]
pub struct SnapshotRow {
    pub seq: i64,
    pub reason: String,
    pub taken_unix: f64,
    pub stacks: u64,
}

impl Store {
    /// Every run, oldest first.
    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let fail = StoreError::sql(&self.path);
        let mut q = self
            .conn
            .prepare(
                "SELECT r.id, r.started_unix, r.ended_unix, r.mode, r.command, r.root_pid,
                        r.exit_code, COUNT(s.id), MAX(s.taken_unix)
                 FROM runs r LEFT JOIN snapshots s ON s.run_id = r.id
                 GROUP BY r.id ORDER BY r.id",
            )
            .map_err(fail)?;
        let rows = q
            .query_map([], |r| {
                Ok(RunRow {
                    id: r.get(0)?,
                    started_unix: r.get(1)?,
                    ended_unix: r.get(2)?,
                    mode: r.get(3)?,
                    command: r.get(4)?,
                    root_pid: r.get(5)?,
                    exit_code: r.get(6)?,
                    snapshots: r.get::<_, i64>(7)? as u64,
                    last_snapshot_unix: r.get(8)?,
                })
            })
            .map_err(fail)?;
        rows.collect::<Result<_, _>>().map_err(fail)
    }

    /// The snapshots stored for `run`, oldest first (None: no such run).
    pub fn snapshot_list(&self, run: i64) -> Result<Option<Vec<SnapshotRow>>, StoreError> {
        let fail = StoreError::sql(&self.path);
        let exists = self
            .conn
            .query_row("SELECT 1 FROM runs WHERE id = ?1", params![run], |_| Ok(()))
            .optional()
            .map_err(fail)?
            .is_some();
        if !exists {
            return Ok(None);
        }
        let mut q = self
            .conn
            .prepare(
                "SELECT s.seq, s.reason, s.taken_unix, COUNT(ss.rank)
                 FROM snapshots s LEFT JOIN snapshot_stacks ss ON ss.snapshot_id = s.id
                 WHERE s.run_id = ?1 GROUP BY s.id ORDER BY s.seq",
            )
            .map_err(fail)?;
        let rows = q
            .query_map(params![run], |r| {
                Ok(SnapshotRow {
                    seq: r.get(0)?,
                    reason: r.get(1)?,
                    taken_unix: r.get(2)?,
                    stacks: r.get::<_, i64>(3)? as u64,
                })
            })
            .map_err(fail)?;
        rows.collect::<Result<_, _>>().map(Some).map_err(fail)
    }

    /// The newest run's id.
    pub fn last_run(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("SELECT MAX(id) FROM runs", [], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .map_err(StoreError::sql(&self.path))?
            .ok_or_else(|| {
                StoreError::Missing(format!("history {} holds no runs", self.path.display()))
            })
    }

    /// Snapshot `seq` of `run` (negative: from the end, -1 the last).
    pub fn snapshot(&self, run: i64, seq: i64) -> Result<Snapshot, StoreError> {
        let fail = StoreError::sql(&self.path);
        let count: i64 = self
            .conn
            .query_row(
                "SELECT COUNT(*) FROM snapshots WHERE run_id = ?1",
                params![run],
                |r| r.get(0),
            )
            .map_err(fail)?;
        let exists: bool = self
            .conn
            .query_row(
                "SELECT COUNT(*) FROM runs WHERE id = ?1",
                params![run],
                |r| r.get::<_, i64>(0),
            )
            .map_err(fail)?
            > 0;
        if !exists {
            return Err(StoreError::Missing(format!(
                "no run {run} in {}",
                self.path.display()
            )));
        }
        // Sequence numbers can have gaps (retention thins long runs): index among those kept.
        let index = if seq < 0 { count + seq } else { seq };
        let row = if seq < 0 {
            self.conn
                .query_row(
                    "SELECT id, seq, reason, taken_unix, header FROM snapshots
                     WHERE run_id = ?1 ORDER BY seq LIMIT 1 OFFSET ?2",
                    params![run, index],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()
        } else {
            self.conn
                .query_row(
                    "SELECT id, seq, reason, taken_unix, header FROM snapshots
                     WHERE run_id = ?1 AND seq = ?2",
                    params![run, seq],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()
        }
        .map_err(fail)?;
        let (id, seq, reason, taken_unix, header): (i64, i64, String, f64, String) = row
            .ok_or_else(|| {
                StoreError::Missing(match count {
                    0 => format!("run {run} has no snapshots stored"),
                    n => format!("run {run} has no snapshot {seq} ({n} stored)"),
                })
            })?;
        let mut report: Report = serde_json::from_str(&header).map_err(|e| {
            StoreError::Unreadable(format!("run {run} snapshot {seq}: unreadable report: {e}"))
        })?;
        report.stacks = self.stacks(id).map_err(fail)?;
        Ok(Snapshot {
            run,
            seq,
            reason,
            taken_unix,
            report,
        })
    }

    fn stacks(&self, snapshot: i64) -> rusqlite::Result<Vec<StackReport>> {
        let mut q = self.conn.prepare(
            "SELECT st.kind, st.frames, ss.pid, ss.inherited, ss.bytes, ss.blocks,
                    ss.oldest_age_s, ss.allocators, ss.truncated, v.evidence
             FROM snapshot_stacks ss JOIN stacks st ON st.id = ss.stack_id
             LEFT JOIN verdicts v ON v.snapshot_id = ss.snapshot_id AND v.rank = ss.rank
             WHERE ss.snapshot_id = ?1 ORDER BY ss.rank",
        )?;
        let rows = q.query_map(params![snapshot], |r| {
            let json = |i: usize| -> rusqlite::Result<serde_json::Value> {
                let text: String = r.get(i)?;
                serde_json::from_str(&text).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
                })
            };
            let kind = serde_json::Value::String(r.get(0)?);
            let evidence: Option<String> = r.get(9)?;
            let value = serde_json::json!({
                "pid": r.get::<_, u32>(2)?,
                "kind": kind,
                "inherited": r.get::<_, bool>(3)?,
                "bytes": r.get::<_, i64>(4)?,
                "blocks": r.get::<_, i64>(5)?,
                "oldest_age_s": r.get::<_, f64>(6)?,
                "allocators": json(7)?,
                "truncated": r.get::<_, bool>(8)?,
                "verdict": evidence.as_deref().map(serde_json::from_str::<serde_json::Value>).transpose().ok().flatten(),
                // A stack that holds no block is one released at the end with a leak verdict:
                // outstanding stacks hold at least one.
                "released": r.get::<_, i64>(5)? == 0 && evidence.is_some(),
                "frames": json(1)?,
            });
            serde_json::from_value(value).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
            })
        })?;
        rows.collect()
    }
}

/// A Unix time as UTC "YYYY-MM-DD HH:MM:SS".
pub fn when(unix: f64) -> String {
    let secs = unix as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// `report --list` as text: one line per run.
pub fn runs_text(runs: &[RunRow]) -> String {
    use std::fmt::Write as _;
    let mut s = String::from(
        "  run  started                  mode    snapshots  status           command\n",
    );
    for r in runs {
        let status = match (r.ended_unix, r.exit_code) {
            (Some(e), Some(c)) => format!("exit {c} after {:.0}s", e - r.started_unix),
            (Some(e), None) => format!("ended after {:.0}s", e - r.started_unix),
            (None, _) => "not ended".to_string(),
        };
        let _ = writeln!(
            s,
            "{:>5}  {}  {:<7} {:>9}  {:<15}  {}",
            r.id,
            when(r.started_unix),
            r.mode,
            r.snapshots,
            status,
            r.command
        );
    }
    s
}
