//! Page-level probes: anonymous mmap, partial munmap, mremap grow/shrink, sbrk; the direct caller
//! of libc's frameless syscall wrappers is in the stack.

use tests::{fixture, report::frame_index};

const PAGE: u64 = 4096;

#[test]
fn mmap_munmap_mremap_and_sbrk_per_call_site() {
    let Some(t) = fixture::trace_fixture("pages", &[], &[]) else {
        return;
    };
    let r = t.last();
    // mmap goes through a helper `map`, called from each leaking function.
    let mapped_from = |f: &str| {
        r.sum(|s| {
            s["kind"] == "mmap" && frame_index(s, "map") == Some(1) && frame_index(s, f) == Some(2)
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
    // sbrk: libc's wrapper chain has no frame pointers; the caller must still be frame 0.
    assert_eq!(r.site("brk", 0, "leak_sbrk"), (16 * PAGE, 1));
    assert_eq!(r.site("brk", 0, "control_sbrk"), (0, 0));
    assert_eq!(r.site("mmap", 0, "failed_mmap"), (0, 0));
}
