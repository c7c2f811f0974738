//! The shared vocabulary, at the bottom of the tree: what every stage names and none owns. Kinds
//! of memory and the group key, stack ids and frames, the heap mode, the clocks. Nothing here
//! imports another module of the crate.

mod clock;
mod heap;
mod kind;
mod stack;

pub use clock::{CpuTimes, monotonic_ns, now_unix, now_unix_ns, thread_cpu_ns};
pub use heap::{HeapAfter, HeapAsked, HeapMode, HeapTracing, HeapUnwind, TensorsMode};
pub use kind::{GroupKey, Kind};
pub use stack::{Frame, StackId};
