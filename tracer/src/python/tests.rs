//! Against a real interpreter: the machine's python3 runs a script, prints where its code
//! objects are and what they say of themselves, and waits while they are read from outside.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use super::{code, interp};

const SCRIPT: &str = r#"
import dis, json, sys

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
    lines = [[i.offset // 2, i.positions.lineno] for i in dis.get_instructions(co)]
    out.append({"id": id(co), "file": co.co_filename, "qualname": co.co_qualname,
                "first": co.co_firstlineno, "lines": lines})
print(json.dumps(out), flush=True)
sys.stdin.read()
"#;

/// Writes `source` as `name` in a scratch directory and starts the machine's python3 on it with
/// piped stdin and stdout; returns it (with its directory) and the first line it printed.
fn start(name: &str, source: &str) -> (std::process::Child, std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("leaktracer-py-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join(name);
    std::fs::write(&script, source).unwrap();
    let mut py = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 on this machine");
    let mut line = String::new();
    BufReader::new(py.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (py, dir, line)
}

#[test]
fn code_objects_of_a_running_interpreter_resolve_to_file_function_and_line() {
    let (mut py, dir, line) = start("réseau_train.py", SCRIPT);
    let want: serde_json::Value = serde_json::from_str(&line).expect(&line);
    let pid = py.id();
    let found = interp::detect(pid).expect("a CPython in the process");
    let layout = code::Layout::of(found.version)
        .unwrap_or_else(|| panic!("no layout for {:?} ({})", found.version, found.path));
    let mut checked = 0;
    for w in want.as_array().unwrap() {
        let info = code::read(pid, &found, &layout, w["id"].as_u64().unwrap()).unwrap();
        assert_eq!(info.file, w["file"].as_str().unwrap());
        assert_eq!(info.function, w["qualname"].as_str().unwrap());
        assert_eq!(u64::from(info.first_line), w["first"].as_u64().unwrap());
        for pair in w["lines"].as_array().unwrap() {
            let offset = pair[0].as_u64().unwrap() as u32;
            let line = pair[1].as_u64().map(|l| l as u32);
            assert_eq!(info.line(offset), line, "{} at {offset}", info.function);
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

const NESTED: &str = r#"import sys
def h():
    print("ready", flush=True)
    sys.stdin.read()
def g():
    h()
def f():
    g()
f()
"#;

#[test]
fn a_threads_python_frames_are_walked_from_its_thread_state() {
    let (mut py, dir, line) = start("nested.py", NESTED);
    assert_eq!(line, "ready\n");
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
    let layout = code::Layout::of(found.version).unwrap();
    let offs = super::walk::offsets(found.version).unwrap();
    // Blocked in read with the GIL released: found in the interpreter's thread list by its id.
    let frames = super::walk::walk(pid, &found, &offs, pid);
    assert!(
        super::walk::walk(pid, &found, &offs, pid + 1_000_000).is_empty(),
        "no such thread"
    );
    let resolved: Vec<(String, Option<u32>, bool)> = frames
        .iter()
        .map(|f| {
            let info = code::read(pid, &found, &layout, f.code).unwrap();
            (info.function.clone(), info.line(f.instr), f.entry)
        })
        .collect();
    assert_eq!(
        resolved,
        [
            ("h".to_string(), Some(4), false),
            ("g".to_string(), Some(6), false),
            ("f".to_string(), Some(8), false),
            ("<module>".to_string(), Some(9), true),
        ],
        "innermost first; Python-to-Python calls share one evaluation, the module's began it"
    );
    drop(py.stdin.take());
    py.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
