//! Heap-level probes: the malloc family. Entry programs record the call's arguments per thread;
//! one return program turns the result into an event with the caller's stack (taken at return, where
//! the frame-pointer chain is intact and the direct caller is the first frame).

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{btf_tracepoint, map, uprobe, uretprobe},
    maps::{PerCpuArray, ProgramArray},
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};
use tracer_common::{
    AllocFn, CallSite, Counter, Event, EventKind, FREES_PER_RECORD, FreesEvent, MAX_DEFERRED,
    Pending, TRACED_NO_HEAP, TRACED_NO_TENSORS,
};

use crate::{
    entries,
    pages::{flush, send},
    sampling,
    shared::{
        HEAP_CFI, HEAP_LEAF, HEAP_OFF, OBJECTS_ON, STEP, TENSORS_OFF, UserRegs, WALKS_PYTHON,
        capture, count, emit, emit_alloc, emit_deep, emit_deep_heap, event, flush_frees, next_hint,
        outermost_return, probe_regs, read_len, send_frees, settings, tick_ns, traced_current,
        untimed_event,
    },
};

/// Records an allocator entry. A call made while another allocator call of the same thread is in
/// flight deeper on the stack (realloc → malloc, reallocarray → realloc) only bumps the depth:
/// the outer call's return accounts for it.
#[inline(always)]
pub fn enter(ctx: &ProbeContext, func: AllocFn, arg0: u64, size: u64) -> u32 {
    // A thread with an entry is traced (entries are made only for traced threads and go away with
    // the thread): one per-thread lookup and no hash on the hot path.
    // SAFETY: `regs` is the probe's register block.
    let sp = unsafe { (*ctx.regs).rsp };
    if let Some((p, id)) = entries::of_probe(ctx.regs) {
        // Nested first: a call inside a Python object's (PyObject_Malloc of more than 512 bytes
        // calls malloc) is counted by the depth even when its own kind is off, so that its
        // return does not close the outer call.
        if p.depth > 0 && sp <= p.sp && !open_call_gone(p, id) {
            if p.depth == 1 && p.aux == 0 && object_call(p) && !func.is_object() {
                heap_inside_object(p, func, id);
            }
            p.depth += 1;
            count(Counter::Nested);
            return 0;
        }
        if heap_off(func as u32, p, id) {
            skip(p, sp);
            return 0;
        }
        // The thread's entry is idle (or stale after a longjmp): reuse it in place.
        start(p, func, sp, arg0, size);
        return 0;
    }
    if traced_current().is_none() {
        return 0;
    }
    match entries::of_probe_or_create(ctx.regs) {
        Some((p, id)) => {
            sampling::first_points(p);
            if heap_off(func as u32, p, id) {
                skip(p, sp);
                return 0;
            }
            start(p, func, sp, arg0, size)
        }
        None => count(Counter::PendingFull),
    }
    0
}

/// Whether the call open in entry `p` (thread `id`) is of a kind its process no longer traces:
/// its return probe may have gone before it returned (a window of Python objects closing, the
/// malloc family or the tensors taken out), so that it never closes. Left open, it took every
/// later call deeper on the thread's stack for a nested one and dropped it: 6,471 `nested_calls`
/// and none of 80 kept blocks found, in a loaded run of a Python program under `--heap full`. It
/// is closed here, its return excused should it still come ([`skip`]); a call nested in it
/// opens in its place (a block pymalloc passes to malloc is then a heap block).
#[inline(always)]
fn open_call_gone(p: &mut Pending, id: u64) -> bool {
    let gone = heap_off(p.func, p, id);
    if gone {
        skip(p, p.sp);
        p.depth = 0;
    }
    gone
}

/// Whether `func` (an [`AllocFn`] value) is of the malloc family and the process of entry `p`
/// (`id`) has it untraced ([`HEAP_OFF`]), or of CPython's object allocator and its objects are
/// not sampled now ([`OBJECTS_ON`]), or a CPU tensor's and its tensors are untraced
/// ([`TENSORS_OFF`]): then neither its entry nor its return records anything.
#[inline(always)]
fn heap_off(func: u32, p: &mut Pending, id: u64) -> bool {
    let s = settings(p, (id >> 32) as u32);
    if AllocFn::is_object_tag(func) {
        return s & OBJECTS_ON == 0;
    }
    if func == AllocFn::C10AllocCpu as u32 {
        return s & TENSORS_OFF != 0;
    }
    s & HEAP_OFF != 0
}

/// An entry that records nothing (its kind untraced in its process): the outermost such call
/// in flight is remembered ([`Pending::skipped_sp`]) for [`skipped_return`].
#[inline(always)]
fn skip(p: &mut Pending, sp: u64) {
    if sp > p.skipped_sp {
        p.skipped_sp = sp;
    }
}

/// Whether a return that closes no call (`p` idle) is of a call whose entry recorded nothing, or
/// of one nested in it: its stack pointer (`sp`, past the return address) is not above the
/// outermost such call's. Once that call returns, none is in flight. Left uncounted, such a
/// return was a `return_without_entry` whenever its kind went in while it ran: a window of
/// Python objects opening under `--heap sampled`, one call in a few runs.
#[inline(always)]
fn skipped_return(p: &mut Pending, sp: u64) -> bool {
    if p.skipped_sp == 0 {
        return false;
    }
    let excused = sp <= p.skipped_sp + 8;
    // That call's own return, or one from a frame above it (its return went unseen): it is gone.
    if sp >= p.skipped_sp {
        p.skipped_sp = 0;
    }
    excused
}

/// A malloc-family call inside an object allocator's (an object of more than 512 bytes, which
/// pymalloc passes to malloc): where the process's malloc family is traced, the object call's
/// return records the block as the inner call's ([`heap_of_object_call`]). Left to the depth
/// alone, the malloc went unrecorded and its free later was unmatched (9,000 of them in a
/// service's objects' window under `--heap full`).
#[inline(always)]
fn heap_inside_object(p: &mut Pending, func: AllocFn, id: u64) {
    if settings(p, (id >> 32) as u32) & HEAP_OFF == 0 {
        p.aux = func as u64;
    }
}

/// An object call that called the malloc family ([`heap_inside_object`]) returns as that call:
/// the same block, a heap block, recorded exactly (not sampled as an object).
#[inline(always)]
fn heap_of_object_call(p: &mut Pending) {
    if p.aux != 0 && object_call(p) {
        p.func = p.aux as u32;
    }
}

/// Whether the call open in `p` is one of CPython's object allocator.
#[inline(always)]
pub fn object_call(p: &Pending) -> bool {
    AllocFn::is_object_tag(p.func)
}

/// Opens a call in the thread's entry; only the header is written (the parked events are not).
#[inline(always)]
fn start(p: &mut Pending, func: AllocFn, sp: u64, arg0: u64, size: u64) {
    (p.func, p.depth, p.sp, p.arg0, p.size, p.n_deferred) = (func as u32, 1, sp, arg0, size, 0);
    p.aux = 0;
    if sp >= p.skipped_sp {
        p.skipped_sp = 0; // not nested in a skipped call: that one is gone (its return unseen)
    }
}

/// A return's stack pointer, past the return address.
#[inline(always)]
fn return_sp(ctx: &RetProbeContext) -> u64 {
    // SAFETY: the probe's register block.
    unsafe { (*ctx.regs).rsp }
}

#[inline(always)]
pub fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// nmemb * size. On overflow the call fails and records nothing, so wrapping is harmless; an
/// overflow check would need a 128-bit multiply helper that BPF does not have.
#[inline(always)]
pub fn mul(a: u64, b: u64) -> u64 {
    a.wrapping_mul(b)
}

#[uprobe(multi)]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Malloc, 0, arg(&ctx, 0))
}

#[uprobe(multi)]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Calloc, 0, mul(arg(&ctx, 0), arg(&ctx, 1)))
}

#[uprobe(multi)]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Realloc, arg(&ctx, 0), arg(&ctx, 1))
}

#[uprobe(multi)]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    enter(
        &ctx,
        AllocFn::Reallocarray,
        arg(&ctx, 0),
        mul(arg(&ctx, 1), arg(&ctx, 2)),
    )
}

#[uprobe(multi)]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PosixMemalign, arg(&ctx, 0), arg(&ctx, 2))
}

#[uprobe(multi)]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::AlignedAlloc, 0, arg(&ctx, 1))
}

#[uprobe(multi)]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Memalign, 0, arg(&ctx, 1))
}

#[uprobe(multi)]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Valloc, 0, arg(&ctx, 0))
}

/// PyTorch's `c10::alloc_cpu(size_t)`: every CPU tensor's memory. It calls posix_memalign, which
/// nests inside it; the block is recorded once, as a tensor, with the caller of alloc_cpu. Its free
/// goes through `free`.
#[uprobe(multi)]
pub fn c10_alloc_cpu_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::C10AllocCpu, 0, arg(&ctx, 0))
}

/// libc wrappers whose syscalls leaktracer sees at page level; probed only so that the syscall's
/// event carries the wrapper caller's stack (see `Pending::deferred`).
#[uprobe(multi)]
pub fn sbrk_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Sbrk, 0, 0)
}

#[uprobe(multi)]
pub fn mremap_wrapper_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Mremap, 0, 0)
}

#[uprobe(multi)]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Pvalloc, 0, arg(&ctx, 0))
}

/// Slot 0: [`heap_flush`], set by user space before the allocator returns are attached.
#[map]
static HEAP_FLUSH: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Shared return program of every allocator above (one multi-attach link per library).
#[uretprobe(multi)]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let mut entry = entries::of_probe(ctx.regs);
    if let Some((p, id)) = entry.as_mut() {
        if p.depth == 0 && skipped_return(p, return_sp(&ctx)) {
            return 0;
        }
        let s = settings(p, (*id >> 32) as u32);
        // A process whose malloc family is off returns here only from a Python object's call,
        // or from a call nested in one; or from a call entered before its malloc family was
        // taken out (the flags go first, the probes after), which closes now, unrecorded: left
        // open, it would take every later call and free of its thread below it (a CPU tensor's
        // through `c10::free_cpu`) for nested ones, and drop them.
        if s & HEAP_OFF != 0 && !(p.depth > 0 && object_call(p)) {
            p.depth = p.depth.saturating_sub(1);
            return 0;
        }
        // An idle entry while its objects are not sampled: an object call whose entry found
        // their window closed while its probes were still going (they go in the background,
        // thousands of calls later), not an entry lost.
        if p.depth == 0 && s & OBJECTS_ON == 0 {
            return 0;
        }
    }
    let Some((p, id)) = outermost_return(entry, TRACED_NO_HEAP) else {
        return 0;
    };
    heap_of_object_call(p);
    let rv: u64 = ctx.ret();
    if let Some(ev) = outcome(p, id, rv) {
        sample_and_send(&ctx, p, ev, id);
    }
    flush_by(&ctx, &HEAP_FLUSH, p);
    0
}

/// Sends an allocator call's event with its caller's stack (under `--heap sampled`, only when the
/// block is sampled). Entered only with an event: LLVM otherwise joins the no-event path into the
/// sampling test holding an undefined register, which the verifier rejects.
#[inline(always)]
fn sample_and_send(ctx: &RetProbeContext, p: &mut Pending, ev: Event, id: u64) {
    let object = object_call(p);
    let ev = if sampling::interval_of(object) != 0 {
        sample(p, ev, object, id)
    } else {
        Some(ev)
    };
    let Some(mut ev) = ev else {
        return;
    };
    // Timed only once it is sent (`--heap sampled` sends few), at tick resolution.
    ev.ts_ns = tick_ns();
    if ev.addr != 0 && settings(p, ev.tgid) & HEAP_CFI != 0 {
        return emit_deep_heap(&probe_regs(ctx.regs), &ev, p);
    }
    let regs = probe_regs(ctx.regs);
    let stack = if ev.addr == 0 {
        None // realloc(p, 0): a free, no stack needed
    } else {
        capture(&regs, read_len(p.walk_hint))
    };
    if let Some(stack) = &stack {
        p.walk_hint = next_hint(p.walk_hint, stack.extent);
    }
    let leaf = (settings(p, ev.tgid) & HEAP_LEAF != 0).then_some(&regs);
    match stack {
        Some(stack) => emit_alloc(&stack, &ev, p, leaf),
        None => {
            flush_frees(p);
            emit(&ev);
        }
    }
}

/// Sends the page-level events still parked in `p` (malloc growing its heap) by a tail call to the
/// program in slot 0 of `slots` ([`heap_flush`], [`c10_flush`]): their walks and sends are
/// verified once there, not in every return program. Should the call fail, they go without a
/// stack (counted as a stack error).
#[inline(always)]
fn flush_by(ctx: &RetProbeContext, slots: &ProgramArray, p: &mut Pending) {
    if p.n_deferred == 0 {
        return;
    }
    // SAFETY: same program type; on success this does not return.
    unsafe { slots.tail_call(ctx, 0) };
    count(Counter::StackErrors);
    flush(None, p);
}

/// The page-level events an allocator call made, sent with its caller's stack (walked again from
/// the return's registers: a second walk, only for calls that mapped memory). Never attached;
/// reached by tail call from the allocator returns.
#[uretprobe(multi)]
pub fn heap_flush(ctx: RetProbeContext) -> u32 {
    let Some((p, id)) = entries::of_probe(ctx.regs) else {
        return 0;
    };
    let regs = probe_regs(ctx.regs);
    if settings(p, (id >> 32) as u32) & HEAP_CFI == 0 {
        let stack = capture(&regs, STEP);
        flush(stack.as_ref(), p);
        return 0;
    }
    // One raw stack copy per event, so that the pages have the stack of the blocks they hold:
    // the first event here, the others by tail calls to this program (a copy per event in one
    // program is more than the verifier takes).
    let Some(first) = take_parked(p) else {
        return 0;
    };
    emit_deep_heap(&regs, &first, p);
    flush_by(&ctx, &HEAP_FLUSH, p);
    0
}

/// The first page-level event parked in the call, taken out (the others move up).
#[inline(always)]
fn take_parked(p: &mut Pending) -> Option<Event> {
    if p.n_deferred == 0 {
        return None;
    }
    let first = p.deferred[0];
    for i in 1..MAX_DEFERRED {
        p.deferred[i - 1] = p.deferred[i];
    }
    p.n_deferred -= 1;
    Some(first)
}

/// `--heap sampled`: what is sent of an allocation event, if anything. A realloc's old block is
/// released only when it was recorded, and its new block is recorded only when sampled.
#[inline(always)]
fn sample(p: &mut Pending, mut ev: Event, object: bool, id: u64) -> Option<Event> {
    let tgid = (id >> 32) as u32;
    if ev.kind == EventKind::Realloc as u32 {
        let old = ev.old_addr != 0 && sampling::forget(tgid, ev.old_addr);
        let new = ev.addr != 0 && sampling::take(p, object, tgid, ev.addr, ev.size);
        if !old {
            ev.old_addr = 0; // realloc(NULL, n): an allocation
        }
        if !new {
            (ev.addr, ev.size) = (0, 0); // realloc(p, 0): a release
        }
        return (old || new).then_some(ev);
    }
    sampling::take(p, object, tgid, ev.addr, ev.size).then_some(ev)
}

/// Slot 0: [`c10_flush`], set by user space before `c10::alloc_cpu`'s return is attached.
#[map]
static C10_FLUSH: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The page-level events a `c10::alloc_cpu` call made, sent with the frame-pointer walk from its
/// return (the tensor itself goes as a raw stack copy): the first here, the others by tail calls
/// to this program. One send to verify, where [`heap_flush`]'s walk path has one per parked
/// event: loading it costs the prober (and a process held for libc10.so) a fraction of the time.
/// Never attached; reached by tail call.
#[uretprobe(multi)]
pub fn c10_flush(ctx: RetProbeContext) -> u32 {
    let Some((p, _)) = entries::of_probe(ctx.regs) else {
        return 0;
    };
    if p.n_deferred == 0 {
        return 0;
    }
    // Walked before the event is taken out: verified in 117 ms here, 196 ms the other way round.
    let stack = capture(&probe_regs(ctx.regs), STEP);
    let Some(first) = take_parked(p) else {
        return 0;
    };
    send(stack.as_ref(), &first, 0);
    flush_by(&ctx, &C10_FLUSH, p);
    0
}

/// Return of `c10::alloc_cpu`: a tensor. Its callers are libtorch's, built without frame pointers:
/// the raw stack goes to user space, which unwinds it (see `DeepStackEvent`). Page-level events
/// of the call (a large tensor is its own mmap) go with the frame-pointer walk.
#[uretprobe(multi)]
pub fn c10_alloc_return(ctx: RetProbeContext) -> u32 {
    let mut entry = entries::of_probe(ctx.regs);
    // Its entry opened no call in a process whose tensors are untraced (or were when it entered).
    if let Some((p, id)) = entry.as_mut()
        && p.depth == 0
        && (skipped_return(p, return_sp(&ctx))
            || settings(p, (*id >> 32) as u32) & TENSORS_OFF != 0)
    {
        return 0;
    }
    let Some((p, id)) = outermost_return(entry, TRACED_NO_TENSORS) else {
        return 0;
    };
    let rv: u64 = ctx.ret();
    if rv != 0 {
        let size = p.size;
        emit_tensor(p, id, rv, size, &probe_regs(ctx.regs));
    }
    flush_by(&ctx, &C10_FLUSH, p);
    0
}

/// Sends a tensor of `size` bytes at `addr` made by thread `id` (entry `p`), with the stack
/// walked from `caller` (alloc_cpu's caller, just returned to): the thread's unsent frees first.
#[inline(always)]
fn emit_tensor(p: &mut Pending, id: u64, addr: u64, size: u64, caller: &UserRegs) {
    flush_frees(p);
    let mut ev = event(EventKind::Alloc, AllocFn::C10AllocCpu as u32, id);
    (ev.addr, ev.size) = (addr, size);
    if sampling::interval() != 0 {
        sampling::remember((id >> 32) as u32, addr); // tensors are all recorded
    }
    let python = settings(p, (id >> 32) as u32) & WALKS_PYTHON != 0;
    emit_deep(caller, &ev, python, &mut p.py_tstate);
}

/// `c10::alloc_cpu` probed right after its call `posix_memalign(&slot, align, n)`: one probe
/// where an entry and a return probe were (tracer/src/probes/placement.rs). The call succeeded
/// when eax is 0; the block is then in the slot at the cookie's displacement from the frame
/// pointer, and n in the cookie's register. Sent as a tensor with the stack of alloc_cpu's
/// caller, found from the frame pointer as the return would find it. In a process whose malloc
/// family is traced, posix_memalign recorded the block already; user space makes it a tensor.
#[uprobe(multi)]
pub fn c10_alloc_site(ctx: ProbeContext) -> u32 {
    // SAFETY: the probe's own register block.
    let r = unsafe { &*ctx.regs };
    if r.rax as u32 != 0 {
        return 0; // posix_memalign failed: alloc_cpu throws
    }
    let entry = match entries::of_probe(ctx.regs) {
        Some(e) => Some(e),
        None if traced_current().is_some() => entries::of_probe_or_create(ctx.regs),
        None => return 0,
    };
    let Some((p, id)) = entry else {
        count(Counter::PendingFull);
        return 0;
    };
    if settings(p, (id >> 32) as u32) & TENSORS_OFF != 0 {
        return 0;
    }
    // SAFETY: helper on the program's own context.
    let site = CallSite::of_cookie(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    // Each register loaded first: a load through a pointer chosen among the context's fields
    // is one the verifier rejects.
    // SAFETY: reads of the probe's own register block.
    let saved = unsafe {
        [&r.rbx, &r.r12, &r.r13, &r.r14, &r.r15].map(|reg| core::ptr::read_volatile(reg))
    };
    let size = match site.size_reg {
        0 => saved[0],
        1 => saved[1],
        2 => saved[2],
        3 => saved[3],
        _ => saved[4],
    };
    let Some((addr, frame)) = site_words(r.rbp, site.slot_disp) else {
        return 0;
    };
    if addr == 0 {
        return 0;
    }
    let caller = UserRegs {
        ip: frame[1],
        sp: r.rbp + 16,
        bp: frame[0],
    };
    emit_tensor(p, id, addr, size, &caller);
    0
}

/// Bytes from a call site's slot up to its frame record, read at once at most: alloc_cpu's slot
/// is 0x248 bytes below its frame pointer in the wheel.
const SITE_WORDS: usize = 128;

/// A copy of the frame between the slot and the frame record, per CPU.
#[map]
static SITE_COPY: PerCpuArray<[u64; SITE_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The block in the slot at `disp` from the frame pointer `bp`, and the frame record at `bp`
/// (the caller's frame pointer and return address): one read of the frame between them where
/// it is short enough (a read costs ~120 ns however small), else two.
#[inline(always)]
fn site_words(bp: u64, disp: i32) -> Option<(u64, [u64; 2])> {
    let below = u64::from(disp.unsigned_abs());
    let len = below + 16;
    if disp < 0 && below % 8 == 0 && len <= SITE_WORDS as u64 * 8 {
        let buf = SITE_COPY.get_ptr_mut(0)?;
        // The length masked, then checked: the bound the verifier needs, on the value passed.
        let n = crate::unwind::opaque(len) as u32 & (SITE_WORDS as u32 * 8 * 2 - 1);
        if n == 0 || n > SITE_WORDS as u32 * 8 {
            return None;
        }
        // SAFETY: user memory read into this CPU's buffer (at least `n` bytes), failing cleanly.
        let ok = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                buf.cast(),
                n,
                (bp - below) as *const _,
            ) == 0
        };
        if !ok {
            return None;
        }
        // SAFETY: this CPU's buffer, just filled; indexes masked below its length.
        let words = unsafe { &*buf };
        let at = crate::unwind::opaque(below / 8) as usize;
        return Some((
            words[0],
            [
                words[at & (SITE_WORDS - 1)],
                words[(at + 1) & (SITE_WORDS - 1)],
            ],
        ));
    }
    let slot = bp.wrapping_add(disp as i64 as u64);
    // SAFETY: user memory reads that fail cleanly.
    unsafe {
        Some((
            bpf_probe_read_user(slot as *const u64).ok()?,
            bpf_probe_read_user(bp as *const [u64; 2]).ok()?,
        ))
    }
}

/// The event a returning allocator call makes, if any (without its time).
#[inline(always)]
fn outcome(p: &Pending, id: u64, rv: u64) -> Option<Event> {
    let func = AllocFn::from_u32(p.func)?;
    let mut ev = match func {
        AllocFn::Sbrk | AllocFn::Mremap => return None, // only their deferred syscall event counts
        AllocFn::PosixMemalign => {
            if rv as u32 != 0 {
                return None; // error code: nothing allocated, *memptr untouched
            }
            // SAFETY: user memory read that fails cleanly.
            let addr = unsafe { bpf_probe_read_user(p.arg0 as *const u64) }.ok()?;
            let mut ev = untimed_event(EventKind::Alloc, p.func, id);
            ev.addr = addr;
            ev
        }
        f if f.is_realloc() => {
            // NULL with a non-zero size is a failure: the old block is untouched.
            if rv == 0 && p.size != 0 {
                return None;
            }
            let mut ev = untimed_event(EventKind::Realloc, p.func, id);
            ev.old_addr = p.arg0;
            ev.addr = rv;
            ev
        }
        _ => {
            if rv == 0 {
                return None;
            }
            let mut ev = untimed_event(EventKind::Alloc, p.func, id);
            ev.addr = rv;
            ev
        }
    };
    ev.size = p.size;
    Some(ev)
}

/// `free(ptr)`, attached past its null test where that instruction is emulated (see
/// tracer/src/probes/placement.rs); `rdi` still holds the pointer there.
#[uprobe(multi)]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    record_free(&ctx, false)
}

/// PyTorch's `c10::free_cpu(void*)`: a CPU tensor's memory going back. It counts only in a
/// process whose malloc family is untraced ([`HEAP_OFF`]) and whose tensors are traced;
/// elsewhere the `free` it calls does, or nothing.
#[uprobe(multi)]
pub fn c10_free_cpu_enter(ctx: ProbeContext) -> u32 {
    record_free(&ctx, true)
}

/// A free through `free` or, for a tensor (`tensor`), through `c10::free_cpu`: whichever of the
/// two the process's settings count.
#[inline(always)]
fn record_free(ctx: &ProbeContext, tensor: bool) -> u32 {
    let ptr = arg(ctx, 0);
    if ptr == 0 {
        return 0;
    }
    // SAFETY: the probe's register block.
    let sp = unsafe { (*ctx.regs).rsp };
    if sampling::interval() != 0 {
        if !tensor {
            free_sampled(ctx, sp, ptr);
        }
        return 0;
    }
    // `--heap full`: the free waits in the thread's entry for its next record.
    let (p, tgid) = match entries::of_probe(ctx.regs) {
        Some((p, _)) if p.depth > 0 && sp <= p.sp => {
            count(Counter::Nested); // realloc(p, 0) frees through free's public address
            return 0;
        }
        Some((p, id)) => (p, (id >> 32) as u32), // an entry means a traced thread
        None => {
            let Some((_, tgid)) = traced_current() else {
                return 0;
            };
            let Some((p, _)) = entries::of_probe_or_create(ctx.regs) else {
                count(Counter::PendingFull);
                send_free(tgid, ptr);
                return 0;
            };
            (p, tgid)
        }
    };
    let s = settings(p, tgid);
    if (s & HEAP_OFF != 0) != tensor || (tensor && s & TENSORS_OFF != 0) {
        return 0;
    }
    let i = p.n_frees as usize;
    if i < FREES_PER_RECORD {
        p.frees[i] = ptr;
        p.n_frees += 1;
    }
    p.tgid = tgid;
    if p.n_frees as usize >= FREES_PER_RECORD {
        flush_frees(p);
    }
    0
}

/// `free` under `--heap sampled`: only recorded blocks are released; most are not, and go first.
#[inline(always)]
fn free_sampled(ctx: &ProbeContext, sp: u64, ptr: u64) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !sampling::recorded(tgid, ptr) {
        return;
    }
    match entries::of_probe(ctx.regs) {
        Some((p, _)) if p.depth > 0 && sp <= p.sp => count(Counter::Nested),
        None if traced_current().is_none() => {}
        _ => {
            if sampling::forget(tgid, ptr) {
                send_free(tgid, ptr);
            }
        }
    }
}

/// Sends one free in a record of its own.
#[inline(always)]
pub fn send_free(tgid: u32, addr: u64) {
    let mut ev = FreesEvent {
        kind: EventKind::Frees as u32,
        tgid,
        n: 1,
        tid: bpf_get_current_pid_tgid() as u32,
        ..FreesEvent::default()
    };
    ev.addrs[0] = addr;
    send_frees(&ev);
}

/// A thread switched out sends its unsent frees: a thread that frees and then waits would
/// otherwise hold them back for as long as it waits.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_out(ctx: BtfTracePointContext) -> i32 {
    // sched_switch's first argument: whether the task switched out was preempted in the kernel.
    let preempt: u64 = ctx.arg(0);
    entries::switch_out(preempt & 0xff != 0);
    0
}

/// Empty programs at the same points: the probe floor for the benchmark.
#[uprobe(multi)]
pub fn bare_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe(multi)]
pub fn bare_return(_ctx: RetProbeContext) -> u32 {
    0
}
