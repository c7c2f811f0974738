//! `run`: the command's exit status comes back, periodic reports come before the final one, and
//! `free` is probed past its single-stepped first instruction.

use tests::fixture;

#[test]
fn exit_status_and_signals_are_propagated() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let run = |script: &str| {
        fixture::leaktracer_cmd()
            .args(["run", "-o", "/dev/null", "--", "sh", "-c", script])
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(run("exit 7"), Some(7));
    assert_eq!(run("kill -9 $$"), Some(128 + 9));
}

#[test]
fn periodic_reports_precede_the_final_one() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let t = fixture::trace(&["--interval", "0.2"], &["sleep", "1"]).unwrap();
    assert!(t.reports.len() >= 3, "{} reports", t.reports.len());
    let (last, earlier) = t.reports.split_last().unwrap();
    assert_eq!(last.0["final"], true);
    assert!(earlier.iter().all(|r| r.0["final"] == false));
}

#[test]
fn free_is_not_probed_on_a_single_stepped_instruction() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let t = fixture::trace(&[], &["true"]).unwrap();
    assert!(
        t.last().0.get("probe_cost").is_none(),
        "only with --probe-cost"
    );
    let probes = t.last().0["probes"].as_array().unwrap().clone();
    let free = probes
        .iter()
        .find(|p| p["function"] == "free")
        .expect("free probed");
    // This machine's glibc starts free with `test %rdi,%rdi`, which the kernel single-steps.
    assert_ne!(free["offset"], 0, "{free}");
    assert_eq!(
        free["reason"],
        "first emulated instruction; arguments intact"
    );
    let malloc = probes.iter().find(|p| p["function"] == "malloc").unwrap();
    assert_eq!(
        malloc["offset"], 0,
        "malloc starts with push, which is emulated: {malloc}"
    );
}

/// `--probe-cost`: each program that ran, with its runs and kernel time; the heap fixture's own
/// calls are among the runs (the probes fire for every process, and are filtered in them).
#[test]
fn probe_cost_counts_each_programs_runs() {
    let Some(t) = fixture::trace_fixture("heap", &["--probe-cost"], &[]) else {
        return;
    };
    let cost = t.last().0["probe_cost"].as_array().unwrap().clone();
    let runs = |name: &str| t.last().program_runs(name);
    // heap.c: 20 mallocs and 10 callocs in its leak and control functions, their 15 frees, and
    // 3 posix_memaligns.
    assert!(runs("malloc_enter") >= 20, "{cost:?}");
    assert!(runs("calloc_enter") >= 10, "{cost:?}");
    assert!(runs("alloc_return") >= 30, "{cost:?}");
    assert!(runs("free_enter") >= 15, "{cost:?}");
    // Named in full, not as the kernel keeps them (15 characters: "posix_memalign_").
    assert!(runs("posix_memalign_enter") >= 3, "{cost:?}");
    assert!(cost.iter().all(|p| p["ns"].as_u64() > Some(0)), "{cost:?}");
    let ns: Vec<u64> = cost.iter().map(|p| p["ns"].as_u64().unwrap()).collect();
    assert!(
        ns.windows(2).all(|w| w[0] >= w[1]),
        "costliest first: {ns:?}"
    );
}
