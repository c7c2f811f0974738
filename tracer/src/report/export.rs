//! Writes a report to the export files asked for (--collapsed, --pprof, --prometheus).

use std::path::Path;

use super::{Report, collapsed, pprof, prometheus};
use crate::cli::Exports;

/// Writes every export in `to`; `time_unix_ns` stamps the pprof profile.
pub fn write(r: &Report, to: &Exports, time_unix_ns: i64) -> Result<(), String> {
    let put = |path: &Option<std::path::PathBuf>, bytes: &dyn Fn() -> Vec<u8>| match path {
        Some(p) => save(p, &bytes()),
        None => Ok(()),
    };
    put(&to.collapsed, &|| collapsed::collapsed(r).into_bytes())?;
    put(&to.pprof, &|| pprof::encode(r, time_unix_ns))?;
    put(&to.prometheus, &|| prometheus::exposition(r).into_bytes())
}

fn save(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}
