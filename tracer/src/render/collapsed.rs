//! Collapsed stacks, the input of flamegraph tools (inferno, flamegraph.pl, speedscope): one line
//! per stack, frames outermost first joined by ';', then the outstanding bytes. The kind is the
//! root frame, so heap, device and the rest are separate towers.

use std::fmt::Write as _;

use crate::report::Report;

pub fn collapsed(r: &Report) -> String {
    let mut out = String::new();
    for s in &r.stacks {
        let mut line = s.kind.name().to_string();
        for f in s.frames.iter().rev() {
            line.push(';');
            // ';' and ' ' separate fields in this format.
            let name = f
                .function
                .as_deref()
                .unwrap_or(f.module.as_deref().unwrap_or("??"));
            line.extend(
                name.chars()
                    .map(|c| if c == ';' || c == ' ' { '_' } else { c }),
            );
        }
        let _ = writeln!(out, "{line} {}", s.bytes);
    }
    out
}
