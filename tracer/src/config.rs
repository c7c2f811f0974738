//! The one place where command-line flags become a validated configuration: every check clap
//! cannot make is here, and everything downstream takes the [`Job`] or [`Config`] it yields, never
//! raw flags. A bad value is an [`Error::Usage`] (exit 2) naming the flag.

use std::{net::SocketAddr, path::PathBuf};

use crate::{
    api::assets::Web,
    check::{self, Budget},
    cli::{Command, ExportArgs, HistoryArgs, ReportArgs},
    error::Error,
    model::{HeapAfter, HeapMode, HeapTracing, HeapUnwind, Kind, TensorsMode},
    render::Exports,
    serve, store,
};

/// What a command line asks for, validated.
pub enum Job {
    /// `run`, `attach`, `serve`: a tracing session.
    Session { target: Target, config: Config },
    /// `check`: a session whose final report is held against a budget.
    Check {
        command: Vec<String>,
        config: Config,
        gate: Gate,
    },
    /// `diff`: two reports compared.
    Diff {
        store: PathBuf,
        old: String,
        new: String,
        top: usize,
        json: bool,
    },
    /// `report`: a stored run shown or exported.
    Stored {
        store: PathBuf,
        show: Stored,
        top: usize,
        json: bool,
        exports: Exports,
    },
    /// `bench` and its internal workloads.
    Bench(Bench),
    /// The guard of a held job (see [`crate::hold::guard`]).
    HoldGuard { root: u32, tracer: u32 },
}

/// What `report` shows of the history.
pub enum Stored {
    List,
    /// A run (the newest when `None`) and its snapshot (the last when `None`; negative from the
    /// end).
    Snapshot {
        run: Option<i64>,
        snapshot: Option<i64>,
    },
}

/// What `check` holds the final report against.
pub struct Gate {
    pub budget: Budget,
    pub kinds: Vec<Kind>,
    /// No kinds named: the page-level stacks of processes whose malloc family was not traced are
    /// checked too (their heap is seen as pages only).
    pub pages_of_untraced: bool,
    pub junit: Option<PathBuf>,
}

/// The benchmarks (`bench`) and the workloads they start as child processes.
pub enum Bench {
    Pairs {
        pairs: u64,
        rounds: usize,
    },
    Verdicts,
    Api {
        serve: Option<String>,
    },
    Storm {
        seconds: f64,
    },
    Rss {
        blocks: u64,
    },
    RssOne {
        blocks: u64,
        ring_mb: u32,
    },
    PairsWorkload {
        pairs: u64,
        file: PathBuf,
        big_frame: bool,
    },
    StormWorkload {
        threads: usize,
        seconds: f64,
        file: PathBuf,
    },
    HoldWorkload {
        blocks: u64,
        file: PathBuf,
    },
}

/// What to trace.
pub enum Target {
    Launch(Vec<String>),
    Attach {
        pid: i32,
        duration: Option<f64>,
    },
    /// `serve`: every process the filter matches, looked for every `scan` seconds, until Ctrl-C.
    Serve {
        filter: serve::Filter,
        scan: f64,
    },
}

/// Which command a session runs for; the history stores its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    Run,
    Check,
    Attach,
    Serve,
}

impl RunMode {
    pub fn name(self) -> &'static str {
        match self {
            RunMode::Run => "run",
            RunMode::Check => "check",
            RunMode::Attach => "attach",
            RunMode::Serve => "serve",
        }
    }
}

/// Stacks in `check`'s reports (its -o): the largest this many, and every one judged a leak
/// besides. Each listed stack is symbolized, and a PyTorch process under `--heap full` holds
/// hundreds of thousands (its import's): listing them all took gigabytes and a minute at the
/// end of a run with two DataLoader workers.
pub const CHECK_TOP: usize = 1000;

/// A tracing session's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub mode: RunMode,
    /// Seconds between printed reports (0: only the final one).
    pub interval: f64,
    /// Stacks listed per report.
    pub top: usize,
    pub json: bool,
    /// Where reports go (stdout when `None`).
    pub output: Option<PathBuf>,
    /// When verdict samples are taken by time (with a step symbol they are taken per step).
    pub sample: Sampling,
    /// Seconds (or steps) left out of verdicts.
    pub warmup: f64,
    pub step_symbol: Option<String>,
    /// What is traced of the heap, `--no-heap` folded in.
    pub heap: HeapTracing,
    pub probe_cost: bool,
    /// The event ring's size in bytes.
    pub ring_bytes: u32,
    pub python_stacks: bool,
    /// `--unwind`: how heap stacks are taken.
    pub unwind: HeapUnwind,
    pub ui: Option<UiConfig>,
    pub exports: Exports,
    pub history: Option<HistoryConfig>,
}

/// How often verdict samples are taken by time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// `--sample S`.
    Every(f64),
    /// The default: fine at the start, slower as the run grows (session/sampling.rs).
    Adaptive,
}

/// `--ui` and its options.
#[derive(Clone, Debug)]
pub struct UiConfig {
    pub addr: SocketAddr,
    /// `--ui-token` as given (off loopback without one, the session makes one).
    pub token: Option<String>,
    pub keep_serving: bool,
    pub web: Web,
}

/// Where runs are stored.
#[derive(Clone, Debug)]
pub struct HistoryConfig {
    pub path: PathBuf,
    /// Named with --store: a file that cannot be used is an error, not a warning.
    pub named: bool,
    /// Seconds between periodic snapshots (0: at exit and on SIGUSR1 only).
    pub snapshot: f64,
    pub retention: store::Retention,
}

impl Config {
    /// Verdict slopes are per step (`--step-symbol`), not per second.
    pub fn per_step(&self) -> bool {
        self.step_symbol.is_some()
    }

    /// The options as parsed from `flags` alone (clap's defaults for the rest), validated, for
    /// sessions started from code (benchmarks, tests).
    pub fn from_flags(flags: &[&str], mode: RunMode) -> Result<Self, Error> {
        let args = ReportArgs::from_flags(flags).map_err(|e| Error::Usage(e.to_string()))?;
        Config::new(args, mode)
    }

    /// Validates the report options of a session.
    pub fn new(a: ReportArgs, mode: RunMode) -> Result<Self, Error> {
        let heap = heap_tracing(&a)?;
        non_negative("--interval", a.interval)?;
        non_negative("--warmup", a.warmup)?;
        if a.top == 0 {
            return usage("--top must be at least 1".into());
        }
        if !(a.ring_mb.is_power_of_two() && a.ring_mb <= 1024) {
            return usage(format!(
                "--ring-mb must be a power of two from 1 to 1024, got {}",
                a.ring_mb
            ));
        }
        let sample = match a.sample {
            None => Sampling::Adaptive,
            Some(s) if s.is_finite() && s >= 0.01 => Sampling::Every(s),
            Some(s) => return usage(format!("--sample must be at least 0.01 seconds, got {s}")),
        };
        Ok(Config {
            mode,
            interval: a.interval,
            top: a.top,
            json: a.json,
            output: a.output,
            sample,
            warmup: a.warmup,
            step_symbol: a.step_symbol,
            heap,
            probe_cost: a.probe_cost,
            ring_bytes: a.ring_mb << 20,
            python_stacks: !a.no_python_stacks,
            unwind: a.unwind,
            ui: ui_config(a.ui, a.ui_token, a.keep_serving, a.web_dir)?,
            exports: a.exports.into(),
            history: history_config(&a.history)?,
        })
    }
}

/// `--heap`, `--no-heap`, `--sample-bytes` and `--heap-after` as the report states them.
fn heap_tracing(a: &ReportArgs) -> Result<HeapTracing, Error> {
    let mode = match (a.no_heap, a.heap) {
        (true, _) => HeapMode::Off,
        // The malloc family is probed from that point on for every process.
        (false, HeapMode::Auto) if a.heap_after.is_some() => HeapMode::Full,
        (false, mode) => mode,
    };
    if mode == HeapMode::Sampled && !(4096..=1 << 40).contains(&a.sample_bytes) {
        return usage(format!(
            "--sample-bytes must be between 4096 and 2^40, got {}",
            a.sample_bytes
        ));
    }
    if let Some(s) = a.heap_after {
        if !(s.is_finite() && s >= 0.0) {
            return usage(format!(
                "--heap-after must be a non-negative number of seconds (or steps), got {s}"
            ));
        }
        if mode == HeapMode::Off {
            return usage("--heap-after needs the heap traced (--heap full or sampled)".into());
        }
    }
    Ok(HeapTracing {
        mode,
        tensors: match mode {
            HeapMode::Auto => a.tensors,
            _ => TensorsMode::All,
        },
        sample_bytes: (mode == HeapMode::Sampled).then_some(a.sample_bytes),
        after: a.heap_after.map(|s| match a.step_symbol {
            Some(_) => HeapAfter::Steps(s.ceil() as u64),
            None => HeapAfter::Seconds(s),
        }),
    })
}

fn ui_config(
    addr: Option<String>,
    token: Option<String>,
    keep_serving: bool,
    web_dir: Option<PathBuf>,
) -> Result<Option<UiConfig>, Error> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let addr = addr.parse().map_err(|_| {
        Error::Usage(format!(
            "--ui: {addr:?} is not an address like 127.0.0.1:7878"
        ))
    })?;
    if let Some(t) = &token
        && (t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()))
    {
        return usage("--ui-token must be at least 16 printable characters, no spaces".into());
    }
    let web = match web_dir {
        Some(d) => Web::dir(&d)?,
        None => Web::Embedded,
    };
    Ok(Some(UiConfig {
        addr,
        token,
        keep_serving,
        web,
    }))
}

fn history_config(h: &HistoryArgs) -> Result<Option<HistoryConfig>, Error> {
    non_negative("--snapshot", h.snapshot)?;
    if !(h.keep_days.is_finite() && h.keep_days > 0.0) || h.keep_mib == 0 {
        return usage("--keep-days and --keep-mib must be positive".into());
    }
    if h.no_store {
        return Ok(None);
    }
    Ok(Some(HistoryConfig {
        path: h.store.clone().unwrap_or_else(store::default_path),
        named: h.store.is_some(),
        snapshot: h.snapshot,
        retention: store::Retention {
            max_age_days: h.keep_days,
            max_bytes: h.keep_mib.saturating_mul(1 << 20),
        },
    }))
}

impl Job {
    /// Validates a parsed command line.
    pub fn new(command: Command) -> Result<Self, Error> {
        Ok(match command {
            Command::Run { report, command } => Job::Session {
                target: Target::Launch(command),
                config: Config::new(report, RunMode::Run)?,
            },
            Command::Attach {
                report,
                pid,
                duration,
            } => attach(report, pid, duration)?,
            Command::Serve {
                report,
                pids,
                comms,
                cgroups,
                cuda,
                all,
                scan,
            } => {
                let filter = serve::Filter {
                    pids,
                    comms,
                    cgroups,
                    cuda,
                    all,
                };
                serve(report, filter, scan)?
            }
            Command::Check {
                report,
                budget,
                kinds,
                junit,
                command,
            } => check(report, &budget, &kinds, junit, command)?,
            Command::Diff {
                store,
                old,
                new,
                top,
                json,
            } => Job::Diff {
                store: store.unwrap_or_else(store::default_path),
                old,
                new,
                top,
                json,
            },
            Command::Report {
                store,
                list,
                run,
                snapshot,
                top,
                json,
                exports,
            } => Job::Stored {
                store: store.unwrap_or_else(store::default_path),
                show: if list {
                    Stored::List
                } else {
                    Stored::Snapshot { run, snapshot }
                },
                top,
                json,
                exports: exports.into(),
            },
            Command::HoldGuard { root, tracer } => Job::HoldGuard { root, tracer },
            other => Job::Bench(bench(other)?),
        })
    }
}

fn attach(report: ReportArgs, pid: i32, duration: Option<f64>) -> Result<Job, Error> {
    if let Some(d) = duration
        && !(d.is_finite() && d > 0.0)
    {
        return usage(format!(
            "--duration must be a positive number of seconds, got {d}"
        ));
    }
    Ok(Job::Session {
        target: Target::Attach { pid, duration },
        config: Config::new(report, RunMode::Attach)?,
    })
}

fn serve(mut report: ReportArgs, filter: serve::Filter, scan: f64) -> Result<Job, Error> {
    if !(scan.is_finite() && scan >= 0.05) {
        return usage(format!("--scan must be at least 0.05 seconds, got {scan}"));
    }
    let filter = filter.validate()?;
    report.ui.get_or_insert_with(|| "127.0.0.1:7878".into());
    Ok(Job::Session {
        target: Target::Serve { filter, scan },
        config: Config::new(report, RunMode::Serve)?,
    })
}

fn check(
    report: ReportArgs,
    budget: &str,
    kinds: &[String],
    junit: Option<PathBuf>,
    command: Vec<String>,
) -> Result<Job, Error> {
    let bad = |e: check::GateError| Error::Usage(e.to_string());
    let budget = check::parse_budget(budget).map_err(bad)?;
    let kinds_named = kinds;
    let kinds = check::parse_kinds(kinds).map_err(bad)?;
    let mut config = Config::new(report, RunMode::Check)?;
    if budget.per_step != config.per_step() {
        return usage(if budget.per_step {
            "a per-step budget needs --step-symbol (the function that marks each step)".into()
        } else {
            "with --step-symbol, slopes are per step: give the budget per step (e.g. 1MiB/step)"
                .into()
        });
    }
    // The largest stacks (more where --top asks) and every leak get a verdict; the full report
    // goes to -o only.
    config.top = config.top.max(CHECK_TOP);
    config.output.get_or_insert_with(|| "/dev/null".into());
    Ok(Job::Check {
        command,
        config,
        gate: Gate {
            budget,
            pages_of_untraced: kinds_named.is_empty(),
            kinds,
            junit,
        },
    })
}

fn bench(command: Command) -> Result<Bench, Error> {
    Ok(match command {
        Command::Bench { verdicts: true, .. } => Bench::Verdicts,
        Command::Bench {
            storm: true,
            seconds,
            ..
        } => {
            if !(seconds.is_finite() && (0.5..=600.0).contains(&seconds)) {
                return usage("--seconds must be between 0.5 and 600".into());
            }
            Bench::Storm { seconds }
        }
        Command::Bench {
            rss_one: Some(one), ..
        } => Bench::RssOne {
            blocks: one[0],
            ring_mb: one[1] as u32,
        },
        Command::Bench {
            rss: true, blocks, ..
        } => {
            if !(10_000..=100_000_000).contains(&blocks) {
                return usage("--blocks must be between 10000 and 100000000".into());
            }
            Bench::Rss { blocks }
        }
        Command::Bench {
            api: true, serve, ..
        } => Bench::Api { serve },
        Command::Bench { pairs, rounds, .. } => {
            if pairs == 0 || rounds == 0 {
                return usage("--pairs and --rounds must be at least 1".into());
            }
            Bench::Pairs { pairs, rounds }
        }
        Command::BenchWorkload {
            pairs,
            file,
            big_frame,
        } => Bench::PairsWorkload {
            pairs: pairs.max(1),
            file,
            big_frame,
        },
        Command::BenchStorm {
            threads,
            seconds,
            file,
        } => Bench::StormWorkload {
            threads: threads.clamp(1, 64),
            seconds,
            file,
        },
        Command::BenchHold { blocks, file } => Bench::HoldWorkload { blocks, file },
        _ => unreachable!("sessions, check, diff and report are matched by Job::new"),
    })
}

impl From<ExportArgs> for Exports {
    fn from(a: ExportArgs) -> Self {
        Self {
            collapsed: a.collapsed,
            pprof: a.pprof,
            prometheus: a.prometheus,
        }
    }
}

fn non_negative(flag: &str, value: f64) -> Result<(), Error> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        usage(format!(
            "{flag} must be a non-negative number of seconds, got {value}"
        ))
    }
}

fn usage<T>(msg: String) -> Result<T, Error> {
    Err(Error::Usage(msg))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    fn job(argv: &[&str]) -> Result<Job, Error> {
        Job::new(Cli::try_parse_from(argv).expect("parses").command)
    }

    #[test]
    fn bad_interval_and_sample_are_rejected() {
        let Err(Error::Usage(msg)) = job(&["lt", "run", "--interval=-1", "--", "true"]) else {
            panic!("accepted")
        };
        assert!(msg.contains("--interval"), "{msg}");
        let Err(Error::Usage(msg)) = job(&["lt", "run", "--sample", "0", "--", "true"]) else {
            panic!("accepted")
        };
        assert!(msg.contains("--sample"), "{msg}");
    }

    #[test]
    fn each_command_names_its_mode() {
        let modes = [
            (&["lt", "run", "--", "true"][..], RunMode::Run),
            (&["lt", "check", "--", "true"], RunMode::Check),
            (&["lt", "attach", "1"], RunMode::Attach),
            (&["lt", "serve", "--all"], RunMode::Serve),
        ];
        for (argv, mode) in modes {
            let config = match job(argv) {
                Ok(Job::Session { config, .. } | Job::Check { config, .. }) => config,
                _ => panic!("{argv:?}: not a session"),
            };
            assert_eq!(config.mode, mode, "{argv:?}");
        }
    }
}
