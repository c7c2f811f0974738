//! Exports of a real run checked by the tools that read them: the pprof profile decoded by protoc
//! against pprof's own profile.proto, the Prometheus exposition by promtool; both carry the exact
//! bytes of the JSON report.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use tests::{fixture, report::frame_fn};

/// Where Debian's golang-github-google-pprof-dev puts pprof's profile.proto (setup installs it).
const PPROF_PROTO_DIR: &str = "/usr/share/gocode/src/github.com/google/pprof/proto";

fn tool(cmd: &mut Command, what: &str) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{what} (installed by scripts/setup.sh): {e}"))
}

#[test]
fn pprof_and_prometheus_exports_read_back_with_exact_bytes() {
    let dir = fixture::target_dir().join("exports");
    std::fs::create_dir_all(&dir).unwrap();
    let (pprof, prom) = (dir.join("heap.pb.gz"), dir.join("metrics.prom"));
    let Some(t) = fixture::trace_fixture(
        "patterns",
        &[
            "--sample",
            "0.1",
            "--pprof",
            pprof.to_str().unwrap(),
            "--prometheus",
            prom.to_str().unwrap(),
        ],
        // Long enough (about 40 samples) for the verdict to be sure under a loaded machine.
        &["40", "100"],
    ) else {
        return;
    };
    let r = t.last();
    let leak = r
        .stacks()
        .iter()
        .find(|s| s["kind"] == "heap" && frame_fn(s, 0) == Some("activations"))
        .expect("activations stack");
    let bytes = leak["bytes"].as_u64().unwrap();
    assert_eq!(leak["verdict"]["verdict"], "leak");

    let raw = tool(Command::new("gzip").arg("-dc").arg(&pprof), "gzip");
    assert!(raw.status.success());
    let mut child = Command::new("protoc")
        .args([
            "--decode",
            "perftools.profiles.Profile",
            "-I",
            PPROF_PROTO_DIR,
        ])
        .arg("profile.proto")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("protoc (installed by scripts/setup.sh)");
    child.stdin.take().unwrap().write_all(&raw.stdout).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("\nsample {").count(),
        r.stacks().len(),
        "one sample per stack"
    );
    assert!(text.contains("string_table: \"inuse_space\""));
    assert!(text.contains("string_table: \"activations\""));
    assert!(
        text.contains(&format!("value: {bytes}\n")),
        "{bytes} not in the profile"
    );

    let check = tool(
        Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&prom).unwrap()),
        "promtool",
    );
    assert!(
        check.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let metrics = std::fs::read_to_string(&prom).unwrap();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("leaktracer_stack_outstanding_bytes{")
                && l.contains("kind=\"heap\"")
                && l.contains("site=\"activations (patterns.c:")
        })
        .unwrap_or_else(|| panic!("no activations line:\n{metrics}"));
    assert!(line.contains("verdict=\"leak\""), "{line}");
    assert!(line.ends_with(&format!(" {bytes}")), "{line}");
    let root = r.root_pid();
    let heap_total = r.process(root)["own"]["heap"]["bytes"].as_u64().unwrap();
    assert!(
        metrics.contains(&format!("kind=\"heap\"}} {heap_total}\n")),
        "{heap_total}"
    );
}
