//! Process tree: a forked child's own leaks and its inherited blocks, an exec'd child's fresh image.

use tests::{fixture, report::frame_fn};

#[test]
fn forked_child_owns_its_leaks_and_inherits_the_parents() {
    let Some(t) = fixture::trace_fixture("tree", &[], &["fork"]) else {
        return;
    };
    let r = t.last();
    let root = r.root_pid();
    let child = r.child_of(root)["pid"].as_u64().unwrap();
    let at = |pid: u64, f: &str, inherited: bool| {
        r.sum(|s| {
            s["pid"] == pid
                && s["kind"] == "heap"
                && s["inherited"] == inherited
                && frame_fn(s, 0) == Some(f)
        })
    };
    assert_eq!(at(root, "parent_leak", false), (3000, 3));
    assert_eq!(
        at(root, "child_leak", false),
        (0, 0),
        "the child's leaks are not the parent's"
    );
    assert_eq!(at(child, "child_leak", false), (10_000, 5));
    assert_eq!(
        at(child, "parent_leak", true),
        (2000, 2),
        "inherited minus the one the child freed"
    );
    assert_eq!(
        r.process(child)["mismatches"]["unmatched_frees"],
        0,
        "the inherited free matched"
    );
}

#[test]
fn execed_child_starts_fresh() {
    let Some(t) = fixture::trace_fixture("tree", &[], &["exec"]) else {
        return;
    };
    let r = t.last();
    let root = r.root_pid();
    let child = r.child_of(root);
    let pid = child["pid"].as_u64().unwrap();
    assert_eq!(child["execs"], 1);
    assert!(
        child["command"].as_str().unwrap().ends_with("leaf"),
        "{}",
        child["command"]
    );
    let heap = |f: &str| {
        r.sum(|s| {
            s["pid"] == pid
                && s["kind"] == "heap"
                && s["inherited"] == false
                && frame_fn(s, 0) == Some(f)
        })
    };
    assert_eq!(heap("exec_leak"), (4 * 4096, 4));
    assert_eq!(heap("parent_leak"), (0, 0));
    assert_eq!(
        r.sum(|s| s["pid"] == pid && s["inherited"] == true),
        (0, 0),
        "exec drops the inherited image"
    );
}

/// A native command's malloc family is probed in the command's own processes alone: in the
/// command and in the child it forks, from the child's first call (its parent's fork is held
/// until the child's probes are in), and not in a process beside them, which would pay a trap
/// for each of its calls while the command is traced (an allocating program ran 18 times slower
/// beside `leaktracer run -- sleep 30` when the probes were attached for every process).
#[test]
fn a_native_commands_malloc_family_is_probed_in_its_processes_alone() {
    probed_in_its_processes_alone(&[], &["fork"], None, &[]);
}

/// The same under `--heap full`, whose malloc family is traced whole for every traced process.
#[test]
fn under_heap_full_the_malloc_family_is_probed_in_the_traced_processes_alone() {
    probed_in_its_processes_alone(&["--heap", "full"], &["fork"], None, &[]);
}

/// Traces `probed MODE…` (`leaktracer run EXTRA`, `env` added to the command's environment)
/// beside an untraced `probed watch WATCHED` (default libc), with the same environment: the
/// command and the child it forks say their function is probed, the process beside that no
/// code of the library it watches ever was. The report.
pub fn probed_in_its_processes_alone(
    extra: &[&str],
    mode: &[&str],
    watched: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Option<tests::report::Report> {
    if !fixture::bpf_available() {
        return None;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("probed");
    let beside = fixture::probed_beside(watched, env);
    let mut argv = vec![bin.to_str().unwrap()];
    argv.extend(mode);
    let t = fixture::trace_with_env(extra, &argv, env).expect("leaktracer run");
    let verdict = beside.verdict();
    let out = String::from_utf8_lossy(&t.output.stdout);
    let said: Vec<(u64, &str)> = out
        .lines()
        .filter_map(|l| {
            let (pid, what) = l.split_once(' ')?;
            Some((pid.parse().ok()?, what))
        })
        .collect();
    let r = t.last();
    let root = r.root_pid();
    let child = r.child_of(root)["pid"].as_u64().unwrap();
    assert_eq!(
        said,
        [(root, "probed"), (child, "probed")],
        "the command and its child carry the probes: {out}"
    );
    assert_eq!(
        verdict, "untouched",
        "a process beside the traced command carries none of its probes"
    );
    Some(r.clone())
}
