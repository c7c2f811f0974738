//! Walking a thread's Python frames: where its thread state is and how its interpreter frames
//! link, per CPython version. These offsets are what the kernel side reads at each allocation;
//! [`walk`] does the same from user space on a stopped thread, which is how they are checked
//! against a real interpreter.
//!
//! The thread state comes from the interpreter's thread-specific key (`_PyRuntime.gilstate.
//! autoTSSkey`) read through glibc's thread control block, found at the thread's fs base: it is
//! the calling thread's own, even when another thread holds the GIL.

use super::{interp::Interpreter, mem};

/// glibc (2.36, x86_64): `struct pthread`'s `specific_1stblock`, 32 keys of 16 bytes, each
/// `{ seq, data }`.
pub const GLIBC_SPECIFIC: u64 = 784;
pub const GLIBC_KEY_DATA: u64 = 16;
pub const GLIBC_KEYS: u32 = 32;

/// Where things are, for one CPython version (x86_64).
#[derive(Clone, Copy, Debug)]
pub struct Offsets {
    /// In `_PyRuntime`: the thread-specific key (`int`).
    pub runtime_tss_key: u64,
    /// In `PyThreadState`: its `_PyCFrame *cframe`.
    pub tstate_cframe: u64,
    /// In `_PyCFrame`: the current `_PyInterpreterFrame *`.
    pub cframe_frame: u64,
    /// In `_PyInterpreterFrame`: the code object, the previous frame, the last instruction, and
    /// whether it is the first frame of its C-level evaluation (`is_entry`).
    pub frame_code: u64,
    pub frame_previous: u64,
    pub frame_instr: u64,
    pub frame_entry: u64,
    /// In `PyCodeObject`: where the bytecode starts.
    pub code_bytecode: u64,
}

impl Offsets {
    pub fn of(version: (u8, u8)) -> Option<Self> {
        match version {
            (3, 11) => Some(Self {
                runtime_tss_key: 568 + 24 + 4,
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
}

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

/// The Python frames of the thread whose fs base is `fs_base` in `pid`, innermost first; empty
/// when the thread has no Python thread state.
pub fn walk(pid: u32, interp: &Interpreter, offs: &Offsets, fs_base: u64) -> Vec<RawFrame> {
    let word = |addr: u64| mem::read(pid, addr, 8).and_then(|b| mem::u64_at(&b, 0));
    let Some(key) = mem::read(pid, interp.runtime + offs.runtime_tss_key, 4)
        .and_then(|b| mem::u32_at(&b, 0))
        .filter(|k| *k < GLIBC_KEYS)
    else {
        return Vec::new();
    };
    let slot = fs_base + GLIBC_SPECIFIC + u64::from(key) * GLIBC_KEY_DATA + 8;
    let mut frame = word(slot)
        .filter(|t| *t != 0)
        .and_then(|tstate| word(tstate + offs.tstate_cframe))
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
