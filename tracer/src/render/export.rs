//! Writes a report to the export files asked for (--collapsed, --pprof, --prometheus).

use std::path::{Path, PathBuf};

use super::{collapsed, pprof, prometheus};
use crate::report::Report;

/// Files the final report (or a stored snapshot) is also written to.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    pub collapsed: Option<PathBuf>,
    pub pprof: Option<PathBuf>,
    pub prometheus: Option<PathBuf>,
}

/// An export file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing {}: {source}", path.display())]
pub struct ExportError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Writes every export in `to`; `time_unix_ns` stamps the pprof profile.
pub fn write(r: &Report, to: &Exports, time_unix_ns: i64) -> Result<(), ExportError> {
    let put = |path: &Option<PathBuf>, bytes: &dyn Fn() -> Vec<u8>| match path {
        Some(p) => save(p, &bytes()),
        None => Ok(()),
    };
    put(&to.collapsed, &|| collapsed::collapsed(r).into_bytes())?;
    put(&to.pprof, &|| pprof::encode(r, time_unix_ns))?;
    put(&to.prometheus, &|| prometheus::exposition(r).into_bytes())
}

fn save(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    std::fs::write(path, bytes).map_err(|source| ExportError {
        path: path.to_path_buf(),
        source,
    })
}
