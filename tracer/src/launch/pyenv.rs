//! pyenv's shims: `python3` on a pyenv user's PATH is a bash script that runs `pyenv exec`, a
//! score of bash processes that find the interpreter to exec. Found here the way pyenv finds
//! it, so that a launched `python3` is known to run Python in the end and its wrappers are
//! layered like it (under `--heap auto`, the shim's processes had their malloc family traced
//! whole: about a second of the start of every traced job).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// The program the pyenv shim `shim` (the script's text `text`) execs: the file of its name in
/// the first selected version that has it (`PYENV_VERSION`, else the nearest `.python-version`
/// from the working directory up, else `$PYENV_ROOT/version`; `system`: the first on PATH after
/// the shims). None for anything else, or where none is found.
pub(super) fn shim_target(shim: &Path, text: &str) -> Option<PathBuf> {
    let start = std::env::var_os("PYENV_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok());
    shim_target_from(shim, text, std::env::var_os("PYENV_VERSION"), start)
}

/// [`shim_target`] with pyenv's `PYENV_VERSION` and the directory its search for a
/// `.python-version` starts from.
fn shim_target_from(
    shim: &Path,
    text: &str,
    env_version: Option<OsString>,
    start: Option<PathBuf>,
) -> Option<PathBuf> {
    if !text.contains("/libexec/pyenv\" exec") {
        return None;
    }
    let root = text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("export PYENV_ROOT=")?;
        Some(PathBuf::from(v.trim_matches('"')))
    })?;
    let name = shim.file_name()?;
    let versions = selected_versions(&root, env_version, start);
    versions.iter().find_map(|v| {
        let found = if v == "system" {
            super::on_path(name, shim.parent())
        } else {
            let dir = version_dir(&root, v)?;
            Some(dir.join("bin").join(name))
        };
        found.filter(|p| super::executable(p))
    })
}

/// The versions pyenv selects, in order (see [`shim_target`]).
fn selected_versions(
    root: &Path,
    env_version: Option<OsString>,
    start: Option<PathBuf>,
) -> Vec<String> {
    let words = |text: &str| -> Vec<String> {
        text.split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .map(String::from)
            .collect()
    };
    if let Some(v) = env_version {
        return v.to_string_lossy().split(':').map(String::from).collect();
    }
    let local = start.iter().flat_map(|d| d.ancestors()).find_map(|d| {
        let text = std::fs::read_to_string(d.join(".python-version")).ok()?;
        Some(words(&text))
    });
    local
        .or_else(|| Some(words(&std::fs::read_to_string(root.join("version")).ok()?)))
        .unwrap_or_else(|| vec!["system".into()])
}

/// The directory of version `v` under `root`: its own, or for a prefix (`3.11`) the latest
/// installed that it names, as `pyenv latest` picks.
fn version_dir(root: &Path, v: &str) -> Option<PathBuf> {
    let versions = root.join("versions");
    let exact = versions.join(v);
    if exact.is_dir() {
        return Some(exact);
    }
    let numbers =
        |name: &str| -> Option<Vec<u32>> { name.split('.').map(|p| p.parse().ok()).collect() };
    let prefix = format!("{v}.");
    std::fs::read_dir(&versions)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .filter_map(|name| Some((numbers(&name)?, name)))
        .max()
        .map(|(_, name)| versions.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pyenv_shim_is_followed_to_the_selected_versions_program() {
        let root = std::env::temp_dir().join(format!("leaktracer-pyenv-{}", std::process::id()));
        let bin = |v: &str| root.join("versions").join(v).join("bin");
        for v in ["3.10.2", "3.10.13", "3.12.1"] {
            std::fs::create_dir_all(bin(v)).unwrap();
            let p = bin(v).join("python3");
            std::fs::write(&p, "").unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let shim = root.join("shims").join("python3");
        let text = format!(
            "#!/usr/bin/env bash\nprogram=\"${{0##*/}}\"\nexport PYENV_ROOT=\"{}\"\n\
             exec \"{}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
            root.display(),
            root.display()
        );
        let at = |env: Option<&str>| {
            shim_target_from(&shim, &text, env.map(Into::into), Some(root.clone()))
        };
        std::fs::write(root.join("version"), "3.12.1\n").unwrap();
        assert_eq!(at(None), Some(bin("3.12.1").join("python3")));
        // A prefix names the latest of it; a version without the program is passed over.
        std::fs::write(root.join("version"), "3.9 3.10\n").unwrap();
        assert_eq!(at(None), Some(bin("3.10.13").join("python3")));
        // PYENV_VERSION first; a .python-version nearer than the global version next.
        assert_eq!(at(Some("3.10.2")), Some(bin("3.10.2").join("python3")));
        std::fs::write(root.join(".python-version"), "3.12.1\n").unwrap();
        assert_eq!(at(None), Some(bin("3.12.1").join("python3")));
        // Not a shim: a script that only mentions pyenv.
        let other = "#!/bin/sh\necho pyenv exec\n";
        assert_eq!(
            shim_target_from(&shim, other, None, Some(root.clone())),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
