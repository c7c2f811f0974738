//! Letting go of the probes' links once leaktracer has exited, all at once.
//!
//! Releasing a uprobe link waits for an RCU Tasks Trace grace period (about 27 ms each here).
//! At its exit a process closes its descriptors one after another, so the links of a session
//! that traced many processes (a dozen for each native process traced whole) were released one
//! grace period at a time: a shell that ran 300 commands under `run` left 74 s of it behind its
//! one-second run, under the global lock the next session's probes must take to go in. Closed
//! on many threads at once, the waits share their grace periods.

use std::{
    ffi::{c_int, c_void},
    sync::atomic::{AtomicUsize, Ordering},
};

/// Threads the descriptors are closed on. A PyTorch job's ~490 descriptors: closed in 0.9–1.1 s
/// on 128 threads, 1.3–1.4 s on 32; 512 gain nothing more.
const THREADS: usize = 128;
/// Each thread's stack: it calls `close` and returns.
const STACK: usize = 64 << 10;

/// The descriptors open in this process from 3 on (`/proc/self/fd`).
pub(super) fn open_fds() -> Vec<c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let fds = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<c_int>().ok());
    fds.filter(|&fd| fd > 2).collect()
}

/// The threads done closing their share.
static DONE: AtomicUsize = AtomicUsize::new(0);

/// One thread's share of the descriptors.
struct Share {
    fds: *const c_int,
    n: usize,
}

extern "C" fn close_share(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is a `Share` that outlives the thread (see `close_all_at_once`).
    let share = unsafe { &*(arg as *const Share) };
    for i in 0..share.n {
        // SAFETY: within the slice the share was made from.
        unsafe { libc::close(*share.fds.add(i)) };
    }
    DONE.fetch_add(1, Ordering::SeqCst);
    0
}

/// Closes `fds` on [`THREADS`] threads at once and returns once all are closed. For the child
/// [`super::Probes::detach_in_background`] forks: it makes only async-signal-safe calls (`mmap`,
/// `clone`, `close`, `nanosleep`), its threads sharing its memory and descriptors; a share whose
/// thread cannot start is closed here.
///
/// # Safety
/// Only in a process about to exit: every descriptor in `fds` is closed.
pub(super) unsafe fn close_all_at_once(fds: &[c_int]) {
    if fds.is_empty() {
        return;
    }
    let per = fds.len().div_ceil(THREADS);
    // On this thread's stack: no allocation in a forked child.
    let mut shares: [Share; THREADS] = std::array::from_fn(|_| Share {
        fds: std::ptr::null(),
        n: 0,
    });
    let mut started = 0;
    for (share, chunk) in shares.iter_mut().zip(fds.chunks(per)) {
        (share.fds, share.n) = (chunk.as_ptr(), chunk.len());
        // SAFETY: `shares` outlives the threads: this function returns once all are done.
        if unsafe { start(share) } {
            started += 1;
        } else {
            close_share((share as *mut Share).cast());
        }
    }
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    while DONE.load(Ordering::SeqCst) < started {
        // SAFETY: sleeps a millisecond.
        unsafe { libc::nanosleep(&tick, std::ptr::null_mut()) };
    }
}

/// Starts a thread of this process that closes `share`; false where it could not.
unsafe fn start(share: &mut Share) -> bool {
    // SAFETY: an anonymous mapping for the thread's stack, never unmapped (the process exits).
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return false;
    }
    let flags = libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM;
    // SAFETY: the stack's top; the thread runs `close_share` on `share`, which outlives it.
    let tid = unsafe {
        libc::clone(
            close_share,
            stack.cast::<u8>().add(STACK).cast(),
            flags,
            (share as *mut Share).cast(),
        )
    };
    tid > 0
}
