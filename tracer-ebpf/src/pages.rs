//! Page-level probes: mmap, munmap, mremap, mprotect and brk syscall tracepoints (they also catch
//! direct syscalls). Only the exits are probed: the call's arguments are still in the user
//! registers the task saved at syscall entry, so an exit builds the event from them and the result
//! when the call succeeded. (Entry probes cost a hash insert and remove per call, on every process
//! of the machine, for arguments the exit can read itself.) Inside an allocator call (malloc growing
//! its heap, sbrk, mremap) events are parked in that call's pending entry, in order, and sent at its
//! return with the caller's stack.
//!
//! The stack walk (native and Python) lives in one program, [`page_send`], which the exits reach
//! by tail call: the verifier checks it once instead of once per exit (~0.5 s each here, most of
//! the tracer's start-up, when every exit carried it and the walks were not yet global functions,
//! see `python::emit_frames`).

use aya_ebpf::{
    bindings::pt_regs,
    macros::{map, tracepoint},
    maps::{PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use tracer_common::{
    AllocFn, Counter, Event, EventKind, MAPPED_BY_ALLOCATOR, MAX_DEFERRED, Pending,
};

use crate::entries;
use crate::shared::{
    STEP, Stack, UserRegs, capture, count, emit, emit_now, emit_with_stack, event, leaf_caller_at,
    probe_regs, saved_regs, stop_for_code, traced_current, traced_flags,
};

/// What an exit hands [`page_send`]: the event, the registers its stack is walked from, and
/// whether the thread's parked events go first.
#[repr(C)]
struct PageJob {
    ev: Event,
    leaf_caller: u64,
    /// 1: the thread's parked events are full: send them (with the stack) and park `ev`.
    flush_and_park: u64,
    regs: UserRegs,
}

#[map]
static PAGE_JOB: PerCpuArray<PageJob> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: [`page_send`], set by user space before the exits are attached.
#[map]
static PAGE_SEND: ProgramArray = ProgramArray::with_max_entries(1, 0);

const MAP_ANONYMOUS: u64 = 0x20;
const PROT_EXEC: u64 = 0x4;

/// Syscall return value (offset 16 in the exit record).
#[inline(always)]
fn sys_ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: in-bounds read of the tracepoint record.
    unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1)
}

/// The current thread's call, at its exit, when its process is traced and the call succeeded:
/// the thread, the registers the call was made with and its result.
#[inline(always)]
fn succeeded(ctx: &TracePointContext) -> Option<(u64, pt_regs, u64)> {
    let (id, _) = traced_current()?;
    let ret = sys_ret(ctx);
    if (-4095..0).contains(&ret) {
        return None;
    }
    Some((id, saved_regs()?, ret as u64))
}

/// Whether an event is worth a stack: memory appearing (anonymous mmap, mremap, brk growth; a
/// `brk(0)` only asks for the break).
#[inline(always)]
pub fn needs_stack(ev: &Event) -> bool {
    match ev.kind {
        k if k == EventKind::Mmap as u32 => ev.aux & MAP_ANONYMOUS != 0,
        k if k == EventKind::Mremap as u32 => true,
        k if k == EventKind::Brk as u32 => ev.old_addr != 0,
        _ => false,
    }
}

/// The exit of every syscall probe: when the thread's call succeeded, builds the event (`fill`
/// maps the call's arguments, rdi, rsi, rdx and r10 on x86-64, and its result onto it) and sends
/// or parks it.
#[inline(always)]
fn exit(
    ctx: &TracePointContext,
    func: AllocFn,
    kind: EventKind,
    fill: impl Fn(&mut Event, &pt_regs, u64),
) -> u32 {
    if let Some((id, regs, ret)) = succeeded(ctx) {
        let mut ev = event(kind, func as u32, id);
        fill(&mut ev, &regs, ret);
        defer_or_send(ctx, &ev, &regs);
    }
    0
}

/// Sends one event, with `stack` when it needs one.
#[inline(always)]
pub fn send(stack: Option<&Stack>, ev: &Event, leaf_caller: u64) {
    match stack {
        Some(stack) if needs_stack(ev) => emit_with_stack(stack, ev, leaf_caller),
        _ => emit(ev),
    }
}

/// Sends the events parked in `p`, in order, with `stack`.
#[inline(always)]
pub fn flush(stack: Option<&Stack>, p: &mut Pending) {
    for i in 0..MAX_DEFERRED {
        if (i as u64) < p.n_deferred {
            send(stack, &p.deferred[i], 0);
        }
    }
    p.n_deferred = 0;
}

/// Parks `ev` in the thread's allocator call in flight, or sends it now when there is none (with
/// the stack walked from `regs`, the call's, when it needs one).
#[inline(always)]
fn defer_or_send(ctx: &TracePointContext, ev: &Event, regs: &pt_regs) {
    // An arena a Python object's call maps is not parked: it is the object allocator's page
    // event, with the stack of the mmap it makes (`_PyObject_ArenaMmap`).
    let Some(p) = entries::current().filter(|p| p.depth > 0 && !crate::heap::object_call(p)) else {
        if needs_stack(ev) {
            // The caller of a frameless libc wrapper, which the frame-pointer walk skips.
            hand_off(ctx, ev, regs, leaf_caller_at(regs.rsp), 0);
        } else {
            emit(ev);
        }
        return;
    };
    if p.n_deferred >= MAX_DEFERRED as u64 {
        // Rare (more page events in one allocator call than slots): send them with this stack.
        hand_off(ctx, ev, regs, 0, 1);
        return;
    }
    park(p, ev);
}

#[inline(always)]
fn park(p: &mut Pending, ev: &Event) {
    let i = p.n_deferred as usize;
    if i < MAX_DEFERRED {
        p.deferred[i] = *ev;
        if ev.kind == EventKind::Mmap as u32 {
            p.deferred[i].aux |= MAPPED_BY_ALLOCATOR;
        }
        p.n_deferred += 1;
    }
}

/// Continues in [`page_send`] with `ev`. Should the tail call fail, `ev` goes without a stack
/// (counted as a stack error) rather than not at all.
#[inline(always)]
fn hand_off(
    ctx: &TracePointContext,
    ev: &Event,
    regs: &pt_regs,
    leaf_caller: u64,
    flush_and_park: u64,
) {
    if let Some(job) = PAGE_JOB.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; the tail-called program runs next on the same CPU.
        unsafe {
            (*job).ev = *ev;
            (*job).leaf_caller = leaf_caller;
            (*job).flush_and_park = flush_and_park;
            (*job).regs = probe_regs(regs);
            PAGE_SEND.tail_call(ctx, 0);
        }
    }
    count(Counter::StackErrors);
    emit(ev);
}

/// The page-level events that need a stack: walks it from the call's user registers and
/// sends [`PageJob`]'s event (and, when asked, the thread's parked events first). Never attached;
/// reached by tail call from the exits.
#[tracepoint]
pub fn page_send(_ctx: TracePointContext) -> u32 {
    let Some(job) = PAGE_JOB.get_ptr(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot, written by the exit that tail-called this program.
    let (ev, leaf_caller, flush_and_park, regs) = unsafe {
        (
            (*job).ev,
            (*job).leaf_caller,
            (*job).flush_and_park,
            (*job).regs,
        )
    };
    let stack = capture(&regs, STEP);
    if flush_and_park == 0 {
        send(stack.as_ref(), &ev, leaf_caller);
    } else if let Some(p) = entries::current() {
        flush(stack.as_ref(), p);
        park(p, &ev);
    }
    0
}

#[tracepoint]
pub fn mmap_exit(ctx: TracePointContext) -> u32 {
    let Some((id, regs, ret)) = succeeded(&ctx) else {
        return 0;
    };
    // mmap(addr, length, prot, flags, fd, offset)
    let (prot, flags) = (regs.rdx, regs.r10);
    let mut ev = event(EventKind::Mmap, AllocFn::Mmap as u32, id);
    (ev.addr, ev.size, ev.aux) = (ret, regs.rsi, (prot << 32) | (flags & 0xffff_ffff));
    if prot & PROT_EXEC != 0 && flags & MAP_ANONYMOUS == 0 {
        // A library's code: user space refreshes its view of the process's modules and probes the
        // library if it allocates, before the thread runs it (when the process is held). Sent now:
        // never parked, since the stop waits for it.
        if let Some((_, _, flags)) = traced_flags() {
            stop_for_code(flags, regs.r8, &mut ev);
        }
        emit_now(&ev);
    } else {
        defer_or_send(&ctx, &ev, &regs);
    }
    0
}

/// munmap(addr, length)
#[tracepoint]
pub fn munmap_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Munmap, EventKind::Munmap, |ev, r, _| {
        (ev.old_addr, ev.old_size) = (r.rdi, r.rsi);
    })
}

/// mprotect(addr, length, prot)
#[tracepoint]
pub fn mprotect_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Mprotect, EventKind::Mprotect, |ev, r, _| {
        (ev.old_addr, ev.old_size, ev.aux) = (r.rdi, r.rsi, r.rdx);
    })
}

/// mremap(old_address, old_size, new_size, flags, new_address)
#[tracepoint]
pub fn mremap_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Mremap, EventKind::Mremap, |ev, r, ret| {
        (ev.old_addr, ev.old_size, ev.addr, ev.size) = (r.rdi, r.rsi, ret, r.rdx);
    })
}

/// brk(addr): the result is the new break (the old one when it failed).
#[tracepoint]
pub fn brk_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Brk, EventKind::Brk, |ev, r, ret| {
        (ev.old_addr, ev.addr) = (r.rdi, ret);
    })
}
