//! Python stacks (in progress): resolving CPython code objects to file, function and line.

pub mod linetable;
