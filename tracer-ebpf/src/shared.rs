//! Maps, settings and helpers every program uses.

use aya_ebpf::bindings::pt_regs;
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user,
        generated::{
            bpf_get_current_task_btf, bpf_jiffies64, bpf_probe_read_user as read_user_raw,
            bpf_send_signal_thread, bpf_task_pt_regs,
        },
    },
    macros::{btf_map, map},
    maps::{Array, HashMap, PerCpuArray},
};
use tracer_common::{
    Counter, DEEP_STACK_BYTES, Event, EventKind, FREES_PER_RECORD, FileKey, FileOffsets,
    FreesEvent, HeapRecord, KNOWN_WITHOUT_PROBES, LEAF_WORDS, LeafWords, MAX_FRAMES, MAX_NO_PROBES,
    MAX_TRACED, Pending, SHARE_NS, STOPPED_FOR_PROBES, StackEvent, TRACED_CFI, TRACED_HOLD,
    TRACED_LEAF, TRACED_NO_HEAP, TRACED_NO_TENSORS, TRACED_OBJECTS,
};

pub use crate::ring::{EVENTS, count, data_flags, untimed_event};
use crate::task_storage::TaskStorage;
pub use crate::unwind::{
    STEP, Stack, UserRegs, capture, deep, deep_heap, next_hint, read_len, share_suffix,
};

/// Threads sent a SIGSTOP for new code, until user space handles the stop: what tells it the stop
/// is the kernel side's own even when the marked record was lost to a full ring (taken for a
/// user's SIGSTOP, the stop would be left in place, and the process stopped for good).
#[map]
pub static STOPS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_TRACED, 0);

/// Processes (tgids) being traced. User space seeds it; fork adds children, exit removes.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(MAX_TRACED, 0);

/// Each thread's device-memory call in flight (CUDA runtime and driver), apart from its heap entry
/// (`entries`): host allocations made inside a device call are real host allocations.
#[btf_map]
pub static GPU_PENDING: TaskStorage<Pending> = TaskStorage::new();

/// Each thread's call into PyTorch's CUDA caching allocator in flight (its cudaMalloc calls are
/// device calls of their own: segments beside blocks).
#[btf_map]
pub static TORCH_PENDING: TaskStorage<Pending> = TaskStorage::new();

/// How many times user space has changed a process's settings (slot 0): a Python interpreter
/// configured in `PY_CONFIG`, [`TRACED_CFI`] set or cleared; bumped after each change. A thread's
/// entry keeps its process's settings until it changes.
#[map]
static PROC_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// [`settings`]: the process has Python frames to walk.
pub const WALKS_PYTHON: u64 = 1;
/// [`settings`]: the process's heap stacks go as raw stack copies ([`TRACED_CFI`]).
pub const HEAP_CFI: u64 = 2;
/// [`settings`]: the process's walked heap records carry leaf words ([`TRACED_LEAF`]).
pub const HEAP_LEAF: u64 = 4;
/// [`settings`]: the process's malloc family is not traced ([`TRACED_NO_HEAP`]).
pub const HEAP_OFF: u64 = 8;
/// [`settings`]: the process's Python objects are sampled ([`TRACED_OBJECTS`]).
pub const OBJECTS_ON: u64 = 16;
/// [`settings`]: the process's CPU tensors are not traced ([`TRACED_NO_TENSORS`]).
pub const TENSORS_OFF: u64 = 32;

/// The settings of the process (`tgid`) of the thread of entry `p`, as bits ([`WALKS_PYTHON`],
/// [`HEAP_CFI`], [`HEAP_LEAF`]): looked up once per thread and per change user space makes, not per allocation
/// (a hash lookup costs ~40 ns a heap record here). A forked child's threads have entries of
/// their own; after an exec the answer may say Python for a process that has no interpreter any
/// more, which `python::emit_frames` then finds.
#[inline(always)]
pub fn settings(p: &mut Pending, tgid: u32) -> u64 {
    let generation = PROC_GEN.get(0).copied().unwrap_or(0) + 1;
    if p.settings_gen != generation {
        p.settings_gen = generation;
        // SAFETY: only tested for presence.
        let python = unsafe { crate::python::PY_CONFIG.get(&tgid) }.is_some();
        // SAFETY: the value is copied out at once.
        let flags = unsafe { TRACED.get(&tgid) }.copied().unwrap_or(0);
        p.settings = if python { WALKS_PYTHON } else { 0 }
            | if flags & TRACED_CFI != 0 { HEAP_CFI } else { 0 }
            | if flags & TRACED_LEAF != 0 {
                HEAP_LEAF
            } else {
                0
            }
            | if flags & TRACED_NO_HEAP != 0 {
                HEAP_OFF
            } else {
                0
            }
            | if flags & TRACED_OBJECTS != 0 {
                OBJECTS_ON
            } else {
                0
            }
            | if flags & TRACED_NO_TENSORS != 0 {
                TENSORS_OFF
            } else {
                0
            };
    }
    p.settings
}

/// The calling thread as (pid_tgid, tgid) when its process is traced.
#[inline(always)]
pub fn traced_current() -> Option<(u64, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: the value is only tested for presence.
    unsafe { TRACED.get(&tgid) }.map(|_| (id, tgid))
}

/// The calling thread as (pid_tgid, tgid, `TRACED` flags) when its process is traced.
#[inline(always)]
pub fn traced_flags() -> Option<(u64, u32, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: the value is copied out at once.
    unsafe { TRACED.get(&tgid) }.map(|f| (id, tgid, *f))
}

/// Where the kernel keeps the inode behind a file descriptor (user space writes it, from the
/// kernel's BTF); zero: not known.
#[map]
static FILE_OFFSETS: Array<FileOffsets> = Array::with_max_entries(1, 0);

/// Files user space looked at before and found nothing to probe in: a thread that maps one's code
/// is not stopped.
#[map]
static NO_PROBES: HashMap<FileKey, u8> = HashMap::with_max_entries(MAX_NO_PROBES, 0);

/// Whether the file behind the current task's descriptor `fd` is one of [`NO_PROBES`]: task →
/// files → fdtable → file → inode → (device, inode number).
#[inline(always)]
fn nothing_to_probe(fd: u64) -> bool {
    let Some(o) = FILE_OFFSETS.get(0) else {
        return false;
    };
    // An `int` in a 64-bit register.
    let fd = fd & 0xffff_ffff;
    if o.task_files == 0 || fd > u64::from(u32::MAX >> 1) {
        return false;
    }
    // SAFETY: kernel reads through the helper, which fails instead of faulting.
    let at = |base: u64, offset: u64| unsafe {
        bpf_probe_read_kernel((base + offset) as *const u64).ok()
    };
    let key = || {
        // SAFETY: helper without arguments.
        let task = unsafe { bpf_get_current_task() };
        let fdt = at(at(task, o.task_files.into())?, o.files_fdt.into())?;
        let file = at(at(fdt, o.fdt_fd.into())?, fd * 8)?;
        let inode = at(file, o.file_inode.into())?;
        let ino = at(inode, o.inode_ino.into())?;
        let sb = at(inode, o.inode_sb.into())?;
        // SAFETY: as above; `s_dev` is a 32-bit `dev_t`.
        let dev =
            unsafe { bpf_probe_read_kernel((sb + u64::from(o.sb_dev)) as *const u32) }.ok()?;
        Some(FileKey {
            dev: u64::from(dev),
            ino,
        })
    };
    // SAFETY: the value is only tested for presence.
    key().is_some_and(|k| unsafe { NO_PROBES.get(&k) }.is_some())
}

/// [`stop_for_probes`] for code just mapped from the file behind `fd`, unless that file is known
/// to hold nothing to probe (then `ev` says so).
#[inline(always)]
pub fn stop_for_code(flags: u32, fd: u64, ev: &mut Event) {
    if flags & TRACED_HOLD == 0 {
        return;
    }
    if nothing_to_probe(fd) {
        ev.old_size = KNOWN_WITHOUT_PROBES;
    } else {
        stop_for_probes(flags, ev);
    }
}

/// Stops the current thread (SIGSTOP, delivered before it returns to user space) when its process
/// is held by user space, so that the code it just mapped is probed before it runs. Marks `ev` so
/// that user space knows the stop is its own.
#[inline(always)]
pub fn stop_for_probes(flags: u32, ev: &mut Event) {
    const SIGSTOP: u32 = 19;
    if flags & TRACED_HOLD == 0 {
        return;
    }
    // Recorded first: a stop user space could not tell for its own is worse than none.
    if STOPS.insert(&ev.tid, &1, 0).is_err() {
        count(Counter::StopFailed);
        return;
    }
    // SAFETY: helper without memory arguments.
    if unsafe { bpf_send_signal_thread(SIGSTOP) } == 0 {
        ev.old_size = STOPPED_FOR_PROBES;
    } else {
        let _ = STOPS.remove(&ev.tid);
        count(Counter::StopFailed);
    }
}

/// An event header for the current thread.
#[inline(always)]
pub fn event(kind: tracer_common::EventKind, func: u32, id: u64) -> Event {
    Event {
        // SAFETY: helper without preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        ..untimed_event(kind, func, id)
    }
}

/// Per CPU: the tick (jiffies) of the last [`tick_ns`] reading, and the exact time taken then.
#[map]
static TICK_CLOCK: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// The time at tick resolution (4 ms here) for heap records: the exact clock read at this CPU's
/// first call in each tick, never ahead of the exact time. What a heap block's time serves (its
/// age, the series) needs no finer, and the exact clock costs ~67 ns a read here, a tenth of an
/// allocation's program; the tick counter is one load. (`bpf_ktime_get_coarse_ns` is not allowed
/// in probe programs.)
#[inline(always)]
pub fn tick_ns() -> u64 {
    // SAFETY: helpers without preconditions; the slot is this CPU's (a program nested on this CPU
    // can at worst leave an earlier time in it).
    unsafe {
        let tick = bpf_jiffies64();
        match TICK_CLOCK.get_ptr_mut(0) {
            Some(c) if (*c)[0] == tick => (*c)[1],
            Some(c) => {
                let now = bpf_ktime_get_ns();
                *c = [tick, now];
                now
            }
            None => bpf_ktime_get_ns(),
        }
    }
}

/// Sends a record without a stack, waking the consumer now (process lifecycle events).
#[inline(always)]
pub fn emit_now(ev: &Event) {
    match EVENTS.output(ev, BPF_RB_FORCE_WAKEUP as u64) {
        Ok(()) => {}
        Err(_) => count(Counter::RingbufFull),
    }
}

/// Sends a record without a stack.
#[inline(always)]
pub fn emit(ev: &Event) {
    match EVENTS.output(ev, data_flags()) {
        Ok(()) => {}
        Err(_) => count(Counter::RingbufFull),
    }
}

/// Sends a record with a captured stack: the header is written into the per-CPU record that holds
/// the frames, and only the header and the used frames are copied into the ring buffer.
#[inline(always)]
pub fn emit_with_stack(stack: &Stack, ev: &Event, leaf_caller: u64) {
    crate::python::emit_frames(u64::from(ev.tgid) << 32 | u64::from(ev.tid), 0);
    send_stack(stack, ev, leaf_caller);
}

/// Sends a heap allocation as a [`HeapRecord`] with its stack, carrying the thread's unsent frees
/// (`p`'s). Only the frames that differ from the thread's previous heap record go (the rest are
/// named by count). The compact header is written just before the frames in this CPU's record,
/// and the frees just after the frames sent, so that one copy into the ring sends it all. With
/// `leaf` (the allocator's return registers, [`HEAP_LEAF`] processes) the record is an
/// [`EventKind::HeapAllocLeaf`]: [`LeafWords`] read from the stack go between header and frames.
#[inline(always)]
pub fn emit_alloc(stack: &Stack, ev: &Event, p: &mut Pending, leaf: Option<&UserRegs>) {
    const FRAMES: usize = size_of::<StackEvent>() - 8 * MAX_FRAMES;
    const WORDS: usize = MAX_FRAMES + FREES_PER_RECORD;
    if settings(p, ev.tgid) & WALKS_PYTHON != 0 {
        python_frames(ev, &mut p.py_tstate);
    }
    if ev.ts_ns > p.prev_ns.saturating_add(SHARE_NS) {
        p.n_prev = 0; // user space may have let this thread's last stack go
    }
    p.prev_ns = ev.ts_ns;
    let shared = share_suffix(stack, &mut p.prev, &mut p.n_prev);
    let n = stack.n.saturating_sub(shared) & (MAX_FRAMES * 2 - 1);
    let n = if n > MAX_FRAMES { MAX_FRAMES } else { n };
    let m = p.n_frees as usize;
    let m = if m > FREES_PER_RECORD {
        FREES_PER_RECORD
    } else {
        m
    };
    let (kind, head) = match leaf {
        Some(_) => (
            EventKind::HeapAllocLeaf,
            size_of::<HeapRecord>() + size_of::<LeafWords>(),
        ),
        None => (EventKind::HeapAlloc, size_of::<HeapRecord>()),
    };
    // SAFETY: `stack.record` is this CPU's record (in a `RecordBuf`: LEAF_ROOM bytes before it,
    // FREES_PER_RECORD words of room after its frames), filled by `capture` in this program run;
    // the header ends where the frames start; every index is checked against the room.
    let bytes = unsafe {
        let frames = stack.record.cast::<u8>().add(FRAMES);
        if let Some(regs) = leaf {
            let block = frames.sub(size_of::<LeafWords>()).cast::<LeafWords>();
            (*block).sp = regs.sp;
            (*block).bp = regs.bp;
            // A failed read leaves zeros: user space then keeps the walk's frames as they are.
            let _ = read_user_raw(
                (&raw mut (*block).words).cast(),
                8 * LEAF_WORDS as u32,
                regs.sp as *const _,
            );
        }
        let start = frames.sub(head);
        *start.cast::<HeapRecord>() = HeapRecord {
            kind: kind as u32,
            tgid: ev.tgid,
            tid: ev.tid,
            func: ev.func as u8,
            shared: shared as u8,
            n_frames: n as u8,
            n_frees: m as u8,
            ts_ns: ev.ts_ns,
            addr: ev.addr,
            size: ev.size,
            old_addr: ev.old_addr,
        };
        let words = (*stack.record).frames.as_mut_ptr();
        for j in 0..FREES_PER_RECORD {
            let i = n + j;
            if j < m && i < WORDS {
                *words.add(i) = p.frees[j];
            }
        }
        core::slice::from_raw_parts(start, head + 8 * (n + m))
    };
    p.n_frees = 0;
    if EVENTS.output(bytes, data_flags()).is_err() {
        count(Counter::RingbufFull);
        p.n_prev = 0; // user space never saw this stack: the next record sends its own whole
    }
}

/// Sends the thread's unsent frees (`p`'s) in a record of their own, if it has any. A thread's
/// frees go out before its next record of a heap call and when it is switched out.
#[inline(always)]
pub fn flush_frees(p: &mut Pending) {
    if p.n_frees == 0 {
        return;
    }
    let n = (p.n_frees as usize).min(FREES_PER_RECORD);
    let ev = FreesEvent {
        kind: EventKind::Frees as u32,
        tgid: p.tgid,
        n: n as u32,
        // Flushed by its own thread (at its heap calls, switch-out and exit).
        tid: bpf_get_current_pid_tgid() as u32,
        addrs: p.frees,
    };
    p.n_frees = 0;
    send_frees(&ev);
}

/// Sends a [`FreesEvent`]: its header and the used entries.
#[inline(always)]
pub fn send_frees(ev: &FreesEvent) {
    let n = (ev.n as usize) & 7;
    let n = if n > FREES_PER_RECORD {
        FREES_PER_RECORD
    } else {
        n
    };
    // SAFETY: 16 + 8n <= size_of::<FreesEvent>() bytes of `ev`.
    let bytes =
        unsafe { core::slice::from_raw_parts((ev as *const FreesEvent).cast::<u8>(), 16 + 8 * n) };
    if EVENTS.output(bytes, data_flags()).is_err() {
        count(Counter::RingbufFull);
    }
}

/// As [`emit_with_stack`], the thread's Python frames already sent.
#[inline(always)]
fn send_stack(stack: &Stack, ev: &Event, leaf_caller: u64) {
    const HEADER: usize = size_of::<StackEvent>() - 8 * MAX_FRAMES;
    let n = stack.n & (MAX_FRAMES * 2 - 1);
    let n = if n > MAX_FRAMES { MAX_FRAMES } else { n };
    // SAFETY: `stack.record` is this CPU's record, filled by `capture` in this program run; the
    // output length is at most its size.
    let used = unsafe {
        (*stack.record).event = *ev;
        (*stack.record).leaf_caller = leaf_caller;
        (*stack.record).stack_bytes = (n * 8) as i64;
        core::slice::from_raw_parts(stack.record.cast::<u8>(), HEADER + 8 * n)
    };
    if EVENTS.output(used, data_flags()).is_err() {
        count(Counter::RingbufFull);
    }
}

/// Sends the Python frames of `ev`'s thread, its thread state found from `tstate` (the one its
/// last walk found; kept for the next).
#[inline(always)]
fn python_frames(ev: &Event, tstate: &mut u64) {
    *tstate = crate::python::emit_frames(u64::from(ev.tgid) << 32 | u64::from(ev.tid), *tstate);
}

/// Sends a deep record (raw stack, for user-space unwinding) when the stack can be read, else a
/// record with the frame-pointer walk's frames. `python_only`: a record with the return address
/// alone as its native stack, beside the Python frames (a Python process's tensors: their line is
/// the interpreter's, and the copy of libtorch's stack costs most of the record).
#[inline(always)]
pub fn emit_deep(regs: &UserRegs, ev: &Event, python_only: bool, tstate: &mut u64) {
    // The Python frames first, from one verifier state (after the raw-stack copy, each of its
    // loop's exits would have the verifier walk them again: over its instruction limit).
    python_frames(ev, tstate);
    if python_only {
        // No frame record to follow: the walk ends at the first frame.
        let leaf = UserRegs { bp: 0, ..*regs };
        return send_walked(&leaf, ev);
    }
    match deep(regs, ev, DEEP_STACK_BYTES as u64) {
        Some(bytes) => send_deep(bytes),
        None => send_walked(regs, ev),
    }
}

/// A heap allocation's (or its pages') deep record, with as much stack as its site needs (see
/// `unwind::deep_heap`) and the thread's unsent frees, else the frees and the frame-pointer
/// walk's frames.
#[inline(always)]
pub fn emit_deep_heap(regs: &UserRegs, ev: &Event, p: &mut Pending) {
    python_frames(ev, &mut p.py_tstate);
    match deep_heap(regs, ev, &p.frees, p.n_frees) {
        Some(bytes) => {
            p.n_frees = 0;
            send_deep(bytes)
        }
        None => {
            flush_frees(p);
            send_walked(regs, ev)
        }
    }
}

#[inline(always)]
fn send_deep(bytes: &[u8]) {
    if EVENTS.output(bytes, data_flags()).is_err() {
        count(Counter::RingbufFull);
    }
}

/// `ev` with the frame-pointer walk's frames (when the stack could not be copied).
#[inline(always)]
fn send_walked(regs: &UserRegs, ev: &Event) {
    match capture(regs, STEP) {
        Some(stack) => send_stack(&stack, ev, 0),
        None => emit(ev),
    }
}

/// The thread's entry and id (`entry`) when this return ends its outermost call (the entry is
/// then idle); None for a nested call's return or a return without an entry (counted).
///
/// `off`: the [`TRACED`] flag that takes the probes' layer out of a process (0: always on). A
/// thread with no entry at all returning while its process has it is no loss: its call's entry
/// probe was detached first (a layer's links go out each on a thread of its own, once its flag
/// is set; entry and return programs in either order), and its entry program records nothing
/// for such a process anyway.
#[inline(always)]
pub fn outermost_return(
    entry: Option<(&mut Pending, u64)>,
    off: u32,
) -> Option<(&mut Pending, u64)> {
    let Some((p, id)) = entry else {
        if traced_flags().is_some_and(|(_, _, flags)| off == 0 || flags & off == 0) {
            count(Counter::ReturnWithoutEntry);
        }
        return None;
    };
    match p.depth {
        0 => {
            count(Counter::ReturnWithoutEntry);
            None
        }
        1 => {
            p.depth = 0;
            Some((p, id))
        }
        _ => {
            p.depth -= 1;
            None
        }
    }
}

/// The user registers of a probe's context.
#[inline(always)]
pub fn probe_regs(regs: *const pt_regs) -> UserRegs {
    // SAFETY: the probe's own register block.
    unsafe {
        UserRegs {
            ip: (*regs).rip,
            sp: (*regs).rsp,
            bp: (*regs).rbp,
        }
    }
}

/// The current task's user registers, saved at syscall entry: at a syscall's exit they still
/// hold the call's arguments and its caller's stack. One read of the whole block.
#[inline(always)]
pub fn saved_regs() -> Option<pt_regs> {
    // SAFETY: helpers return the current task and its saved user registers; the read fails
    // cleanly.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        bpf_probe_read_kernel(regs).ok()
    }
}

/// The return address at the user stack pointer `sp` when the bytes before it encode a call: the
/// caller of a frameless function, which a frame-pointer walk skips. Used where the thread is
/// inside a syscall.
#[inline(always)]
pub fn leaf_caller_at(sp: u64) -> u64 {
    // SAFETY: user memory reads that fail cleanly.
    let Ok(ret) = (unsafe { bpf_probe_read_user(sp as *const u64) }) else {
        return 0;
    };
    if ret < 8 {
        return 0;
    }
    // SAFETY: as above.
    let Ok(b) = (unsafe { bpf_probe_read_user((ret - 8) as *const [u8; 8]) }) else {
        return 0;
    };
    let call_rel32 = b[3] == 0xe8;
    let call_rip_mem = b[2] == 0xff && b[3] == 0x15;
    let call_reg = b[6] == 0xff && (b[7] & 0xf8) == 0xd0;
    let call_reg_disp8 = b[5] == 0xff && (b[6] & 0xf8) == 0x50;
    if call_rel32 || call_rip_mem || call_reg || call_reg_disp8 {
        ret
    } else {
        0
    }
}
