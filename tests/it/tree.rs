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
