//! leaktracer: an eBPF leak tracer. Data flows one way: probes → ingest → ledger → report.

pub mod analysis;
pub mod api;
pub mod bench;
pub mod check;
pub mod cli;
pub mod error;
pub mod gpu;
pub mod hold;
pub mod ingest;
pub mod launch;
pub mod ledger;
pub mod probes;
pub mod python;
pub mod report;
pub mod serve;
pub mod session;
pub mod store;
pub mod stress;
pub mod symbolize;
