//! Page-level probes: anonymous mmap, partial munmap, mremap grow/shrink, sbrk; the direct caller
//! of libc's frameless syscall wrappers is in the stack.

use tests::{
    fixture,
    report::{Report, frame_index},
};

const PAGE: u64 = 4096;

/// The fixture's mappings, by the function that made them: mmap goes through a helper `map`,
/// called from each leaking function (libc's wrapper comes first, with the function inlined into
/// it as a frame of its own).
fn assert_mappings(r: &Report) {
    let mapped_from = |f: &str| {
        r.sum(|s| {
            let map = frame_index(s, "map");
            s["kind"] == "mmap" && map.is_some() && frame_index(s, f) == map.map(|i| i + 1)
        })
    };
    assert_eq!(mapped_from("leak_mmap"), (3 * 5 * PAGE, 3));
    assert_eq!(mapped_from("control_mmap"), (0, 0));
    assert_eq!(
        mapped_from("leak_munmap_partial"),
        (8 * PAGE, 2),
        "a hole splits the mapping in two"
    );
    assert_eq!(
        mapped_from("leak_mremap_grow"),
        (16 * PAGE, 1),
        "mremap keeps the mapping's stack"
    );
    assert_eq!(mapped_from("leak_mremap_shrink"), (2 * PAGE, 1));
}

#[test]
fn mmap_munmap_mremap_and_sbrk_per_call_site() {
    let Some(t) = fixture::trace_fixture("pages", &[], &[]) else {
        return;
    };
    let r = t.last();
    assert_mappings(r);
    // sbrk: libc's wrapper chain has no frame pointers; the caller must still be frame 0.
    assert_eq!(r.site("brk", 0, "leak_sbrk"), (16 * PAGE, 1));
    assert_eq!(r.site("brk", 0, "control_sbrk"), (0, 0));
    assert_eq!(r.site("mmap", 0, "failed_mmap"), (0, 0));
}

/// `--heap off`: the page level alone, each call seen by its exit program only (its arguments read
/// from the user registers saved at syscall entry): the same regions, sizes and call sites as
/// with the heap probes in, one program run per call, and no syscall entry program.
#[test]
fn heap_off_sees_each_call_by_its_exit_alone() {
    let Some(t) = fixture::trace_fixture("pages", &["--heap", "off", "--probe-cost"], &[]) else {
        return;
    };
    let r = t.last();
    assert_mappings(r);
    // The break: +4 and -4 pages, then +16 (the fixture allocates nothing else from the heap).
    assert_eq!(r.sum(|s| s["kind"] == "brk"), (16 * PAGE, 1));
    let runs = |name: &str| r.program_runs(name);
    let cost = &r.0["probe_cost"];
    // The fixture's own calls (ld.so and libc make more): 3 + 1 munmaps, 2 mremaps, 3 sbrks.
    assert!(runs("munmap_exit") >= 4, "{cost}");
    assert!(runs("mremap_exit") >= 2, "{cost}");
    assert!(runs("brk_exit") >= 3, "{cost}");
    for call in ["mmap", "munmap", "mprotect", "mremap", "brk"] {
        assert_eq!(runs(&format!("{call}_enter")), 0, "{cost}");
    }
}
