//! Reading a CPython code object out of a process: its file, qualified name, first line and
//! location table, and so the line of any instruction in it.

use std::sync::Arc;

use super::{
    PythonError,
    interp::Interpreter,
    linetable,
    mem::{self, i32_at, u32_at, u64_at},
};
use crate::model::Frame;

/// Where a code object keeps what a frame's place needs, and how strings and bytes are laid out,
/// for one CPython version (x86_64; the values are in [`super::version`]).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Bytes of the fixed part read (past every field below).
    pub head_len: usize,
    pub ob_type: usize,
    pub co_firstlineno: usize,
    pub co_filename: usize,
    /// The qualified name (3.11+), or the plain name (3.10 has no other).
    pub co_qualname: usize,
    pub co_linetable: usize,
    /// Its bytecode's length in code units (`ob_size`, 3.11+); None where the bytecode is an
    /// object of its own (3.10).
    pub co_units: Option<usize>,
    pub line_format: linetable::Format,
    /// The header of a compact ASCII string, before its characters.
    pub ascii_header: usize,
    /// The header of a compact non-ASCII string.
    pub compact_header: usize,
    /// `length` and the state bits of a string.
    pub str_length: usize,
    pub str_state: usize,
    /// `ob_size` and the bytes of a bytes object.
    pub bytes_size: usize,
    pub bytes_data: usize,
}

impl Layout {
    /// What every version shares; the rest is filled per version.
    pub const COMMON: Self = Self {
        head_len: 0,
        ob_type: 8,
        co_firstlineno: 0,
        co_filename: 0,
        co_qualname: 0,
        co_linetable: 0,
        co_units: Some(16),
        line_format: linetable::Format::Locations,
        ascii_header: 0,
        compact_header: 0,
        str_length: 16,
        str_state: 32,
        bytes_size: 16,
        bytes_data: 32,
    };
}

/// What a code object says about where its instructions came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    pub file: String,
    pub function: String,
    /// The module string of its frames ([`Frame::python_module`]), shared by all of them.
    pub module: Arc<str>,
    pub first_line: u32,
    linetable: Vec<u8>,
    format: linetable::Format,
    /// Its bytecode's length in code units, where the head tells it.
    units: Option<u32>,
    /// The object's type, file, name and line-table pointers: a code object freed and another
    /// made at the same address differs in them (checked before a cached copy is used).
    pub fingerprint: [u64; 4],
}

impl CodeInfo {
    /// The source line of the instruction `offset` code units into the bytecode.
    pub fn line(&self, offset: u32) -> Option<u32> {
        linetable::line_at(self.format, &self.linetable, self.first_line, offset)
    }

    /// Whether a frame at instruction `offset` can be running this code: an offset past its
    /// bytecode was made by another code object, since freed, at the same address.
    pub fn holds(&self, offset: u32) -> bool {
        self.units.is_none_or(|n| offset < n)
    }

    /// Whether a frame (its instruction's offset, and a module body's file name as the kernel
    /// side read it) ran this code object, and not another since freed at its address.
    pub fn ran(&self, offset: Option<u32>, file: Option<u64>) -> bool {
        offset.is_none_or(|o| self.holds(o)) && file.is_none_or(|f| f == self.fingerprint[1])
    }
}

/// Strings and tables longer than this are not read (a corrupt or reused object).
const MAX_LEN: u64 = 1 << 16;

/// Reads the code object at `addr` in `pid`; an error when it is not one (freed and reused, a
/// wrong address) or cannot be read.
pub fn read(
    pid: u32,
    interp: &Interpreter,
    layout: &Layout,
    addr: u64,
) -> Result<CodeInfo, PythonError> {
    let head = head(pid, layout, addr)?;
    from_head(pid, interp, layout, addr, &head)
}

/// The fixed part of the code object at `addr`.
pub fn head(pid: u32, layout: &Layout, addr: u64) -> Result<Vec<u8>, PythonError> {
    mem::read(pid, addr, layout.head_len)
        .filter(|h| h.len() == layout.head_len)
        .ok_or_else(|| PythonError::Unreadable(format!("code object {addr:#x}: unreadable")))
}

/// The fixed parts of the code objects at `addrs` in `pid`, read together (see
/// [`mem::read_many`]); None for one that cannot be read.
pub fn heads(pid: u32, layout: &Layout, addrs: &[u64]) -> Vec<Option<Vec<u8>>> {
    mem::read_many(pid, addrs, layout.head_len)
}

/// What [`CodeInfo::fingerprint`] holds, from a code object's head.
pub fn fingerprint(layout: &Layout, head: &[u8]) -> [u64; 4] {
    let at = |o| u64_at(head, o).unwrap_or(0);
    [
        at(layout.ob_type),
        at(layout.co_filename),
        at(layout.co_qualname),
        at(layout.co_linetable),
    ]
}

/// Reads what `head` (the fixed part of the code object at `addr`) points at.
pub fn from_head(
    pid: u32,
    interp: &Interpreter,
    layout: &Layout,
    addr: u64,
    head: &[u8],
) -> Result<CodeInfo, PythonError> {
    if u64_at(head, layout.ob_type) != Some(interp.code_type) {
        return Err(PythonError::Unreadable(format!(
            "{addr:#x} is not a code object"
        )));
    }
    let field =
        |off: usize| u64_at(head, off).ok_or_else(|| PythonError::Unreadable("short read".into()));
    let first_line =
        i32_at(head, layout.co_firstlineno).ok_or(PythonError::Unreadable("short read".into()))?;
    let file = string(pid, layout, field(layout.co_filename)?)?;
    let function = string(pid, layout, field(layout.co_qualname)?)?;
    let linetable = bytes(pid, layout, field(layout.co_linetable)?)?;
    Ok(CodeInfo {
        module: Frame::python_module(&file, &function),
        file,
        function,
        first_line: u32::try_from(first_line).unwrap_or(0),
        linetable,
        format: layout.line_format,
        units: layout
            .co_units
            .and_then(|o| u64_at(head, o))
            .and_then(|n| u32::try_from(n).ok()),
        fingerprint: fingerprint(layout, head),
    })
}

/// A `str` object's text: compact ASCII, or compact Latin-1, UCS-2 or UCS-4.
pub fn string(pid: u32, layout: &Layout, addr: u64) -> Result<String, PythonError> {
    let head = mem::read(pid, addr, layout.compact_header)
        .ok_or(PythonError::Unreadable("string unreadable".into()))?;
    let len =
        u64_at(&head, layout.str_length).ok_or(PythonError::Unreadable("short read".into()))?;
    let state =
        u32_at(&head, layout.str_state).ok_or(PythonError::Unreadable("short read".into()))?;
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact || len > MAX_LEN {
        return Err(PythonError::Unreadable(format!(
            "string at {addr:#x}: not a compact string"
        )));
    }
    if ascii {
        let data = mem::read(pid, addr + layout.ascii_header as u64, len as usize)
            .ok_or(PythonError::Unreadable("string unreadable".into()))?;
        return String::from_utf8(data)
            .map_err(|_| PythonError::Unreadable("string: not ASCII".into()));
    }
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => {
            return Err(PythonError::Unreadable(format!(
                "string at {addr:#x}: kind {kind}"
            )));
        }
    };
    let data = mem::read(
        pid,
        addr + layout.compact_header as u64,
        len as usize * width,
    )
    .ok_or(PythonError::Unreadable("string unreadable".into()))?;
    Ok(data
        .chunks(width)
        .map(|c| {
            let mut v = [0u8; 4];
            v[..width].copy_from_slice(c);
            char::from_u32(u32::from_le_bytes(v)).unwrap_or('\u{fffd}')
        })
        .collect())
}

fn bytes(pid: u32, layout: &Layout, addr: u64) -> Result<Vec<u8>, PythonError> {
    let head = mem::read(pid, addr, layout.bytes_data)
        .ok_or(PythonError::Unreadable("bytes unreadable".into()))?;
    let len =
        u64_at(&head, layout.bytes_size).ok_or(PythonError::Unreadable("short read".into()))?;
    if len > MAX_LEN {
        return Err(PythonError::Unreadable(format!(
            "bytes at {addr:#x}: {len} long"
        )));
    }
    mem::read(pid, addr + layout.bytes_data as u64, len as usize)
        .ok_or_else(|| PythonError::Unreadable("bytes unreadable".into()))
}
