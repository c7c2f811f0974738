//! Against real interpreters (each CPython 3.10–3.13 on the machine): each runs a script, prints
//! where its code objects are and what they say of themselves, and waits while they are read
//! from outside.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use tracer_common::PyConfig;

use super::{
    code, interp,
    version::{Frames, Version},
};

const SCRIPT: &str = r#"
import json, sys

class Outer:
    def inner(self, n):
        total = 0
        for i in range(n):
            total += i
        return total

def naïve(x):
    return [x] * 3

def 数据(x):
    return {x: x}

out = []
for f in (Outer.inner, naïve, 数据):
    co = f.__code__
    lines = [[o // 2, l] for s, e, l in co.co_lines() for o in range(s, e, 2)]
    out.append({"id": id(co), "file": co.co_filename,
                "qualname": getattr(co, "co_qualname", co.co_name),
                "first": co.co_firstlineno, "lines": lines,
                "units": len(co.co_code) // 2})
print(json.dumps(out), flush=True)
sys.stdin.read()
"#;

/// Writes `source` as `name` in a scratch directory and starts `python` on it with piped stdin
/// and stdout; returns it (with its directory) and the first line it printed.
fn start(
    python: &str,
    name: &str,
    source: &str,
) -> (std::process::Child, std::path::PathBuf, String) {
    let tag = python.rsplit('/').next().unwrap_or(python);
    let dir =
        std::env::temp_dir().join(format!("leaktracer-py-{}-{tag}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join(name);
    std::fs::write(&script, source).unwrap();
    let mut py = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the interpreter starts");
    let mut line = String::new();
    BufReader::new(py.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (py, dir, line)
}

#[test]
fn code_objects_of_a_running_interpreter_resolve_to_file_function_and_line() {
    for (_, python) in crate::python::interpreters() {
        code_objects_resolve(&python);
    }
}

fn code_objects_resolve(python: &str) {
    let (mut py, dir, line) = start(python, "réseau_train.py", SCRIPT);
    let want: serde_json::Value = serde_json::from_str(&line).expect(&line);
    let pid = py.id();
    let found = interp::detect(pid).expect("a CPython in the process");
    let layout = Version::of(&found).unwrap().layout;
    let mut checked = 0;
    for w in want.as_array().unwrap() {
        let info = code::read(pid, &found, &layout, w["id"].as_u64().unwrap()).unwrap();
        assert_eq!(info.file, w["file"].as_str().unwrap(), "{python}");
        assert_eq!(info.function, w["qualname"].as_str().unwrap());
        assert_eq!(u64::from(info.first_line), w["first"].as_u64().unwrap());
        // Its bytecode's length, where the head tells it (3.11+): an offset past it is another's.
        let units = w["units"].as_u64().unwrap() as u32;
        assert!(info.holds(units - 1), "{python}");
        assert_eq!(info.holds(units), layout.co_units.is_none(), "{python}");
        for pair in w["lines"].as_array().unwrap() {
            let offset = pair[0].as_u64().unwrap() as u32;
            let line = pair[1].as_u64().map(|l| l as u32);
            assert_eq!(
                info.line(offset),
                line,
                "{python}: {} at {offset}",
                info.function
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked}");
    // Not a code object: the type check refuses it.
    let not_code = want[0]["id"].as_u64().unwrap() + 8;
    assert!(code::read(pid, &found, &layout, not_code).is_err());
    py.stdin.take().unwrap().write_all(b"").unwrap();
    py.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

const NESTED: &str = r#"import sys, threading
def h():
    print("ready", threading.get_ident(), id(globals()), flush=True)
    sys.stdin.read()
def g():
    h()
def f():
    g()
f()
"#;

#[test]
fn a_threads_python_frames_are_walked_from_its_thread_state() {
    for (_, python) in crate::python::interpreters() {
        frames_are_walked(&python);
    }
}

fn frames_are_walked(python: &str) {
    let (mut py, dir, line) = start(python, "nested.py", NESTED);
    let words: Vec<u64> = line
        .strip_prefix("ready ")
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let [ident, globals] = words[..] else {
        panic!("{line}")
    };
    let pid = py.id();
    // Until it is blocked in sys.stdin.read() (line 4): in the read system call (number 0).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .unwrap_or_default()
        .starts_with("0 0x0 ")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "python never blocked reading stdin"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let found = interp::detect(pid).expect("a CPython in the process");
    let version = Version::of(&found).unwrap();
    let cfg = PyConfig {
        runtime: found.runtime,
        ..version.config
    };
    // The thread as its state records it: 3.10 by pthread_t (threading's ident), later ones by
    // native id (the main thread's is the pid).
    let me = if cfg.task_fsbase != 0 {
        ident
    } else {
        u64::from(pid)
    };
    // Blocked in read with the GIL released: found in the interpreter's thread list.
    let raw = super::walk::walk(pid, &cfg, me);
    assert!(
        super::walk::walk(pid, &cfg, me + 1_000_000).is_empty(),
        "no such thread"
    );
    let resolved: Vec<(String, Option<u32>, bool)> = version
        .steps(&raw)
        .iter()
        .map(|f| {
            let info = code::read(pid, &found, &version.layout, f.code).unwrap();
            (
                info.function.clone(),
                f.offset.and_then(|o| info.line(o)),
                f.entry,
            )
        })
        .collect();
    // Innermost first. From 3.11, Python-to-Python calls share one evaluation, begun by the
    // module's frame; 3.10 evaluates each frame on its own.
    let shared = version.frames != Frames::Legacy;
    assert_eq!(
        resolved,
        [
            ("h".to_string(), Some(4), !shared),
            ("g".to_string(), Some(6), !shared),
            ("f".to_string(), Some(8), !shared),
            ("<module>".to_string(), Some(9), true),
        ],
        "{python}"
    );
    // Each function's frame carries its globals (the module's dict), the module's body its code
    // object's file name.
    let shim = |flags: u64| {
        matches!(version.frames, Frames::Shim { .. }) && tracer_common::py_entry(flags) == 3
    };
    let sent: Vec<(u64, Option<u64>)> = raw
        .chunks(3)
        .filter(|t| !shim(t[2]))
        .map(|t| (t[2] >> 8, tracer_common::py_module_file(t[2])))
        .collect();
    let body = version.steps(&raw).last().unwrap().code;
    let head = code::head(pid, &version.layout, body).unwrap();
    let file = code::fingerprint(&version.layout, &head)[1];
    assert_eq!(
        sent,
        [
            (globals, None),
            (globals, None),
            (globals, None),
            (file, Some(file))
        ],
        "{python}"
    );
    drop(py.stdin.take());
    py.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
