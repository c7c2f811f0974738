//! Support for leaktracer's integration tests (tests/it): fixtures built with gcc, the leaktracer
//! binary run on them as a real user would, and the JSON report read back.

pub mod fixture;
pub mod report;
