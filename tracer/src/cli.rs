//! The command line (clap derive): every flag documented here. Raw flags go to `config`, which
//! validates them; nothing else reads them.

use std::path::PathBuf;

/// The event ring's default size (tracer_common::RINGBUF_BYTES, in MiB). A 2-core machine drains
/// over a million records a second in an allocation storm, where 16 MiB loses nothing; a consumer
/// slowed by work per record (a Python process with PYTHONMALLOC=malloc: a new stack per object,
/// each resolved) needs more room for its bursts. Every MiB is a MiB of resident memory.
pub const DEFAULT_RING_MB: u32 = tracer_common::RINGBUF_BYTES >> 20;

use clap::{Args, Parser, Subcommand};

/// leaktracer: which call stacks of a process tree hold memory, from eBPF, with no code change.
#[derive(Debug, Parser)]
#[command(name = "leaktracer", version, about)]
pub struct Cli {
    /// Log more (-v: info, -vv: debug); logs go to stderr. RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start CMD with the probes attached before its first instruction, follow its children, report
    /// while it runs and at exit. Exits with CMD's exit status.
    Run {
        #[command(flatten)]
        report: ReportArgs,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<String>,
    },
    /// Trace a running process (and the children it creates from now on) until Ctrl-C, the
    /// duration, or its exit.
    Attach {
        #[command(flatten)]
        report: ReportArgs,
        /// Process id to trace.
        pid: i32,
        /// Stop after this many seconds.
        #[arg(long, value_name = "S")]
        duration: Option<f64>,
    },
    /// The daemon: trace every process a filter matches (running now or started later, and their
    /// children) until Ctrl-C or SIGTERM, with the explorer served (127.0.0.1:7878 unless --ui
    /// says otherwise). At least one filter, or --all.
    Serve {
        #[command(flatten)]
        report: ReportArgs,
        /// A process id (repeatable).
        #[arg(long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// A command name: the kernel's name for the process or argv[0]'s file name (repeatable).
        #[arg(long = "comm", value_name = "NAME")]
        comms: Vec<String>,
        /// A cgroup, as /proc/PID/cgroup shows it or as its directory under /sys/fs/cgroup;
        /// processes in it or below it (repeatable).
        #[arg(long = "cgroup", value_name = "PATH")]
        cgroups: Vec<String>,
        /// Every process that maps the CUDA runtime or driver (libcudart, libcuda).
        #[arg(long)]
        cuda: bool,
        /// Every process on the machine (but leaktracer and kernel threads): system-wide.
        #[arg(long)]
        all: bool,
        /// Seconds between looks at /proc for processes to adopt.
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        scan: f64,
    },
    /// The CI gate: run CMD under the tracer and fail (exit 1) when a site (a line's stacks of one
    /// kind together) leaks faster than the budget. Exit 0 clean, 1 leak over budget, 2 leaktracer failed, 3 CMD failed (no leak over
    /// budget). Reports (-o, --json) hold the 1000 largest stacks and every leak, with verdicts.
    Check {
        #[command(flatten)]
        report: ReportArgs,
        /// Leak rate allowed per site (a line's stacks of one kind together): AMOUNT/PERIOD with B, KB, MB, GB, KiB, MiB, GiB and s, min,
        /// h (e.g. 10MiB/min).
        #[arg(long, value_name = "RATE", default_value = "1MiB/min")]
        budget: String,
        /// Kinds checked, comma-separated (heap, mmap, brk, tensor, device, managed, pinned,
        /// torch_block). Default: all but the page-level mmap and brk (memory malloc maps is the
        /// same as its blocks); name them to check direct mappings too.
        #[arg(long, value_name = "KINDS", value_delimiter = ',')]
        kinds: Vec<String>,
        /// Also write the result as JUnit XML (one testcase per leaking stack) to FILE.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<String>,
    },
    /// Compare two snapshots: per-stack change, new and vanished stacks. Each is a report file
    /// written with --json -o FILE (FILE:N picks the Nth report, negative from the end, the last
    /// by default) or a stored snapshot, run:ID or run:ID:N.
    Diff {
        /// History file for run:ID snapshots (default as for `run`).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
        /// The earlier report.
        old: String,
        /// The later report.
        new: String,
        /// Changes listed.
        #[arg(long, value_name = "N", default_value_t = 20)]
        top: usize,
        /// Every change as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a stored run: its last snapshot (or --snapshot N) as text or JSON, or export it;
    /// --list shows the runs stored.
    Report {
        /// History file (default as for `run`).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
        /// List the stored runs.
        #[arg(long, conflicts_with_all = ["run", "snapshot"])]
        list: bool,
        /// The run (default: the newest).
        #[arg(long, value_name = "ID")]
        run: Option<i64>,
        /// The snapshot's number in the run (negative: from the end; default: the last).
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        snapshot: Option<i64>,
        /// Stacks listed in text.
        #[arg(long, value_name = "N", default_value_t = 10)]
        top: usize,
        /// JSON (schema leaktracer.report/1) instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        exports: ExportArgs,
    },
    /// Measure ns per malloc+free pair: untraced, empty probes (the floor), leaktracer, and
    /// leaktracer with `free` probed at +0, in one run with ratios.
    Bench {
        /// malloc+free pairs per measurement.
        #[arg(long, default_value_t = 200_000)]
        pairs: u64,
        /// Measurements per configuration (the median is reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Measure the verdict analysis instead (no probes): steps until a leak is flagged,
        /// memory per stack series, report latency with 100k stacks.
        #[arg(long, conflicts_with = "api")]
        verdicts: bool,
        /// Measure the explorer API instead (no probes): publishing a report from 100k stacks and
        /// 1M outstanding allocations, and the latency of its requests (p50, p99).
        #[arg(long)]
        api: bool,
        /// With --api: then serve the explorer on ADDR with the 100k-stack report (for measuring
        /// the page's load), until Ctrl-C.
        #[arg(long, value_name = "ADDR", requires = "api")]
        serve: Option<String>,
        /// Measure an allocation storm instead: 1, 2 and 4 threads allocating as fast as they
        /// can under --heap full and sampled: the event rate, losses, and the ledger after.
        #[arg(long, conflicts_with_all = ["api", "verdicts", "rss"])]
        storm: bool,
        /// Seconds per storm.
        #[arg(long, default_value_t = 3.0, requires = "storm")]
        seconds: f64,
        /// Measure the tracer's memory instead, with BLOCKS allocations outstanding across 10,000
        /// stacks.
        #[arg(long, conflicts_with_all = ["api", "verdicts"])]
        rss: bool,
        /// Allocations held with --rss.
        #[arg(long, default_value_t = 1_000_000, requires = "rss")]
        blocks: u64,
        /// One run of --rss (internal): BLOCKS and the ring's MiB.
        #[arg(long, num_args = 2, value_names = ["BLOCKS", "RING_MB"], hide = true)]
        rss_one: Option<Vec<u64>>,
    },
    /// The benchmark's workload (internal): PAIRS malloc+free pairs, ns per pair written to FILE.
    #[command(hide = true)]
    BenchWorkload {
        pairs: u64,
        file: PathBuf,
        /// The loop runs below a function with a 6000-byte frame.
        #[arg(long)]
        big_frame: bool,
    },
    /// The storm's workload (internal): THREADS threads for SECONDS, pairs made written to FILE.
    #[command(hide = true)]
    BenchStorm {
        threads: usize,
        seconds: f64,
        file: PathBuf,
    },
    /// The memory benchmark's workload (internal): BLOCKS allocations kept across 10,000
    /// stacks, their number written to FILE.
    #[command(hide = true)]
    BenchHold { blocks: u64, file: PathBuf },
    /// The guard of a held job (internal): continues ROOT's stopped processes if TRACER, its
    /// parent, ends without writing to its standard input.
    #[command(hide = true)]
    HoldGuard { root: u32, tracer: u32 },
}

/// Report options shared by `run` and `attach`.
#[derive(Debug, Args, Clone)]
pub struct ReportArgs {
    /// Print a report every S seconds while tracing (0: only the final one).
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    pub interval: f64,
    /// Stacks listed per report.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Reports as JSON (one document per line, schema leaktracer.report/1) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write reports to FILE instead of stdout (the traced command keeps stdout).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Sample every stack's outstanding bytes every S seconds, for verdicts (leak, spike, bounded
    /// cache, steady). Default: every 50 ms at the start, slowing as the run grows to once a
    /// second (a short run is judged too), never more than 5% of the time spent sampling.
    #[arg(long, value_name = "S")]
    pub sample: Option<f64>,
    /// Ignore the first S seconds in verdicts (start-up, model loading, warm-up steps); with
    /// --step-symbol, the first S steps.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    pub warmup: f64,
    /// A function called once per training step (C name, or C++/Rust `path::name`): sample at its
    /// entries instead of every --sample seconds, so verdicts and slopes are per step.
    #[arg(long, value_name = "NAME")]
    pub step_symbol: Option<String>,
    /// What is traced of the heap (the malloc family and PyTorch's CPU tensors): `auto` records
    /// every allocation of native programs, and in Python processes CPU tensors and then the
    /// malloc family only once the process's pages grow steadily (interpreters and libtorch
    /// make millions of mallocs, and a CPU training loop tens of thousands of tensors a second,
    /// each a probe trap, while a correct job's pages hold: pages with their Python lines,
    /// Python objects' arenas and device memory are traced all along); `full` records every
    /// allocation of every process; `sampled` records allocations with probability proportional to their
    /// size (one sample point every --sample-bytes bytes on average, decided in the kernel;
    /// tensors are all recorded) and reports heap bytes scaled up without bias; `off` probes no
    /// heap function: device memory (CUDA) and pages (mmap, brk) only, the cheapest.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto")]
    pub heap: crate::model::HeapMode,
    /// Probe the heap functions only after S seconds of tracing (with --step-symbol: from step
    /// S on), so that start-up's allocations cost nothing (libtorch's static initialisation
    /// makes about a million). Blocks allocated before are not seen, and frees of them count as
    /// unmatched; device memory and pages are traced from the start.
    #[arg(long, value_name = "S")]
    pub heap_after: Option<f64>,
    /// When a Python process's CPU tensors are traced under --heap auto: `auto` once its pages
    /// grow steadily (tensors made before are not seen), `all` from the start (exact tensor
    /// bytes all along, at two probe traps a tensor).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto")]
    pub tensors: crate::model::TensorsMode,
    /// Measure what leaktracer's own programs cost: each one's runs and kernel time, in the
    /// report (`probe_cost`). The kernel's statistics are on for the session and add two clock
    /// reads to every program run; the probe traps themselves are not in the figures.
    #[arg(long)]
    pub probe_cost: bool,
    /// MiB of the kernel's event ring (a power of two from 1 to 1024): what bursts are buffered
    /// in while user space catches up; resident in full.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_RING_MB)]
    pub ring_mb: u32,
    /// Mean bytes between sample points with --heap sampled.
    #[arg(long, value_name = "BYTES", default_value_t = 512 * 1024)]
    pub sample_bytes: u64,
    /// Same as --heap off.
    #[arg(long, hide = true)]
    pub no_heap: bool,
    /// Native stacks only: do not walk the Python frames of CPython processes.
    #[arg(long)]
    pub no_python_stacks: bool,
    /// How heap stacks are taken: `fp` walks frame pointers in the kernel (cheapest; right for
    /// code built with them, but a frame that calls a frameless function such as `operator new`
    /// is skipped); `cfi` copies the stack (a few hundred bytes to 8 KiB per allocation, as each
    /// site needs) and unwinds it with the call-frame information (right for any code, inlined
    /// functions included; costs more, most of it in leaktracer); `auto` copies for executables
    /// built without frame pointers and walks for the rest and for Python interpreters.
    #[arg(long, value_enum, value_name = "HOW", default_value = "auto")]
    pub unwind: crate::model::HeapUnwind,
    /// Serve the leak explorer (the page at /, the read-only JSON API under /api/v1 with live
    /// updates over SSE, /metrics) on ADDR while tracing (`--ui` or `--ui=ADDR`; default
    /// 127.0.0.1:7878, port 0 picks one; off loopback a token is required, see --ui-token); the
    /// URL is printed.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "127.0.0.1:7878"
    )]
    pub ui: Option<String>,
    /// The token every API request must carry (`Authorization: Bearer TOKEN` or
    /// `?token=TOKEN`); generated and printed when --ui is not a loopback address.
    #[arg(long, value_name = "TOKEN", requires = "ui")]
    pub ui_token: Option<String>,
    /// After the traced program ends, keep serving the explorer (with the final report) until
    /// Ctrl-C or SIGTERM.
    #[arg(long, requires = "ui")]
    pub keep_serving: bool,
    /// Serve the explorer page from this directory (a `npm run build` output, for developing
    /// the page) instead of the copy built into the binary.
    #[arg(long, value_name = "DIR", requires = "ui")]
    pub web_dir: Option<PathBuf>,
    #[command(flatten)]
    pub exports: ExportArgs,
    #[command(flatten)]
    pub history: HistoryArgs,
}

/// Files the final report (or a stored snapshot) is also written to.
#[derive(Debug, Args, Clone, Default)]
pub struct ExportArgs {
    /// Collapsed stacks (flamegraph, inferno, speedscope input: kind;outermost;…;innermost BYTES).
    #[arg(long, value_name = "FILE")]
    pub collapsed: Option<PathBuf>,
    /// pprof profile (gzipped protobuf: go tool pprof, Pyroscope, Parca) with inuse_space and
    /// inuse_objects per stack, labelled with pid, kind and verdict.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Prometheus text exposition (what /metrics serves): totals per process and kind, top stacks
    /// with verdicts and slopes, losses.
    #[arg(long, value_name = "FILE")]
    pub prometheus: Option<PathBuf>,
}

/// Where runs are stored and for how long.
#[derive(Debug, Args, Clone)]
pub struct HistoryArgs {
    /// History file (SQLite). Default: $LEAKTRACER_DB, else
    /// $XDG_DATA_HOME/leaktracer/history.db, else ~/.local/share/leaktracer/history.db.
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,
    /// Store nothing.
    #[arg(long, conflicts_with = "store")]
    pub no_store: bool,
    /// Store a snapshot every S seconds (0: only at exit and on SIGUSR1 to leaktracer).
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    pub snapshot: f64,
    /// Remove stored runs older than D days.
    #[arg(long, value_name = "D", default_value_t = 30.0)]
    pub keep_days: f64,
    /// Keep the history under N MiB: oldest runs go first.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub keep_mib: u64,
}

impl ReportArgs {
    /// The options as parsed from `flags` alone (clap's own defaults for the rest), for sessions
    /// started from code (benchmarks, tests).
    pub fn from_flags(flags: &[&str]) -> Result<Self, clap::Error> {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            report: ReportArgs,
        }
        let argv = std::iter::once("leaktracer").chain(flags.iter().copied());
        Only::try_parse_from(argv).map(|o| o.report)
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_keeps_the_commands_own_flags() {
        let cli = Cli::parse_from([
            "leaktracer",
            "run",
            "--top",
            "3",
            "--",
            "prog",
            "--top",
            "-x",
        ]);
        let Command::Run { report, command } = cli.command else {
            panic!("not run")
        };
        assert_eq!(report.top, 3);
        assert_eq!(command, ["prog", "--top", "-x"]);
    }
}
