//! Turning the kernel side's raw Python frames into frames of the stack: each code object read
//! once per process (file, function, line table), and the frames spliced into the native stack
//! where the evaluator ran them.

use std::{collections::HashMap, sync::Arc};

use rustc_hash::FxHashMap;

use super::{
    code::{self, CodeInfo},
    interp::{self, Interpreter},
    version::Version,
};
use crate::model::Frame;

/// Per process: its interpreter and the code objects read so far.
#[derive(Default)]
pub struct Resolver {
    interps: HashMap<u32, Option<(Interpreter, Version)>>,
    codes: HashMap<(u32, u64), Option<CodeInfo>>,
    /// Lines found, per (process, code object, its fingerprint, instruction offset): the same
    /// caller frames come back in stack after stack, and a line is found by walking the table.
    lines: FxHashMap<LineKey, Option<u32>>,
    /// Module bodies' file names read, per (process, `str` object), as frames' module strings.
    files: HashMap<(u32, u64), Option<Arc<str>>>,
}

type LineKey = (u32, u64, [u64; 4], u32);

/// Lines remembered at most; beyond, they are all dropped and found again.
const MAX_LINES: usize = 1 << 20;

impl Resolver {
    /// `native` (innermost first) with the Python frames of `raw` (triples of code object,
    /// instruction address and flags, innermost first) in place of the evaluator frames that ran
    /// them: the frames up to and including each entry frame replace one
    /// `_PyEval_EvalFrameDefault` frame, innermost first. Groups left over (the native walk
    /// stopped before reaching their evaluator) follow the native frames.
    pub fn merge(&mut self, tgid: u32, native: &[Frame], raw: &[u64]) -> Vec<Frame> {
        let found = self
            .interps
            .entry(tgid)
            .or_insert_with(|| {
                let i = interp::detect(tgid)?;
                let version = Version::of(&i).ok()?;
                Some((i, version))
            })
            .clone();
        let Some((interp, version)) = found else {
            return native.to_vec();
        };
        let layout = version.layout;
        let steps = version.steps(raw);
        // Code objects are freed and their memory reused (an imported module's body, once run):
        // a cached copy is used only while the object still matches it, which its head tells;
        // the heads of all the stack's code objects are read at once.
        let addrs: Vec<u64> = steps.iter().map(|s| s.code).collect();
        let mut heads = code::heads(tgid, &layout, &addrs).into_iter();
        let mut groups: Vec<Vec<Frame>> = vec![Vec::new()];
        for step in steps {
            let code = step.code;
            let head = heads.next().flatten();
            let cached = self.codes.get(&(tgid, code)).and_then(|c| c.as_ref());
            let current = matches!((&head, cached),
                (Some(h), Some(c)) if c.fingerprint == code::fingerprint(&layout, h));
            if !current {
                let fresh =
                    head.and_then(|h| code::from_head(tgid, &interp, &layout, code, &h).ok());
                self.codes.insert((tgid, code), fresh);
            }
            let info = self.codes.get(&(tgid, code)).and_then(|c| c.as_ref());
            // An instruction past the code's bytecode, or a module body's file not the object's:
            // the object read is not the one that ran.
            let info = info.filter(|i| i.ran(step.offset, step.file));
            let frame = match info {
                Some(info) => {
                    let line = step.offset.and_then(|o| {
                        if self.lines.len() >= MAX_LINES {
                            self.lines.clear();
                        }
                        *self
                            .lines
                            .entry((tgid, code, info.fingerprint, o))
                            .or_insert_with(|| info.line(o))
                    });
                    Frame::python_in(info.module.clone(), line, code)
                }
                // A module's body freed before its stack was read: its file still names it.
                None => match step.file.and_then(|f| self.file(tgid, &layout, f)) {
                    Some(module) => Frame::python_in(module, None, code),
                    None => Frame::python("?", &format!("<code {code:#x}>"), None, code),
                },
            };
            groups.last_mut().expect("one group").push(frame);
            if step.entry {
                groups.push(Vec::new());
            }
        }
        groups.retain(|g| !g.is_empty());
        let is_eval = |f: &Frame| {
            interp.eval.is_some_and(|(s, e)| {
                f.module.as_deref() == Some(&*interp.path)
                    && (s..e).contains(&f.offset.saturating_sub(1))
            })
        };
        let mut groups = groups.into_iter();
        let mut out = Vec::with_capacity(native.len() + raw.len() / 3);
        for f in native {
            match is_eval(f).then(|| groups.next()).flatten() {
                Some(g) => out.extend(g),
                None => out.push(f.clone()),
            }
        }
        out.extend(groups.flatten());
        out
    }

    /// The module string of a body whose file name is the `str` at `addr` in `tgid`.
    fn file(&mut self, tgid: u32, layout: &code::Layout, addr: u64) -> Option<Arc<str>> {
        self.files
            .entry((tgid, addr))
            .or_insert_with(|| {
                let name = code::string(tgid, layout, addr).ok()?;
                Some(Frame::python_module(&name, "<module>"))
            })
            .clone()
    }

    /// A process exited or replaced its image: its interpreter and code objects are gone.
    pub fn forget(&mut self, tgid: u32) {
        self.interps.remove(&tgid);
        self.codes.retain(|(pid, _), _| *pid != tgid);
        self.files.retain(|(pid, _), _| *pid != tgid);
        self.lines.retain(|(pid, ..), _| *pid != tgid);
    }
}
