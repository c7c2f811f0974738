//! Building the C fixtures and running leaktracer on them.

use std::{
    io::{BufRead, BufReader, Lines},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, ChildStdout, Command, Output, Stdio},
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
/// A `leaktracer` command whose runs go to the tests' own history file (target/test-history.db),
/// not the user's.
pub fn leaktracer_cmd() -> Command {
    let mut c = Command::new(leaktracer());
    c.env("LEAKTRACER_DB", test_history());
    c
}

/// The history file the tests' runs are stored in.
pub fn test_history() -> PathBuf {
    target_dir().join("test-history.db")
}

pub fn build(name: &str) -> PathBuf {
    build_with(name, &[])
}

/// As [`build`], with extra gcc arguments after the source (libraries to link).
pub fn build_with(name: &str, extra: &[&str]) -> PathBuf {
    build_variant(name, name, extra)
}

/// Builds `tests/fixtures/SOURCE.c` with extra gcc arguments into the binary `name`.
pub fn build_variant(name: &str, source: &str, extra: &[&str]) -> PathBuf {
    let out = target_dir().join("fixtures").join(name);
    let src = fixtures_src().join(format!("{source}.c"));
    let mut args: Vec<String> = CFLAGS.iter().map(|s| s.to_string()).collect();
    args.extend(["-o".into(), path_str(&out), path_str(&src)]);
    args.extend(extra.iter().map(|s| s.to_string()));
    compile_once(&out, &args);
    out
}

/// Builds `tests/fixtures/SOURCE.cpp` with g++ and `flags` only (as a user builds C++: no
/// frame pointers at `-O2`) into the binary `name`.
pub fn build_cxx(name: &str, source: &str, flags: &[&str]) -> PathBuf {
    build_as_user(name, &format!("{source}.cpp"), flags)
}

/// Builds `tests/fixtures/FILE` (C with gcc, C++ with g++) with `flags` only, as its users
/// build it, into the binary `name`.
pub fn build_as_user(name: &str, file: &str, flags: &[&str]) -> PathBuf {
    let out = target_dir().join("fixtures").join(name);
    let src = fixtures_src().join(file);
    let compiler = if file.ends_with(".c") { "gcc" } else { "g++" };
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.extend(["-o".into(), path_str(&out), path_str(&src)]);
    compile_once_with(compiler, &out, &args);
    out
}

/// The stand-in CUDA driver and runtime (libcuda.so.1, libcudart.so.13, tests/fixtures/fakecuda),
/// built once; returns their directory. The runtime finds the driver beside it, as a real install
/// finds it on the loader's path. Its symbols carry the real library's version, and it is built
/// against the CUDA headers of the wheel set ([`cuda_headers`]), as PyTorch's CUDA build expects
/// of the runtime it loads.
pub fn fake_cuda() -> PathBuf {
    let dir = target_dir().join("fixtures").join("fakecuda");
    let src = fixtures_src().join("fakecuda");
    let include = format!("-I{}", path_str(&cuda_headers()));
    let cudart = version_script(&dir, "libcudart.so.13", "cuda*; __cuda*;");
    let libs: [(&str, &[&str], Vec<String>); 2] = [
        ("libcuda.so.1", &["cuda.c"], vec![]),
        (
            "libcudart.so.13",
            &["cudart.c", "runtime.c"],
            vec![include, cudart, "-ldl".into()],
        ),
    ];
    for (soname, sources, extra) in libs {
        let sources: Vec<PathBuf> = sources.iter().map(|s| src.join(s)).collect();
        shared_library(&dir.join(soname), &sources, &extra);
    }
    dir
}

/// The stand-in CUDA libraries a training script on PyTorch's CUDA wheel runs on (its real
/// caching allocator, on this machine): the driver and runtime of [`fake_cuda`], and cuBLAS and
/// cuBLASLt stand-ins whose routines are every one the wheel's libraries import (weak stubs
/// reporting success, computing nothing; tests/fixtures/fakecuda/cublas*.c define those that
/// hand something back), and NVML's few calls (nvml.c). The environment to run the script in:
/// the runtime and cuBLAS preloaded in place of the wheel's, the driver and NVML on the loader's
/// path.
pub fn torch_cuda() -> Vec<String> {
    static ENV: OnceLock<Vec<String>> = OnceLock::new();
    ENV.get_or_init(build_torch_cuda).clone()
}

fn build_torch_cuda() -> Vec<String> {
    let dir = fake_cuda();
    let src = fixtures_src().join("fakecuda");
    shared_library(&dir.join("libnvidia-ml.so.1"), &[src.join("nvml.c")], &[]);
    let mut preload = vec![path_str(&dir.join("libcudart.so.13"))];
    for (soname, source, prefix) in [
        ("libcublas.so.13", "cublas.c", "cublas"),
        ("libcublasLt.so.13", "cublaslt.c", "cublasLt"),
    ] {
        let out = dir.join(soname);
        let stubs = dir.join(format!("{prefix}_imported.c"));
        let body: String = imported_by_torch(soname)
            .iter()
            .map(|n| format!("__attribute__((weak)) int {n}(void) {{ return 0; }}\n"))
            .collect();
        let map = version_script(&dir, soname, &format!("{prefix}*;"));
        std::fs::write(&stubs, body).expect("stubs");
        shared_library(&out, &[src.join(source), stubs], &[map]);
        preload.push(path_str(&out));
    }
    vec![
        format!("LD_PRELOAD={}", preload.join(" ")),
        format!("LD_LIBRARY_PATH={}", path_str(&dir)),
    ]
}

/// The wheel set scripts/setup.sh installs for the machine's python3 (torch, its CUDA libraries).
pub fn pydeps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.pydeps")
}

/// The CUDA headers that come with the wheel set (triton's copy, complete with `crt/`).
fn cuda_headers() -> PathBuf {
    let dir = pydeps().join("triton/backends/nvidia/include");
    assert!(
        dir.join("cuda_runtime_api.h").is_file() && dir.join("crt/host_defines.h").is_file(),
        "no CUDA headers at {} (scripts/setup.sh installs the torch wheel set)",
        dir.display()
    );
    dir
}

/// The functions of `soname` that the torch wheel's libraries import, by their version.
fn imported_by_torch(soname: &str) -> Vec<String> {
    let lib = pydeps().join("torch/lib");
    let libs = std::fs::read_dir(&lib).expect("torch/lib");
    let sos: Vec<PathBuf> = libs
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .collect();
    let out = Command::new("objdump")
        .arg("-T")
        .args(&sos)
        .output()
        .expect("objdump");
    let tag = format!("({soname})");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| l.contains("*UND*") && l.contains(&tag))
        .filter_map(|l| l.split_whitespace().last().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    assert!(
        !names.is_empty(),
        "no import of {soname} in {}",
        lib.display()
    );
    names
}

/// Writes a version script giving `globals` the version named `soname` (the real libraries'
/// scheme), everything else local; returns the linker flag that applies it.
fn version_script(dir: &Path, soname: &str, globals: &str) -> String {
    let map = dir.join(format!("{soname}.map"));
    std::fs::create_dir_all(dir).expect("fixtures dir");
    std::fs::write(
        &map,
        format!("{soname} {{ global: {globals} local: *; }};\n"),
    )
    .expect("version script");
    format!("-Wl,--version-script={}", path_str(&map))
}

/// Builds the shared library `out` (its file name its soname) from `sources`, once.
fn shared_library(out: &Path, sources: &[PathBuf], extra: &[String]) {
    let soname = out.file_name().and_then(|n| n.to_str()).expect("soname");
    let mut args: Vec<String> = CFLAGS.iter().map(|s| s.to_string()).collect();
    args.extend(["-fPIC", "-shared", "-Wl,-rpath,$ORIGIN"].map(String::from));
    args.extend([format!("-Wl,-soname,{soname}"), "-o".into(), path_str(out)]);
    args.extend(sources.iter().map(|s| path_str(s)));
    args.extend(extra.iter().cloned());
    compile_once(out, &args);
}

fn fixtures_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Runs gcc with `args` unless `out` was already built by this test run.
fn compile_once(out: &Path, args: &[String]) {
    compile_once_with("gcc", out, args)
}

/// Runs `compiler` with `args` unless `out` was already built by this test run.
fn compile_once_with(compiler: &str, out: &Path, args: &[String]) {
    static BUILT: OnceLock<Mutex<Vec<PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == out) {
        return;
    }
    std::fs::create_dir_all(out.parent().expect("output dir")).expect("fixtures dir");
    let status = Command::new(compiler).args(args).status().expect(compiler);
    assert!(
        status.success(),
        "{compiler} failed: {compiler} {}",
        args.join(" ")
    );
    built.push(out.to_path_buf());
}

/// The tch harness binary (scripts/test.sh builds it; it needs libtorch from scripts/setup.sh).
/// `None` when it is not built, which CI=true makes a failure.
pub fn harness() -> Option<PathBuf> {
    let bin = profile_dir().join("harness");
    if bin.is_file() {
        return Some(bin);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!(
            "no harness binary at {}: cargo build -p harness",
            bin.display()
        );
    }
    eprintln!("skipping: the harness is not built (cargo build -p harness)");
    None
}

/// The libtorch scripts/setup.sh installs (LIBTORCH): the torch wheel's, `.pydeps/torch` in the
/// workspace.
pub fn libtorch() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.pydeps/torch")
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

/// Waits until no leaktracer process is left (at most a minute). A finished leaktracer leaves a
/// child that detaches its uprobes in the background; until it is done, their breakpoints are in
/// every process that maps libc, which valgrind, reading libc's code, would trip over.
pub fn wait_for_detached_probes() {
    let me = std::process::id();
    let others = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .any(|pid| {
                // A zombie (a leaktracer a failed test never reaped) holds no probes.
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let running = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .is_some_and(|state| state != "Z");
                running
                    && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.trim() == "leaktracer")
            })
    };
    let start = std::time::Instant::now();
    while others() && start.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One BPF test at a time: concurrent tracers would each add their probes to every allocation.
/// A tracer that has finished is still at work while its child detaches its uprobes (seconds,
/// after `--heap full`), taking a core and the kernel's uprobe locks from the next test's
/// tracer: each test starts once it is gone, so what a test times is its own run.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    wait_for_detached_probes();
    guard
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
    trace_with_env(extra, argv, &[])
}

/// As [`trace`], with variables added to the environment.
pub fn trace_with_env(
    extra: &[&str],
    argv: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Traced> {
    let dir = target_dir().join("reports");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!(
        "{}-{}.json",
        Path::new(argv[0]).file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let output = leaktracer_cmd()
        .args(["run", "--json", "--top", "1000", "-o"])
        .arg(&file)
        .args(extra)
        .arg("--")
        .args(argv)
        .envs(env.iter().copied())
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

/// Waits for a fixture's "ready" line on its piped stdout.
pub fn wait_ready(target: &mut Child) {
    let mut line = String::new();
    BufReader::new(target.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("fixture output");
    assert_eq!(line.trim(), "ready");
}

/// `leaktracer -v attach PID --json --top 100 -o FILE`, running, its probes attached.
pub struct Attached {
    tracer: Child,
    /// Its log so far.
    pub log: String,
    /// Kept open to the end: a closed pipe would fail the tracer's own logging.
    lines: Lines<BufReader<ChildStderr>>,
    out: PathBuf,
}

/// Attaches leaktracer to `pid` and waits until the pid is traced; reports go to NAME.json.
pub fn attach(pid: u32, name: &str) -> Attached {
    let out = target_dir().join(format!("{name}.json"));
    let mut tracer = leaktracer_cmd()
        .args([
            "-v",
            "attach",
            &pid.to_string(),
            "--json",
            "--top",
            "100",
            "-o",
        ])
        .arg(&out)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("leaktracer attach");
    let mut lines = BufReader::new(tracer.stderr.take().expect("piped stderr")).lines();
    let mut log = String::new();
    for l in lines.by_ref().map_while(Result::ok) {
        log.push_str(&l);
        log.push('\n');
        if l.contains("tracing") {
            break;
        }
    }
    assert!(log.contains("tracing"), "tracer never attached: {log}");
    Attached {
        tracer,
        log,
        lines,
        out,
    }
}

impl Attached {
    /// Waits for the tracer to end; its exit code, whole log and last report.
    pub fn finish(mut self) -> (Option<i32>, String, Report) {
        self.log
            .extend(self.lines.map_while(Result::ok).map(|l| l + "\n"));
        let code = self.tracer.wait().expect("leaktracer attach").code();
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let last = text
            .lines()
            .last()
            .unwrap_or_else(|| panic!("no report: {}", self.log));
        (code, self.log, Report::parse(last).expect("report"))
    }
}

/// Spawns `cmd` (a leaktracer serving the explorer) with stderr piped and reads up to the line
/// with the explorer's URL. Returns the child, the URL (`http://ADDR/`, with `?token=…` when
/// there is one) and a thread that collects the rest of stderr.
pub fn spawn_explorer(mut cmd: Command) -> (Child, String, std::thread::JoinHandle<Vec<String>>) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning leaktracer");
    let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("explorer at ")
                .map(|(_, rest)| rest.split_whitespace().next().unwrap_or("").to_string())
        })
        .expect("the explorer's URL is printed");
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    (child, url, rest)
}

/// Ctrl-C to a serving leaktracer; its exit status and the rest of its stderr.
pub fn interrupt(
    mut child: Child,
    rest: std::thread::JoinHandle<Vec<String>>,
) -> (std::process::ExitStatus, String) {
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().expect("waiting for leaktracer");
    (status, rest.join().expect("stderr reader").join("\n"))
}

/// GET `path` from `url` (`http://ADDR/…` or `ADDR`): the status line and the body.
pub fn http_get(url: &str, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let addr = url.trim_start_matches("http://");
    let addr = addr.split('/').next().unwrap_or(addr);
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the API");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("socket timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("sending the request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("reading the response");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// `probed watch [LIBRARY]` (tests/fixtures/probed.c) running beside a traced command: whether a
/// process that is not traced ever carries a probe in the library's code.
pub struct Beside {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// Starts `probed watch LIBRARY` (default libc) with `env` added, once it has mapped the library.
pub fn probed_beside(library: Option<&Path>, env: &[(&str, &str)]) -> Beside {
    let mut child = Command::new(build("probed"))
        .arg("watch")
        .args(library)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the process beside");
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(out).lines();
    let ready = lines.next().and_then(Result::ok);
    assert_eq!(ready.as_deref(), Some("ready"), "the process beside");
    Beside { child, lines }
}

impl Beside {
    /// Ends its watch: "probed" if the library's code ever differed from its file, else
    /// "untouched".
    pub fn verdict(mut self) -> String {
        drop(self.child.stdin.take());
        let verdict = self.lines.next().and_then(Result::ok).unwrap_or_default();
        self.child.wait().expect("the process beside ends");
        verdict
    }
}
