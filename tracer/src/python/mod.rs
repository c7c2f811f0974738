//! Python stacks: finding the CPython a process runs (3.10 to 3.13), what its version lays out
//! where, and resolving the code objects the kernel side records at each allocation to file,
//! function and line.

pub mod code;
mod error;
pub mod interp;
pub mod linetable;
pub mod mem;
pub mod resolve;
#[cfg(test)]
mod tests;
pub mod version;
pub mod walk;

pub use error::PythonError;

/// The CPython interpreters on this machine the tests run: `python3`, and each 3.10–3.13 pyenv
/// keeps (`$PYENV_ROOT`, else ~/.pyenv), one per minor version.
#[cfg(test)]
pub fn interpreters() -> Vec<((u8, u8), String)> {
    let mut found = Vec::new();
    let version = |python: &str| -> Option<(u8, u8)> {
        let out = std::process::Command::new(python)
            .args(["-c", "import sys; print(*sys.version_info[:2])"])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let mut it = text.split_whitespace().map(|n| n.parse().ok());
        Some((it.next()??, it.next()??))
    };
    let root = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    let mut candidates = vec!["python3".to_string()];
    if let Ok(dir) = std::fs::read_dir(format!("{root}/versions")) {
        let mut names: Vec<String> = dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let minor: String = name.split('.').take(2).collect::<Vec<_>>().join(".");
            candidates.push(format!("{root}/versions/{name}/bin/python{minor}"));
        }
    }
    for python in candidates {
        if let Some(v) = version(&python)
            && (10..=13).contains(&v.1)
            && v.0 == 3
            && !found.iter().any(|(have, _)| *have == v)
        {
            found.push((v, python));
        }
    }
    eprintln!("CPython interpreters tested: {found:?}");
    found
}
