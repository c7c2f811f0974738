//! Python stacks (in progress): finding the CPython a process runs and resolving its code
//! objects to file, function and line. The kernel side that records a thread's frames at each
//! allocation comes next.

pub mod code;
pub mod interp;
pub mod linetable;
pub mod mem;
pub mod resolve;
#[cfg(test)]
mod tests;
pub mod walk;
