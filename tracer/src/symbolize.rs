//! Frames → function, file:line, module, through one long-lived blazesym `Symbolizer` (its cache)
//! plus our own per-frame result cache. Frames are (file, file offset) pairs captured while the
//! process lived, so this works after it exited. A return address inside code the compiler
//! inlined stands for several source frames: each inlined function becomes a frame of its own,
//! with its file and line, innermost first.

use std::{collections::HashMap, sync::Arc};

use blazesym::symbolize::{
    CodeInfo, Input, Symbolizer as Blaze,
    source::{Elf, Source},
};
use serde::Serialize;

use crate::model::{Frame, Kind};

/// A symbolized frame, as reports and the JSON schema show it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SymFrame {
    /// Virtual address in the process where the stack was first seen (hex).
    pub address: String,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    /// Offset in `module` (hex).
    pub offset: String,
}

/// The module of a Python frame in reports.
pub const PYTHON_MODULE: &str = "python";

/// Whether a stack of `kind` with these source frames (innermost first) maps arenas of CPython's
/// object allocator (pymalloc): Python objects, which no malloc probe sees. An mmap, by name
/// where the interpreter has its symbols (`_PyObject_ArenaMmap`); else, as in the distributions'
/// stripped interpreters, one the interpreter's own code called: the first frame past libc's
/// wrapper is in a python3.X executable or a libpython3.X.
pub fn python_arenas<'f>(kind: Kind, frames: impl Iterator<Item = &'f SymFrame>) -> bool {
    if kind != Kind::Mmap {
        return false;
    }
    for f in frames {
        if f.function.as_deref() == Some("_PyObject_ArenaMmap") {
            return true;
        }
        let Some(module) = f.module.as_deref() else {
            return false;
        };
        if !is_libc(module) {
            return crate::python::interp::version_of(module).is_some();
        }
    }
    false
}

/// [`python_arenas`] on captured frames, without symbolizing them (symbolizing one frame loads
/// its library's symbols: libtorch's are tens of MiB): the first frame past libc's wrapper is in
/// the interpreter, where `_PyObject_ArenaMmap` is too.
pub fn python_arenas_raw(kind: Kind, frames: &[crate::model::Frame]) -> bool {
    let past_libc = frames
        .iter()
        .find(|f| !f.module.as_deref().is_some_and(is_libc));
    kind == Kind::Mmap
        && past_libc
            .and_then(|f| f.module.as_deref())
            .is_some_and(|m| crate::python::interp::version_of(m).is_some())
}

/// Whether the file `module` is a libc.
pub fn is_libc(module: &str) -> bool {
    let name = module.rsplit('/').next().unwrap_or(module);
    name.starts_with("libc.so") || name.starts_with("libc-")
}

/// A captured frame's identity: (module, file offset).
type FrameKey = (Option<Arc<str>>, u64);

/// Symbolization with caching.
pub struct Symbolizer {
    blaze: Blaze,
    cache: HashMap<FrameKey, Arc<[SymFrame]>>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self {
            blaze: Blaze::new(),
            cache: HashMap::new(),
        }
    }
}

impl Symbolizer {
    /// The source frames of one captured frame, innermost first: the functions inlined at the
    /// address, then the function that holds it.
    pub fn frames(&mut self, f: &Frame) -> Arc<[SymFrame]> {
        let key = (f.module.clone(), f.offset);
        if let Some(s) = self.cache.get(&key) {
            return s.clone();
        }
        let s: Arc<[SymFrame]> = self.lookup(f).into();
        self.cache.insert(key, s.clone());
        s
    }

    /// The source frames of a whole stack, innermost first.
    pub fn stack(&mut self, frames: &[Frame]) -> Vec<SymFrame> {
        frames
            .iter()
            .flat_map(|f| self.frames(f).to_vec())
            .collect()
    }

    fn lookup(&self, f: &Frame) -> Vec<SymFrame> {
        if let Some((file, function, line)) = f.as_python() {
            return vec![SymFrame {
                address: format!("{:#x}", f.addr),
                function: Some(function.to_string()),
                file: Some(file.to_string()),
                line,
                module: Some(PYTHON_MODULE.to_string()),
                offset: String::new(),
            }];
        }
        let out = SymFrame {
            address: format!("{:#x}", f.addr),
            function: None,
            file: None,
            line: None,
            module: f.module.as_deref().map(str::to_string),
            offset: format!("{:#x}", f.offset),
        };
        let Some(module) = f.module.as_deref() else {
            return vec![out];
        };
        // Return addresses point after the call: look up the call instruction itself.
        let offset = f.offset.saturating_sub(1);
        let src = Source::Elf(Elf::new(module));
        let Ok(sym) = self.blaze.symbolize_single(&src, Input::FileOffset(offset)) else {
            return vec![out];
        };
        let Some(sym) = sym.as_sym() else {
            return vec![out];
        };
        // blazesym lists the inlined calls outermost first, each with the place in it.
        let located = |name: &str, ci: Option<&CodeInfo<'_>>| SymFrame {
            function: Some(name.to_string()),
            file: ci.map(|ci| ci.to_path().display().to_string()),
            line: ci.and_then(|ci| ci.line),
            ..out.clone()
        };
        let mut frames: Vec<SymFrame> = sym
            .inlined
            .iter()
            .rev()
            .map(|i| located(&i.name, i.code_info.as_ref()))
            .collect();
        frames.push(located(&sym.name, sym.code_info.as_deref()));
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: Option<&str>, module: &str) -> SymFrame {
        SymFrame {
            address: "0x0".into(),
            function: function.map(String::from),
            file: None,
            line: None,
            module: Some(module.into()),
            offset: "0x0".into(),
        }
    }

    #[test]
    fn arenas_are_told_by_name_or_by_the_interpreter_calling_mmap() {
        let libc = frame(Some("__GI___mmap64"), "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let named = frame(Some("_PyObject_ArenaMmap"), "/opt/lib/libpython3.11.so.1.0");
        let stripped = frame(None, "/usr/bin/python3.12");
        let other = frame(Some("map_pages"), "/usr/lib/libfoo.so");
        let line = frame(Some("record"), PYTHON_MODULE);
        let arenas = |frames: &[&SymFrame]| python_arenas(Kind::Mmap, frames.iter().copied());
        assert!(arenas(&[&libc, &libc, &named, &line]));
        assert!(arenas(&[&libc, &stripped, &line]));
        assert!(!arenas(&[&libc, &other, &stripped, &line]));
        assert!(!arenas(&[&libc, &line]));
        assert!(!python_arenas(Kind::Brk, [&libc, &named].into_iter()));
        // The same rule on captured frames (module paths only).
        let raw = |module: Option<&str>| crate::model::Frame {
            module: module.map(Into::into),
            offset: 0x100,
            addr: 0x7f00_0000_0100,
        };
        let libc = raw(Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        let interp = raw(Some("/opt/lib/libpython3.11.so.1.0"));
        let other = raw(Some("/usr/lib/libfoo.so"));
        let unknown = raw(None);
        assert!(python_arenas_raw(
            Kind::Mmap,
            &[libc.clone(), interp.clone()]
        ));
        assert!(!python_arenas_raw(
            Kind::Mmap,
            &[libc.clone(), other, interp.clone()]
        ));
        assert!(!python_arenas_raw(Kind::Mmap, &[libc.clone(), unknown]));
        assert!(!python_arenas_raw(Kind::Brk, &[libc, interp]));
    }
}
