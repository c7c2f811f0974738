//! `attach` to a running process: what it allocates from then on is exact, what it frees from
//! before is counted as unmatched, and the session ends when the target exits.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use tests::{fixture, report::Report};

#[test]
fn attach_sees_what_happens_after_it_and_counts_earlier_frees() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("attach_target");
    let mut target = Command::new(&bin).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(target.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let out = fixture::target_dir().join("attach.json");
    let pid = target.id().to_string();
    let mut tracer = Command::new(fixture::leaktracer())
        .args(["-v", "attach", &pid, "--json", "--top", "100", "-o"])
        .arg(&out)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the probes are attached and the pid is traced.
    let stderr = BufReader::new(tracer.stderr.take().unwrap());
    let mut lines = stderr.lines();
    let mut log = String::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        log.push_str(&l);
        log.push('\n');
        if l.contains("tracing") {
            break;
        }
    }
    assert!(log.contains("tracing"), "tracer never attached: {log}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(target.id() as i32, libc::SIGUSR1) };
    assert!(target.wait().unwrap().success());
    let status = tracer.wait().unwrap();
    assert_eq!(status.code(), Some(0), "attach ends with the target: {log}");
    let text = std::fs::read_to_string(&out).unwrap();
    let r = Report::parse(text.lines().last().unwrap()).unwrap();
    assert_eq!(r.site("heap", 0, "leak_after_attach"), (7000, 7));
    assert_eq!(
        r.site("heap", 0, "before_attach"),
        (0, 0),
        "allocated before attaching: unseen"
    );
    let p = r.process(target.id() as u64);
    assert_eq!(
        p["mismatches"]["unmatched_frees"], 3,
        "the 3 early blocks freed after attach"
    );
    assert_eq!(p["exited"], true);
}
