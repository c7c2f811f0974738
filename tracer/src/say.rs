//! Lines for the user's terminal that never end leaktracer. `eprintln!` and `println!` panic
//! when their stream is gone (stderr or stdout piped into `head`, a log reader that went away,
//! a closed terminal): a session hours into a training job would end there, its report lost, and
//! a panic hook that printed with them would abort. Here the line is lost, not the run.

use std::io::Write;

/// A line on stderr (`format!` arguments); lost if stderr is gone.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::stderr(&format!($($arg)*))
    };
}

/// A line on stdout (`format!` arguments); lost if stdout is gone (a benchmark's table piped
/// into `head`).
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {{
        let _ = $crate::say::stdout(&format!("{}\n", format_args!($($arg)*)));
    }};
}

/// `line` and a newline on stderr, in one write; lost if stderr is gone.
pub fn stderr(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// `text` on stdout, as it is. A reader that stopped reading (`| head`) wanted no more: not a
/// failure. Any other error (a full disk under `> FILE`) is said on stderr, and is `false`.
pub fn stdout(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            stderr(&format!("leaktracer: writing to stdout: {e}"));
            false
        }
        _ => true,
    }
}
