//! Building the C fixtures and running leaktracer on them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Mutex, MutexGuard, OnceLock},
};

use anyhow::{Context as _, bail};

use crate::report::Report;

/// Flags that keep every leak in its own frame (FACTS: -O2 deletes malloc/free pairs and turns
/// `return malloc(n)` into a tail call).
pub const CFLAGS: &[&str] = &[
    "-O1",
    "-fno-builtin",
    "-fno-optimize-sibling-calls",
    "-fno-omit-frame-pointer",
    "-g",
    "-pthread",
];

/// The profile directory (target/debug) holding the leaktracer binary, found above the test
/// executable (scripts/test.sh builds the binary first).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .find(|d| d.join("leaktracer").is_file())
        .unwrap_or_else(|| {
            panic!(
                "no leaktracer binary above {}: build it first (cargo build -p tracer)",
                exe.display()
            )
        })
        .to_path_buf()
}

/// A scratch directory inside the target directory.
pub fn target_dir() -> PathBuf {
    profile_dir().join("test-scratch")
}

/// The leaktracer binary.
pub fn leaktracer() -> PathBuf {
    profile_dir().join("leaktracer")
}

/// Builds `tests/fixtures/NAME.c` once per test run; returns the binary's path.
pub fn build(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let out_dir = target_dir().join("fixtures");
    let out = out_dir.join(name);
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name) {
        return out;
    }
    std::fs::create_dir_all(&out_dir).expect("fixtures dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("{name}.c"));
    let status = Command::new("gcc")
        .args(CFLAGS)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc failed for {}", src.display());
    built.push(name.to_string());
    out
}

/// Whether BPF tests can run here; under CI they must (a test that cannot run fails).
pub fn bpf_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("BPF tests need root and CI=true forbids skipping them");
    }
    eprintln!("skipping: BPF tests need root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)");
    false
}

/// One BPF test at a time: concurrent tracers would each add their probes to every allocation.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The outcome of `leaktracer run --json`.
pub struct Traced {
    pub output: Output,
    pub reports: Vec<Report>,
}

impl Traced {
    pub fn last(&self) -> &Report {
        self.reports.last().expect("at least the final report")
    }
}

/// Runs `leaktracer run --json -o FILE [extra…] -- argv…` and parses every report it wrote.
pub fn trace(extra: &[&str], argv: &[&str]) -> anyhow::Result<Traced> {
    let dir = target_dir().join("reports");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!(
        "{}-{}.json",
        Path::new(argv[0]).file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let output = Command::new(leaktracer())
        .args(["run", "--json", "--top", "1000", "-o"])
        .arg(&file)
        .args(extra)
        .arg("--")
        .args(argv)
        .output()
        .context("running leaktracer")?;
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let reports = text
        .lines()
        .map(Report::parse)
        .collect::<anyhow::Result<Vec<_>>>()?;
    if reports.is_empty() {
        bail!(
            "no report; stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(Traced { output, reports })
}

/// Builds fixture `name` and traces it (`leaktracer run EXTRA -- fixture ARGS`), one test at a time;
/// `None` when BPF tests cannot run here (and may be skipped).
pub fn trace_fixture(name: &str, extra: &[&str], args: &[&str]) -> Option<Traced> {
    if !bpf_available() {
        return None;
    }
    let _x = exclusive();
    let bin = build(name);
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    Some(trace(extra, &argv).expect("leaktracer run"))
}
