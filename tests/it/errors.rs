//! Bad input: one-line errors and documented exit codes, never a panic.

use std::process::Command;

use tests::fixture;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = fixture::leaktracer_cmd()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "panic: {err}");
    (out.status.code().unwrap_or(-1), err)
}

#[test]
fn missing_pid_is_a_target_error() {
    let (code, err) = run(&["attach", "999999999"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no process with pid 999999999"), "{err}");
}

#[test]
fn kernel_thread_is_refused() {
    // kthreadd is pid 2 on Linux.
    let (code, err) = run(&["attach", "2"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("kernel thread"), "{err}");
}

#[test]
fn command_not_found_exits_127() {
    if !fixture::bpf_available() {
        return;
    }
    let (code, err) = run(&["run", "--", "no-such-command-xyz"], &[]);
    assert_eq!(code, 127, "{err}");
    assert!(
        err.contains("command not found: no-such-command-xyz"),
        "{err}"
    );
}

#[test]
fn kernel_without_btf_or_uprobes_is_a_kernel_error() {
    if !fixture::bpf_available() {
        return;
    }
    let empty = fixture::target_dir().join("empty-sysfs");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, err) = run(
        &["run", "--", "true"],
        &[("LEAKTRACER_SYSFS", empty.to_str().unwrap())],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("no BTF"), "{err}");
    let btf_only = fixture::target_dir().join("btf-only-sysfs/kernel/btf");
    std::fs::create_dir_all(&btf_only).unwrap();
    std::fs::write(btf_only.join("vmlinux"), b"").unwrap();
    let root = fixture::target_dir().join("btf-only-sysfs");
    let (code, err) = run(
        &["run", "--", "true"],
        &[("LEAKTRACER_SYSFS", root.to_str().unwrap())],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("uprobe"), "{err}");
}

#[test]
fn unprivileged_user_gets_a_permission_error() {
    if !fixture::bpf_available() {
        return;
    }
    // Drop to nobody with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(fixture::leaktracer())
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("permission denied"), "{err}");
}

#[test]
fn bad_flags_are_usage_errors() {
    let (code, err) = run(&["run", "--interval", "-3", "--", "true"], &[]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = run(&["attach", "1", "--duration", "0"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--duration"), "{err}");
    let (code, _) = run(&["attach", "not-a-pid"], &[]);
    assert_eq!(code, 2);
}

#[test]
fn no_libc_in_target_is_refused() {
    if !fixture::bpf_available() {
        return;
    }
    // A static binary maps no libc.
    let dir = fixture::target_dir().join("fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("static_sleep.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { sleep(30); return 0; }\n",
    )
    .unwrap();
    let bin = dir.join("static_sleep");
    assert!(
        Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .unwrap()
            .success()
    );
    let mut child = Command::new(&bin).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (code, err) = run(&["attach", &child.id().to_string()], &[]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no libc"), "{err}");
}

#[test]
fn bad_heap_mode_ring_size_sample_interval_or_heap_start_is_a_usage_error() {
    for args in [
        &["--heap", "some"][..],
        &["--ring-mb", "3"],
        &["--ring-mb", "2048"],
        &["--heap", "sampled", "--sample-bytes", "100"],
        &["--heap", "off", "--heap-after", "5"],
        &["--heap-after", "-1"],
        &["--heap-after", "soon"],
    ] {
        let out = tests::fixture::leaktracer_cmd()
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--heap") || err.contains("--ring-mb") || err.contains("--sample-bytes"),
            "{args:?}: {err}"
        );
    }
}

/// A terminal that went away (stderr or stdout piped into a reader that stopped) loses lines,
/// not the run: its command's exit status and its report file as always. Debug logging writes
/// to stderr all through the run, so most writes find it closed.
#[test]
fn a_closed_stderr_or_stdout_loses_lines_not_the_run() {
    if !fixture::bpf_available() {
        return;
    }
    use std::process::Stdio;
    let report = fixture::target_dir().join("closed-stderr.json");
    let _ = std::fs::remove_file(&report);
    let mut child = fixture::leaktracer_cmd()
        .args([
            "run",
            "--no-store",
            "--json",
            "-o",
            report.to_str().unwrap(),
        ])
        .args(["--", "sh", "-c", "exit 3"])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let text = std::fs::read_to_string(&report).expect("the report written");
    let last = tests::report::Report::parse(text.lines().last().unwrap()).unwrap();
    assert!(last.0["events"].as_u64() > Some(0), "{text}");
    // `check` into a reader that read nothing: the gate's own exit status (0: a command that
    // keeps nothing).
    let mut child = fixture::leaktracer_cmd()
        .args(["check", "--no-store", "--", "true"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
