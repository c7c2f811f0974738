//! The scenarios, one module per seed, and what they share: square tensors, the step loop, and
//! forked worker processes.

pub mod retain;
pub mod s0;
pub mod s1;
pub mod s2;
pub mod s3;
pub mod s4;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::bail;
use tch::{Kind, Tensor};

use crate::{Config, step::harness_step};

/// A `D × D` f32 tensor filled with `value` on the scenario's device.
pub fn square(cfg: &Config, value: f64) -> Tensor {
    Tensor::full([cfg.size, cfg.size], value, (Kind::Float, cfg.device))
}

/// Keeps a scenario's state until the process exits, as a trainer that stops (or is killed by
/// the OOM killer) holding it: the final report shows what was held, with each stack's verdict.
pub fn hold_until_exit<T>(state: T) {
    std::mem::forget(state);
}

/// Runs `step` for every step, marking each with `harness_step` first. With `HARNESS_LOOP_FILE`
/// set, the loop's seconds are written there, by the wall clock and in CPU time of the whole
/// process (what `harness bench` compares: the training loop without the process's start-up);
/// with `HARNESS_PROGRAM_TIME` set too, then a line per BPF program that ran during the loop, with
/// its runs and kernel time over the loop (the kernel's statistics, on while a tracer asks for
/// them: what the tracer's programs took while the loop ran, start-up left out).
pub fn steps(cfg: &Config, mut step: impl FnMut(u64) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let programs = std::env::var_os("HARNESS_PROGRAM_TIME").map(|_| program_time());
    let start = std::time::Instant::now();
    let cpu = process_cpu_s();
    for i in 0..cfg.steps {
        harness_step(i);
        step(i)?;
    }
    let (wall, cpu) = (start.elapsed().as_secs_f64(), process_cpu_s() - cpu);
    if let Some(path) = std::env::var_os("HARNESS_LOOP_FILE") {
        let mut out = format!("{wall} {cpu}\n");
        if let Some(before) = programs {
            for (id, (name, runs, ns)) in program_time() {
                let (_, runs0, ns0) = before.get(&id).cloned().unwrap_or_default();
                if runs > runs0 {
                    out += &format!("program {name} {} {}\n", runs - runs0, ns - ns0);
                }
            }
        }
        std::fs::write(path, out)?;
    }
    Ok(())
}

/// Every loaded BPF program's name, runs and kernel time in ns, by program id.
fn program_time() -> std::collections::BTreeMap<u32, (String, u64, u64)> {
    aya::programs::loaded_programs()
        .flatten()
        .map(|p| {
            let name = p.name_as_str().unwrap_or("?").to_string();
            (
                p.id(),
                (name, p.run_count(), p.run_time().as_nanos() as u64),
            )
        })
        .collect()
}

/// The CPU time (user and kernel, every thread) this process has used, in seconds.
fn process_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Forked worker processes (DataLoader or compile workers): each runs `body` once and then waits
/// until the parent lets go (drop), so their memory stays for the parent's whole run.
pub struct Workers {
    pids: Vec<libc::pid_t>,
    release: Option<OwnedFd>,
}

impl Workers {
    /// Forks `n` workers. Call before libtorch starts threads: the children use only Rust's
    /// allocator and plain syscalls.
    pub fn fork(n: usize, body: fn(usize)) -> anyhow::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: both were just created and are owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut pids = Vec::new();
        for i in 0..n {
            // SAFETY: the child runs `body`, reads the pipe and _exits; it never returns here.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                bail!("fork: {}", std::io::Error::last_os_error());
            }
            if pid == 0 {
                // SAFETY: closing our copy of the write end, then a blocking read until EOF.
                unsafe {
                    libc::close(w.as_raw_fd());
                    body(i);
                    let mut b = 0u8;
                    while libc::read(r.as_raw_fd(), (&raw mut b).cast(), 1) > 0 {}
                    libc::_exit(0);
                }
            }
            pids.push(pid);
        }
        drop(r);
        Ok(Self {
            pids,
            release: Some(w),
        })
    }

    pub fn pids(&self) -> &[libc::pid_t] {
        &self.pids
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        drop(self.release.take());
        for &pid in &self.pids {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
}

/// A worker's dataset copy: `bytes` touched, held until the worker exits.
#[inline(never)]
pub fn hold_dataset_copy(bytes: usize) {
    let copy = vec![1u8; bytes];
    std::hint::black_box(&copy);
    std::mem::forget(copy);
}
