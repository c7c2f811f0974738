//! `leaktracer serve`: which processes the daemon adopts. Every `--scan` seconds /proc is read
//! and each process that matches a filter (a pid, a command name, a cgroup, or mapping the CUDA
//! runtime or driver) and is not traced yet is adopted; its children are then followed as in any
//! session.

use std::collections::HashSet;

use crate::{error::Error, procfs};

#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub pids: Vec<u32>,
    /// Matched against the kernel's command name and the file name of argv[0].
    pub comms: Vec<String>,
    /// Cgroup paths as /proc/PID/cgroup shows them ("/training/job1"): a process in one of them
    /// or below it matches.
    pub cgroups: Vec<String>,
    /// Processes that map libcudart or libcuda.
    pub cuda: bool,
    /// Every process (system-wide).
    pub all: bool,
}

impl Filter {
    /// Checks the filter before anything is traced: at least one criterion, pids that exist,
    /// cgroups that exist.
    pub fn validate(mut self) -> Result<Self, Error> {
        let filtered = !self.pids.is_empty()
            || !self.comms.is_empty()
            || !self.cgroups.is_empty()
            || self.cuda;
        if !filtered && !self.all {
            return Err(Error::Usage(
                "serve needs a filter (--pid, --comm, --cgroup, --cuda) or --all".into(),
            ));
        }
        if filtered && self.all {
            return Err(Error::Usage(
                "--all traces every process: it takes no other filter".into(),
            ));
        }
        for &pid in &self.pids {
            if !procfs::exists(pid) {
                return Err(Error::NoSuchProcess(pid as i32));
            }
        }
        for c in &mut self.cgroups {
            *c = cgroup_path(c)?;
        }
        Ok(self)
    }

    fn matches(&self, pid: u32) -> bool {
        if self.all || self.pids.contains(&pid) {
            return true;
        }
        if !self.comms.is_empty() {
            let comm = procfs::read(pid, "comm");
            let argv0 = procfs::read(pid, "cmdline");
            let argv0 = argv0.split('\0').next().unwrap_or("");
            let base = argv0.rsplit('/').next().unwrap_or("");
            if self.comms.iter().any(|c| c == comm.trim_end() || c == base) {
                return true;
            }
        }
        if !self.cgroups.is_empty() {
            let lines = procfs::read(pid, "cgroup");
            let inside = lines
                .lines()
                .filter_map(|l| l.splitn(3, ':').nth(2))
                .any(|p| {
                    self.cgroups.iter().any(|c| {
                        p == c || (p.starts_with(c.as_str()) && p[c.len()..].starts_with('/'))
                    })
                });
            if inside {
                return true;
            }
        }
        self.cuda && maps_cuda(pid)
    }
}

/// A cgroup as /proc/PID/cgroup names it: "/a/b" as given, or a directory under /sys/fs/cgroup
/// (the hierarchy's own mount, v1 or v2, is taken off).
fn cgroup_path(given: &str) -> Result<String, Error> {
    let missing = || {
        Error::Usage(format!(
            "--cgroup {given}: no such cgroup (give it as /proc/PID/cgroup shows it, or its directory under /sys/fs/cgroup)"
        ))
    };
    if let Some(rest) = given.strip_prefix("/sys/fs/cgroup") {
        if !std::path::Path::new(given).is_dir() {
            return Err(missing());
        }
        // cgroup v2 alone is mounted at /sys/fs/cgroup; v1 and hybrid layouts mount each
        // hierarchy one level down (/sys/fs/cgroup/memory/…, /sys/fs/cgroup/unified/…).
        let v2_at_root = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let rest = rest.trim_end_matches('/');
        let path = if v2_at_root {
            rest.to_string()
        } else {
            let mut parts = rest.splitn(3, '/').skip(2);
            format!("/{}", parts.next().unwrap_or(""))
        };
        return Ok(if path.is_empty() { "/".into() } else { path });
    }
    if !given.starts_with('/') {
        return Err(missing());
    }
    Ok(given.trim_end_matches('/').to_string()).map(|p| if p.is_empty() { "/".into() } else { p })
}

fn maps_cuda(pid: u32) -> bool {
    procfs::read(pid, "maps").lines().any(|l| {
        l.rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("libcudart.so") || f.starts_with("libcuda.so"))
    })
}

/// The processes to adopt now: they match, are not `known` (traced already, or followed as a
/// traced process's children) and are not leaktracer itself or a kernel thread.
pub fn scan(filter: &Filter, known: &HashSet<u32>) -> Vec<u32> {
    let me = std::process::id();
    let mut pids: Vec<u32> = procfs::pids()
        .into_iter()
        .filter(|&pid| pid != me && !known.contains(&pid))
        .filter(|&pid| !kernel_thread(pid))
        .filter(|&pid| filter.matches(pid))
        .collect();
    pids.sort_unstable();
    pids
}

fn kernel_thread(pid: u32) -> bool {
    // Kernel threads have no command line and no memory map.
    procfs::read(pid, "cmdline").is_empty() && procfs::read(pid, "maps").is_empty()
}

/// What `serve` was asked to watch, for the run's name in the history.
pub fn describe(filter: &Filter) -> String {
    let mut parts = Vec::new();
    parts.extend(filter.pids.iter().map(|p| format!("--pid {p}")));
    parts.extend(filter.comms.iter().map(|c| format!("--comm {c}")));
    parts.extend(filter.cgroups.iter().map(|c| format!("--cgroup {c}")));
    if filter.cuda {
        parts.push("--cuda".into());
    }
    if filter.all {
        parts.push("--all".into());
    }
    format!("serve {}", parts.join(" "))
}
