//! Stacks as every stage names them: an interned [`StackId`] and its frames of (module, file
//! offset), Python frames included.

use std::sync::Arc;

/// An interned stack, numbered from 1 (so that an `Option<StackId>` is four bytes: a million
/// outstanding blocks each carry one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct StackId(std::num::NonZeroU32);

impl StackId {
    /// Stack number `n` (from 1).
    pub fn new(n: u32) -> Self {
        Self(std::num::NonZeroU32::new(n).expect("stack ids start at 1"))
    }

    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// One frame: a return address resolved to the file that contains it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The mapped file, or `None` when the address was in no known file mapping.
    pub module: Option<Arc<str>>,
    /// Offset in `module`'s file, or the raw address when `module` is `None`.
    pub offset: u64,
    /// The virtual address in the process it was first seen in.
    pub addr: u64,
}

/// Python frames are frames of a pseudo-module named by this prefix, the file and the function
/// (NUL-separated); their offset is the line. So they aggregate across processes like native
/// frames (forked workers running the same line share a stack) and need no other type.
const PYTHON: &str = "\u{1}python:";

impl Frame {
    /// A Python frame: `function` at `file`:`line` (0: no line), code object `code`.
    pub fn python(file: &str, function: &str, line: Option<u32>, code: u64) -> Self {
        Self::python_in(Self::python_module(file, function), line, code)
    }

    /// The module string of a Python function's frames: made once per code object and shared by
    /// all its frames (a torch job's start-up makes millions of them).
    pub fn python_module(file: &str, function: &str) -> Arc<str> {
        Arc::from(format!("{PYTHON}{file}\0{function}"))
    }

    /// A frame of the Python function whose [`Frame::python_module`] is `module`.
    pub fn python_in(module: Arc<str>, line: Option<u32>, code: u64) -> Self {
        Self {
            module: Some(module),
            offset: u64::from(line.unwrap_or(0)),
            addr: code,
        }
    }

    /// (file, function, line) of a Python frame.
    pub fn as_python(&self) -> Option<(&str, &str, Option<u32>)> {
        let rest = self.module.as_deref()?.strip_prefix(PYTHON)?;
        let (file, function) = rest.split_once('\0')?;
        let line = u32::try_from(self.offset).ok().filter(|l| *l > 0);
        Some((file, function, line))
    }
}
