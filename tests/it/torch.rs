//! PyTorch's CPU allocator through the tch harness on the real libtorch: tensors are told apart
//! from the rest of the heap, exactly, and counted once (c10::alloc_cpu's own posix_memalign is
//! nested in it).

use tests::{fixture, report::frame_fn};

#[test]
fn retained_tensors_are_counted_exactly_as_tensors() {
    if !fixture::bpf_available() {
        return;
    }
    let Some(harness) = fixture::harness() else {
        return;
    };
    let _x = fixture::exclusive();
    // libtorch's start-up makes a million allocator calls in seconds: a previous session still
    // detaching holds the kernel's uprobe locks, which stalls this one long enough to fill the
    // ring. Exact counts need a clean start.
    fixture::wait_for_detached_probes();
    let steps = 4;
    let t = fixture::trace(
        &[],
        &[harness.to_str().unwrap(), "retain", &steps.to_string()],
    )
    .expect("leaktracer run");
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    let activation = 256 * 256 * 4; // one f32 activation of harness::SIDE²
    assert_eq!(
        r.0["totals"]["tensor"]["bytes"],
        steps * activation,
        "the retained activations, and nothing else: inputs and weights were freed"
    );
    assert_eq!(r.0["totals"]["tensor"]["blocks"], steps);
    let tensors: Vec<_> = r
        .stacks()
        .iter()
        .filter(|s| s["kind"] == "tensor")
        .collect();
    assert_eq!(tensors.len(), 1, "one allocation site");
    assert_eq!(tensors[0]["allocators"][0], "c10::alloc_cpu");
    assert_eq!(
        frame_fn(tensors[0], 0),
        Some("c10::DefaultCPUAllocator::allocate(unsigned long)"),
        "the caller of alloc_cpu, symbolized and demangled"
    );
    // Not counted twice: no heap block of an activation's size.
    assert!(
        !r.stacks()
            .iter()
            .any(|s| s["kind"] == "heap" && s["bytes"] == activation),
        "alloc_cpu's posix_memalign was recorded as heap too"
    );
    let libc10 = r.0["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["path"].as_str().unwrap().ends_with("libc10.so"))
        .expect("libc10 probed");
    assert_eq!(libc10["roles"][0], "torch-cpu");
    assert_eq!(libc10["timing"]["when"], "at_map");
    assert_eq!(r.losses()["ringbuf_full"], 0);
}
