//! The human-readable rendering of a report.

use std::fmt::Write as _;

use crate::{
    analysis::{Evidence, Verdict},
    ledger::TensorLayer,
    model::Kind,
    probes::Timing,
    report::{Finding, KindTotals, Report},
    symbolize::SymFrame,
};

/// Human-readable rendering.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let title = if r.final_report {
        "final report"
    } else {
        "report"
    };
    let _ = writeln!(
        s,
        "== leaktracer {title} after {:.1}s: {} events ==",
        r.elapsed_s, r.events
    );
    let _ = writeln!(s, "outstanding: {}", kinds(&r.totals));
    for note in heap_notes(r) {
        let _ = writeln!(s, "{note}");
    }
    if r.tracer_peak_rss_bytes > 0 {
        let rss = human(r.tracer_peak_rss_bytes);
        let _ = writeln!(s, "leaktracer: peak resident memory {rss}");
    }
    let l = &r.losses;
    let _ = writeln!(
        s,
        "lost: ringbuf_full={} pending_full={} traced_full={} stack_errors={} return_without_entry={} stack_table_full={} undecodable={} stop_failed={} sampled_full={} | unmatched: frees={} unmap_bytes={} reused_addresses={} device_frees={} | untraced_frees={} thread_exit_frees={}",
        l.ringbuf_full,
        l.pending_full,
        l.traced_full,
        l.stack_errors,
        l.return_without_entry,
        l.stack_table_full,
        l.undecodable,
        l.stop_failed,
        l.sampled_full,
        l.unmatched_frees,
        l.unmatched_unmap_bytes,
        l.reused_addresses,
        l.unmatched_device_frees,
        l.untraced_frees,
        l.thread_exit_frees,
    );
    for f in &r.probe_failures {
        let _ = writeln!(s, "warning: {f}: its calls are not traced ({})", f.error);
    }
    for f in &r.map_fill {
        let most = f.peak.unwrap_or(f.used).max(f.used);
        if most * 5 >= f.capacity * 4 {
            let _ = writeln!(
                s,
                "warning: {} table reached {}% full ({} of {}): past it, events are dropped",
                f.name,
                most * 100 / f.capacity.max(1),
                most,
                f.capacity
            );
        }
    }
    libraries(&mut s, r);
    probe_cost(&mut s, r);
    gpu(&mut s, r);
    let _ = writeln!(s, "\nprocesses:");
    for p in &r.processes {
        let state = if p.exited { "exited" } else { "running" };
        let inherited = if p.inherited == KindTotals::default() {
            String::new()
        } else {
            format!(" | inherited: {}", kinds(&p.inherited))
        };
        let _ = writeln!(
            s,
            "  pid {:>7} ppid {:>7} {state:<7} {}{inherited}  {}",
            p.pid,
            p.ppid.map_or_else(|| "-".into(), |v| v.to_string()),
            kinds(&p.own),
            one_line(&p.command),
        );
        if let Some(r) = p.retention.as_ref().filter(|r| r.retention) {
            let _ = writeln!(
                s,
                "      allocator retention: its brk heap grew {} while heap bytes did not (fragmentation, not a leak)",
                human(r.pages_growth_bytes.max(0) as u64)
            );
        }
        for (k, v) in &p.allocator_env {
            let _ = writeln!(s, "      {k}={}", one_line(v));
        }
        objects(&mut s, p.objects.as_deref().unwrap_or_default());
    }
    failures(&mut s, r);
    leaks(&mut s, r);
    let _ = writeln!(s, "\ntop stacks by outstanding bytes:");
    for (i, st) in r.stacks.iter().enumerate() {
        if st.released {
            let _ = writeln!(
                s,
                "#{:<2} released at the end, {:?}, pid {}: it leaked while the run was sampled{}",
                i + 1,
                st.kind,
                st.pid,
                st.verdict
                    .as_ref()
                    .map(|e| verdict(e, &r.verdicts_per))
                    .unwrap_or_default()
            );
            frames(&mut s, &st.frames);
            continue;
        }
        let inh = if st.inherited { " (inherited)" } else { "" };
        let _ = writeln!(
            s,
            "#{:<2} {} in {} blocks, {:?}{inh} via {}, pid {}, oldest {:.1}s{}",
            i + 1,
            human(st.bytes),
            st.blocks,
            st.kind,
            st.allocators.join("/"),
            st.pid,
            st.oldest_age_s,
            st.verdict
                .as_ref()
                .map(|e| verdict(e, &r.verdicts_per))
                .unwrap_or_default()
        );
        if !st.pages.is_empty() {
            let pages: Vec<String> = st
                .pages
                .iter()
                .map(|p| format!("{} {} ({})", p.kind.name(), human(p.bytes), p.blocks))
                .collect();
            let _ = writeln!(
                s,
                "      pages the allocator mapped for them: {}",
                pages.join(", ")
            );
        }
        frames(&mut s, &st.frames);
    }
    if r.unlisted.stacks > 0 {
        let _ = writeln!(
            s,
            "…and {} smaller stacks not listed (--top to list them): {}",
            r.unlisted.stacks,
            kinds(&r.unlisted.totals)
        );
    }
    s
}

/// " — LEAK +1.0 MiB/s (confidence 0.90)" (or /step).
fn verdict(e: &Evidence, per: &str) -> String {
    let what = match e.verdict {
        Verdict::Leak => "LEAK",
        Verdict::Spike => "spike",
        Verdict::BoundedCache => "bounded cache",
        Verdict::Steady => "steady",
        Verdict::Retention => "allocator retention (not a leak)",
        Verdict::Moved => "moved here from other stacks (not a leak)",
        Verdict::UnderTensors => "pages under tensors (a leak is on the tensors)",
        Verdict::UnderHeap => "pages under the heap (a leak is on its malloc stacks)",
        Verdict::UnderObjects => "arenas under Python objects (a leak is on the objects)",
        Verdict::Imported => "a library's module, made when imported (not a leak)",
    };
    let sign = if e.slope_bytes_per_s < 0.0 { "-" } else { "+" };
    let unit = if per == "step" { "step" } else { "s" };
    format!(
        " — {what} {sign}{}/{unit} (confidence {:.2})",
        human(e.slope_bytes_per_s.abs() as u64),
        e.confidence
    )
}

/// A process's window of Python objects: what the stacks that keep kept, and the most made of
/// the others (at most four lines in all).
fn objects(s: &mut String, lines: &[crate::report::ObjectLine]) {
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "      Python objects sampled in a window (made in its first half, still held at its end):"
    );
    for l in lines.iter().take(4) {
        let _ = writeln!(
            s,
            "        {} of {} kept{}{}: {}",
            human(l.kept_bytes),
            human(l.made_bytes),
            match l.imported_bytes {
                0 => String::new(),
                b => format!(", {} by imports", human(b)),
            },
            if l.keeps { " (keeps)" } else { "" },
            l.site
        );
    }
}

fn frames(s: &mut String, frames: &[SymFrame]) {
    for f in frames.iter().take(12) {
        let func = f.function.as_deref().unwrap_or("??");
        let loc = match (&f.file, f.line) {
            (Some(file), Some(line)) => format!(" {file}:{line}"),
            _ => String::new(),
        };
        let module = f
            .module
            .as_deref()
            .map(|m| m.rsplit('/').next().unwrap_or(m))
            .unwrap_or("?");
        let _ = writeln!(s, "      {func}{loc} [{module}]");
    }
}

/// "heap 1.2 MiB in 3 blocks, device 4.0 GiB in 2 blocks, …": the kinds with memory (heap always).
fn kinds(t: &KindTotals) -> String {
    let parts: Vec<String> = Kind::ALL
        .iter()
        .map(|&k| (k, t.get(k)))
        .filter(|(k, a)| a.bytes > 0 || *k == Kind::Heap)
        .map(|(k, a)| format!("{} {} ({})", k.name(), human(a.bytes), a.blocks))
        .collect();
    parts.join(", ")
}

/// What a leaking stack holds, in words: its outstanding bytes; for Python objects, sampled in a
/// window, what the arenas grew by for them (the objects' leak is its arenas' growth, shared by
/// the stacks that keep), and how many of its site's sampled objects are held.
pub fn held(f: &Finding<'_>) -> String {
    match f.stack.kind {
        _ if f.released == f.stacks => "released at the end".to_string(),
        _ if f.released > 0 => format!(
            "{} outstanding in {} blocks of {} stacks ({} released at the end)",
            human(f.bytes),
            f.blocks,
            f.stacks,
            f.released
        ),
        Kind::Object => format!(
            "~{} of arenas, {} sampled objects held",
            human(f.growth.max(0) as u64),
            f.blocks
        ),
        _ if f.stacks > 1 => format!(
            "{} outstanding in {} blocks of {} stacks",
            human(f.bytes),
            f.blocks,
            f.stacks
        ),
        _ => format!("{} outstanding in {} blocks", human(f.bytes), f.blocks),
    }
}

/// The report's leaks by site, the fastest first (what `check` gates on, every kind): where to
/// look before the stacks by size, whose largest are often pages that a leak listed here fills.
fn leaks(s: &mut String, r: &Report) {
    let sites = crate::report::leak_sites(r, |_| true);
    if sites.is_empty() {
        return;
    }
    let per = if r.verdicts_per == "step" {
        "step"
    } else {
        "s"
    };
    let _ = writeln!(s, "\nleaks by site, the fastest first:");
    for f in &sites {
        let rate = human(f.slope.max(0.0) as u64);
        let (kind, pid) = (f.stack.kind.name(), f.stack.pid);
        let _ = writeln!(
            s,
            "  {kind} {rate}/{per}, {}, pid {pid}: {}",
            held(f),
            f.stack.site()
        );
    }
}

/// What a reader must know of the heap figures, unless every allocation was traced from the start.
pub fn heap_notes(r: &Report) -> Vec<String> {
    let h = &r.heap;
    let mut notes = Vec::new();
    match (h.mode, h.sample_bytes) {
        (crate::model::HeapMode::Sampled, Some(b)) => notes.push(format!(
            "heap: sampled, one point every {b} bytes on average: heap bytes are estimates"
        )),
        (crate::model::HeapMode::Off, _) => notes.push("heap: not traced (--heap off)".into()),
        (crate::model::HeapMode::Auto, _) => notes.push(
            "heap: Python processes' malloc calls traced only from when their pages grew (--heap auto; --heap full for all)"
                .into(),
        ),
        _ => {}
    }
    if h.mode == crate::model::HeapMode::Auto && h.tensors == crate::model::TensorsMode::Auto {
        notes.push(
            "tensors: Python processes' CPU tensors traced only while their pages grew (--tensors all for all)"
                .into(),
        );
    }
    notes.extend(layer_notes(r));
    notes.extend(pages_notes(r));
    let from = match h.after {
        Some(crate::model::HeapAfter::Seconds(t)) => format!("{t} s into tracing"),
        Some(crate::model::HeapAfter::Steps(n)) => format!("step {n}"),
        None => return notes,
    };
    notes.push(format!(
        "heap: probed from {from} on (--heap-after): blocks allocated before are not seen"
    ));
    notes
}

/// What a reader must know of the layers of each process traced for a while: its CPU tensors
/// (`--tensors auto`), its malloc family taken out once its leak was confirmed (`--heap auto`);
/// `check` prints them under its verdict too.
pub fn layer_notes(r: &Report) -> Vec<String> {
    let heap = |p: &crate::report::ProcReport| {
        let why = if p.heap_held {
            "its heap held while traced and its malloc family was taken out"
        } else {
            "its leak was confirmed and its malloc family taken out"
        };
        match (p.heap_as_of_s, p.heap_slowdown) {
            (Some(at), _) => Some(format!(
                "heap of pid {}: as of {at:.1} s, when {why}{}{}{} (--heap full traces it to the end)",
                p.pid,
                traced_again(p),
                pages_after(p),
                slowed(p)
            )),
            (None, Some(_)) => Some(format!(
                "heap of pid {}: traced from when its pages grew{}",
                p.pid,
                slowed(p)
            )),
            (None, None) => None,
        }
    };
    let tensors = r.processes.iter().filter_map(|p| tensor_note(r, p));
    tensors.chain(r.processes.iter().filter_map(heap)).collect()
}

/// How often its malloc family was traced again, its pages growing on after it was taken out:
/// " (traced again 2 times since its first window, judged on the last)".
fn traced_again(p: &crate::report::ProcReport) -> String {
    match p.heap_again {
        0 => String::new(),
        1 => " (traced again once since its first window, judged on the last)".into(),
        n => format!(" (traced again {n} times since its first window, judged on the last)"),
    }
}

/// How much slower the program ran while its malloc family was traced, where it was: "; it ran
/// 2.6× slower while traced, and its heap's rates are as it runs untraced".
fn slowed(p: &crate::report::ProcReport) -> String {
    p.heap_slowdown.map_or_else(String::new, |s| {
        format!(
            "; it ran {s:.1}× slower while traced, and its heap's rates are as it runs untraced"
        )
    })
}

/// How far a confirmed heap leak went on after its malloc family was taken out, by its pages:
/// "; its pages grew by 712.0 MiB after", where they grew by a MiB or more.
fn pages_after(p: &crate::report::ProcReport) -> String {
    match p.pages_after_heap_bytes {
        Some(grew) if !p.heap_held && grew >= 1 << 20 => {
            format!("; its pages grew by {} after", human(grew))
        }
        _ => String::new(),
    }
}

/// What a reader must know of a process's CPU tensors traced for a while (`--tensors auto`):
/// kept as they were when their leak was confirmed, or traced from too shortly before the end
/// for a leak of them to be sure to show (a second of ramp and two of growth, as a confirmed
/// one needs).
fn tensor_note(r: &Report, p: &crate::report::ProcReport) -> Option<String> {
    let needs = crate::analysis::TENSOR_RAMP + crate::analysis::TENSORS_CONFIRM_S;
    match (p.tensors?, p.tensors_as_of_s, p.tensors_since_s) {
        (TensorLayer::Kept, Some(at), _) => Some(format!(
            "tensors of pid {}: as of {at:.1} s, when their leak was confirmed; traced now and then since, so only those made while traced are counted (--tensors all counts every one)",
            p.pid
        )),
        (TensorLayer::Traced, Some(at), Some(since)) => Some(format!(
            "tensors of pid {}: as of {at:.1} s, when their leak was last confirmed, and those made since {since:.1} s, when they were traced again (--tensors all counts every one)",
            p.pid
        )),
        (TensorLayer::Traced, None, Some(since))
            if r.final_report && r.elapsed_s - since < needs =>
        {
            Some(format!(
                "tensors of pid {}: traced only from {since:.1} s, {:.1} s before the end: a leak of them may not have had the time to show, so its pages are judged on what they did before then (--tensors all traces them from the start)",
                p.pid,
                r.elapsed_s - since
            ))
        }
        _ => None,
    }
}

/// What a reader of a leak of pages must know: in a process whose malloc family was not traced,
/// a leak of the heap's pages is named by the lines whose allocations grew the heap, which need
/// not be those that keep the memory (a training loop keeping each step's loss keeps its
/// autograd graph's nodes, allocated through the step, and the heap grows at whichever line of
/// the loop needs a new page). Not for the arenas of Python objects, whose window names the
/// lines that keep them.
pub fn pages_notes(r: &Report) -> Vec<String> {
    let leaks = |pid: u32, arenas: bool| {
        r.stacks.iter().any(|s| {
            s.pid == pid
                && matches!(s.kind, Kind::Brk | Kind::Mmap)
                && s.python_arenas() == arenas
                && s.verdict
                    .as_ref()
                    .is_some_and(|v| v.verdict == Verdict::Leak)
        })
    };
    let pages = r
        .processes
        .iter()
        .filter(|p| !p.malloc_traced && leaks(p.pid, false))
        .map(|p| format!(
            "pages of pid {}: leaking at the lines where its heap grew, which need not be where the memory is kept: its malloc family was not traced (--heap full traces it from the start)",
            p.pid
        ));
    let arenas = r.processes.iter().filter(|p| leaks(p.pid, true)).map(|p| {
        let window = if p.objects.is_some() {
            ": its objects' window found no line keeping a quarter of what it made"
        } else {
            ""
        };
        format!(
            "arenas of pid {}: Python objects' arenas leaking at the lines whose objects needed a new arena, which need not be the lines that keep them{window}",
            p.pid
        )
    });
    pages.chain(arenas).collect()
}

/// `--probe-cost`: "probe cost: 1234 runs, 2.1 ms in the kernel (alloc_return 700 × 596 ns, …)".
fn probe_cost(s: &mut String, r: &Report) {
    if r.probe_cost.is_empty() {
        return;
    }
    let calls: u64 = r.probe_cost.iter().map(|p| p.calls).sum();
    let ns: u64 = r.probe_cost.iter().map(|p| p.ns).sum();
    let top: Vec<String> = r
        .probe_cost
        .iter()
        .take(3)
        .map(|p| format!("{} {} × {} ns", p.program, p.calls, p.ns / p.calls.max(1)))
        .collect();
    let _ = writeln!(
        s,
        "probe cost: {calls} program runs, {:.1} ms in the kernel ({}; traps not included)",
        ns as f64 / 1e6,
        top.join(", ")
    );
}

fn libraries(s: &mut String, r: &Report) {
    for lib in r
        .libraries
        .iter()
        .filter(|l| l.timing != Timing::BeforeStart)
    {
        let when = match lib.timing {
            Timing::BeforeStart | Timing::AtMap => "probed when mapped, nothing missed".to_string(),
            Timing::Ahead => "probed before it was mapped, nothing missed".into(),
            Timing::AlreadyLoaded => "already loaded: calls before the attach not seen".into(),
            Timing::Late { late_ms } => {
                format!("probed {late_ms:.1} ms after it was mapped: calls in between not seen")
            }
            Timing::HeapAfter { after_s } => {
                format!("probed {after_s:.1} s into tracing (--heap-after): calls before not seen")
            }
            Timing::Engaged { after_s } if lib.roles.iter().any(|r| r == "python-objects") => {
                format!(
                    "sampled for pid {} in a window from {after_s:.1} s into tracing, its arenas growing",
                    lib.pid
                )
            }
            Timing::Engaged { after_s } => format!(
                "probed for pid {} {after_s:.1} s into tracing, its pages growing: calls before not seen",
                lib.pid
            ),
        };
        let _ = writeln!(
            s,
            "library {} ({}): {when}",
            lib.path.display(),
            lib.roles.join(", ")
        );
    }
}

/// Traced device memory beside NVML's, when CUDA is in the picture.
fn gpu(s: &mut String, r: &Report) {
    let cuda = r
        .libraries
        .iter()
        .any(|l| l.roles.iter().any(|x| x.starts_with("cuda")));
    if !cuda && r.gpu.processes.is_empty() {
        return;
    }
    let nvml = &r.gpu.nvml;
    if !nvml.available {
        let reason = nvml.reason.as_deref().unwrap_or("unknown reason");
        let _ = writeln!(
            s,
            "gpu: NVML unavailable ({reason}): traced CUDA memory only"
        );
    }
    for d in &nvml.devices {
        let _ = writeln!(
            s,
            "gpu {} {}: {} of {} in use",
            d.index,
            d.name,
            human(d.used_bytes),
            human(d.total_bytes)
        );
    }
    for p in &r.gpu.processes {
        let nvml_part = match (p.nvml_bytes, p.unexplained_bytes, p.nvml_at_s) {
            (Some(n), Some(u), at) => format!(
                ", NVML {}{} ({}{} not explained by traced calls then)",
                human(n),
                at.map(|t| format!(" at {t:.1} s")).unwrap_or_default(),
                if u < 0 { "-" } else { "" },
                human(u.unsigned_abs())
            ),
            _ => String::new(),
        };
        let torch = if p.torch_block_bytes > 0 {
            format!(
                " (PyTorch tensors {}, its cache {})",
                human(p.torch_block_bytes),
                human(p.traced_bytes.saturating_sub(p.torch_block_bytes))
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "gpu pid {}: traced device {}{torch}, managed {}{nvml_part}",
            p.pid,
            human(p.traced_bytes),
            human(p.managed_bytes)
        );
    }
}

fn failures(s: &mut String, r: &Report) {
    if r.device_failures.is_empty() {
        return;
    }
    let _ = writeln!(s, "\nfailed CUDA allocations:");
    for f in &r.device_failures {
        let _ = writeln!(
            s,
            "  {} × {} → {} ({}), {} asked for, pid {}",
            f.calls,
            f.function,
            f.error,
            f.code,
            human(f.bytes),
            f.pid
        );
        frames(s, &f.frames);
    }
}

/// A traced program's string on one line: control characters (newlines in `python -c` scripts)
/// escaped, so one process stays one row.
fn one_line(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Bytes in binary units.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        analysis::{Evidence, Verdict},
        model::Kind,
        report::{
            Report,
            synthetic::{ledger_with, report_of},
        },
    };

    /// A report of `n` stacks of one process, all listed.
    fn report(n: u32) -> Report {
        let (ledger, analysis) = ledger_with(n, 5);
        report_of(&ledger, &analysis, n as usize)
    }

    #[test]
    fn commands_render_on_one_line() {
        assert_eq!(
            super::one_line("python3 -c \nimport x\tprint()"),
            "python3 -c \\nimport x\\tprint()"
        );
    }

    /// `--tensors auto`: a process whose tensors were kept is reported as of then; one whose
    /// tensors went in too shortly before the end (a ramp and a confirmation's span) is said
    /// to be, and one traced for longer is not.
    #[test]
    fn tensor_notes_say_what_the_tensors_could_show() {
        let (mut ledger, analysis) = ledger_with(1, 5);
        let notes = |ledger: &crate::ledger::Ledger, elapsed_s: f64| {
            let mut r = report_of(ledger, &analysis, 1);
            r.elapsed_s = elapsed_s;
            super::layer_notes(&r)
        };
        ledger.tensors_traced(1, 4.3);
        assert_eq!(
            notes(&ledger, 6.2),
            [
                "tensors of pid 1: traced only from 4.3 s, 1.9 s before the end: a leak of them may not have had the time to show, so its pages are judged on what they did before then (--tensors all traces them from the start)"
            ]
        );
        assert!(notes(&ledger, 7.4).is_empty());
        ledger.keep_tensors(1, 8.6);
        assert_eq!(
            notes(&ledger, 9.0),
            [
                "tensors of pid 1: as of 8.6 s, when their leak was confirmed; traced now and then since, so only those made while traced are counted (--tensors all counts every one)"
            ]
        );
        ledger.forget_tensors(1);
        assert!(notes(&ledger, 9.0).is_empty());
    }

    /// `--heap auto`: a process whose malloc family slowed it while traced says by how much, as
    /// of its take-out or while it is traced still.
    #[test]
    fn heap_notes_say_how_much_slower_the_program_ran_while_traced() {
        let (ledger, analysis) = ledger_with(1, 5);
        let notes = |as_of: Option<f64>, slowdown: Option<f64>| {
            let mut r = report_of(&ledger, &analysis, 1);
            (r.processes[0].heap_as_of_s, r.processes[0].heap_slowdown) = (as_of, slowdown);
            super::layer_notes(&r)
        };
        assert_eq!(
            notes(Some(24.2), Some(2.06)),
            [
                "heap of pid 1: as of 24.2 s, when its leak was confirmed and its malloc family taken out; it ran 2.1× slower while traced, and its heap's rates are as it runs untraced (--heap full traces it to the end)"
            ]
        );
        assert_eq!(
            notes(None, Some(3.0)),
            [
                "heap of pid 1: traced from when its pages grew; it ran 3.0× slower while traced, and its heap's rates are as it runs untraced"
            ]
        );
        assert!(notes(None, None).is_empty());
    }

    /// A stack's evidence: `verdict`, grown by 1 MiB at `slope_bytes_per_s`.
    fn judged(verdict: Verdict, slope_bytes_per_s: f64) -> Option<Evidence> {
        Some(Evidence {
            verdict,
            confidence: 1.0,
            growth_bytes: 1 << 20,
            slope_bytes_per_s,
            windows: Vec::new(),
        })
    }

    /// A leak of brk pages in a process whose malloc family was not traced is said to be named
    /// by where the heap grew; not once its malloc family is traced, nor for a page-level stack
    /// that is not a leak.
    #[test]
    fn pages_notes_say_where_a_leak_of_pages_is_named() {
        let mut r = report(1);
        r.processes[0].malloc_traced = false;
        (r.stacks[0].kind, r.stacks[0].verdict) = (Kind::Brk, judged(Verdict::Leak, 1e5));
        assert_eq!(
            super::pages_notes(&r),
            [
                "pages of pid 1: leaking at the lines where its heap grew, which need not be where the memory is kept: its malloc family was not traced (--heap full traces it from the start)"
            ]
        );
        r.processes[0].malloc_traced = true;
        assert!(super::pages_notes(&r).is_empty());
        r.processes[0].malloc_traced = false;
        r.stacks[0].verdict.as_mut().unwrap().verdict = Verdict::BoundedCache;
        assert!(super::pages_notes(&r).is_empty());
        // An arena of Python objects leaking (mapped through _PyObject_ArenaMmap), whatever the
        // malloc family: its own note.
        r.stacks[0].verdict.as_mut().unwrap().verdict = Verdict::Leak;
        (r.stacks[0].kind, r.processes[0].malloc_traced) = (Kind::Mmap, true);
        r.stacks[0].frames[0].function = Some("_PyObject_ArenaMmap".into());
        r.processes[0].objects = Some(Vec::new());
        assert_eq!(
            super::pages_notes(&r),
            [
                "arenas of pid 1: Python objects' arenas leaking at the lines whose objects needed a new arena, which need not be the lines that keep them: its objects' window found no line keeping a quarter of what it made"
            ]
        );
    }

    /// The leaks by site (a site's stacks of a kind together) come before the stacks by size,
    /// the fastest first; pages under the heap are no leak of theirs, and a report without a
    /// leak has no such list.
    #[test]
    fn the_leaks_are_listed_by_site_before_the_stacks_by_size() {
        let mut r = report(3);
        (r.stacks[0].kind, r.stacks[0].verdict) = (Kind::Brk, judged(Verdict::UnderHeap, 4e5));
        r.stacks[1].verdict = judged(Verdict::Leak, 1e5);
        (r.stacks[2].kind, r.stacks[2].verdict) = (Kind::Tensor, judged(Verdict::Leak, 2e5));
        let text = super::text(&r);
        let (leaks, stacks) = text
            .split_once("\nleaks by site, the fastest first:\n")
            .unwrap_or_else(|| panic!("{text}"))
            .1
            .split_once("\n\ntop stacks by outstanding bytes:")
            .unwrap();
        let lines: Vec<&str> = leaks.lines().collect();
        assert_eq!(lines.len(), 2, "{leaks}");
        assert!(lines[0].starts_with("  tensor 195.3 KiB/s, "), "{leaks}");
        assert!(lines[1].starts_with("  heap 97.7 KiB/s, "), "{leaks}");
        assert!(stacks.contains("pages under the heap"), "{stacks}");
        for s in &mut r.stacks {
            s.verdict = None;
        }
        assert!(!super::text(&r).contains("leaks by site"));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(super::human(1000), "1000 B");
        assert_eq!(super::human(10 * 1024 * 1024), "10.0 MiB");
    }
}
