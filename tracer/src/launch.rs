//! Starting the command for `run`: forked, then held before execve until the probes are attached
//! and its pid is in the traced map, so not one of its allocations is missed.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use crate::error::Error;

mod pyenv;

/// A forked child waiting for [`HeldChild::release`] before it execs.
pub struct HeldChild {
    pub pid: u32,
    gate: OwnedFd,
    exec_error: OwnedFd,
    program: PathBuf,
}

/// Finds `cmd` the way execvp would: a path when it has a slash, else in $PATH.
pub fn resolve(cmd: &str) -> Result<PathBuf, Error> {
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(Error::CommandNotFound(cmd.into()))
        };
    }
    on_path(cmd.as_ref(), None).ok_or_else(|| Error::CommandNotFound(cmd.into()))
}

/// The first executable file `name` in a directory of $PATH (but `skip`).
fn on_path(name: &std::ffi::OsStr, skip: Option<&Path>) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|d| Some(d.as_path()) != skip)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// Whether `p` is a file this process may execute.
fn executable(p: &Path) -> bool {
    let c = CString::new(p.as_os_str().as_bytes()).ok();
    // SAFETY: access(2) on a NUL-terminated path.
    p.is_file() && c.is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
}

/// Commands that exec the command they are given after their own options, and those options that
/// take a separate value.
const WRAPPERS: &[(&str, &[&str])] = &[
    ("env", &["-u", "--unset", "-C", "--chdir"]),
    ("timeout", &["-s", "--signal", "-k", "--kill-after"]),
    ("nice", &["-n", "--adjustment"]),
    ("nohup", &[]),
    ("setsid", &[]),
    ("stdbuf", &["-i", "-o", "-e"]),
    ("taskset", &["-c"]),
    ("ionice", &["-c", "-n", "-t"]),
    ("numactl", &["-C", "-N", "-m", "-i", "-p"]),
    ("chrt", &[]),
    ("time", &["-f", "-o"]),
];

/// Whether `argv` runs a Python interpreter in the end, as far as can be told before it starts:
/// through a script's `#!` line and the commands that exec another (`env NAME=VALUE python3 …`,
/// `timeout 1h …`).
pub fn runs_python(argv: &[String]) -> bool {
    runs_in_the_end(argv, 0).is_some_and(|p| {
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        crate::python::interp::version_of(&p.to_string_lossy()).is_some()
    })
}

/// The program `argv` runs in the end (see [`runs_python`]), or None when that cannot be
/// told (a wrapper with nothing after its options, a file that cannot be read).
fn runs_in_the_end(argv: &[String], depth: u8) -> Option<PathBuf> {
    let program = resolve(argv.first()?).ok()?;
    if depth > 4 {
        return Some(program);
    }
    let name = program.file_name()?.to_str()?;
    if let Some((_, valued)) = WRAPPERS.iter().find(|(w, _)| *w == name) {
        let mut rest = argv[1..].iter();
        while let Some(arg) = rest.next() {
            if valued.contains(&arg.as_str()) {
                rest.next();
            } else if !(arg.starts_with('-')
                || arg.contains('=')
                || arg.starts_with(|c: char| c.is_ascii_digit()))
            {
                let tail: Vec<String> = std::iter::once(arg).chain(rest).cloned().collect();
                return runs_in_the_end(&tail, depth + 1);
            }
        }
        return None;
    }
    match script_runs(&program) {
        Some(Script::Shim(target)) => {
            runs_in_the_end(&[target.to_string_lossy().into_owned()], depth + 1)
        }
        Some(Script::Interpreter(interpreter)) => runs_in_the_end(&interpreter, depth + 1),
        None => Some(program),
    }
}

/// What a script runs: the program a pyenv shim execs, or its `#!` line's interpreter.
enum Script {
    Shim(PathBuf),
    /// The interpreter and its one argument.
    Interpreter(Vec<String>),
}

/// What the script `program` runs (see [`Script`]), None for a binary.
fn script_runs(program: &Path) -> Option<Script> {
    use std::io::Read;
    let mut head = [0u8; 1024];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    if let Some(target) = pyenv::shim_target(program, &String::from_utf8_lossy(line)) {
        return Some(Script::Shim(target));
    }
    let line = line.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim();
    let (interpreter, arg) = line.split_once([' ', '\t']).unwrap_or((line, ""));
    Some(Script::Interpreter(
        std::iter::once(interpreter)
            .chain((!arg.trim().is_empty()).then_some(arg.trim()))
            .map(String::from)
            .collect(),
    ))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(anyhow::anyhow!("pipe2: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks `argv` (argv[0] resolved through PATH) and holds it before execve.
pub fn spawn_held(argv: &[String]) -> Result<HeldChild, Error> {
    let program = resolve(&argv[0])?;
    let c_program =
        CString::new(program.as_os_str().as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("argument with a NUL byte: {e}"))?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let (gate_r, gate_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // SAFETY: the child only calls async-signal-safe functions (read, execv, write, _exit) on data
    // prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(anyhow::anyhow!("fork: {}", std::io::Error::last_os_error()).into());
    }
    if pid == 0 {
        // SAFETY: see above; the child never returns from this block.
        unsafe {
            let mut b = 0u8;
            // EOF: leaktracer failed before releasing it; never run the command untraced. (Our
            // copy of the write end must go first, or EOF never comes.)
            libc::close(gate_w.as_raw_fd());
            if libc::read(gate_r.as_raw_fd(), (&raw mut b).cast(), 1) != 1 {
                libc::_exit(127);
            }
            libc::execv(c_program.as_ptr(), c_argv.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&raw const errno).cast(), 4);
            libc::_exit(127);
        }
    }
    drop(gate_r);
    drop(err_w);
    Ok(HeldChild {
        pid: pid as u32,
        gate: gate_w,
        exec_error: err_r,
        program,
    })
}

impl HeldChild {
    /// The child's pid (the command's, once released).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The resolved path the child will exec.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Lets the child exec; fails if execve failed.
    pub fn release(self) -> Result<u32, Error> {
        let b = 1u8;
        // SAFETY: one-byte write to our pipe end.
        unsafe { libc::write(self.gate.as_raw_fd(), (&raw const b).cast(), 1) };
        drop(self.gate);
        let mut errno = 0i32;
        // SAFETY: reading at most 4 bytes into `errno`; EOF means execve succeeded (CLOEXEC).
        let n = unsafe { libc::read(self.exec_error.as_raw_fd(), (&raw mut errno).cast(), 4) };
        if n == 4 {
            wait(self.pid);
            let e = std::io::Error::from_raw_os_error(errno);
            return Err(Error::CommandNotFound(format!(
                "{}: {e}",
                self.program.display()
            )));
        }
        Ok(self.pid)
    }
}

/// Waits for `pid` and returns its exit status as a shell would (128 + signal when killed).
pub fn wait(pid: u32) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        if r == pid as i32 {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
    exit_code(status)
}

/// A wait status as a shell exit code (128 + signal when killed).
pub fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(argv: &[&str]) -> Option<PathBuf> {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        runs_in_the_end(&argv, 0)
    }

    #[test]
    fn the_program_run_in_the_end_is_found_through_wrappers_and_scripts() {
        let dir = std::env::temp_dir().join(format!("leaktracer-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            path.to_str().unwrap().to_string()
        };
        let sh = resolve("sh").unwrap();
        assert_eq!(runs(&["sh", "-c", "true"]), Some(sh.clone()));
        assert_eq!(
            runs(&[
                "env", "-u", "HOME", "A=1", "timeout", "-s", "INT", "10", "sh", "x"
            ]),
            Some(sh.clone())
        );
        assert_eq!(runs(&["nice", "-n", "5", "sh"]), Some(sh.clone()));
        // Through `#!` lines, with and without env.
        let direct = script("direct", &format!("#!{} -e\necho\n", sh.display()));
        assert_eq!(runs(&[&direct]), Some(sh.clone()));
        let by_env = script("by_env", "#!/usr/bin/env sh\necho\n");
        assert_eq!(runs(&["env", "X=1", &by_env]), Some(sh));
        // A wrapper with no command: nothing to tell.
        assert_eq!(runs(&["env", "A=1"]), None);
        let true_ = resolve("true").unwrap();
        assert_eq!(runs(&["true"]), Some(true_));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
