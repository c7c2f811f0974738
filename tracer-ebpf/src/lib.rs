//! Library target so that `tracer` can list this crate as a build-dependency (its rebuild trigger);
//! the programs themselves are the `tracer` binary of this crate, built for bpfel by tracer/build.rs.
#![no_std]
