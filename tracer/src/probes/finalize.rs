//! The start of each traced interpreter's exit, marked: `Py_FinalizeEx` probed in every CPython
//! found (its process is judged on what it held then). The probe matters at the exit alone, so a
//! thread held for its library's mapping is let go first and the probe goes in once the prober
//! has had no request for a moment (prober.rs, `QUIET`): its attach waits for an RCU grace period
//! (11–25 ms at a Python job's start), which the job no longer waits with it, nor, held for its
//! libc's mapping right after, behind it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::programs::uprobe::UProbeScope;

use super::{AttachedFn, Probes, elf};

/// CPython's exit: exit handlers, then the modules' clearing.
const FINALIZE: &str = "Py_FinalizeEx";

/// How long a probe found while a thread was held waits for a quiet moment, at most.
const AT_MOST: Duration = Duration::from_millis(200);

/// Exits to mark once the threads held for their libraries are let go, owned by [`Probes`].
#[derive(Default)]
pub(super) struct Finalize {
    /// Each library and its function's file offset.
    due: Vec<(PathBuf, u64)>,
    /// When the first of them was found.
    since: Option<Instant>,
}

impl Probes {
    /// Marks the exit of the interpreter in `path`, at once, or once its thread is let go
    /// (`held`, see [`Probes::attach_after_release`]). Without its function (not found, or not
    /// attached: said in the log), the teardown is judged with the rest.
    pub(super) fn mark_finalize(&mut self, path: &Path, elf: &elf::ElfFile, held: bool) {
        let Some(f) = elf.function(FINALIZE) else {
            tracing::warn!(library = %path.display(), "no {FINALIZE}: the interpreter's exit is not marked");
            return;
        };
        if held {
            self.finalize.due.push((path.to_path_buf(), f.file_offset));
            self.finalize.since.get_or_insert_with(Instant::now);
        } else {
            self.attach_finalize(path, f.file_offset);
        }
    }

    fn attach_finalize(&mut self, path: &Path, offset: u64) {
        let at = std::iter::once((offset, None));
        if let Err(e) = self.attach_points(path, "py_finalize_enter", at, UProbeScope::AllProcesses)
        {
            tracing::warn!(library = %path.display(), error = %e, "the interpreter's exit is not marked");
            return;
        }
        self.attached.push(AttachedFn {
            function: FINALIZE.into(),
            library: path.to_path_buf(),
            offset: 0,
            reason: "the interpreter's exit begins (judged before it)".into(),
        });
    }

    /// Marks the exits found while threads were held: once the prober is idle, or once they
    /// have waited [`AT_MOST`] for it.
    pub fn attach_after_release(&mut self) {
        self.finalize.since = None;
        for (path, offset) in std::mem::take(&mut self.finalize.due) {
            self.attach_finalize(&path, offset);
        }
    }

    /// When the exits found while threads were held are marked, whether or not the prober is
    /// idle by then.
    pub fn finalize_due(&self) -> Option<Instant> {
        self.finalize.since.map(|s| s + AT_MOST)
    }
}
