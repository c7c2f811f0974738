//! Page-level probes: mmap, munmap, mremap and brk syscall tracepoints (they also catch direct
//! syscalls). Entry records the arguments per thread; exit emits the event when the call succeeded.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{AllocFn, EventKind, Pending};

use crate::shared::{
    PENDING, SYS_PENDING, emit, emit_with_stack, event, syscall_leaf_caller, traced_current,
};

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

#[inline(always)]
fn save(func: AllocFn, id: u64, arg0: u64, size: u64, aux: u64, stack: bool) {
    let leaf_caller = if stack { syscall_leaf_caller() } else { 0 };
    let p = Pending {
        func: func as u32,
        depth: 1,
        arg0,
        size,
        aux,
        leaf_caller,
        ..Pending::default()
    };
    if SYS_PENDING.insert(&id, &p, 0).is_err() {
        crate::shared::count(tracer_common::Counter::PendingFull);
    }
}

/// Takes the pending entry of the current thread's syscall, if it is `func` and succeeded.
#[inline(always)]
fn take(ctx: &TracePointContext, func: AllocFn) -> Option<(u64, Pending, i64)> {
    let (id, _) = traced_current()?;
    // SAFETY: map value owned by this thread's key, copied out before removal.
    let p = unsafe { *SYS_PENDING.get(&id)? };
    let _ = SYS_PENDING.remove(&id);
    let ret = sys_ret(ctx);
    if p.func != func as u32 || (-4095..0).contains(&ret) {
        return None;
    }
    Some((id, p, ret))
}

/// Sends an event that needs a stack, or parks it in the thread's allocator call in flight (malloc
/// growing the heap, sbrk, mremap), whose return sends it with the caller's stack. A second event in
/// the same call first sends the parked one, so events stay in order.
#[inline(always)]
fn defer_or_emit(ctx: &TracePointContext, id: u64, ev: &tracer_common::Event, leaf_caller: u64) {
    let Some(p) = PENDING.get_ptr_mut(&id) else {
        emit_with_stack(ctx, ev, leaf_caller);
        return;
    };
    // SAFETY: map value owned by this thread's key.
    let p = unsafe { &mut *p };
    if p.deferred.kind != 0 {
        emit_with_stack(ctx, &p.deferred, 0);
    }
    p.deferred = *ev;
}

#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    if let Some((id, _)) = traced_current() {
        let flags = sys_arg(&ctx, 3);
        let aux = (sys_arg(&ctx, 2) << 32) | (flags & 0xffff_ffff);
        save(
            AllocFn::Mmap,
            id,
            sys_arg(&ctx, 0),
            sys_arg(&ctx, 1),
            aux,
            flags & MAP_ANONYMOUS != 0,
        );
    }
    0
}

#[tracepoint]
pub fn mmap_exit(ctx: TracePointContext) -> u32 {
    if let Some((id, p, ret)) = take(&ctx, AllocFn::Mmap) {
        let mut ev = event(EventKind::Mmap, p.func, id);
        ev.addr = ret as u64;
        ev.size = p.size;
        ev.aux = p.aux;
        if p.aux & MAP_ANONYMOUS != 0 {
            defer_or_emit(&ctx, id, &ev, p.leaf_caller);
        } else {
            emit(&ev); // file mapping: user space refreshes its view of the process's modules
        }
    }
    0
}

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    if let Some((id, _)) = traced_current() {
        save(
            AllocFn::Munmap,
            id,
            sys_arg(&ctx, 0),
            sys_arg(&ctx, 1),
            0,
            false,
        );
    }
    0
}

#[tracepoint]
pub fn munmap_exit(ctx: TracePointContext) -> u32 {
    if let Some((id, p, _)) = take(&ctx, AllocFn::Munmap) {
        let mut ev = event(EventKind::Munmap, p.func, id);
        ev.old_addr = p.arg0;
        ev.old_size = p.size;
        emit(&ev);
    }
    0
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    if let Some((id, _)) = traced_current() {
        save(
            AllocFn::Mremap,
            id,
            sys_arg(&ctx, 0),
            sys_arg(&ctx, 2),
            sys_arg(&ctx, 1),
            true,
        );
    }
    0
}

#[tracepoint]
pub fn mremap_exit(ctx: TracePointContext) -> u32 {
    if let Some((id, p, ret)) = take(&ctx, AllocFn::Mremap) {
        let mut ev = event(EventKind::Mremap, p.func, id);
        ev.old_addr = p.arg0;
        ev.old_size = p.aux;
        ev.addr = ret as u64;
        ev.size = p.size;
        defer_or_emit(&ctx, id, &ev, p.leaf_caller);
    }
    0
}

#[tracepoint]
pub fn brk_enter(ctx: TracePointContext) -> u32 {
    if let Some((id, _)) = traced_current() {
        save(AllocFn::Brk, id, sys_arg(&ctx, 0), 0, 0, true);
    }
    0
}

#[tracepoint]
pub fn brk_exit(ctx: TracePointContext) -> u32 {
    if let Some((id, p, ret)) = take(&ctx, AllocFn::Brk) {
        let mut ev = event(EventKind::Brk, p.func, id);
        ev.old_addr = p.arg0;
        ev.addr = ret as u64;
        if p.arg0 == 0 {
            emit(&ev); // brk(0) asks for the break: no stack needed, nothing to attribute
        } else {
            defer_or_emit(&ctx, id, &ev, p.leaf_caller);
        }
    }
    0
}
