//! CPython's object allocator, sampled for a bounded window in a process whose arenas grow
//! (`--heap auto`, [`tracer_common::TRACED_OBJECTS`]): `PyObject_*` and `PyMem_*`, attached for
//! that process's address space alone. The entries share the malloc family's return program;
//! sample points fall every [`tracer_common::OBJECT_SAMPLE_BYTES`] on average, and a free is sent
//! only for a recorded block.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};
use tracer_common::{AllocFn, TRACED_OBJECTS};

use crate::{
    heap::{arg, enter, mul, send_free},
    sampling,
    shared::traced_flags,
};

#[uprobe]
pub fn object_malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PyObjectMalloc, 0, arg(&ctx, 0))
}

#[uprobe]
pub fn object_calloc_enter(ctx: ProbeContext) -> u32 {
    enter(
        &ctx,
        AllocFn::PyObjectCalloc,
        0,
        mul(arg(&ctx, 0), arg(&ctx, 1)),
    )
}

#[uprobe]
pub fn object_realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PyObjectRealloc, arg(&ctx, 0), arg(&ctx, 1))
}

#[uprobe]
pub fn mem_malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PyMemMalloc, 0, arg(&ctx, 0))
}

#[uprobe]
pub fn mem_calloc_enter(ctx: ProbeContext) -> u32 {
    enter(
        &ctx,
        AllocFn::PyMemCalloc,
        0,
        mul(arg(&ctx, 0), arg(&ctx, 1)),
    )
}

#[uprobe]
pub fn mem_realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PyMemRealloc, arg(&ctx, 0), arg(&ctx, 1))
}

/// `PyObject_Free` and `PyMem_Free`: most blocks were not recorded and go first, on one lookup;
/// a recorded one is released while the process's objects are still sampled (after the window,
/// its blocks stay as they were when it closed).
#[uprobe]
pub fn object_free_enter(ctx: ProbeContext) -> u32 {
    let ptr = arg(&ctx, 0);
    if ptr == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !sampling::recorded(tgid, ptr) {
        return 0;
    }
    let sampled = traced_flags().is_some_and(|(_, _, flags)| flags & TRACED_OBJECTS != 0);
    if sampled && sampling::forget(tgid, ptr) {
        send_free(tgid, ptr);
    }
    0
}
