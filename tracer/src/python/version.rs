//! What differs between CPython versions, in one place: where the kernel side finds a thread's
//! frames ([`PyConfig`]), how a code object and its strings are laid out ([`Layout`]) and how
//! the raw frames it sends read ([`Frames`]).
//!
//! 3.10, 3.11 and 3.12 are per-version tables, read off each version's debug information (gdb
//! `ptype /o`) and checked against running interpreters by the tests. 3.13 publishes its own
//! offsets at the start of `_PyRuntime` (`_Py_DebugOffsets`), read from the ELF file.

use std::sync::OnceLock;

use tracer_common::{PY_NONE, PyConfig, py_entry, py_module_file};

use super::{
    PythonError,
    code::Layout,
    interp::{DEBUG_OFFSETS_LEN, Interpreter},
    linetable::Format,
};

/// How the frames of a version read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frames {
    /// 3.10: every frame is its own evaluation (a `PyFrameObject` per `_PyEval_EvalFrameDefault`
    /// call), and the instruction word is `f_lasti`, an index in code units (-1 before the
    /// first).
    Legacy,
    /// 3.11: the flags byte is `is_entry` (1 on the first frame of an evaluation), the
    /// instruction word the address of the last instruction run, `bytecode` bytes into the code
    /// object.
    Entry { bytecode: u64 },
    /// 3.12+: each evaluation pushes a shim frame owned by the C stack (owner 3) below its first
    /// frame; the instruction word as in 3.11.
    Shim { bytecode: u64 },
}

/// Owner of a shim frame in 3.12+ (`FRAME_OWNED_BY_CSTACK`).
const OWNED_BY_CSTACK: u8 = 3;

/// A frame as [`Frames`] reads it: its code object, the instruction (code units into the
/// bytecode, None before the first) and whether it began an evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub code: u64,
    pub offset: Option<u32>,
    pub entry: bool,
    /// A module body's file name (a `str` object's address), as the kernel side read it.
    pub file: Option<u64>,
}

/// Everything leaktracer knows of one CPython version (x86_64).
#[derive(Clone, Copy, Debug)]
pub struct Version {
    /// The kernel side's walk, with `runtime` 0 (set per process).
    pub config: PyConfig,
    pub layout: Layout,
    pub frames: Frames,
}

impl Version {
    /// The version `interp` runs; an error saying why its frames cannot be walked.
    pub fn of(interp: &Interpreter) -> Result<Self, PythonError> {
        let mut v = match interp.version {
            (3, 10) => Self::V3_10,
            (3, 11) => Self::V3_11,
            (3, 12) => Self::V3_12,
            (3, 13) => debug_offsets(interp.debug_offsets.as_deref().unwrap_or_default())?,
            (3, minor) => {
                return Err(PythonError::Unsupported(format!(
                    "CPython 3.{minor}: Python frames are walked for 3.10 to 3.13"
                )));
            }
            (major, minor) => {
                return Err(PythonError::Unsupported(format!(
                    "Python {major}.{minor} is not CPython 3"
                )));
            }
        };
        if v.config.task_fsbase != 0 {
            v.config.task_fsbase = task_fsbase()?;
        }
        Ok(v)
    }

    /// The frames of `raw` (triples of code object, instruction word and flags word, innermost
    /// first), shims left out.
    pub fn steps(&self, raw: &[u64]) -> Vec<Step> {
        let mut out: Vec<Step> = Vec::with_capacity(raw.len() / 3);
        for &[code, instr, flags] in raw.as_chunks::<3>().0 {
            // A word that is no code object's address (read from a frame in the making; seen
            // once as all ones in a Hugging Face job) gives no offset.
            let from = |bytecode: u64| {
                let start = code.checked_add(bytecode)?;
                (instr >= start).then(|| ((instr - start) / 2) as u32)
            };
            let file = py_module_file(flags);
            let step = match self.frames {
                Frames::Legacy => Step {
                    code,
                    offset: u32::try_from(instr as u32 as i32).ok(),
                    entry: true,
                    file,
                },
                Frames::Entry { bytecode } => Step {
                    code,
                    offset: from(bytecode),
                    entry: py_entry(flags) == 1,
                    file,
                },
                Frames::Shim { bytecode } => {
                    if py_entry(flags) == OWNED_BY_CSTACK {
                        if let Some(last) = out.last_mut() {
                            last.entry = true;
                        }
                        continue;
                    }
                    Step {
                        code,
                        offset: from(bytecode),
                        entry: false,
                        file,
                    }
                }
            };
            out.push(step);
        }
        out
    }

    const V3_10: Self = Self {
        config: PyConfig {
            runtime: 0,
            runtime_tstate_current: 568,
            runtime_main_interp: 40,
            interp_threads_head: 8,
            tstate_next: 8,
            // `thread_id`, the pthread_t: 3.10 records no native id.
            tstate_native_id: 176,
            tstate_cframe: 24,
            cframe_frame: PY_NONE,
            frame_code: 32,
            frame_previous: 24,
            frame_instr: 96,
            // Every frame is an entry (`Frames::Legacy`).
            frame_entry: PY_NONE,
            frame_globals: 48,
            frame_locals: 56,
            code_filename: 104,
            task_fsbase: 1,
        },
        layout: Layout {
            head_len: 128,
            co_firstlineno: 40,
            co_filename: 104,
            co_qualname: 112,
            co_linetable: 120,
            co_units: None,
            line_format: Format::Pairs,
            ascii_header: 48,
            compact_header: 72,
            ..Layout::COMMON
        },
        frames: Frames::Legacy,
    };

    const V3_11: Self = Self {
        config: PyConfig {
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
            frame_globals: 8,
            frame_locals: 24,
            code_filename: 112,
            task_fsbase: 0,
        },
        layout: Layout {
            head_len: 184,
            co_firstlineno: 72,
            co_filename: 112,
            co_qualname: 128,
            co_linetable: 136,
            line_format: Format::Locations,
            ascii_header: 48,
            compact_header: 72,
            ..Layout::COMMON
        },
        frames: Frames::Entry { bytecode: 184 },
    };

    const V3_12: Self = Self {
        config: PyConfig {
            runtime: 0,
            runtime_tstate_current: PY_NONE,
            runtime_main_interp: 48,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_native_id: 144,
            tstate_cframe: 56,
            cframe_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_entry: 70,
            frame_globals: 24,
            frame_locals: 40,
            code_filename: 112,
            task_fsbase: 0,
        },
        layout: Layout {
            head_len: 192,
            co_firstlineno: 68,
            co_filename: 112,
            co_qualname: 128,
            co_linetable: 136,
            line_format: Format::Locations,
            ascii_header: 40,
            compact_header: 56,
            ..Layout::COMMON
        },
        frames: Frames::Shim { bytecode: 192 },
    };
}

/// The line-table format of a version.
pub fn format_of(version: (u8, u8)) -> Option<Format> {
    match version {
        (3, 10) => Some(Format::Pairs),
        (3, 11..) => Some(Format::Locations),
        _ => None,
    }
}

/// The leading part of `_Py_DebugOffsets` that leaktracer reads, as 3.13 lays it out: 8-byte
/// words, by index.
mod word {
    pub const VERSION: usize = 1;
    pub const FREE_THREADED: usize = 2;
    pub const RUNTIME_INTERPRETERS_HEAD: usize = 5;
    pub const INTERP_THREADS_HEAD: usize = 9;
    pub const TSTATE_NEXT: usize = 21;
    pub const TSTATE_CURRENT_FRAME: usize = 23;
    pub const TSTATE_NATIVE_THREAD_ID: usize = 25;
    pub const FRAME_PREVIOUS: usize = 29;
    pub const FRAME_EXECUTABLE: usize = 30;
    pub const FRAME_INSTR_PTR: usize = 31;
    pub const FRAME_OWNER: usize = 33;
    pub const CODE_FILENAME: usize = 35;
    pub const CODE_QUALNAME: usize = 37;
    pub const CODE_LINETABLE: usize = 38;
    pub const CODE_FIRSTLINENO: usize = 39;
    pub const CODE_ADAPTIVE: usize = 43;
    pub const UNICODE_ASCII_SIZE: usize = 70;
    /// Words read.
    pub const COUNT: usize = 73;
}

// The interpreter's file is read for exactly the words above.
const _: () = assert!(DEBUG_OFFSETS_LEN == word::COUNT * 8);

/// The version described by `raw`, the start of a 3.13 `_PyRuntime` as its ELF file holds it.
fn debug_offsets(raw: &[u8]) -> Result<Version, PythonError> {
    if raw.len() < DEBUG_OFFSETS_LEN || &raw[..8] != b"xdebugpy" {
        return Err(PythonError::Unsupported(
            "CPython 3.13 without _Py_DebugOffsets at the start of _PyRuntime".into(),
        ));
    }
    let w = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let hex = w(word::VERSION);
    if (hex >> 24, (hex >> 16) & 0xff) != (3, 13) {
        return Err(PythonError::Unsupported(format!(
            "_Py_DebugOffsets of version {hex:#x}, not 3.13"
        )));
    }
    if w(word::FREE_THREADED) != 0 {
        return Err(PythonError::Unsupported(
            "free-threaded CPython: its frames are not walked".into(),
        ));
    }
    // Fields within the first 128 bytes of a frame: the kernel side reads no more.
    let frame = [
        word::FRAME_PREVIOUS,
        word::FRAME_EXECUTABLE,
        word::FRAME_INSTR_PTR,
        word::FRAME_OWNER,
    ];
    if frame.iter().any(|&i| w(i) > 120) {
        return Err(PythonError::Unsupported(
            "_Py_DebugOffsets: a frame field past 120 bytes".into(),
        ));
    }
    // `f_globals` and `f_locals` are not among the offsets: where the frame is laid out as 3.12's
    // (so far every 3.13), they are 3.12's.
    let as_3_12 = (
        w(word::FRAME_EXECUTABLE),
        w(word::FRAME_PREVIOUS),
        w(word::FRAME_INSTR_PTR),
    ) == (0, 8, 56);
    let (frame_globals, frame_locals) = if as_3_12 {
        (24, 40)
    } else {
        (PY_NONE, PY_NONE)
    };
    let code = w(word::CODE_ADAPTIVE);
    let ascii = w(word::UNICODE_ASCII_SIZE) as usize;
    Ok(Version {
        config: PyConfig {
            runtime: 0,
            runtime_tstate_current: PY_NONE,
            runtime_main_interp: w(word::RUNTIME_INTERPRETERS_HEAD),
            interp_threads_head: w(word::INTERP_THREADS_HEAD),
            tstate_next: w(word::TSTATE_NEXT),
            tstate_native_id: w(word::TSTATE_NATIVE_THREAD_ID),
            tstate_cframe: w(word::TSTATE_CURRENT_FRAME),
            cframe_frame: PY_NONE,
            frame_code: w(word::FRAME_EXECUTABLE),
            frame_previous: w(word::FRAME_PREVIOUS),
            frame_instr: w(word::FRAME_INSTR_PTR),
            frame_entry: w(word::FRAME_OWNER),
            frame_globals,
            frame_locals,
            code_filename: w(word::CODE_FILENAME),
            task_fsbase: 0,
        },
        layout: Layout {
            head_len: code as usize,
            co_firstlineno: w(word::CODE_FIRSTLINENO) as usize,
            co_filename: w(word::CODE_FILENAME) as usize,
            co_qualname: w(word::CODE_QUALNAME) as usize,
            co_linetable: w(word::CODE_LINETABLE) as usize,
            line_format: Format::Locations,
            ascii_header: ascii,
            // A compact string's header: the ASCII one, then its UTF-8 length and pointer.
            compact_header: ascii + 16,
            ..Layout::COMMON
        },
        frames: Frames::Shim { bytecode: code },
    })
}

/// Where `fsbase` is in the running kernel's `task_struct`, from its BTF.
fn task_fsbase() -> Result<u64, PythonError> {
    static FOUND: OnceLock<Result<u64, PythonError>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let types =
                crate::kernel_types::KernelTypes::open().map_err(PythonError::Unsupported)?;
            types
                .offset("task_struct", &["thread", "fsbase"])
                .ok_or_else(|| {
                    PythonError::Unsupported("kernel BTF: no task_struct.thread.fsbase".into())
                })
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(frames: Frames) -> Version {
        Version {
            frames,
            ..Version::V3_11
        }
    }

    #[test]
    fn shims_mark_the_frame_above_them_as_an_evaluations_first() {
        let raw = [
            0x1000,
            0x1000 + 192 + 8,
            0, // h, unit 4
            0x2000,
            0x2000 + 192,
            0, // <module>, unit 0
            0x3000,
            0,
            3, // shim
        ];
        assert_eq!(
            v(Frames::Shim { bytecode: 192 }).steps(&raw),
            [
                Step {
                    code: 0x1000,
                    offset: Some(4),
                    entry: false,
                    file: None
                },
                Step {
                    code: 0x2000,
                    offset: Some(0),
                    entry: true,
                    file: None
                },
            ]
        );
    }

    #[test]
    fn legacy_frames_each_begin_an_evaluation_and_carry_an_index() {
        // f_lasti 7 with f_lineno 12 beside it in the same word; -1 before the first.
        let raw = [0x1000, (12 << 32) | 7, 0, 0x2000, 0xffff_ffff, 0];
        assert_eq!(
            v(Frames::Legacy).steps(&raw),
            [
                Step {
                    code: 0x1000,
                    offset: Some(7),
                    entry: true,
                    file: None
                },
                Step {
                    code: 0x2000,
                    offset: None,
                    entry: true,
                    file: None
                },
            ]
        );
    }

    #[test]
    fn a_frame_whose_code_word_is_no_address_has_no_offset() {
        // All ones where the code object should be: no bytecode starts past it.
        let raw = [u64::MAX, 0x5555_0000_1234, 0];
        let steps = v(Frames::Entry { bytecode: 184 }).steps(&raw);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].offset, None);
    }

    #[test]
    fn entry_frames_carry_their_flag() {
        // Their flags words carry their globals above the flag byte, or a module body's file.
        let (globals, file) = (0x7f12_3456_7890, 0x7f00_5555_0040);
        let raw = [
            0x1000,
            0x1000 + 184 + 2,
            tracer_common::py_flags(1, globals),
            0x2000,
            0x10,
            tracer_common::py_flags(tracer_common::PY_MODULE, file),
        ];
        assert_eq!(
            v(Frames::Entry { bytecode: 184 }).steps(&raw),
            [
                Step {
                    code: 0x1000,
                    offset: Some(1),
                    entry: true,
                    file: None
                },
                Step {
                    code: 0x2000,
                    offset: None,
                    entry: false,
                    file: Some(file)
                },
            ]
        );
    }

    #[test]
    fn debug_offsets_of_another_version_are_refused() {
        let mut raw = vec![0u8; DEBUG_OFFSETS_LEN];
        raw[..8].copy_from_slice(b"xdebugpy");
        raw[8..16].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
        assert!(
            debug_offsets(&raw)
                .unwrap_err()
                .to_string()
                .contains("not 3.13")
        );
        assert!(debug_offsets(&raw[..64]).is_err());
    }

    #[test]
    fn the_kernel_has_fsbase_in_its_task_struct() {
        let off = task_fsbase().unwrap();
        assert!(off > 0 && off % 8 == 0, "{off}");
    }
}
