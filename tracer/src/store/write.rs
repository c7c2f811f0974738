//! Writing a run: its row, each snapshot as one transaction, its end.

use rusqlite::{OptionalExtension, params};

use super::{NewRun, Reason, Store, StoreError, stack_key};
use crate::model::now_unix;
use crate::report::Report;

impl Store {
    /// Starts a run; returns its id.
    pub fn begin_run(&mut self, run: &NewRun) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs (started_unix, mode, command, root_pid) VALUES (?1, ?2, ?3, ?4)",
                params![now_unix(), run.mode, run.command, run.root_pid],
            )
            .map_err(StoreError::doing("history: starting a run"))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Stores `report` as the next snapshot of `run` in one transaction; returns its sequence
    /// number (0 for the first). `report` is given back as it was (its stacks are set aside while
    /// its header is written).
    pub fn add_snapshot(
        &mut self,
        run: i64,
        reason: Reason,
        report: &mut Report,
    ) -> Result<i64, StoreError> {
        self.snapshot_tx(run, reason, report)
            .map_err(StoreError::doing(format!(
                "history: storing a snapshot of run {run}"
            )))
    }

    fn snapshot_tx(
        &mut self,
        run: i64,
        reason: Reason,
        report: &mut Report,
    ) -> rusqlite::Result<i64> {
        let tx = self.conn.transaction()?;
        let seq: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM snapshots WHERE run_id = ?1",
            params![run],
            |r| r.get(0),
        )?;
        let header = header_json(report);
        tx.execute(
            "INSERT INTO snapshots (run_id, seq, taken_unix, reason, header) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![run, seq, now_unix(), reason.name(), header],
        )?;
        let snapshot = tx.last_insert_rowid();
        for p in &report.processes {
            tx.execute(
                "INSERT INTO processes (run_id, pid, ppid, command) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (run_id, pid) DO UPDATE SET ppid = excluded.ppid, command = excluded.command",
                params![run, p.pid, p.ppid, p.command],
            )?;
        }
        for (rank, s) in report.stacks.iter().enumerate() {
            let key = stack_key(s);
            let existing: Option<i64> = tx
                .query_row(
                    "SELECT id FROM stacks WHERE run_id = ?1 AND key = ?2",
                    params![run, key],
                    |r| r.get(0),
                )
                .optional()?;
            let stack = match existing {
                Some(id) => id,
                None => {
                    tx.execute(
                        "INSERT INTO stacks (run_id, key, kind, frames) VALUES (?1, ?2, ?3, ?4)",
                        params![run, key, s.kind.name(), to_json(&s.frames)],
                    )?;
                    tx.last_insert_rowid()
                }
            };
            tx.execute(
                "INSERT INTO snapshot_stacks (snapshot_id, rank, stack_id, pid, inherited, bytes,
                 blocks, oldest_age_s, allocators, truncated)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    snapshot,
                    rank as i64,
                    stack,
                    s.pid,
                    s.inherited,
                    s.bytes as i64,
                    s.blocks as i64,
                    s.oldest_age_s,
                    to_json(&s.allocators),
                    s.truncated
                ],
            )?;
            if let Some(v) = &s.verdict {
                tx.execute(
                    "INSERT INTO verdicts (snapshot_id, rank, verdict, confidence, growth_bytes,
                     slope, evidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        snapshot,
                        rank as i64,
                        v.verdict.name(),
                        v.confidence,
                        v.growth_bytes,
                        v.slope_bytes_per_s,
                        to_json(v)
                    ],
                )?;
            }
        }
        tx.commit()?;
        Ok(seq)
    }

    pub fn set_root_pid(&mut self, run: i64, pid: u32) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET root_pid = ?1 WHERE id = ?2",
                params![pid, run],
            )
            .map(|_| ())
            .map_err(StoreError::doing(format!("history: run {run}")))
    }

    /// Marks `run` ended with the traced command's exit status (None for attach).
    pub fn end_run(&mut self, run: i64, exit_code: Option<i32>) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET ended_unix = ?1, exit_code = ?2 WHERE id = ?3",
                params![now_unix(), exit_code, run],
            )
            .map(|_| ())
            .map_err(StoreError::doing(format!("history: ending run {run}")))
    }
}

/// The report without its stacks (those are rows of their own), written with its stacks set
/// aside: turned into a JSON value whole and then cut, a Trainer job's report of a thousand deep
/// stacks took 40–50 ms for a header of 11 KB, most of what storing a snapshot cost.
fn header_json(report: &mut Report) -> String {
    let stacks = std::mem::take(&mut report.stacks);
    let header = to_json(report);
    report.stacks = stacks;
    header
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
