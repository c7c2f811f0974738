//! A report's leaks by site: each process's line of each kind once, whatever number of stacks
//! it has (what `check` gates on, and what the text report lists first).

use crate::{analysis::Verdict, model::Kind, report::StackReport};

use super::Report;

/// A site's stacks of one kind with a leak verdict, and whether they are over a gate's budget
/// together: the native stacks under one Python line (a step's autograd nodes are
/// made by a dozen of them), a line's Python objects of several types, a line's stacks whose
/// blocks the program's teardown freed and those it did not. The first outstanding one stands
/// for all of them, with their slopes, growth, bytes and blocks summed.
pub struct Finding<'a> {
    pub stack: &'a StackReport,
    /// How many of its stacks were released at the end.
    pub released: usize,
    pub slope: f64,
    pub over: bool,
    /// What the site's stacks grew by, hold and their blocks (sampled objects, for objects).
    pub growth: i64,
    pub bytes: u64,
    pub blocks: u64,
    /// How many stacks.
    pub stacks: usize,
}

/// The stacks of `report` with a leak verdict that `checked` keeps, by site (see [`Finding`]),
/// the fastest first; none over a budget yet.
pub fn leak_sites<'a>(
    report: &'a Report,
    checked: impl Fn(&StackReport) -> bool,
) -> Vec<Finding<'a>> {
    let leaks = report.stacks.iter().filter(|s| checked(s)).filter_map(|s| {
        let v = s.verdict.as_ref().filter(|v| v.verdict == Verdict::Leak)?;
        Some(Finding {
            stack: s,
            released: usize::from(s.released),
            slope: v.slope_bytes_per_s,
            over: false,
            growth: v.growth_bytes,
            bytes: s.bytes,
            blocks: s.blocks,
            stacks: 1,
        })
    });
    let mut out = by_site(leaks);
    out.sort_by(|a, b| b.slope.total_cmp(&a.slope));
    out
}

/// `leaks` with each process's site as one finding per kind: the stacks a line's objects are
/// sampled at (a dict, its strings, a list's array) share its arenas' leak between them, the
/// native stacks under a Python line share its heap's, and each alone may be under the budget the
/// line is over. A line's stacks released at the end are of its leak too (a training job's line
/// that keeps a tensor a step has two stacks of it, one of which its teardown may free): one
/// line, not a second that says less.
pub(crate) fn by_site<'a>(leaks: impl Iterator<Item = Finding<'a>>) -> Vec<Finding<'a>> {
    let mut out: Vec<Finding<'a>> = Vec::new();
    let mut sites: Vec<((u32, Kind, String), usize)> = Vec::new();
    for f in leaks {
        let s = f.stack;
        let key = (s.pid, s.kind, s.site());
        match sites.iter().find(|(k, _)| *k == key) {
            Some(&(_, at)) => {
                let site = &mut out[at];
                if site.stack.released && !s.released {
                    site.stack = s;
                }
                site.released += f.released;
                site.slope += f.slope;
                site.growth += f.growth;
                site.bytes += f.bytes;
                site.blocks += f.blocks;
                site.stacks += 1;
            }
            None => {
                sites.push((key, out.len()));
                out.push(f);
            }
        }
    }
    out
}
