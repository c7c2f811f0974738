//! The `leaktracer` binary: parse, validate, run a session, map errors to exit codes.

use clap::Parser;
use tracer::{
    cli::Cli,
    config::{Config, Gate, Job, Stored},
    error::{Error, exit},
    render, session,
    store::{self, Store},
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
    let job = Job::new(cli.command).unwrap_or_else(|e| finish(Err(e)));
    exit_on_panic(if matches!(job, Job::Check { .. }) {
        tracer::check::exit::TOOL
    } else {
        exit::FAILURE
    });
    match job {
        Job::Session { target, config } => {
            finish(session::run(target, config).map(|o| o.exit_code))
        }
        Job::Check {
            command,
            config,
            gate,
        } => check(command, config, &gate),
        Job::Diff {
            store,
            old,
            new,
            top,
            json,
        } => diff(&store, &old, &new, top, json),
        Job::Stored {
            store,
            show,
            top,
            json,
            exports,
        } => stored(&store, show, top, json, &exports),
        Job::Bench(bench) => finish(tracer::bench::run(bench)),
        Job::HoldGuard { root, tracer } => {
            std::process::exit(tracer::hold::guard::watch(root, tracer))
        }
    }
}

/// `leaktracer report`: a stored run, or the list of runs. A history that cannot be read exits 6,
/// a run or snapshot not in it 2.
fn stored(
    path: &std::path::Path,
    show: Stored,
    top: usize,
    json: bool,
    exports: &render::Exports,
) -> ! {
    let fail = |code: i32, msg: &str| -> ! {
        tracer::say!("leaktracer: {msg}");
        std::process::exit(code)
    };
    let db = Store::open_read(path).unwrap_or_else(|e| fail(exit::STORE, &e.to_string()));
    let (run, snapshot) = match show {
        Stored::List => {
            let runs = db
                .runs()
                .unwrap_or_else(|e| fail(exit::STORE, &e.to_string()));
            if json {
                print_out(
                    &format!("{}\n", serde_json::to_string(&runs).unwrap_or_default()),
                    exit::FAILURE,
                );
            } else {
                print_out(&store::runs_text(&runs), exit::FAILURE);
            }
            std::process::exit(0);
        }
        Stored::Snapshot { run, snapshot } => (run, snapshot),
    };
    let run = match run {
        Some(r) => r,
        None => db
            .last_run()
            .unwrap_or_else(|e| fail(exit::USAGE, &e.to_string())),
    };
    let snap = db
        .snapshot(run, snapshot.unwrap_or(-1))
        .unwrap_or_else(|e| fail(exit::USAGE, &e.to_string()));
    let r = snap.report;
    if json {
        print_out(
            &format!("{}\n", serde_json::to_string(&r).unwrap_or_default()),
            exit::FAILURE,
        );
    } else {
        print_out(
            &format!(
                "run {run}, snapshot {} ({}, {})\n",
                snap.seq,
                snap.reason,
                store::when(snap.taken_unix)
            ),
            exit::FAILURE,
        );
        let mut shown = r.clone();
        shown.stacks.truncate(top.max(1));
        print_out(&render::text(&shown), exit::FAILURE);
    }
    let stamp = (snap.taken_unix * 1e9) as i64;
    if let Err(e) = render::export::write(&r, exports, stamp) {
        fail(exit::FAILURE, &e.to_string());
    }
    std::process::exit(0)
}

/// `leaktracer diff`: a report file or stored snapshot that cannot be read is a bad argument
/// (exit 2).
fn diff(store: &std::path::Path, old: &str, new: &str, top: usize, json: bool) -> ! {
    use tracer::store::diff;
    let (old, new) = match (diff::load(old, store), diff::load(new, store)) {
        (Ok(o), Ok(n)) => (o, n),
        (Err(e), _) | (_, Err(e)) => usage(&e.to_string()),
    };
    let deltas = diff::diff(&old, &new);
    if json {
        match serde_json::to_string(&deltas) {
            Ok(s) => print_out(&format!("{s}\n"), exit::FAILURE),
            Err(e) => usage(&e.to_string()),
        }
    } else {
        print_out(&diff::text(&deltas, top), exit::FAILURE);
    }
    std::process::exit(0)
}

/// `leaktracer check`: every failure of leaktracer itself exits 2 here (see tracer::check).
fn check(command: Vec<String>, config: Config, gate: &Gate) -> ! {
    use tracer::check;
    let fail = |msg: &str| -> ! {
        tracer::say!("leaktracer: {msg}");
        std::process::exit(check::exit::TOOL)
    };
    let outcome = session::run(tracer::config::Target::Launch(command), config)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let run = check::Run {
        command_status: outcome.exit_code,
        unprobed: &outcome.last.probe_failures,
    };
    let findings = check::findings(
        &outcome.last,
        gate.budget,
        &gate.kinds,
        gate.pages_of_untraced,
    );
    print_out(
        &check::summary(&findings, gate.budget, run),
        check::exit::TOOL,
    );
    let last = &outcome.last;
    let notes = tracer::render::layer_notes(last);
    for note in notes.into_iter().chain(tracer::render::pages_notes(last)) {
        print_out(&format!("  note: {note}\n"), check::exit::TOOL);
    }
    if let Some(path) = &gate.junit {
        let xml = check::junit(&findings, gate.budget, run);
        check::write_junit(path, &xml).unwrap_or_else(|e| fail(&e.to_string()));
    }
    std::process::exit(check::exit_code(&findings, run))
}

fn finish(result: Result<i32, Error>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            tracer::say!("leaktracer: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

/// A panic anywhere, in any thread, ends leaktracer with `code` after its message: a session
/// whose ingest, owner or hold thread died would otherwise go on half alive, its report wrong or
/// its job held. The kernel then detaches the job, and the guard (`hold::guard`) continues what
/// was held.
fn exit_on_panic(code: i32) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracer::say!("leaktracer: internal error (above); the traced job goes on untraced");
        std::process::exit(code);
    }));
}

/// `text` on stdout; where it could not be written (other than to a reader that stopped
/// reading), leaktracer ends with `code` after saying so.
fn print_out(text: &str, code: i32) {
    if !tracer::say::stdout(text) {
        std::process::exit(code);
    }
}

fn usage(msg: &str) -> ! {
    tracer::say!("leaktracer: {msg}");
    std::process::exit(exit::USAGE);
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Its fallback for a failed write is `eprintln!`, which panics when stderr is gone.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .init();
}
