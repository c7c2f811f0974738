//! Process-tree tracepoints: new processes of traced processes are traced too (threads are already
//! covered by their tgid), exec starts a fresh image, the last thread's exit ends the process.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use aya_log_ebpf::warn;
use tracer_common::{Counter, EventKind, TRACED_HEAP_LOCAL, TRACED_NO_HEAP, TRACED_OBJECTS};

use crate::shared::{
    TRACED, count, emit_now, event, flush_frees, stop_for_probes, traced_current, traced_flags,
};

/// Field offsets read by user space from the tracepoints' format files (they move between kernels).
#[unsafe(no_mangle)]
static NEWTASK_PID_OFF: aya_ebpf::Global<u32> = aya_ebpf::Global::new(8);
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFF: aya_ebpf::Global<u32> = aya_ebpf::Global::new(32);
/// Offset of `group_dead` in sched_process_exit, or 0 where the kernel does not have it.
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFF: aya_ebpf::Global<u32> = aya_ebpf::Global::new(32);

const CLONE_THREAD: u64 = 0x0001_0000;

#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let Some((id, _, parent_flags)) = traced_flags() else {
        return 0;
    };
    // SAFETY: in-bounds reads of the tracepoint record at offsets from its format file.
    let (pid, flags) = unsafe {
        (
            ctx.read_at::<u32>(NEWTASK_PID_OFF.load() as usize)
                .unwrap_or(0),
            ctx.read_at::<u64>(NEWTASK_FLAGS_OFF.load() as usize)
                .unwrap_or(0),
        )
    };
    if flags & CLONE_THREAD != 0 || pid == 0 {
        return 0;
    }
    // The child is held like its parent (ptrace follows forks). Heap probes attached for the
    // parent's address space alone do not fire in the child's, nor do its objects' window's.
    let child_flags = if parent_flags & TRACED_HEAP_LOCAL != 0 {
        (parent_flags | TRACED_NO_HEAP) & !TRACED_HEAP_LOCAL
    } else {
        parent_flags
    } & !TRACED_OBJECTS;
    if TRACED.insert(&pid, &child_flags, 0).is_err() {
        count(Counter::TracedFull);
        warn!(
            &ctx,
            "traced-process map full: child {} of a traced process not followed", pid
        );
        return 0;
    }
    // A forked child runs the same interpreter at the same addresses.
    let parent = (id >> 32) as u32;
    // SAFETY: the value is copied at once.
    if let Some(cfg) = unsafe { crate::python::PY_CONFIG.get(&parent) }.copied() {
        let _ = crate::python::PY_CONFIG.insert(&pid, &cfg, 0);
    }
    let mut ev = event(EventKind::Fork, 0, id);
    ev.aux = pid as u64;
    ev.size = flags;
    emit_now(&ev);
    0
}

#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    if let Some((id, _, flags)) = traced_flags() {
        flush_current_frees();
        // The new image and its loader are mapped by the kernel, not by mmap: stop here so that a
        // program that links CUDA statically is probed before its first instruction.
        // A new image: its interpreter, if any, is found again when it maps one.
        let _ = crate::python::PY_CONFIG.remove(&((id >> 32) as u32));
        let mut ev = event(EventKind::Exec, 0, id);
        stop_for_probes(flags, &mut ev);
        emit_now(&ev);
    }
    0
}

#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let Some((id, tgid)) = traced_current() else {
        return 0;
    };
    flush_current_frees();
    let off = EXIT_GROUP_DEAD_OFF.load();
    let group_dead = if off != 0 {
        // SAFETY: in-bounds read at the offset from the format file.
        unsafe { ctx.read_at::<u8>(off as usize) }.unwrap_or(0) != 0
    } else {
        bpf_get_current_pid_tgid() as u32 == tgid
    };
    if group_dead {
        let _ = TRACED.remove(&tgid);
        let _ = crate::python::PY_CONFIG.remove(&tgid);
        emit_now(&event(EventKind::Exit, 0, id));
    } else {
        // After its frees: those its allocator made as it exited are told by this.
        emit_now(&event(EventKind::ThreadExit, 0, id));
    }
    0
}

/// The exiting or exec'ing thread's unsent frees go before its process's end or new image.
#[inline(always)]
fn flush_current_frees() {
    if let Some(p) = crate::entries::current() {
        flush_frees(p);
    }
}

/// Entry of CPython's `Py_FinalizeEx`: the traced interpreter begins its exit (its process is
/// judged on what it held before this point, not on what the teardown makes and frees).
#[aya_ebpf::macros::uprobe]
pub fn py_finalize_enter(_ctx: aya_ebpf::programs::ProbeContext) -> u32 {
    if let Some((id, _, _)) = traced_flags() {
        // After this thread's unsent frees: what the program dropped before is not held.
        flush_current_frees();
        emit_now(&event(EventKind::Finalize, 0, id));
    }
    0
}

/// `--heap-after N` with `--step-symbol`: [0] the step at whose entry the stepping thread is
/// stopped until the heap probes are in (0: none), [1] the steps counted so far.
#[aya_ebpf::macros::map]
static HEAP_STEP: aya_ebpf::maps::Array<u64> = aya_ebpf::maps::Array::with_max_entries(2, 0);

/// Entry of the step function named by `--step-symbol`: a step boundary, for per-step verdicts.
#[aya_ebpf::macros::uprobe]
pub fn step_enter(_ctx: aya_ebpf::programs::ProbeContext) -> u32 {
    if let Some((id, _, flags)) = traced_flags() {
        let mut ev = event(EventKind::Step, 0, id);
        if let (Some(&target), Some(seen)) = (HEAP_STEP.get(0), HEAP_STEP.get_ptr_mut(1))
            && target != 0
        {
            // SAFETY: a map value. Not atomic (no such add for this target): the step function is
            // one thread's, and two threads stepping at once could only count one step less.
            let n = unsafe {
                *seen += 1;
                *seen
            };
            if n == target {
                stop_for_probes(flags, &mut ev);
            }
        }
        crate::shared::emit(&ev);
    }
    0
}
