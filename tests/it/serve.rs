//! `serve`: the daemon adopts running processes by command name, cgroup and CUDA mapping, leaves
//! the others alone, and accounts what each does once adopted, exactly.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tests::{fixture, report::Report};

/// A copy of `bin` under the name `name` (command-name filters see it), started and ready.
fn start_as(bin: &Path, name: &str) -> Child {
    let dir = fixture::target_dir().join("serve");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(name);
    std::fs::copy(bin, &copy).unwrap();
    let mut child = Command::new(&copy).stdout(Stdio::piped()).spawn().unwrap();
    fixture::wait_ready(&mut child);
    child
}

/// A cgroup of our own (cgroup v2: at /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid
/// layouts), removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new() -> Self {
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|r| r.join("cgroup.procs").exists())
            .expect("a cgroup v2 hierarchy");
        let dir = root.join(format!("leaktracer-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating a cgroup");
        Self(dir)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .expect("moving into the cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn serve_adopts_matching_processes_and_accounts_them_exactly() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let plain = fixture::build("attach_target");
    let cuda = fixture::fake_cuda();
    let with_cuda = fixture::build_variant(
        "attach_target_cuda",
        "attach_target",
        &[
            "-DWITH_CUDA",
            cuda.join("libcudart.so.13").to_str().unwrap(),
            &format!("-Wl,-rpath,{}", cuda.display()),
        ],
    );
    let by_name = start_as(&plain, "lt_srv_named");
    let in_cgroup = start_as(&plain, "lt_srv_cgroup");
    let on_gpu = start_as(&with_cuda, "lt_srv_gpu");
    let other = start_as(&plain, "lt_srv_other");
    let cgroup = Cgroup::new();
    cgroup.add(in_cgroup.id());
    let out = fixture::target_dir().join("serve").join("report.jsonl");
    let mut tracer = fixture::leaktracer_cmd()
        .args(["serve", "--comm", "lt_srv_named", "--cuda", "--cgroup"])
        .arg(&cgroup.0)
        .args(["--ui=127.0.0.1:0", "--no-store", "--json", "-o"])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("leaktracer serve");
    let mut lines = BufReader::new(tracer.stderr.take().unwrap()).lines();
    let wanted = [by_name.id(), in_cgroup.id(), on_gpu.id()];
    let mut adopted = Vec::new();
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while adopted.len() < wanted.len() && Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("leaktracer: tracing ") {
            adopted.push(
                rest.split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<u32>()
                    .unwrap(),
            );
        }
        log.push(line);
    }
    adopted.sort_unstable();
    let mut expect = wanted.to_vec();
    expect.sort_unstable();
    assert_eq!(adopted, expect, "{}", log.join("\n"));
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    for mut child in [by_name, in_cgroup, on_gpu, other] {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        assert!(child.wait().unwrap().success());
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = tracer.wait().unwrap();
    log.extend(rest.join().unwrap());
    assert_eq!(status.code(), Some(0), "{}", log.join("\n"));
    let text = std::fs::read_to_string(&out).unwrap();
    let r = Report::parse(text.lines().last().unwrap()).unwrap();
    let mut pids: Vec<u32> = r
        .processes()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap() as u32)
        .collect();
    pids.sort_unstable();
    assert_eq!(pids, expect, "only the matching processes are traced");
    for pid in wanted {
        let (bytes, blocks) = r
            .sum(|s| s["pid"] == pid && tests::report::frame_fn(s, 0) == Some("leak_after_attach"));
        assert_eq!((bytes, blocks), (7000, 7), "pid {pid}");
        assert_eq!(r.process(u64::from(pid))["exited"], true);
    }
    let (device, n) = r.sum(|s| s["kind"] == "device");
    assert_eq!((device, n), (3 << 20, 1), "the CUDA process's device leak");
    fixture::wait_for_detached_probes();
}

#[test]
fn serve_without_a_filter_or_with_a_missing_cgroup_is_a_usage_error() {
    for (args, msg) in [
        (&[][..], "serve needs at least one filter"),
        (
            &["--cgroup", "/sys/fs/cgroup/no-such-group-here"][..],
            "no such cgroup",
        ),
        (&["--scan", "0"][..], "--scan must be at least"),
    ] {
        let out = fixture::leaktracer_cmd()
            .arg("serve")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}
