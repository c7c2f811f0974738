//! A thread's CPython frames at an event with a stack: found from its thread state (the GIL
//! holder's when it is this thread, else the main interpreter's thread list, matched by native
//! thread id or by pthread_t), then the interpreter frames, innermost first. Code objects,
//! instruction addresses and globals go to user space, which reads the code objects while the
//! process lives.

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_loop,
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use tracer_common::{
    EventKind, MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREADS, PY_MODULE, PY_NONE, PyConfig,
    PyFrame, PyStackEvent, py_flags,
};

use crate::ring::{EVENTS, count, data_flags, untimed_event};
use crate::unwind::{get, set};

/// Processes whose frames are walked, and where: set by user space, copied to forked children.
#[map]
pub static PY_CONFIG: HashMap<u32, PyConfig> = HashMap::with_max_entries(MAX_PY_PROCESSES, 0);

/// The record being filled, per CPU (too large for the BPF stack).
#[map]
static PY_RECORD: PerCpuArray<PyStackEvent> = PerCpuArray::with_max_entries(1, 0);

/// The walks' loop state. It lives in a map, not in registers (as the native walk's does, see
/// unwind.rs): map loads are unknown scalars to the verifier, so iterations look alike and prune.
/// In registers, each iteration was a state of its own, and this walk, verified again in every
/// program that sends a stack, took the kernel five seconds to load.
#[repr(C)]
struct PyWalk {
    tstate: u64,
    frame: u64,
    n: u64,
    /// Windows read in this walk.
    windows: u64,
    /// Where the process's CPython keeps a frame's fields.
    layout: FrameLayout,
    /// The current frame's first 128 bytes, when it is outside the window.
    words: [u64; 16],
    /// Where the window starts in the thread's memory (0: no window) and its bytes.
    base: u64,
    len: u64,
    /// The thread state's words between its owner and frame fields, read at once.
    ts: [u64; TSTATE_WORDS],
    /// The data stack below the innermost frame, read at once: CPython 3.11+ pushes a Python
    /// call's frame right above its caller's, so most of a thread's chain is in it, and one
    /// read of it costs about what two reads of single frames do.
    window: [u64; WINDOW_WORDS + 16],
    /// The module body last found on this CPU: (process, code object, globals) and its file
    /// name. The main script's body is under every stack of its process: read once, not at each
    /// event. Another body made at the same code address runs with another module's globals.
    module: [u64; 4],
}

/// Word indexes of a frame's fields in its first 128 bytes, for the walk's steps (flags: 1 where
/// the version has the field).
#[repr(C)]
#[derive(Clone, Copy)]
struct FrameLayout {
    code_w: u64,
    instr_w: u64,
    prev_w: u64,
    entry_w: u64,
    entry_shift: u64,
    globals_w: u64,
    locals_w: u64,
    has_entry: u64,
    has_globals: u64,
    has_modules: u64,
    tgid: u64,
    /// The code object's file name field.
    filename: u64,
}

/// The thread state's words read at once at most; a power of two.
const TSTATE_WORDS: usize = 32;
/// The window's largest read, in words; a power of two.
const WINDOW_WORDS: usize = 1024;
/// The window read first: this many bytes below the innermost frame's end.
const WINDOW_BYTES: u64 = 4096;
/// Windows a walk reads at most; past them, frames are read one by one.
const MAX_WINDOWS: u64 = 4;
/// A frame's bytes read, in the window or alone.
const FRAME_BYTES: u64 = 128;

#[map]
static PY_WALK: PerCpuArray<PyWalk> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn word(addr: u64) -> u64 {
    // SAFETY: user memory read that fails cleanly (0 then).
    unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(0)
}

/// Sends the Python frames of the calling thread (`id` = pid_tgid) when its process runs a
/// CPython leaktracer knows; nothing otherwise. `hint`: the thread state this thread's last walk
/// found (0: none), tried first; returns the one found (0: none).
///
/// The hint saves the search: the GIL holder's state and the check that it is this thread's (two
/// reads) when the thread holds the GIL, the walk of the interpreter's thread list (three or more)
/// when it does not, as in a CPU training step's backward pass, where PyTorch's autograd engine
/// runs with the GIL released. A state freed with its thread and reused fails the check.
///
/// A global function (exported, so its BTF linkage is global): the verifier checks it once per
/// program, on its own, where a static one is checked again at every call site and on every path
/// that reaches one. page_send took 0.69 s to load with it static, 0.12 s global; heap_flush
/// 1.2 s and 0.19 s. Its cost when it runs is the same (a call either way).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn emit_frames(id: u64, hint: u64) -> u64 {
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    // SAFETY: read in place (a copy on the stack would leave too little of it for the walk's
    // steps); user space changes a process's entry only before its frames are walked.
    let Some(cfg) = (unsafe { PY_CONFIG.get(&tgid) }) else {
        return 0;
    };
    // This thread as its thread state records it: its kernel id, or its pthread_t (the fs base).
    let me = if cfg.task_fsbase == 0 {
        u64::from(tid)
    } else {
        // SAFETY: the current task, read at an offset from the kernel's own BTF; fails cleanly.
        let task = unsafe { bpf_get_current_task() };
        unsafe { bpf_probe_read_kernel((task + cfg.task_fsbase) as *const u64) }.unwrap_or(0)
    };
    let owner = |t: u64| word(t + cfg.tstate_native_id) == me;
    let Some(w) = PY_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch entry, used only while this program runs.
    let w = unsafe { &mut *w };
    // The thread state and its frame field: the hint's, or the GIL holder's, when this thread
    // owns it (one read for both fields), else the one found in the thread list.
    let mut tstate = 0;
    let mut frame = 0;
    let holder = || {
        if cfg.runtime_tstate_current == PY_NONE {
            0
        } else {
            word(cfg.runtime + cfg.runtime_tstate_current)
        }
    };
    let first = if hint != 0 { hint } else { holder() };
    if first != 0 {
        let (id, f) = tstate_fields(w, cfg, first);
        if id == me {
            (tstate, frame) = (first, f);
        }
    }
    if tstate == 0 && hint != 0 {
        let t = holder();
        if t != 0 && t != hint && owner(t) {
            (tstate, frame) = (t, word(t + cfg.tstate_cframe));
        }
    }
    if tstate == 0 {
        set(
            &mut w.tstate,
            word(word(cfg.runtime + cfg.runtime_main_interp) + cfg.interp_threads_head),
        );
        set(&mut w.n, 0); // 1 once found
        for _ in 0..MAX_PY_THREADS {
            let t = get(&w.tstate);
            if t == 0 {
                break;
            }
            if owner(t) {
                set(&mut w.n, 1);
                break;
            }
            set(&mut w.tstate, word(t + cfg.tstate_next));
        }
        tstate = get(&w.tstate);
        if tstate == 0 || get(&w.n) == 0 {
            return 0;
        }
        frame = word(tstate + cfg.tstate_cframe);
    }
    if cfg.cframe_frame != PY_NONE {
        frame = word(frame + cfg.cframe_frame);
    }
    if frame == 0 {
        return tstate;
    }
    // Word indexes of the fields in a frame's first 128 bytes, read at once (one probe read a
    // frame, not four: each read costs about 100 ns).
    let has_globals = cfg.frame_globals != PY_NONE;
    w.layout = FrameLayout {
        code_w: cfg.frame_code / 8,
        instr_w: cfg.frame_instr / 8,
        prev_w: cfg.frame_previous / 8,
        entry_w: cfg.frame_entry / 8,
        entry_shift: (cfg.frame_entry % 8) * 8,
        globals_w: cfg.frame_globals / 8,
        locals_w: cfg.frame_locals / 8,
        has_entry: u64::from(cfg.frame_entry != PY_NONE),
        has_globals: u64::from(has_globals),
        has_modules: u64::from(
            has_globals && cfg.frame_locals != PY_NONE && cfg.code_filename != PY_NONE,
        ),
        tgid: u64::from(tgid),
        filename: cfg.code_filename,
    };
    read_window(w, frame);
    set(&mut w.windows, 1);
    set(&mut w.frame, frame);
    set(&mut w.n, 0);
    let Some(rec) = PY_RECORD.get_ptr_mut(0) else {
        return tstate;
    };
    let mut step = StepCtx { w, rec };
    // SAFETY: a helper call; the callback is a static function of this object, its context this
    // function's.
    unsafe {
        bpf_loop(
            MAX_PY_FRAMES.div_ceil(STEPS_PER_CALL) as u32,
            frame_steps as *const () as *mut c_void,
            (&raw mut step).cast(),
            0,
        )
    };
    let (frame, n) = (get(&w.frame), get(&w.n) as usize);
    let mut ev = untimed_event(EventKind::PyFrames, 0, id);
    ev.aux = n as u64;
    ev.size = u64::from(frame != 0);
    const HEADER: usize = size_of::<tracer_common::Event>();
    let n = n & (MAX_PY_FRAMES * 2 - 1);
    let n = if n > MAX_PY_FRAMES { MAX_PY_FRAMES } else { n };
    // SAFETY: this CPU's record, filled above; the length is at most its size.
    let used = unsafe {
        (*rec).event = ev;
        core::slice::from_raw_parts(rec.cast::<u8>(), HEADER + size_of::<PyFrame>() * n)
    };
    if EVENTS.output(used, data_flags()).is_err() {
        count(tracer_common::Counter::RingbufFull);
    }
    tstate
}

/// What a walk's steps work on: this CPU's walk state and record, looked up once per walk.
#[repr(C)]
struct StepCtx {
    w: *mut PyWalk,
    rec: *mut PyStackEvent,
}

/// Frames a call of [`frame_steps`] walks: a call costs about 10 ns, a frame in the window less.
const STEPS_PER_CALL: usize = 4;

/// [`STEPS_PER_CALL`] steps of a walk, bpf_loop's callback; 1 ends the walk. A callback is
/// verified once, whatever the number of calls: the same steps unrolled, one per frame, took the
/// verifier about 4 ms a frame in every program that walks.
#[inline(never)]
extern "C" fn frame_steps(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the walk's context (this CPU's walk and record), on the caller's stack.
    let (w, rec) = unsafe {
        let c = &*ctx.cast::<StepCtx>();
        (&mut *c.w, c.rec)
    };
    for _ in 0..STEPS_PER_CALL {
        if !frame_step(w, rec) {
            return 1;
        }
    }
    0
}

/// One step of a walk: records the frame at `frame` in this CPU's walk and moves to its caller;
/// false when the walk ends.
#[inline(always)]
fn frame_step(w: &mut PyWalk, rec: *mut PyStackEvent) -> bool {
    let (frame, i) = (get(&w.frame), get(&w.n));
    if frame == 0 || i >= MAX_PY_FRAMES as u64 {
        return false;
    }
    let mut inside = in_window(w, frame);
    if !inside && get(&w.windows) < MAX_WINDOWS {
        // The chain left the window (into an older data stack chunk, or a generator's frame):
        // read the next window, ending at this frame, as the first was.
        read_window(w, frame);
        set(&mut w.windows, get(&w.windows) + 1);
        inside = in_window(w, frame);
    }
    let off = frame.wrapping_sub(get(&w.base));
    let (words, at) = if inside {
        (&w.window[..], (off / 8) as usize & (WINDOW_WORDS - 1))
    } else if read_frame(&mut w.words, frame) {
        (&w.words[..], 0)
    } else {
        return false;
    };
    let l = &w.layout;
    let word_at = |k: u64| words.get(at + (k as usize & 15)).copied().unwrap_or(0);
    let entry = if l.has_entry != 0 {
        (word_at(l.entry_w) >> (l.entry_shift & 63)) as u8
    } else {
        0
    };
    let globals = if l.has_globals != 0 {
        word_at(l.globals_w)
    } else {
        0
    };
    let (code, instr, previous) = (word_at(l.code_w), word_at(l.instr_w), word_at(l.prev_w));
    let module = l.has_modules != 0 && globals != 0 && word_at(l.locals_w) == globals;
    let flags = if module {
        let file = module_file(w, l.tgid, code, globals, l.filename);
        py_flags(entry | PY_MODULE, file)
    } else {
        py_flags(entry, globals)
    };
    // SAFETY: `rec` is this CPU's record; the index is masked below MAX_PY_FRAMES.
    unsafe { (*rec).frames[(i as usize) & (MAX_PY_FRAMES - 1)] = PyFrame { code, instr, flags } };
    set(&mut w.n, i + 1);
    set(&mut w.frame, previous);
    true
}

/// The file name of the module body running `code` with `globals` in process `tgid`: the last
/// one found on this CPU, or read from the code object (at `filename` in it).
#[inline(always)]
fn module_file(w: &mut PyWalk, tgid: u64, code: u64, globals: u64, filename: u64) -> u64 {
    if w.module[..3] == [tgid, code, globals] {
        return w.module[3];
    }
    let file = word(code + filename);
    w.module = [tgid, code, globals, file];
    file
}

/// The thread state `t`'s owner (native id or pthread_t) and frame field (its cframe, or 3.13's
/// current frame), in one read when both are aligned words within [`TSTATE_WORDS`] words.
#[inline(always)]
fn tstate_fields(w: &mut PyWalk, cfg: &PyConfig, t: u64) -> (u64, u64) {
    let (a, b) = (cfg.tstate_native_id, cfg.tstate_cframe);
    let lo = if a < b { a } else { b };
    let len = (if a > b { a } else { b }) + 8 - lo;
    let aligned = a % 8 == 0 && b % 8 == 0;
    if aligned && len <= TSTATE_WORDS as u64 * 8 && read_user(w.ts.as_mut_ptr(), len, t + lo) {
        let at = |off: u64| w.ts[((off - lo) / 8) as usize & (TSTATE_WORDS - 1)];
        (at(a), at(b))
    } else {
        (word(t + a), word(t + b))
    }
}

/// Whether the frame at `frame` lies whole in the window read last. A frame below the window's
/// start is not in it: its offset from the start wraps around.
#[inline(always)]
fn in_window(w: &PyWalk, frame: u64) -> bool {
    let (base, len) = (get(&w.base), get(&w.len));
    base != 0 && frame >= base && (frame - base) % 8 == 0 && frame - base + FRAME_BYTES <= len
}

/// Reads the window ending at a frame's end (the innermost frame's, first): [`WINDOW_BYTES`]
/// below it, or, where that reaches memory not mapped (a data stack chunk's start), from the
/// frame's page on.
#[inline(always)]
fn read_window(w: &mut PyWalk, frame: u64) {
    let end = frame + FRAME_BYTES;
    let wide = end.saturating_sub(WINDOW_BYTES);
    let page = frame & !4095;
    let (mut base, mut len) = (wide, end - wide);
    if !read_user(w.window.as_mut_ptr(), len, base) {
        (base, len) = (page, end - page);
        if !read_user(w.window.as_mut_ptr(), len, base) {
            base = 0;
        }
    }
    set(&mut w.base, base);
    set(&mut w.len, len);
}

/// Reads a frame outside the window into `to`; false when it is not mapped.
#[inline(always)]
fn read_frame(to: &mut [u64; 16], frame: u64) -> bool {
    // SAFETY: user memory read into this CPU's entry, failing cleanly.
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            to.as_mut_ptr().cast(),
            FRAME_BYTES as u32,
            frame as *const _,
        ) == 0
    }
}

/// Copies `len` bytes of the thread's memory at `addr` to `to` (at most the window's size);
/// false when any of it is not mapped.
#[inline(always)]
fn read_user(to: *mut u64, len: u64, addr: u64) -> bool {
    let len = len as u32 & (WINDOW_WORDS as u32 * 8 * 2 - 1);
    if len == 0 || len > WINDOW_WORDS as u32 * 8 {
        return false;
    }
    // SAFETY: user memory read into this CPU's entry (at least `len` bytes), failing cleanly.
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(to.cast(), len, addr as *const _) == 0
    }
}
