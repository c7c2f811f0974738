//! CPython's object allocator, sampled for a bounded window in a process whose arenas grow
//! (`--heap auto`, [`tracer_common::TRACED_OBJECTS`]): `PyObject_*` and `PyMem_*`, attached for
//! that process's address space alone. The entries share the malloc family's return program;
//! sample points fall every [`tracer_common::OBJECT_SAMPLE_BYTES`] on average, and a free is sent
//! only for a recorded block.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{AllocFn, TRACED_OBJECTS};

use crate::{
    heap::{arg, enter, mul, send_free},
    sampling,
    shared::traced_flags,
};

/// The entry of every allocating function of the object allocator: one multi-attach link per
/// interpreter (a window's probes are detached at its end, a grace period per link), the
/// function told by its cookie.
#[uprobe(multi)]
pub fn object_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: helper on the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(func) = AllocFn::from_u32(cookie as u32) else {
        return 0;
    };
    let (old, size) = match func {
        AllocFn::PyObjectCalloc | AllocFn::PyMemCalloc => (0, mul(arg(&ctx, 0), arg(&ctx, 1))),
        AllocFn::PyObjectRealloc | AllocFn::PyMemRealloc => (arg(&ctx, 0), arg(&ctx, 1)),
        _ => (0, arg(&ctx, 0)),
    };
    enter(&ctx, func, old, size)
}

/// `PyObject_Free` and `PyMem_Free`: most blocks were not recorded and go first, on one lookup;
/// a recorded one is released while the process's objects are still sampled (after the window,
/// its blocks stay as they were when it closed).
#[uprobe(multi)]
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
