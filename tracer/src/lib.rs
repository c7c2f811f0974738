//! leaktracer: an eBPF leak tracer. Data flows one way, and the modules are layered the same way
//! (each imports only those below it):
//!
//! ```text
//! main → config (flags → Config) → session (the owner) → bench (behind its subcommand)
//!          probes → ingest → ledger → analysis → report → render · store · api · check
//!          python · hold · launch · serve · symbolize · gpu
//!          model (shared vocabulary) · procfs (every /proc read) · kernel_types (its BTF)
//!          error · fault · say (lines for the terminal)
//! ```

pub mod analysis;
pub mod api;
pub mod bench;
pub mod check;
pub mod cli;
pub mod config;
pub mod error;
pub mod fault;
pub mod gpu;
pub mod hold;
pub mod ingest;
pub mod kernel_types;
pub mod launch;
pub mod ledger;
pub mod model;
pub mod probes;
pub mod procfs;
pub mod python;
pub mod render;
pub mod report;
pub mod say;
pub mod serve;
pub mod session;
pub mod store;
pub mod symbolize;
