//! A thread's CPython frames at an event with a stack: found from its thread state (the GIL
//! holder's when it is this thread, else the main interpreter's thread list, matched by native
//! thread id or by pthread_t), then the interpreter frames, innermost first. Code objects,
//! instruction addresses and globals go to user space, which reads the code objects while the
//! process lives.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use tracer_common::{
    EventKind, MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREADS, PY_MODULE, PY_NONE, PyConfig,
    PyFrame, PyStackEvent, py_flags,
};

use crate::ring::{DATA_FLAGS, EVENTS, count, untimed_event};
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

/// The thread state's words read at once at most; a power of two.
const TSTATE_WORDS: usize = 32;
/// The window's largest read, in words; a power of two.
const WINDOW_WORDS: usize = 1024;
/// The window read first: this many bytes below the innermost frame's end.
const WINDOW_BYTES: u64 = 4096;
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
    // SAFETY: the value is copied out at once.
    let Some(cfg) = (unsafe { PY_CONFIG.get(&tgid) }).copied() else {
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
        let (id, f) = tstate_fields(w, &cfg, first);
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
    let Some(rec) = PY_RECORD.get_ptr_mut(0) else {
        return tstate;
    };
    // Word indexes of the fields in a frame's first 128 bytes, read at once (one probe read a
    // frame, not four: each read costs about 100 ns).
    let (code_w, instr_w, prev_w) = (
        (cfg.frame_code / 8) as usize & 15,
        (cfg.frame_instr / 8) as usize & 15,
        (cfg.frame_previous / 8) as usize & 15,
    );
    let (entry_w, entry_shift) = (
        (cfg.frame_entry / 8) as usize & 15,
        (cfg.frame_entry % 8) * 8,
    );
    let globals_w = (cfg.frame_globals / 8) as usize & 15;
    let locals_w = (cfg.frame_locals / 8) as usize & 15;
    let (has_entry, has_globals) = (cfg.frame_entry != PY_NONE, cfg.frame_globals != PY_NONE);
    let has_modules = has_globals && cfg.frame_locals != PY_NONE && cfg.code_filename != PY_NONE;
    read_window(w, frame);
    set(&mut w.frame, frame);
    set(&mut w.n, 0);
    for _ in 0..MAX_PY_FRAMES {
        let (frame, i) = (get(&w.frame), get(&w.n));
        if frame == 0 || i >= MAX_PY_FRAMES as u64 {
            break;
        }
        let (base, len) = (get(&w.base), get(&w.len));
        let off = frame.wrapping_sub(base);
        let (words, at) = if base != 0 && off % 8 == 0 && off + FRAME_BYTES <= len {
            (&w.window[..], (off / 8) as usize & (WINDOW_WORDS - 1))
        } else if read_frame(&mut w.words, frame) {
            (&w.words[..], 0)
        } else {
            break;
        };
        let word_at = |k: usize| words.get(at + k).copied().unwrap_or(0);
        let entry = if has_entry {
            (word_at(entry_w) >> entry_shift) as u8
        } else {
            0
        };
        let globals = if has_globals { word_at(globals_w) } else { 0 };
        let (code, instr, previous) = (word_at(code_w), word_at(instr_w), word_at(prev_w));
        let module = has_modules && globals != 0 && word_at(locals_w) == globals;
        let flags = if module {
            let file = module_file(w, u64::from(tgid), code, globals, cfg.code_filename);
            py_flags(entry | PY_MODULE, file)
        } else {
            py_flags(entry, globals)
        };
        let f = PyFrame { code, instr, flags };
        // SAFETY: `rec` is this CPU's record; the index is masked below MAX_PY_FRAMES.
        unsafe { (*rec).frames[(i as usize) & (MAX_PY_FRAMES - 1)] = f };
        set(&mut w.n, i + 1);
        set(&mut w.frame, previous);
    }
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
    if EVENTS.output(used, DATA_FLAGS).is_err() {
        count(tracer_common::Counter::RingbufFull);
    }
    tstate
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

/// Reads the window ending at the innermost frame's end: [`WINDOW_BYTES`] below it, or, where
/// that reaches memory not mapped (a data stack chunk's start), from the frame's page on.
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
