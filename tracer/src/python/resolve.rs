//! Turning the kernel side's raw Python frames into frames of the stack: each code object read
//! once per process (file, function, line table), and the frames spliced into the native stack
//! where the evaluator ran them.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

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
    /// Code objects' heads read in the last [`HEADS_FRESH`], per (process, code object), and
    /// since when: the stacks decoded together share most of their code objects (a job's outer
    /// frames are in every one), and reading each stack's heads again took a torch job's
    /// ingest thread 8 s of CPU over 434,000 new stacks under `--heap full`.
    heads: FxHashMap<(u32, u64), Option<Vec<u8>>>,
    heads_since: Option<Instant>,
}

/// How long a code object's head read stands for the stacks decoded after. A head is read when
/// a stack is decoded, after the allocation it belongs to (milliseconds after, seconds in a
/// burst): a code object freed and its memory reused meanwhile is misread either way; this
/// widens that by as much.
const HEADS_FRESH: Duration = Duration::from_millis(10);

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
        let codes = steps.iter().map(|s| (s.code, s.file.is_some()));
        self.read_heads(tgid, &layout, codes);
        let mut groups: Vec<Vec<Frame>> = vec![Vec::new()];
        for step in steps {
            let code = step.code;
            let head = self.heads.get(&(tgid, code)).and_then(|h| h.as_deref());
            let cached = self.codes.get(&(tgid, code)).and_then(|c| c.as_ref());
            let current = matches!((head, cached),
                (Some(h), Some(c)) if c.fingerprint == code::fingerprint(&layout, h));
            if !current {
                let fresh =
                    head.and_then(|h| code::from_head(tgid, &interp, &layout, code, h).ok());
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

    /// Reads the heads of the code objects at `addrs` in `tgid` (each with whether it ran a
    /// module's body) not read in the last [`HEADS_FRESH`], all at once. A module body's is read
    /// every time: a body is freed once run, and the next module's is made at its address
    /// (modules imported in turn from one template).
    fn read_heads(
        &mut self,
        tgid: u32,
        layout: &code::Layout,
        addrs: impl Iterator<Item = (u64, bool)>,
    ) {
        let now = Instant::now();
        if self.heads_since.is_none_or(|t| now - t > HEADS_FRESH) {
            (self.heads_since, self.heads) = (Some(now), FxHashMap::default());
        }
        let mut missing: Vec<u64> = addrs
            .filter(|&(a, body)| body || !self.heads.contains_key(&(tgid, a)))
            .map(|(a, _)| a)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return;
        }
        let read = code::heads(tgid, layout, &missing);
        self.heads
            .extend(missing.into_iter().map(|a| (tgid, a)).zip(read));
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
        self.heads.retain(|(pid, _), _| *pid != tgid);
    }
}
