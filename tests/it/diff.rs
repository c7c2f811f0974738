//! `leaktracer diff` between the reports of two runs of the same program: stacks matched across
//! pids, exact byte and block changes; unreadable input is a clear error.

use tests::fixture;

#[test]
fn two_runs_diff_by_stack() {
    let Some(short) = fixture::trace_fixture("patterns", &[], &["1", "10"]) else {
        return;
    };
    let long = fixture::trace_fixture("patterns", &[], &["1", "30"]).unwrap();
    let dir = fixture::target_dir().join("diff");
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("short.json"), dir.join("long.json"));
    std::fs::write(&a, short.last().0.to_string()).unwrap();
    std::fs::write(&b, long.last().0.to_string()).unwrap();
    let out = fixture::leaktracer_cmd()
        .args(["diff", "--json"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deltas: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = deltas
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "heap" && d["frames"][0] == "activations")
        .expect("activations in the diff");
    // 8 and 24 retained 64 KiB activations (4 steps of 5 keep one), plus the last step's 8 MiB.
    assert_eq!(d["delta_bytes"], 16 * 65536, "{d}");
    assert_eq!(
        (d["old_blocks"].as_u64(), d["new_blocks"].as_u64()),
        (Some(9), Some(25))
    );
    assert_eq!(d["change"], "grew");
    let lru = deltas
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "heap" && d["frames"][0] == "lru_put")
        .unwrap();
    assert_eq!(
        lru["delta_bytes"],
        20 * 65536,
        "10 → 30 cache entries (of 32)"
    );
}

#[test]
fn unreadable_reports_are_bad_arguments() {
    let out = fixture::leaktracer_cmd()
        .args(["diff", "/nonexistent/a.json", "/nonexistent/b.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading /nonexistent/a.json"), "{err}");
}
