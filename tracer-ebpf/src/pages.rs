//! Page-level probes: mmap, munmap, mremap, mprotect and brk syscall tracepoints (they also catch
//! direct syscalls). Entry records the arguments per thread; exit builds the event when the call
//! succeeded. Inside an allocator call (malloc growing its heap, sbrk, mremap) events are parked in
//! that call's pending entry, in order, and sent at its return with the caller's stack.
//!
//! The stack walk (native and Python) lives in one program, [`page_send`], which the exits reach
//! by tail call: the verifier checks it once instead of once per exit (~0.5 s each here, most of
//! the tracer's start-up when every exit carried it).

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::{PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use tracer_common::{AllocFn, Counter, Event, EventKind, MAX_DEFERRED, Pending, SysCall};

use crate::shared::{
    PENDING, STEP, SYS_PENDING, Stack, capture, count, emit, emit_now, emit_with_stack, event,
    stop_for_probes, syscall_leaf_caller, task_regs, traced_current, traced_flags,
};

/// What an exit hands [`page_send`]: the event, and whether the thread's parked events go first.
#[repr(C)]
struct PageJob {
    ev: Event,
    leaf_caller: u64,
    /// 1: the thread's parked events are full: send them (with the stack) and park `ev`.
    flush_and_park: u64,
}

#[map]
static PAGE_JOB: PerCpuArray<PageJob> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: [`page_send`], set by user space before the exits are attached.
#[map]
static PAGE_SEND: ProgramArray = ProgramArray::with_max_entries(1, 0);

const MAP_ANONYMOUS: u64 = 0x20;

/// Syscall argument `n` (tracepoint layout: arguments from offset 16, 8 bytes each).
#[inline(always)]
fn sys_arg(ctx: &TracePointContext, n: usize) -> u64 {
    // SAFETY: in-bounds read of the tracepoint record.
    unsafe { ctx.read_at::<u64>(16 + 8 * n) }.unwrap_or(0)
}

/// Syscall return value (offset 16 in the exit record).
#[inline(always)]
fn sys_ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: in-bounds read of the tracepoint record.
    unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1)
}

/// The entry half of every syscall probe: saves the call's arguments (`args` reads them) for the
/// exit half, with the caller of a frameless wrapper when the event will want a stack.
#[inline(always)]
fn entry(
    ctx: &TracePointContext,
    func: AllocFn,
    args: impl Fn(&TracePointContext) -> (u64, u64, u64),
    stack: bool,
) -> u32 {
    if let Some((id, _)) = traced_current() {
        let (arg0, size, aux) = args(ctx);
        save(func, id, arg0, size, aux, stack);
    }
    0
}

#[inline(always)]
fn save(func: AllocFn, id: u64, arg0: u64, size: u64, aux: u64, stack: bool) {
    let leaf_caller = if stack { syscall_leaf_caller() } else { 0 };
    let p = SysCall {
        func: func as u32,
        arg0,
        size,
        aux,
        leaf_caller,
        ..SysCall::default()
    };
    if SYS_PENDING.insert(&id, &p, 0).is_err() {
        crate::shared::count(tracer_common::Counter::PendingFull);
    }
}

/// Takes the pending entry of the current thread's syscall, if it is `func` and succeeded.
#[inline(always)]
fn take(ctx: &TracePointContext, func: AllocFn) -> Option<(u64, SysCall, i64)> {
    let (id, _) = traced_current()?;
    let p = SYS_PENDING.get_ptr(&id)?;
    // SAFETY: map value owned by this thread's key; copied before removal.
    let p = unsafe { *p };
    let _ = SYS_PENDING.remove(&id);
    let ret = sys_ret(ctx);
    if p.func != func as u32 || (-4095..0).contains(&ret) {
        return None;
    }
    Some((id, p, ret))
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

/// The exit half of every syscall probe: when the thread's call of `func` succeeded, builds the
/// event (`fill` maps the saved arguments and the result onto it) and sends or parks it.
#[inline(always)]
fn exit(
    ctx: &TracePointContext,
    func: AllocFn,
    kind: EventKind,
    fill: impl Fn(&mut Event, &SysCall, u64),
) -> u32 {
    if let Some((id, p, ret)) = take(ctx, func) {
        let mut ev = event(kind, p.func, id);
        fill(&mut ev, &p, ret as u64);
        defer_or_send(ctx, &ev, p.leaf_caller);
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

/// Parks `ev` in the thread's allocator call in flight, or sends it now when there is none.
#[inline(always)]
fn defer_or_send(ctx: &TracePointContext, ev: &Event, leaf_caller: u64) {
    let Some(p) = PENDING.current().filter(|p| p.depth > 0) else {
        if needs_stack(ev) {
            hand_off(ctx, ev, leaf_caller, 0);
        } else {
            emit(ev);
        }
        return;
    };
    if p.n_deferred >= MAX_DEFERRED as u64 {
        // Rare (more page events in one allocator call than slots): send them with this stack.
        hand_off(ctx, ev, 0, 1);
        return;
    }
    park(p, ev);
}

#[inline(always)]
fn park(p: &mut Pending, ev: &Event) {
    let i = p.n_deferred as usize;
    if i < MAX_DEFERRED {
        p.deferred[i] = *ev;
        p.n_deferred += 1;
    }
}

/// Continues in [`page_send`] with `ev`. Should the tail call fail, `ev` goes without a stack
/// (counted as a stack error) rather than not at all.
#[inline(always)]
fn hand_off(ctx: &TracePointContext, ev: &Event, leaf_caller: u64, flush_and_park: u64) {
    if let Some(job) = PAGE_JOB.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; the tail-called program runs next on the same CPU.
        unsafe {
            (*job).ev = *ev;
            (*job).leaf_caller = leaf_caller;
            (*job).flush_and_park = flush_and_park;
            PAGE_SEND.tail_call(ctx, 0);
        }
    }
    count(Counter::StackErrors);
    emit(ev);
}

/// The page-level events that need a stack: walks it from the task's saved user registers and
/// sends [`PageJob`]'s event (and, when asked, the thread's parked events first). Never attached;
/// reached by tail call from the exits.
#[tracepoint]
pub fn page_send(_ctx: TracePointContext) -> u32 {
    let Some(job) = PAGE_JOB.get_ptr(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot, written by the exit that tail-called this program.
    let (ev, leaf_caller, flush_and_park) =
        unsafe { ((*job).ev, (*job).leaf_caller, (*job).flush_and_park) };
    let stack = capture(&task_regs(), STEP);
    if flush_and_park == 0 {
        send(stack.as_ref(), &ev, leaf_caller);
    } else if let Some(p) = PENDING.current() {
        flush(stack.as_ref(), p);
        park(p, &ev);
    }
    0
}

#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    if let Some((id, _)) = traced_current() {
        let flags = sys_arg(&ctx, 3);
        let aux = (sys_arg(&ctx, 2) << 32) | (flags & 0xffff_ffff);
        let anon = flags & MAP_ANONYMOUS != 0;
        save(
            AllocFn::Mmap,
            id,
            sys_arg(&ctx, 0),
            sys_arg(&ctx, 1),
            aux,
            anon,
        );
    }
    0
}

#[tracepoint]
pub fn mmap_exit(ctx: TracePointContext) -> u32 {
    const PROT_EXEC: u64 = 0x4;
    let Some((id, p, ret)) = take(&ctx, AllocFn::Mmap) else {
        return 0;
    };
    let mut ev = event(EventKind::Mmap, p.func, id);
    (ev.addr, ev.size, ev.aux) = (ret as u64, p.size, p.aux);
    let code_of_a_file = (p.aux >> 32) & PROT_EXEC != 0 && p.aux & MAP_ANONYMOUS == 0;
    if code_of_a_file {
        // A library's code: user space refreshes its view of the process's modules and probes the
        // library if it allocates, before the thread runs it (when the process is held). Sent now:
        // never parked, since the stop waits for it.
        if let Some((_, _, flags)) = traced_flags() {
            stop_for_probes(flags, &mut ev);
        }
        emit_now(&ev);
    } else {
        defer_or_send(&ctx, &ev, p.leaf_caller);
    }
    0
}

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    entry(
        &ctx,
        AllocFn::Munmap,
        |c| (sys_arg(c, 0), sys_arg(c, 1), 0),
        false,
    )
}

#[tracepoint]
pub fn munmap_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Munmap, EventKind::Munmap, |ev, p, _| {
        (ev.old_addr, ev.old_size) = (p.arg0, p.size);
    })
}

#[tracepoint]
pub fn mprotect_enter(ctx: TracePointContext) -> u32 {
    entry(
        &ctx,
        AllocFn::Mprotect,
        |c| (sys_arg(c, 0), sys_arg(c, 1), sys_arg(c, 2)),
        false,
    )
}

#[tracepoint]
pub fn mprotect_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Mprotect, EventKind::Mprotect, |ev, p, _| {
        (ev.old_addr, ev.old_size, ev.aux) = (p.arg0, p.size, p.aux);
    })
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    // (old address, new length, old length)
    entry(
        &ctx,
        AllocFn::Mremap,
        |c| (sys_arg(c, 0), sys_arg(c, 2), sys_arg(c, 1)),
        true,
    )
}

#[tracepoint]
pub fn mremap_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Mremap, EventKind::Mremap, |ev, p, ret| {
        (ev.old_addr, ev.old_size, ev.addr, ev.size) = (p.arg0, p.aux, ret, p.size);
    })
}

#[tracepoint]
pub fn brk_enter(ctx: TracePointContext) -> u32 {
    entry(&ctx, AllocFn::Brk, |c| (sys_arg(c, 0), 0, 0), true)
}

#[tracepoint]
pub fn brk_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx, AllocFn::Brk, EventKind::Brk, |ev, p, ret| {
        (ev.old_addr, ev.addr) = (p.arg0, ret);
    })
}
