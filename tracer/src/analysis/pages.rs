//! Which processes' page-level stacks grow, and whether their tensors explain it: what the
//! layers of `--heap auto` are asked for by (session/owner/layers.rs).

use super::{
    Analysis, Evidence, Verdict, classify, last_step_only, rose_in_every_window, span,
    top_kept_its_reach,
};
use crate::model::{GroupKey, Kind};

impl Analysis {
    /// Page-level stacks (mmap, brk) that no tensor explains, judged a leak from `start(pid)` on
    /// (the warm-up, or when the process's tensors began to be traced) over `span_s` seconds at
    /// least and grown by `min_bytes` at least: where `--heap auto` traces its process's next
    /// layer, to tell what fills those pages. (A start-up grows like a leak for a few seconds;
    /// the pages a tensor's allocation maps have the tensor's stack.)
    pub fn growing_pages(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
    ) -> Vec<GroupKey> {
        self.pages_grown(start, span_s, min_bytes, |_, _| true)
    }

    /// As [`Analysis::growing_pages`], less the brk stacks whose floors rose in some windows
    /// only, by less than `sure_bytes`: the allocator's heap top moving up now and then as it
    /// places blocks (a no-leak training job's, by 0.25–3 MiB over a few seconds, one step of
    /// 256 KiB or 1 MiB at a time), which a leak outgrows window after window. What calls for a
    /// process's tensors: a second or two later for a leak, none of their cost for the heap top.
    pub fn rising_pages(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
        sure_bytes: i64,
    ) -> Vec<GroupKey> {
        self.pages_grown(start, span_s, min_bytes, |k, e| {
            k.kind != Kind::Brk || e.growth_bytes >= sure_bytes || rose_in_every_window(e)
        })
    }

    /// As [`Analysis::growing_pages`], less those a leak of tensors kept as they were explains
    /// (see `Analysis::under_kept_tensors`) and the brk stacks whose heap top came back below
    /// where it reached before ([`top_kept_its_reach`]): what calls for a process's malloc
    /// family, every window of which costs seconds of a program two to five times slower.
    pub fn unexplained_pages(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
    ) -> Vec<GroupKey> {
        self.pages_grown(start, span_s, min_bytes, |k, e| {
            ratchets(k, e) && !self.under_kept_tensors(k, e)
        })
    }

    /// The stacks [`Analysis::pages_growing`] gives that `keep` keeps, by process.
    fn pages_grown(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
        keep: impl Fn(&GroupKey, &Evidence) -> bool,
    ) -> Vec<GroupKey> {
        let mut grown: Vec<GroupKey> = self
            .pages_growing(start, span_s, min_bytes)
            .filter(|(k, e)| keep(k, e))
            .map(|(k, _)| k)
            .collect();
        grown.sort_unstable_by_key(|k| k.pid);
        grown
    }

    /// The page-level stacks of `pid` (of every process where none) that grow as
    /// [`Analysis::growing_pages`] says from `from` on, by more than twice what their process's
    /// tensors grew meanwhile, brk stacks only where their heap top kept its reach
    /// ([`top_kept_its_reach`]): once its tensors were traced long enough to tell, what calls
    /// for its malloc family at once. By process.
    pub fn pages_beyond_tensors(
        &self,
        pid: Option<u32>,
        from: f64,
        span_s: f64,
        min_bytes: i64,
    ) -> Vec<GroupKey> {
        let start = |p: u32| {
            if pid.is_none_or(|pid| pid == p) {
                from
            } else {
                f64::INFINITY
            }
        };
        let mut grown: Vec<GroupKey> = self
            .pages_growing(start, span_s, min_bytes)
            .filter(|(k, e)| ratchets(k, e) && !self.under_tensors(k.pid, e, from))
            .map(|(k, _)| k)
            .collect();
        grown.sort_unstable_by_key(|k| k.pid);
        grown
    }

    /// Whether `pid`'s tensors held bytes in a sample: a process of PyTorch's, where they are
    /// traced.
    pub fn held_tensors(&self, pid: u32) -> bool {
        let s = self.procs.get(&pid);
        s.is_some_and(|s| s.tensors.points().iter().any(|p| p.max > 0))
    }

    /// Page-level stacks judged a leak from `start(pid)` on, over `span_s` at least, grown by
    /// `min_bytes` at least, that neither their own tensors nor a library's import explain (a
    /// slow `import torch` grew the loader's brk by 10 MiB over 25 s); with their evidence. Not
    /// those that rose in the last window only (see [`last_step_only`]): a brk heap's top placed
    /// higher once, which the report judges steady, or a mapping made once. A DataLoader job's
    /// main process, its heap's top placed 25 MiB higher once for a collated batch, had its
    /// tensors traced for 3 s and its malloc family for 5 s; 3 MiB mapped once at its start
    /// called for its tensors too. A leak grows them again in the windows after.
    fn pages_growing(
        &self,
        start: impl Fn(u32) -> f64,
        span_s: f64,
        min_bytes: i64,
    ) -> impl Iterator<Item = (GroupKey, Evidence)> {
        self.groups
            .iter()
            .filter(|(k, _)| matches!(k.kind, Kind::Mmap | Kind::Brk))
            .filter(|(k, _)| !self.made_by_import(k))
            .filter_map(move |(k, t)| {
                let from = start(k.pid);
                let e = classify(&self.before_exit(k.pid, &t.series), from)?;
                let span = span(&e);
                let grows = e.verdict == Verdict::Leak
                    && !last_step_only(&e)
                    && e.growth_bytes >= min_bytes
                    && span >= span_s
                    && !self.explained_by_own_tensors(k, &e, from);
                if grows {
                    let floors: Vec<u64> = e.windows.iter().map(|w| w.floor >> 10).collect();
                    let peaks: Vec<u64> = e.windows.iter().map(|w| w.peak >> 10).collect();
                    tracing::debug!(key = ?k, growth = e.growth_bytes, span, ?floors, ?peaks, "pages grow");
                }
                grows.then_some((*k, e))
            })
    }
}

/// Whether a page-level stack grows as what calls for a malloc family: a mapping's as it is, a
/// brk stack's where its heap top kept its reach ([`top_kept_its_reach`]).
fn ratchets(key: &GroupKey, evidence: &Evidence) -> bool {
    key.kind != Kind::Brk || top_kept_its_reach(evidence)
}
