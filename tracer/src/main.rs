//! The `leaktracer` binary: parse, validate, run a session, map errors to exit codes.

use clap::Parser;
use tracer::{
    cli::{Cli, Command},
    error::exit,
    session::{self, Target},
};
use tracing_subscriber::EnvFilter;

fn main() {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let (target, report) = match cli.command {
        Command::Run { report, command } => (Target::Launch(command), report),
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
    match session::run(target, report) {
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
