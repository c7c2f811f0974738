//! The `leaktracer` binary: parse, validate, run a session, map errors to exit codes.

use clap::Parser;
use tracer::{
    cli::{Cli, Command},
    error::exit,
    session::{self, Target},
};
use tracing_subscriber::EnvFilter;

/// The tracer's own allocations must not go through the libc malloc it probes: every probe hit in
/// its own process is a trap (the probes cover every process mapping libc; the programs then
/// filter by tgid), and it allocates per event.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    /// mimalloc's option setter (its C API; the option numbers are those of its v3 header).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Memory the tracer frees goes back to the kernel at once, and arenas are committed as used:
/// a ledger table that grows leaves its old buckets behind, and by default mimalloc keeps them
/// (a million outstanding blocks cost about 40 MiB more resident memory that way). Set before
/// mimalloc reserves its first arena: in a constructor ordered before its own (priority 101).
#[used]
#[unsafe(link_section = ".init_array.00100")]
static RETURN_FREED_MEMORY: extern "C" fn() = return_freed_memory;

extern "C" fn return_freed_memory() {
    const ARENA_EAGER_COMMIT: std::ffi::c_int = 4;
    const PURGE_DELAY: std::ffi::c_int = 15;
    // SAFETY: plain option stores, before the threads that allocate start.
    unsafe {
        mi_option_set(ARENA_EAGER_COMMIT, 0);
        mi_option_set(PURGE_DELAY, 0);
    }
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let (target, report) = match cli.command {
        Command::Diff {
            store,
            old,
            new,
            top,
            json,
        } => diff(store, &old, &new, top, json),
        Command::Report {
            store,
            list,
            run,
            snapshot,
            top,
            json,
            exports,
        } => stored(store, list, run, snapshot, top, json, &exports),
        Command::Bench { verdicts: true, .. } => finish(tracer::analysis::bench::run()),
        Command::Bench {
            storm: true,
            seconds,
            ..
        } => {
            if !(seconds.is_finite() && (0.5..=600.0).contains(&seconds)) {
                usage("--seconds must be between 0.5 and 600");
            }
            finish(tracer::stress::storm(seconds))
        }
        Command::Bench {
            rss_one: Some(one), ..
        } => finish(tracer::stress::rss_one(one[0], one[1] as u32)),
        Command::Bench {
            rss: true, blocks, ..
        } => {
            if !(10_000..=100_000_000).contains(&blocks) {
                usage("--blocks must be between 10000 and 100000000");
            }
            finish(tracer::stress::rss_bench(blocks))
        }
        Command::Bench {
            api: true, serve, ..
        } => finish(tracer::api::bench::run(serve.as_deref())),
        Command::Bench { pairs, rounds, .. } => {
            if pairs == 0 || rounds == 0 {
                usage("--pairs and --rounds must be at least 1");
            }
            finish(tracer::bench::run(pairs, rounds))
        }
        Command::BenchStorm {
            threads,
            seconds,
            file,
        } => workload_result(
            &file,
            tracer::stress::storm_workload(threads.clamp(1, 64), seconds),
        ),
        Command::BenchHold { blocks, file } => {
            workload_result(&file, tracer::stress::hold_workload(blocks))
        }
        Command::BenchWorkload {
            pairs,
            file,
            big_frame,
        } => workload_result(&file, tracer::bench::workload(pairs.max(1), big_frame)),
        Command::Run { report, command } => (Target::Launch(command), report),
        Command::Check {
            report,
            budget,
            kinds,
            junit,
            command,
        } => check(report, &budget, &kinds, junit.as_deref(), command),
        Command::Serve {
            mut report,
            pids,
            comms,
            cgroups,
            cuda,
            all,
            scan,
        } => {
            if !(scan.is_finite() && scan >= 0.05) {
                usage(&format!("--scan must be at least 0.05 seconds, got {scan}"));
            }
            let filter = tracer::serve::Filter {
                pids,
                comms,
                cgroups,
                cuda,
                all,
            };
            let filter = filter.validate().unwrap_or_else(|e| finish(Err(e)));
            report.ui.get_or_insert_with(|| "127.0.0.1:7878".into());
            (Target::Serve { filter, scan }, report)
        }
        Command::Attach {
            report,
            pid,
            duration,
        } => {
            if let Some(d) = duration
                && !(d.is_finite() && d > 0.0)
            {
                usage(&format!(
                    "--duration must be a positive number of seconds, got {d}"
                ));
            }
            (Target::Attach { pid, duration }, report)
        }
    };
    if let Err(msg) = report.validate() {
        usage(&msg);
    }
    finish(session::run(target, report).map(|o| o.exit_code))
}

/// `leaktracer report`: a stored run, or the list of runs. A history that cannot be read exits 6,
/// a run or snapshot not in it 2.
fn stored(
    store: Option<std::path::PathBuf>,
    list: bool,
    run: Option<i64>,
    snapshot: Option<i64>,
    top: usize,
    json: bool,
    exports: &tracer::cli::Exports,
) -> ! {
    use tracer::{report, store::Store};
    let path = store.unwrap_or_else(tracer::store::default_path);
    let fail = |code: i32, msg: &str| -> ! {
        eprintln!("leaktracer: {msg}");
        std::process::exit(code)
    };
    let db = Store::open_read(&path).unwrap_or_else(|e| fail(exit::STORE, &e));
    if list {
        let runs = db.runs().unwrap_or_else(|e| fail(exit::STORE, &e));
        if json {
            println!("{}", serde_json::to_string(&runs).unwrap_or_default());
        } else {
            print!("{}", tracer::store::runs_text(&runs));
        }
        std::process::exit(0);
    }
    let run = match run {
        Some(r) => r,
        None => db.last_run().unwrap_or_else(|e| fail(exit::USAGE, &e)),
    };
    let snap = db
        .snapshot(run, snapshot.unwrap_or(-1))
        .unwrap_or_else(|e| fail(exit::USAGE, &e));
    let r = snap.report;
    if json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        println!(
            "run {run}, snapshot {} ({}, {})",
            snap.seq,
            snap.reason,
            tracer::store::when(snap.taken_unix)
        );
        let mut shown = r.clone();
        shown.stacks.truncate(top.max(1));
        print!("{}", report::text(&shown));
    }
    let stamp = (snap.taken_unix * 1e9) as i64;
    if let Err(e) = report::export::write(&r, exports, stamp) {
        fail(exit::FAILURE, &e);
    }
    std::process::exit(0)
}

/// `leaktracer diff`: a report file or stored snapshot that cannot be read is a bad argument
/// (exit 2).
fn diff(store: Option<std::path::PathBuf>, old: &str, new: &str, top: usize, json: bool) -> ! {
    use tracer::report::diff;
    let store = store.unwrap_or_else(tracer::store::default_path);
    let (old, new) = match (diff::load(old, &store), diff::load(new, &store)) {
        (Ok(o), Ok(n)) => (o, n),
        (Err(e), _) | (_, Err(e)) => usage(&e),
    };
    let deltas = diff::diff(&old, &new);
    if json {
        match serde_json::to_string(&deltas) {
            Ok(s) => println!("{s}"),
            Err(e) => usage(&e.to_string()),
        }
    } else {
        print!("{}", diff::text(&deltas, top));
    }
    std::process::exit(0)
}

/// `leaktracer check`: every failure of leaktracer itself exits 2 here (see tracer::check).
fn check(
    mut report: tracer::cli::ReportArgs,
    budget: &str,
    kinds: &[String],
    junit: Option<&std::path::Path>,
    command: Vec<String>,
) -> ! {
    use tracer::check;
    let fail = |msg: &str| -> ! {
        eprintln!("leaktracer: {msg}");
        std::process::exit(check::exit::TOOL)
    };
    let budget = check::parse_budget(budget).unwrap_or_else(|e| fail(&e));
    let kinds = check::parse_kinds(kinds).unwrap_or_else(|e| fail(&e));
    if let Err(msg) = report.validate() {
        fail(&msg);
    }
    if budget.per_step != report.step_symbol.is_some() {
        fail(if budget.per_step {
            "a per-step budget needs --step-symbol (the function that marks each step)"
        } else {
            "with --step-symbol, slopes are per step: give the budget per step (e.g. 1MiB/step)"
        });
    }
    // Every stack gets a verdict; the full report goes to -o only.
    report.top = usize::MAX;
    if report.output.is_none() {
        report.output = Some("/dev/null".into());
    }
    let outcome =
        session::run(Target::Launch(command), report).unwrap_or_else(|e| fail(&e.to_string()));
    let findings = check::findings(&outcome.last, budget, &kinds);
    print!("{}", check::summary(&findings, budget, outcome.exit_code));
    if let Some(path) = junit {
        let xml = check::junit(&findings, budget, outcome.exit_code);
        check::write_junit(path, &xml).unwrap_or_else(|e| fail(&e));
    }
    std::process::exit(check::exit_code(&findings, outcome.exit_code))
}

fn finish(result: Result<i32, tracer::error::Error>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("leaktracer: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("leaktracer: {msg}");
    std::process::exit(exit::USAGE);
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Writes a benchmark workload's result and exits.
fn workload_result(file: &std::path::Path, value: impl std::fmt::Display) -> ! {
    if let Err(e) = std::fs::write(file, format!("{value}\n")) {
        eprintln!("leaktracer: writing {}: {e}", file.display());
        std::process::exit(exit::FAILURE);
    }
    std::process::exit(0);
}
