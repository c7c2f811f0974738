//! CPython's object allocator, sampled for a bounded window in a process whose arenas grow
//! (every heap mode but `off`, [`tracer_common::TRACED_OBJECTS`]): `PyObject_*` and `PyMem_*`,
//! attached for that process's address space alone. The entries share the malloc family's return
//! program; sample points fall every [`tracer_common::OBJECT_SAMPLE_BYTES`] on average, and a free
//! is sent only for a recorded block.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{AllocFn, COOKIE_ARGS_AFTER_CONTEXT, TRACED_OBJECTS};

use crate::{
    entries,
    heap::{enter, mul, send_free},
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
    let [a, b] = args(&ctx, cookie);
    let (old, size) = match func {
        AllocFn::PyObjectCalloc | AllocFn::PyMemCalloc => (0, mul(a, b)),
        AllocFn::PyObjectRealloc | AllocFn::PyMemRealloc => (a, b),
        _ => (0, a),
    };
    enter(&ctx, func, old, size)
}

/// The call's first two arguments: from the second argument register on where the probe is on
/// the function the interpreter's allocator table holds (its context first).
#[inline(always)]
fn args(ctx: &ProbeContext, cookie: u64) -> [u64; 2] {
    // SAFETY: the probe's own register block.
    let r = unsafe { &*ctx.regs };
    // Each register loaded first, then chosen: a load at an offset chosen at run time is one the
    // verifier rejects.
    // SAFETY: reads of the probe's own register block.
    let [rdi, rsi, rdx] = unsafe { [&r.rdi, &r.rsi, &r.rdx].map(|x| core::ptr::read_volatile(x)) };
    if cookie & COOKIE_ARGS_AFTER_CONTEXT != 0 {
        [rsi, rdx]
    } else {
        [rdi, rsi]
    }
}

/// Whether `ptr` is freed by the object realloc in flight on this thread that moves it
/// (pymalloc's realloc calls `_PyObject_Free` itself, where the free probe may be): the
/// realloc's return releases it, with what it grew by.
#[inline(always)]
fn moved_by_realloc(ctx: &ProbeContext, ptr: u64) -> bool {
    entries::of_probe(ctx.regs).is_some_and(|(p, _)| {
        let realloc = AllocFn::from_u32(p.func).is_some_and(|f| f.is_object() && f.is_realloc());
        p.depth > 0 && p.arg0 == ptr && realloc
    })
}

/// `PyObject_Free` and `PyMem_Free` (or the one function their tables hold): most blocks were
/// not recorded and go first, on one lookup; a recorded one is released while the process's
/// objects are still sampled (after the window, its blocks stay as they were when it closed).
#[uprobe(multi)]
pub fn object_free_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: helper on the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let [ptr, _] = args(&ctx, cookie);
    if ptr == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !sampling::recorded(tgid, ptr) {
        return 0;
    }
    if moved_by_realloc(&ctx, ptr) {
        return 0;
    }
    let sampled = traced_flags().is_some_and(|(_, _, flags)| flags & TRACED_OBJECTS != 0);
    if sampled && sampling::forget(tgid, ptr) {
        send_free(tgid, ptr);
    }
    0
}
