//! History in SQLite from real sessions: periodic snapshots survive `kill -9` of leaktracer and a
//! restart appends; SIGUSR1 stores a snapshot on demand; `report --run` and `diff run:ID:N` read
//! stored snapshots; bad history arguments are clear errors.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::fixture;

fn fresh_db(name: &str) -> PathBuf {
    let db = fixture::target_dir().join(format!("{name}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    db
}

/// `leaktracer SUBCOMMAND --store DB ARGS…`.
fn leaktracer(db: &Path, args: &[&str]) -> Output {
    fixture::leaktracer_cmd()
        .arg(args[0])
        .arg("--store")
        .arg(db)
        .args(&args[1..])
        .output()
        .expect("leaktracer")
}

fn ok_json(o: &Output) -> Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON output")
}

fn runs(db: &Path) -> Vec<Value> {
    ok_json(&leaktracer(db, &["report", "--list", "--json"]))
        .as_array()
        .expect("runs")
        .clone()
}

fn snapshot(db: &Path, run: u64, n: i64) -> Value {
    let (run, n) = (run.to_string(), n.to_string());
    ok_json(&leaktracer(
        db,
        &["report", "--run", &run, "--snapshot", &n, "--json"],
    ))
}

/// Starts `leaktracer -v run --store DB EXTRA -- patterns ARGS` and waits until it traces.
fn start(db: &Path, extra: &[&str], args: &[&str]) -> Child {
    let bin = fixture::build("patterns");
    let mut c = fixture::leaktracer_cmd()
        .args(["-v", "run", "-o", "/dev/null", "--store"])
        .arg(db)
        .args(extra)
        .arg("--")
        .arg(&bin)
        .args(args)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("leaktracer run");
    let mut log = String::new();
    let mut lines = BufReader::new(c.stderr.take().unwrap()).lines();
    for l in lines.by_ref().map_while(Result::ok) {
        log.push_str(&l);
        if l.contains("tracing") {
            break;
        }
    }
    assert!(log.contains("tracing"), "never traced: {log}");
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    c
}

fn kill(pid: u32) {
    // SAFETY: sends a signal.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn a_killed_tracer_keeps_every_committed_snapshot_and_a_restart_appends() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let db = fresh_db("history-kill");
    let mut tracer = start(&db, &["--snapshot", "0.2"], &["20", "400"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let r = runs(&db);
        if r.first()
            .is_some_and(|r| r["snapshots"].as_u64() >= Some(3))
        {
            break r[0].clone();
        }
        assert!(Instant::now() < deadline, "no snapshots stored: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let committed = listed["snapshots"].as_u64().unwrap();
    let last_seen = snapshot(&db, 1, committed as i64 - 1);
    kill(tracer.id());
    tracer.wait().unwrap();
    kill(listed["root_pid"].as_u64().unwrap() as u32);

    let after = runs(&db);
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["mode"], "run");
    assert!(after[0]["ended_unix"].is_null(), "{}", after[0]);
    assert!(after[0]["snapshots"].as_u64().unwrap() >= committed);
    assert_eq!(snapshot(&db, 1, committed as i64 - 1), last_seen);
    assert_eq!(last_seen["schema"], "leaktracer.report/1");
    assert!(
        last_seen["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["frames"][0]["function"] == "activations"),
        "{last_seen}"
    );

    // A new session on the same file appends its run; the killed one is kept as it was.
    let bin = fixture::build("patterns");
    let o = leaktracer(
        &db,
        &[
            "run",
            "-o",
            "/dev/null",
            "--snapshot",
            "0",
            "--",
            bin.to_str().unwrap(),
            "5",
            "10",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("run 2 stored in"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after = runs(&db);
    assert_eq!(after.len(), 2);
    assert!(after[0]["snapshots"].as_u64().unwrap() >= committed);
    assert_eq!(snapshot(&db, 1, committed as i64 - 1), last_seen);
    assert_eq!(
        (
            after[1]["snapshots"].as_u64(),
            after[1]["exit_code"].as_i64()
        ),
        (Some(1), Some(0))
    );
}

#[test]
fn sigusr1_stores_a_snapshot_and_stored_snapshots_diff() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let db = fresh_db("history-usr1");
    let mut tracer = start(&db, &["--snapshot", "0"], &["20", "100"]);
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(600));
        // SAFETY: sends a signal.
        unsafe { libc::kill(tracer.id() as i32, libc::SIGUSR1) };
    }
    assert_eq!(tracer.wait().unwrap().code(), Some(0));
    let r = runs(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0]["snapshots"].as_u64(), r[0]["exit_code"].as_i64()),
        (Some(3), Some(0))
    );
    let text = |n: &str| {
        let o = leaktracer(&db, &["report", "--run", "1", "--snapshot", n]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        text("0").starts_with("run 1, snapshot 0 (on_demand, "),
        "{}",
        text("0")
    );
    assert!(text("1").starts_with("run 1, snapshot 1 (on_demand, "));
    assert!(text("-1").starts_with("run 1, snapshot 2 (exit, "));
    let last = snapshot(&db, 1, -1);
    assert_eq!(last["final"], true);
    assert_eq!(snapshot(&db, 1, 0)["final"], false);

    // The activations stack keeps 64 KiB per step: it grew between the first and last snapshot.
    let o = leaktracer(&db, &["diff", "--json", "run:1:0", "run:1"]);
    let deltas = ok_json(&o);
    let act = deltas
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "heap" && d["frames"][0] == "activations")
        .unwrap_or_else(|| panic!("{deltas}"));
    let grew = act["delta_bytes"].as_i64().unwrap();
    assert!(grew > 0 && grew % 65536 == 0, "{act}");
    assert_eq!(act["change"], "grew");
}

#[test]
fn bad_history_arguments_are_clear_errors() {
    let missing = fixture::target_dir().join("no-such-history.db");
    let o = leaktracer(&missing, &["report"]);
    assert_eq!(o.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no history at"));
    let not_db = fixture::target_dir().join("not-a-history.db");
    std::fs::write(
        &not_db,
        "plain text, not SQLite, long enough to have a header",
    )
    .unwrap();
    let o = leaktracer(&not_db, &["report", "--list"]);
    assert_eq!(o.status.code(), Some(6));
    let db = fresh_db("history-empty");
    // A history with one run and no such run 99.
    if fixture::bpf_available() {
        let _x = fixture::exclusive();
        let o = leaktracer(&db, &["run", "-o", "/dev/null", "--", "true"]);
        assert_eq!(o.status.code(), Some(0));
        let o = leaktracer(&db, &["report", "--run", "99"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("no run 99"));
        let o = leaktracer(&db, &["diff", "run:1", "run:x"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("run:ID or run:ID:N"));
        // A history named with --store that cannot be created stops the session before CMD runs.
        let o = fixture::leaktracer_cmd()
            .args(["run", "--store", "/proc/no/such/dir/h.db", "--", "touch"])
            .arg(fixture::target_dir().join("must-not-exist"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(6));
        assert!(String::from_utf8_lossy(&o.stderr).contains("cannot create /proc/no/such/dir"));
        assert!(!fixture::target_dir().join("must-not-exist").exists());
        // So does a report file that cannot be written (the command once stayed stopped).
        let o = fixture::leaktracer_cmd()
            .args(["run", "-o", "/proc/no/such/dir/r.txt", "--", "touch"])
            .arg(fixture::target_dir().join("must-not-exist"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("cannot write report file /proc/no/such/dir"),
            "{err}"
        );
        assert!(!fixture::target_dir().join("must-not-exist").exists());
    }
}

/// Each command stores its runs under its own name: a `check` run reads back as mode "check"
/// (it was stored as "run"), a `run` as "run", with the command line that was traced.
#[test]
fn check_runs_are_stored_as_check() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let db = fresh_db("history-modes");
    let bin = fixture::build("patterns");
    let bin = bin.to_str().expect("utf-8 path");
    let checked = leaktracer(&db, &["check", "--budget", "1GiB/s", "--", bin, "1", "5"]);
    assert_eq!(
        checked.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let ran = leaktracer(&db, &["run", "-o", "/dev/null", "--", bin, "1", "5"]);
    assert_eq!(ran.status.code(), Some(0));
    let stored = runs(&db);
    let modes: Vec<(&str, &str)> = stored
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["command"].as_str().unwrap()))
        .collect();
    let command = format!("{bin} 1 5");
    assert_eq!(
        modes,
        [("check", command.as_str()), ("run", command.as_str())],
        "oldest first"
    );
}
