//! Walking a thread's Python frames from user space, as the kernel side does at each allocation
//! (tracer-ebpf/src/python.rs) with the same [`PyConfig`]: how the tests check a version's
//! offsets against a real interpreter.
//!
//! A thread's state is found by what it records of its owner: the GIL holder
//! (`_PyRuntime.gilstate.tstate_current`, up to 3.11) first, else the main interpreter's list
//! of thread states. So a thread that allocates with the GIL released still gets its own frames.

use tracer_common::{MAX_PY_FRAMES, MAX_PY_THREADS, PY_MODULE, PY_NONE, PyConfig, py_flags};

use super::mem;

/// The raw frames (code object, instruction word, flags word; innermost first) of the thread of
/// `pid` whose state records `me` as its owner (its native id, or its pthread_t when
/// `cfg.task_fsbase` is set); empty when there is none. `cfg.runtime` is the process's.
pub fn walk(pid: u32, cfg: &PyConfig, me: u64) -> Vec<u64> {
    let word = |addr: u64| mem::read(pid, addr, 8).and_then(|b| mem::u64_at(&b, 0));
    let owner = |t: u64| word(t + cfg.tstate_native_id) == Some(me);
    let mut tstate = if cfg.runtime_tstate_current == PY_NONE {
        0
    } else {
        word(cfg.runtime + cfg.runtime_tstate_current).unwrap_or(0)
    };
    if tstate == 0 || !owner(tstate) {
        tstate = word(cfg.runtime + cfg.runtime_main_interp)
            .and_then(|i| word(i + cfg.interp_threads_head))
            .unwrap_or(0);
        for _ in 0..MAX_PY_THREADS {
            if tstate == 0 || owner(tstate) {
                break;
            }
            tstate = word(tstate + cfg.tstate_next).unwrap_or(0);
        }
        if tstate == 0 || !owner(tstate) {
            return Vec::new();
        }
    }
    let mut frame = word(tstate + cfg.tstate_cframe).unwrap_or(0);
    if cfg.cframe_frame != PY_NONE && frame != 0 {
        frame = word(frame + cfg.cframe_frame).unwrap_or(0);
    }
    let mut out = Vec::new();
    while frame != 0 && out.len() < MAX_PY_FRAMES * 3 {
        let Some(f) = mem::read(pid, frame, 128) else {
            break;
        };
        let at = |o: u64| mem::u64_at(&f, o as usize).unwrap_or(0);
        let entry = f.get(cfg.frame_entry as usize).copied().unwrap_or(0);
        let globals = if cfg.frame_globals == PY_NONE {
            0
        } else {
            at(cfg.frame_globals)
        };
        let code = at(cfg.frame_code);
        let module = globals != 0
            && cfg.frame_locals != PY_NONE
            && cfg.code_filename != PY_NONE
            && at(cfg.frame_locals) == globals;
        let flags = if module {
            let file = word(code + cfg.code_filename).unwrap_or(0);
            py_flags(entry | PY_MODULE, file)
        } else {
            py_flags(entry, globals)
        };
        out.extend([code, at(cfg.frame_instr), flags]);
        frame = at(cfg.frame_previous);
    }
    out
}
