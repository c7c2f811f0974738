//! Cross-check against valgrind: each traced process's heap at exit equals valgrind's "in use at
//! exit" for the same binary. valgrind runs with --run-libc-freeres=no so that glibc's exit-time
//! cleanup (which an ordinary run never does) does not free blocks only under valgrind, and with
//! --run-cxx-freeres=no for libstdc++'s.

use std::process::Command;

use tests::fixture;

/// valgrind's "in use at exit: N bytes in M blocks" per pid.
fn valgrind(argv: &[&str]) -> Vec<(u64, u64, u64)> {
    fixture::wait_for_detached_probes();
    let out = Command::new("valgrind")
        .args([
            "--run-libc-freeres=no",
            "--run-cxx-freeres=no",
            "--trace-children=yes",
            "--child-silent-after-fork=no",
        ])
        .args(argv)
        .output()
        .expect("valgrind (apt: valgrind) is installed by scripts/setup.sh");
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .filter_map(|l| {
            let pid: u64 = l.strip_prefix("==")?.split("==").next()?.parse().ok()?;
            let rest = l.split("in use at exit: ").nth(1)?;
            let nums: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|w| w.replace(',', "").parse().ok())
                .collect();
            Some((pid, nums[0], nums[1]))
        })
        .collect()
}

/// Heap (bytes, blocks) of each traced process at exit, own plus inherited, by order of pid.
fn traced(argv: &[&str]) -> Vec<(u64, u64)> {
    let t = fixture::trace(&[], argv).unwrap();
    let mut procs: Vec<_> = t
        .last()
        .processes()
        .iter()
        .map(|p| {
            let (own, inh) = (&p["own"]["heap"], &p["inherited"]["heap"]);
            let bytes = own["bytes"].as_u64().unwrap() + inh["bytes"].as_u64().unwrap();
            let blocks = own["blocks"].as_u64().unwrap() + inh["blocks"].as_u64().unwrap();
            (p["pid"].as_u64().unwrap(), bytes, blocks)
        })
        .collect();
    procs.sort();
    procs.into_iter().map(|(_, b, n)| (b, n)).collect()
}

fn check(name: &str, args: &[&str]) {
    check_binary(name, &fixture::build(name), args);
}

fn check_binary(name: &str, bin: &std::path::Path, args: &[&str]) {
    let mut argv = vec![bin.to_str().unwrap()];
    argv.extend_from_slice(args);
    let mut expected: Vec<_> = valgrind(&argv);
    expected.sort();
    let expected: Vec<_> = expected.into_iter().map(|(_, b, n)| (b, n)).collect();
    assert!(!expected.is_empty(), "valgrind printed no summary");
    assert_eq!(
        traced(&argv),
        expected,
        "{name} {args:?}: leaktracer vs valgrind (bytes, blocks) per process"
    );
}

#[test]
fn heap_totals_at_exit_equal_valgrind() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    // valgrind does not intercept pvalloc (glibc serves it internally): the fixture skips it here.
    check("heap", &["no-pvalloc"]);
    check("threads", &[]);
    check("tree", &["fork"]);
}

/// A C++ program built as users build it (`g++ -O2 -g`, no frame pointers: stacks copied and
/// unwound), with libstdc++'s own start-up allocations.
#[test]
fn cplusplus_heap_at_exit_equals_valgrind() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build_cxx("thumbnailer-O2", "thumbnailer", &["-O2", "-g"]);
    check_binary("thumbnailer", &bin, &["30"]);
}
