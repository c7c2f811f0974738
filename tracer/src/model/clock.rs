//! The clocks: the kernel's monotonic clock that events are stamped with, wall time for the
//! history, and a thread's CPU time for what the tracer's own work costs.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds on the clock bpf_ktime_get_ns() uses.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The calling thread's CPU time in ns: what its work cost, whatever else ran on its CPU
/// meanwhile.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A process's CPU time so far, all its threads, in seconds: `total`, user and system; `user`,
/// its own code's alone. The kernel's time in its probes' handlers is system time: `user` goes
/// on at the pace of the program's own work, however slowly its probes make it run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub total: f64,
    pub user: f64,
}

/// Wall time, nanoseconds since the Unix epoch.
pub fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Wall time, seconds since the Unix epoch.
pub fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
