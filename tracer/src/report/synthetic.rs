//! A synthetic ledger and its report, with no probes: what the unit tests of the report, its
//! renderers, the store and the API are fed, and what the verdict and API benchmarks measure.

use std::sync::Arc;

use tracer_common::AllocFn;

use super::{Context, Report, build};
use crate::{
    analysis::Analysis,
    ingest::{Event, Input, What},
    ledger::Ledger,
    model::{Frame, StackId},
    symbolize::Symbolizer,
};

/// A ledger with `n` outstanding stacks of 3 frames, one block each, sampled `samples` times.
pub fn ledger_with(n: u32, samples: u32) -> (Ledger, Analysis) {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "bench".into(), Vec::new(), 0);
    let mut analysis = Analysis::tracking_every_group();
    for id in 1..=n {
        let frames: Arc<[Frame]> = (0..3u64)
            .map(|k| Frame {
                module: None,
                offset: 0x1000 + u64::from(id) * 16 + k,
                addr: 0x1000 + u64::from(id) * 16 + k,
            })
            .collect();
        ledger.apply(Input::Stack {
            id: StackId::new(id),
            frames,
            truncated: false,
        });
    }
    for round in 0..samples {
        for id in 1..=n {
            ledger.apply(Input::Event(Event {
                tgid: 1,
                tid: 0,
                ts_ns: 1,
                func: Some(AllocFn::Malloc),
                stack: Some(StackId::new(id)),
                what: What::Alloc {
                    addr: u64::from(round) << 40 | u64::from(id) << 8,
                    size: 64,
                },
            }));
        }
        analysis.sample(f64::from(round), &ledger, &ledger.group_bytes());
    }
    (ledger, analysis)
}

/// The report of `top` stacks (final, at time 0) of a ledger and its analysis.
pub fn report_of(ledger: &Ledger, analysis: &Analysis, top: usize) -> Report {
    let mut sym = Symbolizer::default();
    let nvml = crate::gpu::Sample::default();
    let cx = Context {
        final_report: true,
        elapsed_s: 0.0,
        now_ns: 0,
        top,
        probes: &[],
        libraries: &[],
        failures: &[],
        nvml: &nvml,
        analysis,
        warmup_s: 0.0,
        per_step: false,
        heap: Default::default(),
        probe_cost: Vec::new(),
    };
    build(ledger, &mut sym, &cx)
}
