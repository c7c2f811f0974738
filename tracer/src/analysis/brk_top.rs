//! A brk stack judged against its process's whole brk heap: the heap's top floats as glibc grows
//! and trims it, and whichever allocation moved it last holds the pages above.

use super::{Analysis, Evidence, ends_over, holds, same_span, span_start};

impl Analysis {
    /// Whether its process's brk heap, all its stacks together, holds while a brk stack grows
    /// (`stack`), as [`Analysis::moved`] says of heap stacks: the heap's top floats by megabytes
    /// as glibc grows and trims it, and whichever allocation grew it last has the pages above
    /// (a correct training job's validation line, over its last seconds). Pages are traced
    /// whether or not the malloc family is, so the brk heap is judged whole.
    pub(super) fn top_moved(&self, pid: u32, stack: &Evidence, warmup_s: f64) -> bool {
        let Some(s) = self.procs.get(&pid) else {
            return false;
        };
        holds(&s.pages, stack, warmup_s)
    }

    /// Whether its process's brk heap, all its stacks together, kept its top while a brk stack
    /// grew (`stack`): over the stack's span, the heap's highest point in the last window is above
    /// that of the first by less than half the stack's growth. Pages a leak keeps push the top
    /// up; a heap floating below a top it reached before (a no-leak training job's, between 140
    /// and 144.6 MiB, whose floors rose by 3 MiB as it trimmed less often) holds nothing more.
    pub(super) fn top_held(&self, pid: u32, stack: &Evidence, warmup_s: f64) -> bool {
        let Some(s) = self.procs.get(&pid) else {
            return false;
        };
        let heap = same_span(&s.pages, stack);
        let Some((first, last)) = ends_over(&heap, span_start(stack, warmup_s)) else {
            return false;
        };
        last.peak.saturating_sub(first.peak).saturating_mul(2) < stack.growth_bytes.unsigned_abs()
    }

    /// Its process's brk heap at its highest over a stack's evidence: a released brk stack's rise
    /// is weighed against it as an outstanding one's is against the heap now.
    pub(super) fn heap_peak(&self, pid: u32, stack: &Evidence) -> u64 {
        self.procs.get(&pid).map_or(0, |s| {
            let span = same_span(&s.pages, stack);
            span.points().iter().map(|p| p.max).max().unwrap_or(0)
        })
    }
}
