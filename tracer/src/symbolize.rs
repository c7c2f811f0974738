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

use crate::model::Frame;

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

/// Whether source frames map arenas of CPython's object allocator (pymalloc): Python objects,
/// which no malloc probe sees.
pub fn python_arenas<'f>(mut frames: impl Iterator<Item = &'f SymFrame>) -> bool {
    frames.any(|f| f.function.as_deref() == Some("_PyObject_ArenaMmap"))
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
