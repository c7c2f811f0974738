//! What can go wrong with the history, told apart where callers act differently: a file that
//! cannot serve as a history (exit 6 on the command line), a run or snapshot that is not in it (a
//! bad argument), a failed statement, a stored report that does not read back.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file cannot be created or opened, or is not a history this leaktracer reads.
    #[error("{0}")]
    Unusable(String),
    /// A statement failed on an open history.
    #[error("{context}: {source}")]
    Sql {
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A run or snapshot asked for is not in the history.
    #[error("{0}")]
    Missing(String),
    /// A stored report that does not read back.
    #[error("{0}")]
    Unreadable(String),
    /// The writer thread could not start.
    #[error("history thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl StoreError {
    /// A failed statement on the history at `path`.
    pub(super) fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Self + Copy + '_ {
        move |source| Self::Sql {
            context: format!("history {}", path.display()),
            source,
        }
    }

    /// A failed statement, with what was being done.
    pub(super) fn doing(context: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> Self {
        let context = context.into();
        move |source| Self::Sql { context, source }
    }
}
