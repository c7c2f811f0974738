//! Frames → function, file:line, module, through one long-lived blazesym `Symbolizer` (its cache)
//! plus our own per-frame result cache. Frames are (file, file offset) pairs captured while the
//! process lived, so this works after it exited.

use std::{collections::HashMap, sync::Arc};

use blazesym::symbolize::{
    Input, Symbolizer as Blaze,
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

/// Symbolization with caching.
pub struct Symbolizer {
    blaze: Blaze,
    cache: HashMap<(Option<Arc<str>>, u64), SymFrame>,
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
    pub fn frame(&mut self, f: &Frame) -> SymFrame {
        let key = (f.module.clone(), f.offset);
        if let Some(s) = self.cache.get(&key) {
            return s.clone();
        }
        let s = self.lookup(f);
        self.cache.insert(key, s.clone());
        s
    }

    fn lookup(&self, f: &Frame) -> SymFrame {
        if let Some((file, function, line)) = f.as_python() {
            return SymFrame {
                address: format!("{:#x}", f.addr),
                function: Some(function.to_string()),
                file: Some(file.to_string()),
                line,
                module: Some(PYTHON_MODULE.to_string()),
                offset: String::new(),
            };
        }
        let mut out = SymFrame {
            address: format!("{:#x}", f.addr),
            function: None,
            file: None,
            line: None,
            module: f.module.as_deref().map(str::to_string),
            offset: format!("{:#x}", f.offset),
        };
        let Some(module) = f.module.as_deref() else {
            return out;
        };
        // Return addresses point after the call: look up the call instruction itself.
        let offset = f.offset.saturating_sub(1);
        let src = Source::Elf(Elf::new(module));
        let Ok(sym) = self.blaze.symbolize_single(&src, Input::FileOffset(offset)) else {
            return out;
        };
        let Some(sym) = sym.as_sym() else {
            return out;
        };
        out.function = Some(sym.name.to_string());
        if let Some(ci) = &sym.code_info {
            out.file = Some(ci.to_path().display().to_string());
            out.line = ci.line;
        }
        out
    }
}
