//! Walking a thread's Python frames: where its thread state is and how its interpreter frames
//! link, per CPython version. These offsets are what the kernel side reads at each allocation;
//! [`walk`] does the same from user space, which is how they are checked against a real
//! interpreter.
//!
//! A thread's state is found by its kernel thread id: the GIL holder (`_PyRuntime.gilstate.
//! tstate_current`) first, else the main interpreter's list of thread states, each of which
//! records its thread's native id. So a thread that allocates with the GIL released still gets
//! its own frames, and nothing depends on the C library's thread layout.

use tracer_common::PyConfig;

use super::{interp::Interpreter, mem};

/// Where things are, for one CPython version (x86_64): the kernel side's own configuration
/// ([`PyConfig`], documented in tracer-common), with `runtime` 0 until a process is known.
pub type Offsets = PyConfig;

/// The offsets of CPython `version`, checked against a running 3.11 by the tests (from its
/// DWARF: gdb `ptype /o`).
pub fn offsets(version: (u8, u8)) -> Option<Offsets> {
    match version {
        (3, 11) => Some(PyConfig {
            runtime: 0,
            runtime_tstate_current: 576,
            runtime_main_interp: 48,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_native_id: 160,
            tstate_cframe: 56,
            cframe_frame: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_instr: 56,
            frame_entry: 68,
            code_bytecode: 184,
        }),
        _ => None,
    }
}

/// Thread states looked at at most, past the GIL holder.
pub const MAX_THREADS: usize = 16;

/// One Python frame: its code object, the instruction it is at (code units into the bytecode)
/// and whether it began a C-level evaluation (the frames up to and including it ran in one
/// `_PyEval_EvalFrameDefault` call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFrame {
    pub code: u64,
    pub instr: u32,
    pub entry: bool,
}

/// Frames read at most (the kernel side's bound too).
pub const MAX_DEPTH: usize = 32;

/// The Python frames of thread `tid` of `pid`, innermost first; empty when it has no Python
/// thread state.
pub fn walk(pid: u32, interp: &Interpreter, offs: &Offsets, tid: u32) -> Vec<RawFrame> {
    let word = |addr: u64| mem::read(pid, addr, 8).and_then(|b| mem::u64_at(&b, 0));
    let owner = |t: u64| word(t + offs.tstate_native_id) == Some(u64::from(tid));
    let mut tstate = word(interp.runtime + offs.runtime_tstate_current).unwrap_or(0);
    if tstate == 0 || !owner(tstate) {
        tstate = word(interp.runtime + offs.runtime_main_interp)
            .and_then(|i| word(i + offs.interp_threads_head))
            .unwrap_or(0);
        for _ in 0..MAX_THREADS {
            if tstate == 0 || owner(tstate) {
                break;
            }
            tstate = word(tstate + offs.tstate_next).unwrap_or(0);
        }
        if tstate == 0 || !owner(tstate) {
            return Vec::new();
        }
    }
    let mut frame = word(tstate + offs.tstate_cframe)
        .and_then(|cframe| word(cframe + offs.cframe_frame))
        .unwrap_or(0);
    let mut out = Vec::new();
    while frame != 0 && out.len() < MAX_DEPTH {
        let Some(f) = mem::read(pid, frame, offs.frame_entry as usize + 1) else {
            break;
        };
        let at = |o: u64| mem::u64_at(&f, o as usize).unwrap_or(0);
        let (code, instr) = (at(offs.frame_code), at(offs.frame_instr));
        let start = code + offs.code_bytecode;
        out.push(RawFrame {
            code,
            instr: (instr.saturating_sub(start) / 2) as u32,
            entry: f.get(offs.frame_entry as usize) == Some(&1),
        });
        frame = at(offs.frame_previous);
    }
    out
}
