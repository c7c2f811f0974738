//! CUDA memory through the stand-in libcudart.so.13 / libcuda.so.1 (no GPU here): every runtime and
//! driver allocation call, exact bytes per kind and leaking function, failures with their error
//! codes, libraries loaded late, thread pools.

use tests::{
    fixture::{self, Traced},
    report::frame_fn,
};

use crate::line_of;

/// Traces `gpu SCENARIO`, linked against the stand-in runtime and driver.
fn trace_gpu(scenario: &str) -> Option<Traced> {
    trace_gpu_env(scenario, &[])
}

fn trace_gpu_env(scenario: &str, env: &[(&str, &str)]) -> Option<Traced> {
    trace_gpu_with(&[], scenario, env)
}

fn trace_gpu_with(extra: &[&str], scenario: &str, env: &[(&str, &str)]) -> Option<Traced> {
    if !fixture::bpf_available() {
        return None;
    }
    let _x = fixture::exclusive();
    let bin = gpu_fixture();
    let t = fixture::trace_with_env(extra, &[bin.to_str().unwrap(), scenario], env)
        .expect("leaktracer run");
    assert_eq!(
        t.output.status.code(),
        Some(0),
        "the fixture's own checks of return codes: {}",
        String::from_utf8_lossy(&t.output.stderr)
    );
    Some(t)
}

/// The `gpu` fixture, linked against the stand-in runtime and driver.
fn gpu_fixture() -> std::path::PathBuf {
    let cuda = fixture::fake_cuda();
    fixture::build_with(
        "gpu",
        &[
            cuda.join("libcudart.so.13").to_str().unwrap(),
            cuda.join("libcuda.so.1").to_str().unwrap(),
            &format!("-Wl,-rpath,{}", cuda.display()),
        ],
    )
}

/// --heap off: the same device bytes per site, and not one heap probe or heap byte.
#[test]
fn no_heap_traces_device_memory_and_pages_only() {
    let Some(t) = trace_gpu_with(&["--heap", "off"], "runtime", &[]) else {
        return;
    };
    let r = t.last();
    assert_eq!(r.0["heap"]["mode"], "off");
    assert_eq!(r.site("device", 0, "leak_device"), (3 << 20, 3));
    assert_eq!(r.0["totals"]["heap"]["bytes"], 0);
    assert_eq!(r.0["totals"]["heap"]["blocks"], 0);
    let probed = r.probed();
    assert!(probed.contains(&"cudaMalloc"), "{probed:?}");
    assert!(
        !probed.contains(&"malloc") && !probed.contains(&"free"),
        "{probed:?}"
    );
}

#[test]
fn runtime_calls_are_accounted_per_kind_and_site() {
    let Some(t) = trace_gpu("runtime") else {
        return;
    };
    let r = t.last();
    let site = |kind: &str, f: &str| r.site(kind, 0, f);
    assert_eq!(site("device", "leak_device"), (3 << 20, 3));
    assert_eq!(
        site("device", "leak_async"),
        (2 * 65536, 2),
        "the freed async block is gone"
    );
    assert_eq!(site("managed", "leak_managed"), (200_000, 1));
    assert_eq!(
        site("pinned", "leak_pinned"),
        (4096 * 5 + 10_000, 2),
        "cudaMallocHost + cudaHostAlloc, minus the cudaFreeHost'd block"
    );
    assert_eq!(
        site("device", "leak_pitch"),
        (1024 * 10, 1),
        "pitch × height"
    );
    for control in [
        "control_device",
        "out_of_memory",
        "null_out_pointer",
        "bad_free",
    ] {
        assert_eq!(
            r.sum(|s| frame_fn(s, 0) == Some(control)),
            (0, 0),
            "{control}"
        );
    }
    // Device kinds are totalled apart from host memory, and each runtime call is counted once
    // (the driver calls it makes are nested).
    let totals = &r.0["totals"];
    assert_eq!(totals["device"]["bytes"], (3u64 << 20) + 2 * 65536 + 10_240);
    assert_eq!(totals["device"]["blocks"], 6);
    assert_eq!(totals["managed"]["bytes"], 200_000);
    assert_eq!(totals["pinned"]["bytes"], 4096 * 5 + 10_000);
    let leak = r
        .stacks()
        .iter()
        .find(|s| frame_fn(s, 0) == Some("leak_device"))
        .unwrap();
    assert_eq!(leak["allocators"][0], "cudaMalloc");
    assert_eq!(
        leak["frames"][0]["line"],
        line_of("gpu", "cudaMalloc(&p, 1 << 20)")
    );
    // Failures: recorded with stack and error, nothing allocated.
    let failures = r.0["device_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{failures:?}");
    let oom = failures
        .iter()
        .find(|f| f["frames"][0]["function"] == "out_of_memory")
        .unwrap();
    assert_eq!(oom["error"], "cudaErrorMemoryAllocation");
    assert_eq!(oom["bytes"], 1u64 << 40);
    assert_eq!(oom["calls"], 1);
    let null = failures
        .iter()
        .find(|f| f["frames"][0]["function"] == "null_out_pointer")
        .unwrap();
    assert_eq!(null["error"], "cudaErrorInvalidValue");
    assert_eq!(r.losses()["unmatched_device_frees"], 0);
    for lib in ["libcudart.so.13", "libcuda.so.1"] {
        assert_eq!(
            r.library(lib)["timing"]["when"],
            "at_map",
            "{lib} probed before it ran"
        );
    }
    assert_eq!(r.library("libcuda.so.1")["roles"][0], "cuda-driver");
}

/// A program with the runtime linked in (as with cudart_static): the executable itself defines
/// cudaMalloc (in its symbol table, not exported) and is probed at exec, before it runs.
#[test]
fn a_program_with_the_runtime_linked_in_is_probed_itself() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let cuda = fixture::fake_cuda();
    let runtime =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fakecuda/cudart.c");
    let bin = fixture::build_variant(
        "gpu_static",
        "gpu",
        &[
            runtime.to_str().unwrap(),
            cuda.join("libcuda.so.1").to_str().unwrap(),
            &format!("-Wl,-rpath,{}", cuda.display()),
            "-ldl",
        ],
    );
    let t = fixture::trace(&[], &[bin.to_str().unwrap(), "runtime"]).expect("leaktracer run");
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    assert_eq!(r.site("device", 0, "leak_device"), (3 << 20, 3));
    assert_eq!(r.site("pinned", 0, "leak_pinned"), (4096 * 5 + 10_000, 2));
    let exe = r.library("/gpu_static");
    assert_eq!(exe["roles"][0], "cuda-runtime");
    assert_eq!(exe["timing"]["when"], "at_map", "probed at exec");
    assert!(
        !r.0["libraries"].to_string().contains("libcudart"),
        "no runtime library is involved"
    );
}

#[test]
fn driver_and_virtual_memory_calls_are_accounted() {
    let conf = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True");
    let Some(t) = trace_gpu_env("driver", &[conf]) else {
        return;
    };
    let r = t.last();
    let site = |kind: &str, f: &str| r.site(kind, 0, f);
    assert_eq!(site("device", "leak_driver"), (2 * 300_000 + 5000, 3));
    assert_eq!(site("pinned", "leak_driver_host"), (7000 + 9000, 2));
    assert_eq!(
        site("device", "leak_vmm"),
        (2 << 20, 1),
        "the physical handle holds the bytes"
    );
    assert_eq!(site("device", "control_driver"), (0, 0));
    assert_eq!(site("device", "control_vmm"), (0, 0));
    let vmm = r
        .stacks()
        .iter()
        .find(|s| frame_fn(s, 0) == Some("leak_vmm"))
        .unwrap();
    assert_eq!(vmm["allocators"][0], "cuMemCreate");
    let root = r.process(r.root_pid());
    assert_eq!(
        root["device"]["mapped_bytes"],
        2 << 20,
        "the leaked handle's mapping stays, the control's was unmapped"
    );
    assert_eq!(root["device"]["unmatched_frees"], 0);
    let failures = r.0["device_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["error"], "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(failures[0]["frames"][0]["function"], "main");
    assert_eq!(
        root["allocator_env"],
        serde_json::json!([["PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"]]),
        "the allocator's settings are read from the target's environment"
    );
}

/// No GPU and no driver here: NVML cannot load, the report says so, and everything else works.
#[test]
fn without_nvml_the_report_says_so_and_still_accounts_device_memory() {
    let Some(t) = trace_gpu("runtime") else {
        return;
    };
    let r = t.last();
    let gpu = &r.0["gpu"];
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        eprintln!("an NVIDIA driver is present: the NVML-unavailable path is not exercised here");
        return;
    }
    assert_eq!(gpu["nvml"]["available"], false);
    assert!(
        gpu["nvml"]["reason"]
            .as_str()
            .unwrap()
            .contains("libnvidia-ml"),
        "{gpu}"
    );
    let p = &gpu["processes"][0];
    assert_eq!(p["pid"], r.root_pid());
    assert_eq!(p["traced_bytes"], r.0["totals"]["device"]["bytes"]);
    assert_eq!(p["managed_bytes"], 200_000);
    assert!(p["nvml_bytes"].is_null() && p["unexplained_bytes"].is_null());
}

#[test]
fn a_thread_pool_is_accounted_exactly() {
    let Some(t) = trace_gpu("threads") else {
        return;
    };
    let r = t.last();
    assert_eq!(r.site("device", 0, "pool_worker"), (4 * 8 * 4096, 32));
    assert_eq!(r.0["totals"]["device"]["blocks"], 32);
    assert_eq!(r.losses()["return_without_entry"], 0);
}

#[test]
fn a_runtime_loaded_with_dlopen_after_start_is_probed_before_its_first_call() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let cuda = fixture::fake_cuda();
    let bin = fixture::build_with("gpu_dlopen", &["-ldl"]);
    let runtime = cuda.join("libcudart.so.13");
    let t = fixture::trace(&[], &[bin.to_str().unwrap(), runtime.to_str().unwrap()])
        .expect("leaktracer run");
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    assert_eq!(r.site("device", 0, "leak_after_dlopen"), (2 * 123_456, 2));
    let lib = r.library("libcudart.so.13");
    assert_eq!(lib["timing"]["when"], "at_map");
    assert_eq!(lib["pid"], r.root_pid());
    assert_eq!(r.losses()["stop_failed"], 0);
}

/// A process that cannot be held (another tracer has it under ptrace, as a debugger would): a
/// library it loads later is probed as soon as its mapping is seen, and the report says it was
/// late and by how much.
#[test]
#[allow(
    clippy::zombie_processes,
    reason = "the target is reaped by waitpid below, as its ptrace tracer"
)]
fn a_library_probed_late_is_reported_as_late() {
    use std::{
        os::unix::process::CommandExt,
        process::{Command, Stdio},
    };
    if !fixture::bpf_available() {
        return;
    }
    // Probing late takes the kernel's uprobe lock, which an earlier session still detaching its
    // probes in the background holds for seconds (the library would be probed after the end):
    // `exclusive` waits for it.
    let _x = fixture::exclusive();
    let cuda = fixture::fake_cuda();
    let bin = fixture::build_with("gpu_dlopen", &["-ldl"]);
    let mut cmd = Command::new(&bin);
    cmd.arg(cuda.join("libcudart.so.13")).arg("wait");
    // SAFETY: ptrace(PTRACE_TRACEME) between fork and exec touches no shared state.
    unsafe {
        cmd.pre_exec(|| {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            Ok(())
        })
    };
    let mut target = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let pid = target.id() as i32;
    let wait_stop = || {
        let mut status = 0;
        // SAFETY: waiting for our own traced child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        status
    };
    let status = wait_stop(); // the exec trap of a PTRACE_TRACEME child
    assert!(libc::WIFSTOPPED(status));
    // SAFETY: resuming our own tracee.
    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, 0) };
    fixture::wait_ready(&mut target);
    let tracer = fixture::attach(pid as u32, "late");
    assert!(
        tracer.log.contains("cannot hold"),
        "the target was held after all: {}",
        tracer.log
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    loop {
        let status = wait_stop();
        if libc::WIFEXITED(status) {
            assert_eq!(libc::WEXITSTATUS(status), 0);
            break;
        }
        assert!(!libc::WIFSIGNALED(status), "target killed");
        let sig = if libc::WIFSTOPPED(status) {
            libc::WSTOPSIG(status)
        } else {
            0
        };
        let sig = if sig == libc::SIGTRAP { 0 } else { sig };
        // SAFETY: resuming our own tracee with the signal it stopped for.
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, sig) };
    }
    let (code, log, r) = tracer.finish();
    assert_eq!(code, Some(0), "{log}");
    let lib = r.library("libcudart.so.13");
    assert_eq!(lib["timing"]["when"], "late", "{lib}");
    assert!(lib["timing"]["late_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        r.site("device", 0, "leak_after_dlopen"),
        (2 * 123_456, 2),
        "probed in the half second between loading and allocating"
    );
    let libc_lib = r.library("libc.so.6");
    assert_eq!(libc_lib["timing"]["when"], "already_loaded");
}

/// A library whose probes cannot go in (`LEAKTRACER_FAULT=attach:libcudart.so.13` fails the
/// attach as a kernel refusing it would) is named in the report with its role and the error, the
/// rest is traced as usual (the runtime's calls reach the driver, whose probes went in), and
/// `check` does not pass a run it could not see whole: it exits 2 and says why.
#[test]
fn a_library_that_cannot_be_probed_is_named_and_the_check_does_not_pass() {
    let fault = [("LEAKTRACER_FAULT", "attach:libcudart.so.13")];
    let Some(t) = trace_gpu_env("runtime", &fault) else {
        return;
    };
    let r = t.last();
    let failures = r.0["probe_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    let f = &failures[0];
    assert!(
        f["library"].as_str().unwrap().ends_with("/libcudart.so.13"),
        "{f}"
    );
    assert_eq!(f["role"], "cuda-runtime");
    assert!(f["error"].as_str().unwrap().contains("on purpose"), "{f}");
    let libraries = r.0["libraries"].as_array().unwrap();
    assert!(
        !libraries
            .iter()
            .any(|l| l["path"].as_str().unwrap().ends_with("libcudart.so.13")),
        "{libraries:?}"
    );
    assert_eq!(r.library("libcuda.so.1")["roles"][0], "cuda-driver");
    let probed = r.probed();
    assert!(
        !probed.contains(&"cudaMalloc") && probed.contains(&"cuMemAlloc_v2"),
        "the runtime's functions are not listed as probed: {probed:?}"
    );
    // cudaMalloc's three blocks, seen as the driver calls cudaMalloc makes.
    assert_eq!(r.site("device", 1, "leak_device"), (3 << 20, 3));
    let leak = r
        .stacks()
        .iter()
        .find(|s| frame_fn(s, 1) == Some("leak_device"))
        .unwrap();
    assert_eq!(leak["allocators"][0], "cuMemAlloc_v2");
    assert_eq!(frame_fn(leak, 0), Some("cudaMalloc"));
    let _x = fixture::exclusive();
    let o = fixture::leaktracer_cmd()
        .args(["check", "--"])
        .arg(gpu_fixture())
        .arg("runtime")
        .envs(fault)
        .output()
        .expect("leaktracer check");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(
            "libcudart.so.13 could not be probed for cuda-runtime: its calls were not traced"
        ),
        "{out}"
    );
}

/// The CUDA runtime's probes are in the traced command's processes alone: in the command and in
/// the child it forks, from the child's first call (its parent's fork is held until the child's
/// probes are in), and not in a process beside them that maps the same runtime. The child's
/// device block it keeps is its own.
#[test]
fn the_cuda_runtime_is_probed_in_the_traced_processes_alone() {
    cuda_probed_in_the_traced_processes_alone(&[]);
}

/// The same under `--heap off`, where no process's malloc family is traced: the runtime's and
/// the driver's links are all the links of its own a process has.
#[test]
fn without_the_heap_the_cuda_runtime_is_probed_in_the_traced_processes_alone() {
    cuda_probed_in_the_traced_processes_alone(&["--heap", "off"]);
}

/// `leaktracer run EXTRA -- probed fork-cuda RUNTIME` beside `probed watch RUNTIME`.
fn cuda_probed_in_the_traced_processes_alone(extra: &[&str]) {
    let runtime = fixture::fake_cuda().join("libcudart.so.13");
    let runtime_arg = runtime.to_str().unwrap();
    let mode = ["fork-cuda", runtime_arg];
    let Some(r) = crate::tree::probed_in_its_processes_alone(extra, &mode, Some(&runtime), &[])
    else {
        return;
    };
    let root = r.root_pid();
    let child = r.child_of(root)["pid"].as_u64().unwrap();
    let device = |pid: u64| r.sum(|s| s["pid"] == pid && s["kind"] == "device");
    assert_eq!(
        device(child),
        (1 << 20, 1),
        "the child's first call is seen"
    );
    assert_eq!(device(root), (0, 0));
}

/// A library on the loader's path named as NVML's that lacks `nvmlShutdown` (here the stand-in
/// the PyTorch tests give their scripts) is taken as no NVML, said so in the report; nothing
/// panics, and device memory is accounted as without one.
#[test]
fn an_nvml_without_its_shutdown_is_no_nvml() {
    fixture::torch_cuda(); // builds the stand-in libnvidia-ml.so.1 beside the runtime
    let dir = fixture::fake_cuda();
    let path = [("LD_LIBRARY_PATH", dir.to_str().unwrap())];
    let Some(t) = trace_gpu_env("runtime", &path) else {
        return;
    };
    let r = t.last();
    let nvml = &r.0["gpu"]["nvml"];
    assert_eq!(nvml["available"], false, "{nvml}");
    let reason = nvml["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("nvmlShutdown"), "{nvml}");
    assert_eq!(r.site("device", 0, "leak_device"), (3 << 20, 3));
}
