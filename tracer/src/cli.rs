//! The command line (clap derive): every flag documented here, validated into a session config.

use std::path::PathBuf;

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
    /// The CI gate: run CMD under the tracer and fail (exit 1) when a stack leaks faster than the
    /// budget. Exit 0 clean, 1 leak over budget, 2 leaktracer failed, 3 CMD failed (no leak over
    /// budget). Reports (-o, --json) hold every stack with its verdict.
    Check {
        #[command(flatten)]
        report: ReportArgs,
        /// Leak rate allowed per stack: AMOUNT/PERIOD with B, KB, MB, GB, KiB, MiB, GiB and s, min,
        /// h (e.g. 10MiB/min).
        #[arg(long, value_name = "RATE", default_value = "1MiB/min")]
        budget: String,
        /// Kinds checked, comma-separated (heap, mmap, brk, tensor, device, managed, pinned,
        /// torch_block); all by default.
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
    /// Compare two snapshots (reports written with --json -o FILE; FILE:N picks the Nth report,
    /// negative from the end, the last by default): per-stack change, new and vanished stacks.
    Diff {
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
        #[arg(long)]
        verdicts: bool,
    },
    /// The benchmark's workload (internal): PAIRS malloc+free pairs, ns per pair written to FILE.
    #[command(hide = true)]
    BenchWorkload { pairs: u64, file: PathBuf },
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
    /// cache, steady).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub sample: f64,
    /// Ignore the first S seconds in verdicts (start-up, model loading, warm-up steps); with
    /// --step-symbol, the first S steps.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    pub warmup: f64,
    /// A function called once per training step (C name, or C++/Rust `path::name`): sample at its
    /// entries instead of every --sample seconds, so verdicts and slopes are per step.
    #[arg(long, value_name = "NAME")]
    pub step_symbol: Option<String>,
    /// At the end, also write the final report's stacks as collapsed stacks (flamegraph input:
    /// kind;outermost;…;innermost BYTES) to FILE.
    #[arg(long, value_name = "FILE")]
    pub collapsed: Option<PathBuf>,
}

impl ReportArgs {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.interval.is_finite() && self.interval >= 0.0) {
            return Err(format!(
                "--interval must be a non-negative number of seconds, got {}",
                self.interval
            ));
        }
        if self.top == 0 {
            return Err("--top must be at least 1".into());
        }
        if !(self.sample.is_finite() && self.sample >= 0.01) {
            return Err(format!(
                "--sample must be at least 0.01 seconds, got {}",
                self.sample
            ));
        }
        if !(self.warmup.is_finite() && self.warmup >= 0.0) {
            return Err(format!(
                "--warmup must be a non-negative number of seconds, got {}",
                self.warmup
            ));
        }
        Ok(())
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

    #[test]
    fn bad_interval_is_rejected() {
        let r = ReportArgs {
            interval: -1.0,
            top: 1,
            json: false,
            output: None,
            sample: 1.0,
            warmup: 0.0,
            step_symbol: None,
            collapsed: None,
        };
        assert!(r.validate().unwrap_err().contains("--interval"));
        let r = ReportArgs {
            interval: 0.0,
            sample: 0.0,
            ..r
        };
        assert!(r.validate().unwrap_err().contains("--sample"));
    }
}
