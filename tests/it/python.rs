//! Python stacks from the kernel: the real CPython runs scripts that leak (a list of bytearrays, a
//! dict cache, ctypes malloc, one of two threads), each beside a control, under `leaktracer run`
//! with no change to them; the leak's stack names the exact `file:line function` of the script.

use std::{path::PathBuf, process::Command};

use serde_json::Value;
use tests::{fixture, report::Report};

/// The machine's CPython itself (not a launcher script in front of it).
pub(crate) fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on this machine");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub(crate) fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/python")
        .join(format!("{name}.py"))
}

/// The 1-based line of `script` holding `marker`.
pub(crate) fn line(name: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(script(name)).unwrap();
    text.lines().position(|l| l.contains(marker)).unwrap() as u64 + 1
}

/// The innermost Python frame of a stack: (function, file, line).
pub(crate) fn python_top(stack: &Value) -> Option<(String, String, u64)> {
    let f = stack["frames"]
        .as_array()?
        .iter()
        .find(|f| f["module"] == "python")?;
    Some((
        f["function"].as_str()?.to_string(),
        f["file"].as_str()?.to_string(),
        f["line"].as_u64()?,
    ))
}

/// (bytes, blocks) of heap stacks whose innermost Python frame is `function` at `file`:`line`.
fn at(r: &Report, function: &str, name: &str, line: u64) -> (u64, u64) {
    let file = script(name).display().to_string();
    r.sum(|s| {
        s["kind"] == "heap"
            && python_top(s).is_some_and(|(f, p, l)| f == function && p == file && l == line)
    })
}

/// Under `--heap full`: these tests are of Python frames on malloc-level records, which the
/// default (`--heap auto`) takes in a Python process only once its pages grow.
fn run(argv: &[&str]) -> Option<Report> {
    run_with(&["--no-store", "--heap", "full"], argv)
}

/// Under the default options.
pub(crate) fn run_default(argv: &[&str]) -> Option<Report> {
    run_with(&["--no-store"], argv)
}

/// As [`run`], with these options.
pub(crate) fn run_with(options: &[&str], argv: &[&str]) -> Option<Report> {
    run_with_env(options, argv, &[])
}

/// As [`run_with`], with variables added to leaktracer's environment.
fn run_with_env(options: &[&str], argv: &[&str], env: &[(&str, &str)]) -> Option<Report> {
    if !fixture::bpf_available() {
        return None;
    }
    let _x = fixture::exclusive();
    let t = fixture::trace_with_env(options, argv, env).expect("leaktracer run");
    assert_eq!(
        t.output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&t.output.stderr)
    );
    Some(t.last().clone())
}

#[test]
fn a_list_of_bytearrays_leaks_at_its_python_line() {
    let py = python();
    let path = script("leaky_list");
    let Some(r) = run(&[&py, path.to_str().unwrap(), "30"]) else {
        return;
    };
    // 30 bytearrays of 1 MiB (and their terminating NUL), from grow(); scratch() freed its own.
    let leak = line("leaky_list", "# LEAK");
    assert_eq!(
        at(&r, "grow", "leaky_list", leak),
        (30 * ((1 << 20) + 1), 30)
    );
    assert_eq!(
        at(&r, "scratch", "leaky_list", line("leaky_list", "# CONTROL")),
        (0, 0)
    );
    // The leak's site, as the report, the table and the CI gate show it.
    let top = r
        .stacks()
        .iter()
        .find(|s| python_top(s).is_some_and(|(f, ..)| f == "grow"))
        .unwrap();
    let caller = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"] == "python")
        .nth(1)
        .unwrap();
    assert_eq!(caller["function"], "<module>");
    assert_eq!(caller["line"], line("leaky_list", "    grow()"));
}

/// The Python frames of `stack`, innermost first: (function, line).
fn python_frames(stack: &Value) -> Vec<(String, u64)> {
    stack["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"] == "python")
        .map(|f| {
            let function = f["function"].as_str().unwrap_or_default().to_string();
            (function, f["line"].as_u64().unwrap_or(0))
        })
        .collect()
}

#[test]
fn a_leak_sixty_calls_down_has_every_frame_up_to_its_module_line() {
    let py = python();
    let path = script("deep_stack");
    let Some(r) = run(&[&py, path.to_str().unwrap()]) else {
        return;
    };
    let (leak, dive) = (line("deep_stack", "# LEAK"), line("deep_stack", "# DIVE"));
    let stack = r
        .stacks()
        .iter()
        .find(|s| python_top(s).is_some_and(|(f, _, l)| f == "dive" && l == leak))
        .expect("the leak's stack");
    assert_eq!(stack["bytes"], 20 * ((1 << 20) + 1));
    assert_eq!(stack["blocks"], 20);
    // Every frame, read in two windows of the data stack and more: 61 calls of dive (the
    // innermost at the leak, 60 at the recursive call) under the module body's line.
    let mut want = vec![("dive".to_string(), leak)];
    want.extend(std::iter::repeat_n(("dive".to_string(), dive), 60));
    want.push(("<module>".into(), line("deep_stack", "# CALL")));
    assert_eq!(python_frames(stack), want);
    assert_eq!(stack["truncated"], false);
    // 201 calls of plunge are more than a record holds (128 frames): the innermost kept, and
    // the stack said to be cut.
    let deep = line("deep_stack", "# TOO DEEP");
    let stack = r
        .stacks()
        .iter()
        .find(|s| python_top(s).is_some_and(|(f, _, l)| f == "plunge" && l == deep))
        .expect("the deeper leak's stack");
    assert_eq!(stack["bytes"], 20 * ((1 << 19) + 1));
    let frames = python_frames(stack);
    assert_eq!(frames.len(), 128);
    let plunge = line("deep_stack", "# PLUNGE");
    assert!(
        frames[1..]
            .iter()
            .all(|f| *f == ("plunge".to_string(), plunge)),
        "{frames:?}"
    );
    assert_eq!(stack["truncated"], true);
}

#[test]
fn a_dict_cache_that_never_evicts_is_attributed_to_its_line() {
    let py = python();
    let path = script("dict_cache");
    let Some(r) = run(&[&py, path.to_str().unwrap()]) else {
        return;
    };
    // Each entry is a bytes object of 256 KiB + 1 (its allocation: 33 bytes of header and NUL
    // more). The dict's own table grows at the same line: a few KiB at most.
    let entry = (256 << 10) + 1 + 33;
    let (bytes, blocks) = at(&r, "remember", "dict_cache", line("dict_cache", "# LEAK"));
    assert!(
        blocks >= 20 && bytes >= 20 * entry && bytes < 20 * entry + 16384,
        "{bytes} {blocks}"
    );
    let (bytes, blocks) = at(
        &r,
        "remember_capped",
        "dict_cache",
        line("dict_cache", "# CONTROL"),
    );
    assert!(
        blocks >= 4 && bytes >= 4 * entry && bytes < 5 * entry,
        "the capped cache holds 4: {bytes} {blocks}"
    );
}

#[test]
fn malloc_through_ctypes_is_attributed_to_the_calling_python_line() {
    let py = python();
    let path = script("ctypes_leak");
    let Some(r) = run(&[&py, path.to_str().unwrap()]) else {
        return;
    };
    assert_eq!(
        at(
            &r,
            "native_leak",
            "ctypes_leak",
            line("ctypes_leak", "# LEAK")
        ),
        (10 * (3 << 20), 10)
    );
    assert_eq!(
        at(
            &r,
            "native_clean",
            "ctypes_leak",
            line("ctypes_leak", "# CONTROL")
        ),
        (0, 0)
    );
}

#[test]
fn each_thread_gets_its_own_python_frames() {
    let py = python();
    let path = script("threads_leak");
    let Some(r) = run(&[&py, path.to_str().unwrap()]) else {
        return;
    };
    let leak = line("threads_leak", "# LEAK");
    assert_eq!(
        at(&r, "worker_leaks", "threads_leak", leak),
        (8 * ((512 << 10) + 1), 8)
    );
    let control = line("threads_leak", "# CONTROL");
    assert_eq!(at(&r, "worker_clean", "threads_leak", control), (0, 0));
}

#[test]
fn a_script_started_through_a_wrapper_is_still_attributed() {
    let py = python();
    let path = script("leaky_list");
    let leak = line("leaky_list", "# LEAK");
    // Through a shell that execs the interpreter.
    let cmd = format!("exec {py} {} 5", path.display());
    if let Some(r) = run(&["/bin/sh", "-c", &cmd]) {
        assert_eq!(at(&r, "grow", "leaky_list", leak), (5 * ((1 << 20) + 1), 5));
    }
    // As a module (`python -m`), found on its path.
    let dir = path.parent().unwrap().display().to_string();
    let cmd = format!("cd {dir} && exec {py} -m leaky_list 5");
    if let Some(r) = run(&["/bin/sh", "-c", &cmd]) {
        assert_eq!(at(&r, "grow", "leaky_list", leak), (5 * ((1 << 20) + 1), 5));
    }
}

/// `python3` as a pyenv user's PATH has it: a shim, a bash script whose `pyenv exec` runs some
/// forty bash processes before it execs the interpreter. Under the default options they are
/// known ahead to run Python in the end and are layered like it: not one heap record of theirs
/// (traced whole, they made some 15,000 blocks and 75,000 records, a second of each traced job's
/// start), and the interpreter is the one pyenv selects. Where `python3` is not a pyenv shim
/// there is nothing to test.
#[test]
fn python3_through_a_pyenv_shim_is_layered_from_the_shims_first_process() {
    let shim = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("python3"))
        .find(|p| p.is_file());
    let shim = shim.expect("python3 on PATH");
    let text = std::fs::read_to_string(&shim).unwrap_or_default();
    if !text.contains("/libexec/pyenv\" exec") {
        eprintln!("{} is not a pyenv shim: nothing to test", shim.display());
        return;
    }
    let shim = shim.to_str().unwrap();
    let Some(r) = run_default(&[shim, "-c", "import json; json.dumps(list(range(1000)))"]) else {
        return;
    };
    let root = r.process(r.root_pid());
    assert_eq!(
        root["command"].as_str().unwrap().split(' ').next(),
        Some(python().as_str()),
        "{root}"
    );
    assert!(
        r.processes().len() > 10,
        "the shim's processes: {}",
        r.processes().len()
    );
    let heap: u64 = r
        .processes()
        .iter()
        .map(|p| p["own"]["heap"]["blocks"].as_u64().unwrap())
        .sum();
    assert_eq!(heap, 0, "{:?}", r.0["totals"]);
    assert_eq!(r.0["totals"]["heap"]["blocks"], 0);
}

/// A Python program whose work runs in child interpreters exec'd anew, as `torchrun` starts
/// its workers (a script run by a new interpreter) and `torch.multiprocessing.spawn` its own (a
/// new interpreter run with `-c`): each child maps the interpreter its parent mapped first, and
/// its frames are walked all the same. Its leak is at its line, exact, in the child.
#[test]
fn a_python_programs_children_exec_d_anew_are_attributed_at_their_lines() {
    let py = python();
    let path = script("spawned_workers");
    let path = path.to_str().unwrap();
    let in_child = |r: &Report, function: &str, name: &str, line: u64| {
        let file = script(name).display().to_string();
        let root = r.root_pid();
        r.sum(|s| {
            s["kind"] == "heap"
                && s["pid"].as_u64() != Some(root)
                && python_top(s).is_some_and(|(f, p, l)| f == function && p == file && l == line)
        })
    };
    let Some(r) = run(&[&py, path, "script", "5"]) else {
        return;
    };
    let leak = line("leaky_list", "# LEAK");
    let kept = (5 * ((1 << 20) + 1), 5);
    assert_eq!(in_child(&r, "grow", "leaky_list", leak), kept);
    let r = run(&[&py, path, "spawn", "5"]).unwrap();
    let leak = line("spawned_workers", "# LEAK");
    assert_eq!(in_child(&r, "work", "spawned_workers", leak), kept);
}

/// Each other CPython 3.10–3.13 on the machine (pyenv's, under `$PYENV_ROOT` or ~/.pyenv), one
/// per minor version: (minor, path of its executable).
fn other_interpreters() -> Vec<(u8, String)> {
    let root = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    let mut names: Vec<String> = std::fs::read_dir(format!("{root}/versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mine = python();
    let mut found: Vec<(u8, String)> = Vec::new();
    for name in names {
        let Some(minor) = name.strip_prefix("3.").and_then(|r| r.split('.').next()) else {
            continue;
        };
        let Ok(minor) = minor.parse::<u8>() else {
            continue;
        };
        let exe = format!("{root}/versions/{name}/bin/python3.{minor}");
        let new = !found.iter().any(|(m, _)| *m == minor);
        if (10..=13).contains(&minor)
            && new
            && !mine.contains(&format!("python3.{minor}"))
            && std::path::Path::new(&exe).exists()
        {
            found.push((minor, exe));
        }
    }
    eprintln!("other CPython versions tested: {found:?}");
    found
}

#[test]
fn every_cpython_from_3_10_to_3_13_on_the_machine_is_attributed() {
    let leak = line("leaky_list", "# LEAK");
    for (minor, py) in other_interpreters() {
        let path = script("leaky_list");
        let Some(r) = run(&[&py, path.to_str().unwrap(), "6"]) else {
            return;
        };
        assert_eq!(
            at(&r, "grow", "leaky_list", leak),
            (6 * ((1 << 20) + 1), 6),
            "3.{minor}"
        );
        assert_eq!(
            at(&r, "scratch", "leaky_list", line("leaky_list", "# CONTROL")),
            (0, 0),
            "3.{minor}"
        );
        // Threads: 3.10 knows its threads by pthread_t, which the kernel side reads as the fs
        // base; later versions by native id.
        let path = script("threads_leak");
        let r = run(&[&py, path.to_str().unwrap()]).unwrap();
        assert_eq!(
            at(
                &r,
                "worker_leaks",
                "threads_leak",
                line("threads_leak", "# LEAK")
            ),
            (8 * ((512 << 10) + 1), 8),
            "3.{minor}"
        );
        // Modules made from one template: their frames' globals tell their stacks apart.
        if minor >= 11 {
            shards_each_at_their_file(&py);
        }
    }
}

#[test]
fn a_list_of_numpy_arrays_leaks_at_its_python_line() {
    let pydeps = fixture::pydeps();
    assert!(
        pydeps.join("numpy").is_dir(),
        "numpy in {} (scripts/setup.sh installs it)",
        pydeps.display()
    );
    let py = python();
    let path = script("numpy_list");
    let env = format!("PYTHONPATH={}", pydeps.display());
    let Some(r) = run(&["/usr/bin/env", &env, &py, path.to_str().unwrap(), "12"]) else {
        return;
    };
    // Each array's data: 2^17 doubles, one block of exactly 1 MiB from numpy's allocator, made
    // in numpy's own Python (`full`) called from the script's line.
    let leak = line("numpy_list", "# LEAK");
    let file = path.display().to_string();
    let (bytes, blocks) = r.sum(|s| {
        let frames = s["frames"].as_array().unwrap();
        let mut python = frames.iter().filter(|f| f["module"] == "python");
        let numpy = python.next().is_some_and(|f| {
            f["function"] == "full"
                && f["file"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("numeric.py"))
        });
        let caller = python.next().is_some_and(|f| {
            f["function"] == "record" && f["file"] == file.as_str() && f["line"] == leak
        });
        s["kind"] == "heap" && numpy && caller
    });
    assert_eq!((bytes, blocks), (12 << 20, 12));
    let control = line("numpy_list", "# CONTROL");
    let (bytes, _) = r.sum(|s| {
        s["kind"] == "heap"
            && s["frames"].as_array().unwrap().iter().any(|f| {
                f["function"] == "transient" && f["file"] == file.as_str() && f["line"] == control
            })
    });
    assert!(bytes < 1 << 20, "the dropped arrays are freed: {bytes}");
}

#[test]
fn modules_made_from_one_template_are_each_attributed_to_their_own_file() {
    shards_each_at_their_file(&python());
}

/// `shard_modules.py` under `py` (3.11+): each of its five modules' buffers at its own file,
/// twice: with each body still running when its stack is read (at line 2), and with each gone by
/// then (its line unknown: its code object, and with it its line table, was freed).
fn shards_each_at_their_file(py: &str) {
    for wait in ["0.2", "0"] {
        let tag = py.rsplit('/').next().unwrap_or(py);
        let dir = fixture::target_dir().join(format!("shards-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = script("shard_modules");
        let dir_arg = dir.to_str().unwrap();
        let Some(r) = run(&[py, path.to_str().unwrap(), dir_arg, "5", wait]) else {
            return;
        };
        let codes = std::fs::read_to_string(dir.join("codes")).unwrap();
        let codes: Vec<&str> = codes.lines().collect();
        assert_eq!(codes.len(), 5, "{py}");
        // What makes it a trap: the five bodies' code objects were made at one address in turn
        // (3.10 made them at five), and each ran its allocation at the same instruction of it.
        assert!(codes.iter().all(|c| *c == codes[0]), "{py}: {codes:?}");
        // The build before gave all five to the first module with the wait, and without it
        // three to the last (with no line) and two to no file at all.
        for k in 0..5 {
            let file = dir.join(format!("shard_{k}.py")).display().to_string();
            let kept = r.sum(|s| {
                let frames = s["frames"].as_array().into_iter().flatten();
                let top = frames.clone().find(|f| f["module"] == "python");
                let line_ok = |l: &Value| l == 2 || (wait == "0" && l.is_null());
                s["kind"] == "heap"
                    && top.is_some_and(|f| {
                        f["function"] == "<module>"
                            && f["file"] == file.as_str()
                            && line_ok(&f["line"])
                    })
            });
            assert_eq!(kept, ((1 << 20) + 1, 1), "{py}, wait {wait}: shard_{k}.py");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn pymalloc_arena_growth_is_attributed_to_the_line_that_made_it() {
    let py = python();
    let path = script("arena_growth");
    let Some(r) = run_default(&[&py, path.to_str().unwrap()]) else {
        return;
    };
    // Arena maps (kind mmap) whose innermost Python frame is `function` of the script.
    let arenas = |function: &str| {
        r.sum(|s| s["kind"] == "mmap" && python_top(s).is_some_and(|(f, ..)| f == function))
    };
    // 120,000 tuples of 48 bytes and their ints of 32 (9.2 MiB) held: whole 1 MiB arenas mapped
    // in hoard() (at its loop, for the ints, and at the append, for the tuples).
    let (bytes, blocks) = arenas("hoard");
    assert_eq!(bytes, blocks << 20, "whole arenas: {bytes}");
    assert!((6..=10).contains(&blocks), "{blocks} arenas");
    let leak = line("arena_growth", "# LEAK");
    let (at_leak, _) = r.sum(|s| {
        s["kind"] == "mmap" && python_top(s).is_some_and(|(f, _, l)| f == "hoard" && l == leak)
    });
    assert!(
        at_leak >= 3 << 20,
        "tuples' arenas at the append: {at_leak}"
    );
    // The same objects made and dropped: their arenas were unmapped (a few stay, holding
    // objects made meanwhile), or reused by hoard().
    let (bytes, _) = arenas("churn");
    assert!(bytes <= 3 << 20, "churn's arenas are gone: {bytes}");
}

#[test]
fn device_memory_from_python_is_attributed_to_its_python_line() {
    let cudart = fixture::fake_cuda().join("libcudart.so.13");
    let py = python();
    let path = script("cuda_leak");
    let Some(r) = run_default(&[&py, path.to_str().unwrap(), cudart.to_str().unwrap()]) else {
        return;
    };
    // Device records carry a raw stack, unwound in user space: the Python frames ride with it.
    let device = |function: &str, marker: &str| {
        let l = line("cuda_leak", marker);
        r.sum(|s| {
            s["kind"] == "device"
                && python_top(s).is_some_and(|(f, _, at)| f == function && at == l)
        })
    };
    assert_eq!(device("cache_activations", "# LEAK"), (5 * (2 << 20), 5));
    assert_eq!(device("scratch_space", "# CONTROL"), (0, 0));
    assert_eq!(r.0["totals"]["device"]["bytes"], 5 * (2 << 20));
}

#[test]
fn with_pythonmalloc_malloc_every_object_is_a_heap_block_and_the_report_says_so() {
    let py = python();
    let path = script("arena_growth");
    let Some(r) = run(&[
        "/usr/bin/env",
        "PYTHONMALLOC=malloc",
        &py,
        path.to_str().unwrap(),
    ]) else {
        return;
    };
    // Each one-element tuple its own 48-byte malloc block at the append (a few reuse tuples
    // from the interpreter's free list), plus one block: the list's array of pointers to them
    // (8 bytes each, with room to grow). No arena maps anywhere in hoard().
    let (bytes, blocks) = at(&r, "hoard", "arena_growth", line("arena_growth", "# LEAK"));
    let tuples = blocks - 1;
    let array = bytes - tuples * 48;
    assert!(
        tuples >= 110_000 && array >= tuples * 8 && array < tuples * 8 * 2,
        "{bytes} {blocks}"
    );
    let arenas =
        r.sum(|s| s["kind"] == "mmap" && python_top(s).is_some_and(|(f, ..)| f == "hoard"));
    assert_eq!(arenas, (0, 0));
    let env = &r.process(r.root_pid())["allocator_env"];
    assert_eq!(
        env[0],
        serde_json::json!(["PYTHONMALLOC", "malloc"]),
        "{env}"
    );
}

#[test]
fn a_full_ring_never_leaves_a_process_stopped_for_new_code() {
    // With a 1 MiB ring, PYTHONMALLOC=malloc (a record per object) overflows it, and records that
    // mark the kernel side's stops for new code (the interpreter's libraries) are lost with the
    // rest. The kernel's own table of those stops still tells the hold they are the tracer's, so
    // the process goes on (taken for a user's SIGSTOP, it stayed stopped for good). A hang is cut
    // short by `timeout`, which then fails the exit code.
    // The ring is copied every 300 ms, so that it fills between two copies.
    let py = python();
    let path = script("arena_growth");
    let Some(r) = run_with_env(
        &["--no-store", "--ring-mb", "1", "--heap", "full"],
        &[
            "timeout",
            "-s",
            "KILL",
            "120",
            "/usr/bin/env",
            "PYTHONMALLOC=malloc",
            &py,
            path.to_str().unwrap(),
        ],
        &[("LEAKTRACER_RING_POLL_MS", "300")],
    ) else {
        return;
    };
    let lost = r.losses()["ringbuf_full"].as_u64().unwrap();
    assert!(lost > 0, "the 1 MiB ring overflowed: {lost} records lost");
}

/// The default layers on a Python service whose heap leaks: the malloc family is not traced at
/// first (importing and starting cost no malloc probe), the heap's pages grow at the line for over
/// ten seconds, and from then on the process's malloc family is traced: each body logged after is
/// a heap block of exactly its size at that line, judged a leak, beside the pages judged so.
/// Once that leak has been judged one for two seconds, the malloc family is taken out (its traps
/// would cost the rest of the run): the bodies logged after are not seen, and the stack is
/// reported as it was then, still a leak.
#[test]
fn the_default_layers_trace_the_malloc_family_of_a_python_process_whose_pages_grow() {
    let py = python();
    let path = script("request_log");
    let Some(r) = run_default(&[&py, path.to_str().unwrap(), "600", "abrupt"]) else {
        return;
    };
    let pid = r.root_pid();
    assert_eq!(r.process(pid)["malloc_traced"], true);
    assert_eq!(r.process(pid)["heap_asked"], "unexplained");
    let libc = r.library("libc.so.6");
    assert_eq!(libc["timing"]["when"], "engaged", "{libc}");
    assert_eq!(libc["pid"], pid);
    let after_s = libc["timing"]["after_s"].as_f64().unwrap();
    assert!(
        after_s >= 10.0,
        "pages judged over ten seconds first: {after_s}"
    );
    let body = line("request_log", "# BODY");
    let at_body = |kind: &str| {
        r.stacks()
            .iter()
            .find(|s| {
                s["kind"] == kind
                    && python_top(s).is_some_and(|(f, _, l)| f == "handle" && l == body)
            })
            .unwrap_or_else(|| panic!("no {kind} stack at line {body}"))
    };
    let heap = at_body("heap");
    let blocks = heap["blocks"].as_u64().unwrap();
    // bytearray(64 KiB): a buffer of 64 KiB + 1 each. 600 bodies in all, those logged before
    // the malloc family was traced, and after it was taken out, not seen: 20 a second at most
    // (50 ms apart) while it was traced.
    assert_eq!(heap["bytes"].as_u64().unwrap(), blocks * ((64 << 10) + 1));
    let as_of = r.process(pid)["heap_as_of_s"].as_f64();
    let as_of = as_of.unwrap_or_else(|| panic!("not taken out: {}", r.process(pid)));
    let elapsed = r.0["elapsed_s"].as_f64().unwrap();
    assert!(
        as_of > after_s + 1.0 && as_of < elapsed,
        "{after_s} {as_of} {elapsed}"
    );
    let most = ((as_of - after_s) * 20.0).ceil() as u64 + 2;
    assert!(
        (10..=most).contains(&blocks),
        "{blocks} bodies seen, {most} at most"
    );
    assert_eq!(heap["verdict"]["verdict"], "leak", "{heap}");
    // Its pages, grown at the same line: under the heap, whose stack the leak is reported on.
    assert_eq!(at_body("brk")["verdict"]["verdict"], "under_heap");
    // A service paced by its timer is not slowed by its probes (its steps wait for it), and its
    // rate is not put at another pace.
    assert_eq!(r.process(pid)["heap_slowdown"], Value::Null);
    // The leak went on untraced: the bodies logged after, 20 a second at most, each grew the
    // brk heap by its 64 KiB (none is freed, and little else is allocated), so its pages grew by
    // at most the bodies not seen while traced.
    let after = r.process(pid)["pages_after_heap_bytes"].as_u64().unwrap();
    let unseen = (600 - blocks) * (64 << 10);
    assert!(
        (1 << 20..=unseen + (1 << 20)).contains(&after),
        "pages grew by {after} after, {unseen} unseen"
    );
}

/// A Python service with a 400 MiB heap that keeps a 2 KiB record every fifth step
/// (`heap_cache.py`): under the default its pages grow, and its malloc family, traced for a
/// while, names the line that keeps, each record a block of exactly its size. Its mallocs' traps
/// slow every step meanwhile; the report measures by how much (`heap_slowdown`: its own code's
/// pace, user CPU time a second, around the window over that within it; 2.1–2.4 here) and puts
/// the heap stack's rate at the program's untraced pace: before, the rate read a third of what
/// the program leaked, and `check --budget` passed a leak three times over its budget.
#[test]
fn a_heap_layer_measures_how_much_it_slowed_the_program_and_names_the_line_that_keeps() {
    let py = python();
    let path = script("heap_cache");
    let Some(r) = run_default(&[&py, path.to_str().unwrap(), "20"]) else {
        return;
    };
    let process = r.process(r.root_pid());
    assert_eq!(process["heap_asked"], "unexplained", "{process}");
    let slowdown = process["heap_slowdown"].as_f64();
    assert!(slowdown.is_some_and(|s| s > 1.05), "{process}");
    let at = line("heap_cache", "# LEAK");
    let heap = r
        .stacks()
        .iter()
        .find(|s| {
            s["kind"] == "heap" && python_top(s).is_some_and(|(f, _, l)| f == "<module>" && l == at)
        })
        .unwrap_or_else(|| panic!("no heap stack at line {at}"));
    assert_eq!(heap["verdict"]["verdict"], "leak", "{heap}");
    // bytes(2048): its object header (33 bytes) and its bytes, one malloc each.
    let blocks = heap["blocks"].as_u64().unwrap();
    assert!(blocks >= 10, "{heap}");
    assert_eq!(heap["bytes"].as_u64().unwrap(), blocks * (33 + 2048));
}

/// `leaktracer check --sample 0.1 OPTIONS -- python3 request_log.py ARGS…`.
fn check_script(options: &[&str], args: &[&str]) -> std::process::Output {
    check_python(&python(), "request_log", options, args)
}

/// `leaktracer check --sample 0.1 OPTIONS -- PY NAME.py ARGS…`.
pub(crate) fn check_python(
    py: &str,
    name: &str,
    options: &[&str],
    args: &[&str],
) -> std::process::Output {
    fixture::leaktracer_cmd()
        .args(["check", "--sample", "0.1", "--no-store"])
        .args(options)
        .args(["--", py])
        .arg(script(name))
        .args(args)
        .output()
        .expect("leaktracer check")
}

/// A service that keeps every request's body in a list and exits normally: the interpreter frees
/// the list at teardown, so nothing is outstanding at the end, yet `check` fails at the line that
/// kept the bodies. The same service keeping only the last 8 passes.
#[test]
fn a_list_the_interpreter_frees_at_exit_still_fails_the_check() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let site = format!("handle (request_log.py:{})", line("request_log", "# BODY"));
    // Every malloc traced: the bodies' blocks. By default, in a run this short, the malloc family
    // is not traced: the heap's pages, grown at that line.
    for (options, kind) in [(&["--heap", "full"][..], "heap"), (&[][..], "brk")] {
        let o = check_script(options, &["40"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{options:?}: {out}");
        let leak = format!("LEAK {kind}");
        assert!(
            out.contains(&leak) && out.contains(&site),
            "{options:?}: {out}"
        );
        // The blocks are all freed; the heap's first pages stay.
        assert_eq!(
            out.contains("released at the end"),
            kind == "heap",
            "{options:?}: {out}"
        );
        let o = check_script(options, &["40", "bounded"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{options:?}: {out}");
    }
}
