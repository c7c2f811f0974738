//! Every read of /proc: command lines, environments, states, threads, capabilities and memory
//! maps. A process that is gone reads as nothing (`None`, empty), never as an error: the tracer
//! meets processes that exit at any moment.

mod maps;

pub use maps::ProcMaps;

/// The command line of a live process, NUL separators turned into spaces.
pub fn command(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    (!text.is_empty()).then(|| text.join(" "))
}

/// Environment variables that change how PyTorch allocates (and so what a leak looks like): the
/// CUDA caching allocator's settings and the switch that turns caching off.
pub const ALLOCATOR_ENV: &[&str] = &[
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_HIP_ALLOC_CONF",
    "CUDA_LAUNCH_BLOCKING",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    // PYTHONMALLOC=malloc: every Python object is a malloc block (none hidden in pymalloc arenas).
    "PYTHONMALLOC",
];

/// The executable `pid` runs (None when it is gone or not ours to read).
pub fn executable(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// The [`ALLOCATOR_ENV`] variables set in a live process's environment, in that order.
pub fn allocator_env(pid: u32) -> Vec<(String, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let vars: Vec<(&[u8], &[u8])> = raw
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((&kv[..eq], &kv[eq + 1..]))
        })
        .collect();
    ALLOCATOR_ENV
        .iter()
        .filter_map(|name| {
            let (_, v) = vars.iter().find(|(k, _)| *k == name.as_bytes())?;
            Some((name.to_string(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect()
}

/// A file of /proc/PID as text (lossy), empty when it cannot be read.
pub fn read(pid: u32, file: &str) -> String {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Whether /proc/PID exists.
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Every process id in /proc.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The fields of /proc/PID/stat after the parenthesized command name (field 3 on); `None` when
/// the process is gone.
fn stat_fields(pid: i64) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// A process's kernel flags (stat field 9); `None` when it does not exist.
pub fn flags(pid: i32) -> Option<u64> {
    let fields = stat_fields(pid.into())?;
    Some(fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0))
}

/// The CPU time a process has had so far, all its threads (stat fields 14 and 15, user and
/// system); `None` when it is gone.
pub fn cpu_times(pid: u32) -> Option<crate::model::CpuTimes> {
    let fields = stat_fields(pid.into())?;
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    let (user, system) = (ticks(11)?, ticks(12)?);
    Some(crate::model::CpuTimes {
        total: (user + system) as f64 / hz,
        user: user as f64 / hz,
    })
}

/// Whether `pid` is a kernel thread (PF_KTHREAD in its flags).
pub fn is_kernel_thread_flag(flags: u64) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    flags & PF_KTHREAD != 0
}

/// Whether the process is gone or dead (zombie, exiting).
pub fn has_exited(pid: u32) -> bool {
    matches!(state(pid), None | Some('Z') | Some('X'))
}

/// A process's state letter (stat field 3: `R`, `S`, `T` stopped, `t` in a ptrace stop, `Z`…);
/// `None` when it is gone.
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid.into())?.first()?.chars().next()
}

/// `root` and every process below it, from each process's parent (stat field 4).
pub fn tree(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = pids()
        .into_iter()
        .filter_map(|p| {
            let ppid = stat_fields(p.into())?.get(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while let Some(&p) = found.get(i) {
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
}

/// The threads of a process (at least the process itself), sorted.
pub fn threads(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    let mut tids: Vec<u32> = tasks
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    if tids.is_empty() {
        tids.push(pid);
    }
    tids.sort_unstable();
    tids
}

/// A line of /proc/PID/status (`self` for this process) after its `name:`, trimmed.
pub fn status_field(pid: &str, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let value = l.strip_prefix(name)?.strip_prefix(':')?;
        Some(value.trim().to_owned())
    })
}

/// The process a thread belongs to.
pub fn tgid_of(tid: u32) -> Option<u32> {
    status_field(&tid.to_string(), "Tgid")?.parse().ok()
}

/// The parent process of `pid` (or of a thread's process).
pub fn ppid_of(pid: u32) -> Option<u32> {
    status_field(&pid.to_string(), "PPid")?.parse().ok()
}

/// A size field of this process's status in bytes (VmRSS, VmHWM, RssAnon…), 0 if absent.
pub fn own_status_bytes(name: &str) -> u64 {
    status_field("self", name)
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// This process's effective capabilities (CapEff), 0 if unreadable.
pub fn own_capabilities() -> u64 {
    status_field("self", "CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}
