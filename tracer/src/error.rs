//! Errors a user can cause or meet, each with its own exit code (documented in README.md).

/// Exit codes of `leaktracer` itself. `run` otherwise exits with the traced command's status.
pub mod exit {
    /// Internal or unexpected failure.
    pub const FAILURE: i32 = 1;
    /// Invalid command line (clap's own code).
    pub const USAGE: i32 = 2;
    /// The target process does not exist or cannot be traced (kernel thread, no libc).
    pub const TARGET: i32 = 3;
    /// Not root / missing CAP_BPF, CAP_PERFMON or CAP_SYS_ADMIN.
    pub const PERMISSION: i32 = 4;
    /// The kernel lacks something needed: BTF, uprobes, tracepoints, tracefs.
    pub const KERNEL: i32 = 5;
    /// The history file (--store) cannot be opened or is not a leaktracer history.
    pub const STORE: i32 = 6;
    /// The command to run was not found or is not executable (shell convention).
    pub const NOT_FOUND: i32 = 127;
}

/// An error with a one-line message for the user and an exit code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error("pid {0} is a kernel thread: it has no user-space memory to trace")]
    KernelThread(i32),
    #[error("no libc found in the memory maps of pid {0}: nothing to attach the heap probes to")]
    NoLibc(i32),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("permission denied: {0} (run as root, or with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)")]
    Permission(String),
    #[error("kernel support missing: {0}")]
    Kernel(String),
    #[error("{0}")]
    Store(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::NoSuchProcess(_) | Error::KernelThread(_) | Error::NoLibc(_) => exit::TARGET,
            Error::CommandNotFound(_) => exit::NOT_FOUND,
            Error::Permission(_) => exit::PERMISSION,
            Error::Kernel(_) => exit::KERNEL,
            Error::Store(_) => exit::STORE,
            Error::Usage(_) => exit::USAGE,
            Error::Other(_) => exit::FAILURE,
        }
    }
}
