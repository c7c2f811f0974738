//! Heap-level probes: the malloc family. Entry programs record the call's arguments per thread;
//! one return program turns the result into an event with the caller's stack (taken at return, where
//! the frame-pointer chain is intact and the direct caller is the first frame).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{AllocFn, Counter, EventKind, Pending};

use crate::{
    pages::flush,
    shared::{
        PENDING, Stack, capture, count, emit, emit_deep, emit_with_stack, event, outermost_return,
        probe_regs, traced_current, untimed_event,
    },
};

/// Records an allocator entry. A call made while another allocator call of the same thread is in
/// flight deeper on the stack (realloc → malloc, reallocarray → realloc) only bumps the depth:
/// the outer call's return accounts for it.
#[inline(always)]
fn enter(ctx: &ProbeContext, func: AllocFn, arg0: u64, size: u64) -> u32 {
    // A thread with an entry is traced (entries are made only for traced threads and go away with
    // the thread): one per-thread lookup and no hash on the hot path.
    // SAFETY: `regs` is the probe's register block.
    let sp = unsafe { (*ctx.regs).rsp };
    if let Some(p) = PENDING.current() {
        if p.depth > 0 && sp <= p.sp {
            p.depth += 1;
            count(Counter::Nested);
            return 0;
        }
        // The thread's entry is idle (or stale after a longjmp): reuse it in place.
        start(p, func, sp, arg0, size);
        return 0;
    }
    if traced_current().is_none() {
        return 0;
    }
    match PENDING.current_or_create() {
        Some(p) => start(p, func, sp, arg0, size),
        None => count(Counter::PendingFull),
    }
    0
}

/// Opens a call in the thread's entry; only the header is written (the parked events are not).
#[inline(always)]
fn start(p: &mut Pending, func: AllocFn, sp: u64, arg0: u64, size: u64) {
    (p.func, p.depth, p.sp, p.arg0, p.size, p.n_deferred) = (func as u32, 1, sp, arg0, size, 0);
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// nmemb * size. On overflow the call fails and records nothing, so wrapping is harmless; an
/// overflow check would need a 128-bit multiply helper that BPF does not have.
#[inline(always)]
fn mul(a: u64, b: u64) -> u64 {
    a.wrapping_mul(b)
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Malloc, 0, arg(&ctx, 0))
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Calloc, 0, mul(arg(&ctx, 0), arg(&ctx, 1)))
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Realloc, arg(&ctx, 0), arg(&ctx, 1))
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    enter(
        &ctx,
        AllocFn::Reallocarray,
        arg(&ctx, 0),
        mul(arg(&ctx, 1), arg(&ctx, 2)),
    )
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PosixMemalign, arg(&ctx, 0), arg(&ctx, 2))
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::AlignedAlloc, 0, arg(&ctx, 1))
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Memalign, 0, arg(&ctx, 1))
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Valloc, 0, arg(&ctx, 0))
}

/// PyTorch's `c10::alloc_cpu(size_t)`: every CPU tensor's memory. It calls posix_memalign, which
/// nests inside it; the block is recorded once, as a tensor, with the caller of alloc_cpu. Its free
/// goes through `free`.
#[uprobe]
pub fn c10_alloc_cpu_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::C10AllocCpu, 0, arg(&ctx, 0))
}

/// libc wrappers whose syscalls leaktracer sees at page level; probed only so that the syscall's
/// event carries the wrapper caller's stack (see `Pending::deferred`).
#[uprobe]
pub fn sbrk_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Sbrk, 0, 0)
}

#[uprobe]
pub fn mremap_wrapper_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Mremap, 0, 0)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Pvalloc, 0, arg(&ctx, 0))
}

/// Shared return program of every allocator above (one multi-attach link per library).
#[uretprobe(multi)]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = outermost_return(&PENDING) else {
        return 0;
    };
    let rv: u64 = ctx.ret();
    // One walk serves the allocation and the page-level events of this call (its caller's stack).
    let stack = capture(&probe_regs(ctx.regs));
    finish(stack.as_ref(), p, id, rv);
    flush(stack.as_ref(), p);
    0
}

/// Return of `c10::alloc_cpu`: a tensor. Its callers are libtorch's, built without frame pointers:
/// the raw stack goes to user space, which unwinds it (see `DeepStackEvent`). Page-level events
/// of the call (a large tensor is its own mmap) go with the frame-pointer walk.
#[uretprobe(multi)]
pub fn c10_alloc_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = outermost_return(&PENDING) else {
        return 0;
    };
    let rv: u64 = ctx.ret();
    let regs = probe_regs(ctx.regs);
    if rv != 0 {
        let mut ev = event(EventKind::Alloc, p.func, id);
        (ev.addr, ev.size) = (rv, p.size);
        emit_deep(&regs, &ev);
    }
    if p.n_deferred > 0 {
        let stack = capture(&regs);
        flush(stack.as_ref(), p);
    }
    0
}

#[inline(always)]
fn finish(stack: Option<&Stack>, p: &Pending, id: u64, rv: u64) {
    let Some(func) = AllocFn::from_u32(p.func) else {
        return;
    };
    let mut ev = match func {
        AllocFn::Sbrk | AllocFn::Mremap => return, // only their deferred syscall event counts
        AllocFn::PosixMemalign => {
            if rv as u32 != 0 {
                return; // error code: nothing allocated, *memptr untouched
            }
            // SAFETY: user memory read that fails cleanly.
            let Ok(addr) = (unsafe { bpf_probe_read_user(p.arg0 as *const u64) }) else {
                return;
            };
            let mut ev = event(EventKind::Alloc, p.func, id);
            ev.addr = addr;
            ev
        }
        AllocFn::Realloc | AllocFn::Reallocarray => {
            // NULL with a non-zero size is a failure: the old block is untouched.
            if rv == 0 && p.size != 0 {
                return;
            }
            let mut ev = event(EventKind::Realloc, p.func, id);
            ev.old_addr = p.arg0;
            ev.addr = rv;
            ev
        }
        _ => {
            if rv == 0 {
                return;
            }
            let mut ev = event(EventKind::Alloc, p.func, id);
            ev.addr = rv;
            ev
        }
    };
    ev.size = p.size;
    match stack {
        Some(stack) if ev.addr != 0 => emit_with_stack(stack, &ev, 0),
        _ => emit(&ev), // realloc(p, 0): a free, no stack needed
    }
}

/// `free(ptr)`, attached past its null test where that instruction is emulated (see
/// tracer/src/probes/placement.rs); `rdi` still holds the pointer there.
#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    let ptr = arg(&ctx, 0);
    if ptr == 0 {
        return 0;
    }
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the probe's register block.
    let sp = unsafe { (*ctx.regs).rsp };
    match PENDING.current() {
        Some(p) if p.depth > 0 && sp <= p.sp => {
            count(Counter::Nested); // realloc(p, 0) frees through free's public address
            return 0;
        }
        Some(_) => {} // an entry means a traced thread
        None if traced_current().is_none() => return 0,
        None => {}
    }
    let mut ev = untimed_event(EventKind::Free, AllocFn::Free as u32, id);
    ev.old_addr = ptr;
    emit(&ev);
    0
}

/// Empty programs at the same points: the probe floor for the benchmark.
#[uprobe]
pub fn bare_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe(multi)]
pub fn bare_return(_ctx: RetProbeContext) -> u32 {
    0
}
