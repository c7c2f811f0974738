//! Renderers: a [`Report`] turned into text, JSON lines, pprof, Prometheus exposition or collapsed
//! stacks. They read the report model and nothing else; the model itself is built in `report`.

pub mod collapsed;
pub mod export;
pub mod pprof;
pub mod prometheus;
mod text;

use crate::report::Report;

pub use export::{ExportError, Exports};
pub use text::{heap_notes, held, human, layer_notes, pages_notes, text};

/// One report as a line of JSON (schema `leaktracer.report/1`).
pub fn json_line(r: &Report) -> serde_json::Result<String> {
    let mut s = serde_json::to_string(r)?;
    s.push('\n');
    Ok(s)
}
