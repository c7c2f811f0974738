//! Attaching one probe set in one library: where each function is probed (after its allocating
//! call, on its first emulated instruction, or on the function its table holds), and one link per
//! program, entries before returns.

use std::path::{Path, PathBuf};

use aya::programs::uprobe::UProbeScope;

use super::{
    AttachedFn, AttachedLink, Mode, Probes, elf, objects, placement,
    sets::{self, ProbeSet},
};
use crate::error::Error;

/// `LEAKTRACER_PROBE_AT_ENTRY=1` puts every probe at offset 0 (to measure what placement saves).
fn probe_at_entry() -> bool {
    std::env::var("LEAKTRACER_PROBE_AT_ENTRY").is_ok_and(|v| v == "1")
}

/// A probe set placed in one library: each program with its points (program, file offset,
/// cookie), entries before returns, and its functions as the report lists them once it is in.
/// Placed once; attached once for every process, or once for each traced process (own.rs), or
/// for each process whose layer it is, each time it is engaged (layers.rs).
#[derive(Clone)]
pub(super) struct PlacedSet {
    pub(super) library: PathBuf,
    pub(super) role: &'static str,
    progs: Vec<&'static str>,
    points: Vec<(&'static str, u64, Option<u64>)>,
    fns: Vec<AttachedFn>,
}

impl Probes {
    /// Attaches `set` in `library` for `scope`, listing its functions as probed if it goes in.
    pub(super) fn attach_set(
        &mut self,
        library: &Path,
        elf: &elf::ElfFile,
        set: &'static ProbeSet,
        scope: UProbeScope,
    ) -> Result<Vec<AttachedLink>, Error> {
        let placed = self.place_set(library, elf, set, scope);
        self.attach_placed(&placed, scope)
    }

    /// Where each function of `set` in `library` is probed (for `scope`).
    pub(super) fn place_set(
        &self,
        library: &Path,
        elf: &elf::ElfFile,
        set: &'static ProbeSet,
        scope: UProbeScope,
    ) -> PlacedSet {
        let mut seen_addrs = Vec::new();
        // (program, file offset, cookie)
        let mut points: Vec<(&'static str, u64, Option<u64>)> = Vec::new();
        let mut fns = Vec::new();
        let names: Vec<&str> = set.fns.iter().map(|f| f.name).collect();
        for (f, func) in set.fns.iter().zip(elf.functions(&names)) {
            let Some(func) = func else {
                tracing::warn!(function = f.name, library = %library.display(), "symbol not found: not probed");
                continue;
            };
            if seen_addrs.contains(&func.addr) {
                // An alias (glibc's aligned_alloc is memalign): one probe already covers it.
                continue;
            }
            seen_addrs.push(func.addr);
            if let Some((offset, prog, cookie)) = self.after_call(elf, f, &func) {
                points.push((prog, func.file_offset + offset, Some(cookie)));
                fns.push(AttachedFn {
                    function: f.name.into(),
                    library: library.to_path_buf(),
                    offset,
                    reason: "after the call that allocates: one probe for entry and return".into(),
                });
                continue;
            }
            let (at, cookie, place) = place_probe(library, f, &func, set.placed, scope);
            tracing::info!(
                function = f.name,
                offset = place.offset,
                reason = place.reason,
                "probe placement"
            );
            let (entry, ret) = match self.mode {
                Mode::Full => (f.entry, f.ret),
                Mode::Bare => ("bare_enter", f.ret.map(|_| "bare_return")),
            };
            for prog in std::iter::once(entry).chain(ret) {
                // Wrappers whose table holds one function (PyObject_Free, PyMem_Free) share
                // its probe.
                if !points.iter().any(|p| p.0 == prog && p.1 == at) {
                    points.push((prog, at, cookie));
                }
            }
            fns.push(AttachedFn {
                function: f.name.into(),
                library: library.to_path_buf(),
                offset: place.offset,
                reason: place.reason.into(),
            });
        }
        // One attach call per program: a multi-attach program (the shared return programs, the
        // CUDA entry) gets one link for all its points, and a link is what costs a grace period
        // to detach; the others get one uprobe per point as before.
        let mut progs: Vec<&'static str> = points.iter().map(|p| p.0).collect();
        // Return programs last: in a process already running, a return whose entry program was
        // not in yet would be a return without an entry.
        let is_return = |prog: &str| set.fns.iter().any(|f| f.ret == Some(prog));
        progs.sort_unstable_by_key(|p| (is_return(p), *p));
        progs.dedup();
        PlacedSet {
            library: library.to_path_buf(),
            role: set.role,
            progs,
            points,
            fns,
        }
    }

    /// Attaches a set `placed` for `scope`, all of it or none; its functions are listed as
    /// probed once it is in.
    pub(super) fn attach_placed(
        &mut self,
        placed: &PlacedSet,
        scope: UProbeScope,
    ) -> Result<Vec<AttachedLink>, Error> {
        let PlacedSet {
            library,
            progs,
            points,
            ..
        } = placed;
        let links = self.attach_programs(library, progs, points, scope)?;
        self.list_probed(placed);
        Ok(links)
    }

    /// Lists the functions of `placed` as probed, those not listed yet.
    pub(super) fn list_probed(&mut self, placed: &PlacedSet) {
        for f in &placed.fns {
            if !self.attached.contains(f) {
                self.attached.push(f.clone());
            }
        }
    }

    /// Attaches each of `progs` at its `points` (program, file offset, cookie), all or none: a
    /// set whose entries went in without their returns would leave every call it sees pending.
    fn attach_programs(
        &mut self,
        library: &Path,
        progs: &[&'static str],
        points: &[(&'static str, u64, Option<u64>)],
        scope: UProbeScope,
    ) -> Result<Vec<AttachedLink>, Error> {
        self.load_all(progs)?;
        let mut links = Vec::with_capacity(progs.len());
        for &prog in progs {
            let mine = points.iter().filter(|p| p.0 == prog);
            match self.attach_points(library, prog, mine.map(|p| (p.1, p.2)), scope) {
                Ok(id) => links.push((prog, id)),
                Err(e) => {
                    self.detach_links(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    /// (offset, program, cookie) of the one probe that stands for `f`'s entry and return
    /// probes, where its code allows it (see [`placement::after_call`]).
    fn after_call(
        &self,
        elf: &elf::ElfFile,
        f: &sets::ProbeFn,
        func: &elf::Function,
    ) -> Option<(u64, &'static str, u64)> {
        let after = f.after_call.as_ref()?;
        if self.mode != Mode::Full || probe_at_entry() {
            return None;
        }
        let stubs = elf.plt_stubs(after.callee);
        let found = placement::after_call(&func.code, func.addr, &stubs);
        if found.is_none() {
            tracing::info!(
                function = f.name,
                callee = after.callee,
                "no call site to probe after: entry and return probes"
            );
        }
        found.map(|(offset, site)| (offset, after.program, site.cookie()))
    }
}

/// Where `f` (`func` in `library`) is probed: its file offset, its cookie and the placement.
/// Functions of a `placed` set go on the first instruction the kernel emulates; a wrapper that
/// jumps through a table (`through_table`) and has none, probed for one process, goes on the
/// function that process's table holds, its cookie flagged `COOKIE_ARGS_AFTER_CONTEXT`.
fn place_probe(
    library: &Path,
    f: &sets::ProbeFn,
    func: &elf::Function,
    placed: bool,
    scope: UProbeScope,
) -> (u64, Option<u64>, placement::Placement) {
    let place = if !placed {
        placement::Placement::entry("entry (a rarely called function)")
    } else if probe_at_entry() {
        return (
            func.file_offset,
            f.cookie,
            placement::Placement::entry("LEAKTRACER_PROBE_AT_ENTRY set"),
        );
    } else {
        placement::choose(&func.code, func.addr, f.args)
    };
    let table = match scope {
        UProbeScope::OneProcess(pid) if f.through_table && !place.emulated => {
            objects::table_target(pid, library, func, f.args)
        }
        _ => None,
    };
    match table {
        Some((offset, table_place)) => (
            offset + table_place.offset,
            f.cookie
                .map(|c| c | tracer_common::COOKIE_ARGS_AFTER_CONTEXT),
            placement::Placement {
                reason: "the function its table holds in the process: first emulated instruction",
                ..table_place
            },
        ),
        None => (func.file_offset + place.offset, f.cookie, place),
    }
}
