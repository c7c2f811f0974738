//! Why a process's Python frames cannot be walked or a code object cannot be read.

#[derive(Clone, Debug, thiserror::Error)]
pub enum PythonError {
    /// An interpreter this tracer does not walk: its version, its build, or a kernel without
    /// what the walk needs.
    #[error("{0}")]
    Unsupported(String),
    /// Memory of the process that does not read as what it should be (a code object, a string).
    #[error("{0}")]
    Unreadable(String),
}
