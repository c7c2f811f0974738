//! History on real SQLite files in a temporary directory, with reports from synthetic ledgers.

use std::path::PathBuf;

use rusqlite::params;

use super::*;
use crate::report::synthetic::{ledger_with, report_of};

fn temp_db(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leaktracer-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("sub/history.db")
}

fn run_info() -> NewRun {
    NewRun {
        mode: "run",
        command: "train.py --epochs 3".into(),
        root_pid: 1,
    }
}

fn count(store: &Store, table: &str) -> i64 {
    store
        .conn
        .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_snapshot_reads_back_as_the_report_it_was() {
    let path = temp_db("roundtrip");
    let mut store = Store::open(&path).unwrap();
    let run = store.begin_run(&run_info()).unwrap();
    let (ledger, analysis) = ledger_with(5, 6);
    let mut report = report_of(&ledger, &analysis, 3);
    assert_eq!(report.stacks.len(), 3);
    assert!(report.stacks.iter().all(|s| s.verdict.is_some()));
    assert_eq!(
        store
            .add_snapshot(run, Reason::Periodic, &mut report)
            .unwrap(),
        0
    );
    assert_eq!(
        store.add_snapshot(run, Reason::Exit, &mut report).unwrap(),
        1
    );
    drop(store);

    let store = Store::open_read(&path).unwrap();
    let back = store.snapshot(run, -1).unwrap();
    assert_eq!((back.seq, back.reason.as_str()), (1, "exit"));
    assert_eq!(
        serde_json::to_value(&back.report).unwrap(),
        serde_json::to_value(&report).unwrap()
    );
    assert_eq!(store.snapshot(run, 0).unwrap().reason, "periodic");
    assert_eq!(store.snapshot(run, -2).unwrap().seq, 0);
    // Two snapshots of the same three stacks: three stack rows, six placements, six verdicts.
    assert_eq!(count(&store, "stacks"), 3);
    assert_eq!(count(&store, "snapshot_stacks"), 6);
    assert_eq!(count(&store, "verdicts"), 6);
    let runs = store.runs().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].snapshots, runs[0].ended_unix), (2, None));
    assert!(
        store
            .snapshot(run, 2)
            .err()
            .unwrap()
            .to_string()
            .contains("no snapshot 2 (2 stored)")
    );
    assert!(
        store
            .snapshot(run + 1, -1)
            .err()
            .unwrap()
            .to_string()
            .contains("no run")
    );
}

#[test]
fn runs_end_with_their_exit_code() {
    let path = temp_db("end");
    let mut store = Store::open(&path).unwrap();
    let a = store.begin_run(&run_info()).unwrap();
    let b = store.begin_run(&run_info()).unwrap();
    store.end_run(a, Some(3)).unwrap();
    let runs = store.runs().unwrap();
    assert_eq!(runs[0].exit_code, Some(3));
    assert!(runs[0].ended_unix.is_some());
    assert_eq!((runs[1].exit_code, runs[1].ended_unix), (None, None));
    assert_eq!(store.last_run().unwrap(), b);
}

#[test]
fn runs_past_the_age_limit_are_removed_with_their_rows() {
    let path = temp_db("age");
    let mut store = Store::open(&path).unwrap();
    let (ledger, analysis) = ledger_with(4, 5);
    let mut report = report_of(&ledger, &analysis, 4);
    let old = store.begin_run(&run_info()).unwrap();
    store.add_snapshot(old, Reason::Exit, &mut report).unwrap();
    let new = store.begin_run(&run_info()).unwrap();
    store.add_snapshot(new, Reason::Exit, &mut report).unwrap();
    let forty_days_ago = now_unix() - 40.0 * 86400.0;
    store
        .conn
        .execute(
            "UPDATE runs SET started_unix = ?1 WHERE id = ?2",
            params![forty_days_ago, old],
        )
        .unwrap();
    let removed = store.enforce(Retention::default(), None).unwrap();
    assert_eq!(removed, (1, 0));
    let runs = store.runs().unwrap();
    assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [new]);
    assert_eq!(count(&store, "snapshots"), 1);
    assert_eq!(count(&store, "stacks"), 4);
    assert_eq!(count(&store, "snapshot_stacks"), 4);
    assert_eq!(count(&store, "verdicts"), 4);
}

#[test]
fn over_the_size_limit_older_runs_go_then_the_running_one_is_thinned() {
    let path = temp_db("size");
    let mut store = Store::open(&path).unwrap();
    let (ledger, analysis) = ledger_with(200, 5);
    let mut report = report_of(&ledger, &analysis, 200);
    let old = store.begin_run(&run_info()).unwrap();
    store.add_snapshot(old, Reason::Exit, &mut report).unwrap();
    let current = store.begin_run(&run_info()).unwrap();
    for _ in 0..8 {
        store
            .add_snapshot(current, Reason::Periodic, &mut report)
            .unwrap();
    }
    let used = store.used_bytes().unwrap();
    // Room for about half of what is stored now.
    let limits = Retention {
        max_age_days: 30.0,
        max_bytes: used / 2,
    };
    let (runs, snapshots) = store.enforce(limits, Some(current)).unwrap();
    assert_eq!(runs, 1);
    assert!(snapshots >= 4, "{snapshots} snapshots thinned");
    assert!(store.used_bytes().unwrap() <= used / 2);
    let left = store.runs().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, current);
    // The newest snapshot of the running session is kept.
    assert_eq!(store.snapshot(current, -1).unwrap().seq, 7);
}

#[test]
fn a_file_that_is_not_a_history_is_refused() {
    let path = temp_db("foreign");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        "not a database at all, just some text that is long enough",
    )
    .unwrap();
    let err = Store::open_read(&path).err().unwrap().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    let missing = temp_db("missing");
    let err = Store::open_read(&missing).err().unwrap().to_string();
    assert!(err.contains("no history at"), "{err}");
}

#[test]
fn an_empty_history_has_no_last_run() {
    let path = temp_db("empty");
    let store = Store::open(&path).unwrap();
    assert!(
        store
            .last_run()
            .err()
            .unwrap()
            .to_string()
            .contains("holds no runs")
    );
}

#[test]
fn the_writer_thread_commits_everything_before_finish_returns() {
    let path = temp_db("writer");
    let (ledger, analysis) = ledger_with(3, 5);
    let w = Writer::start(&path, &run_info(), Retention::default()).unwrap();
    let run = w.run;
    for _ in 0..3 {
        w.snapshot(report_of(&ledger, &analysis, 3), Reason::Periodic);
    }
    w.snapshot(report_of(&ledger, &analysis, 3), Reason::Exit);
    let done = w.finish(Some(0));
    assert_eq!((done.snapshots, done.failed), (4, 0));
    let store = Store::open_read(&path).unwrap();
    let runs = store.runs().unwrap();
    assert_eq!((runs[0].id, runs[0].snapshots), (run, 4));
    assert_eq!(runs[0].exit_code, Some(0));
    assert_eq!(store.snapshot(run, -1).unwrap().reason, "exit");
}

#[test]
fn times_print_as_utc_dates() {
    assert_eq!(when(0.0), "1970-01-01 00:00:00 UTC");
    assert_eq!(when(1_700_000_000.5), "2023-11-14 22:13:20 UTC");
    assert_eq!(when(951_782_400.0), "2000-02-29 00:00:00 UTC");
}
