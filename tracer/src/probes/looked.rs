//! Libraries looked at in earlier runs, by file (device, inode, size, modification time) and the
//! names looked for, kept a line a library under `$XDG_CACHE_HOME/leaktracer/` (else
//! `~/.cache/leaktracer/`), appended, with its path. Two such lists:
//! - `no-probes`: those that define none of the functions leaktracer probes. A process that maps
//!   one is not held while the library's tables are searched again (a Trainer job's import waited
//!   0.26 s on such looks, most of it on libraries that hold none: libtorch_cpu's 76 MB of names
//!   took 44 ms to search, libtorch_cuda's 37, libtriton's 26). The files still as they were are
//!   told to the kernel side at the start of a session (known.rs), so that a thread mapping one
//!   is not even stopped.
//! - `probed-ahead`: those whose probes a Python job's import needs at once, probed before it
//!   maps them (ahead.rs).

use std::{
    collections::HashMap,
    fs,
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use tracer_common::FileKey;

/// Bumped when a look at the same names may find otherwise (the way tables are searched), or
/// when lines kept before lack what is needed now (2: their paths).
const FORMAT: u64 = 2;
/// Lines kept at most: past them, the file starts again.
const MAX_LINES: usize = 10_000;

/// A library file as it is on disk, and the names looked for in it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    names: u64,
}

impl Seen {
    fn of(path: &Path, names: &[&str]) -> Option<Self> {
        let m = fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            names: names_key(names),
        })
    }

    /// The file's line: its fields, then its path where the path fits on a line.
    fn line(&self, path: &Path) -> String {
        let Self {
            dev,
            ino,
            size,
            mtime_ns,
            names,
        } = self;
        let path = path
            .to_str()
            .filter(|p| !p.contains('\n'))
            .map(|p| format!(" {p}"))
            .unwrap_or_default();
        format!("{dev} {ino} {size} {mtime_ns} {names}{path}\n")
    }

    /// A line's file, and its path when the line has one.
    fn parse(line: &str) -> Option<(Self, Option<PathBuf>)> {
        let mut f = line.splitn(6, ' ');
        let seen = Self {
            dev: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            size: f.next()?.parse().ok()?,
            mtime_ns: f.next()?.parse().ok()?,
            names: f.next()?.parse().ok()?,
        };
        let path = f.next().filter(|p| p.starts_with('/')).map(PathBuf::from);
        Some((seen, path))
    }

    /// The file as the kernel names it: `st_dev` in the kernel's own encoding, and the inode.
    fn key(&self) -> FileKey {
        let (major, minor) = (libc::major(self.dev), libc::minor(self.dev));
        FileKey {
            dev: (u64::from(major) << 20) | u64::from(minor),
            ino: self.ino,
        }
    }
}

/// FNV-1a of the format and the names: the same in every build that looks for the same names.
fn names_key(names: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let format = FORMAT.to_le_bytes();
    let bytes = names.iter().flat_map(|n| n.bytes().chain([0]));
    for b in format.into_iter().chain(bytes) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Libraries found so for the names looked for (with their paths, where known), and where they
/// are kept.
pub struct Looked {
    file: Option<PathBuf>,
    files: HashMap<Seen, Option<PathBuf>>,
}

/// The libraries of a [`Looked`] whose paths are known, to be checked again off the prober's
/// thread.
pub struct WithPaths(Vec<(Seen, PathBuf)>);

impl WithPaths {
    /// Those still as they were, for the names `names_of` gives a path: the kernel's name of
    /// each, and its path.
    pub fn unchanged(
        &self,
        names_of: impl Fn(&Path) -> Vec<&'static str>,
    ) -> Vec<(FileKey, PathBuf)> {
        let same = |(seen, path): &&(Seen, PathBuf)| Seen::of(path, &names_of(path)) == Some(*seen);
        let still = self.0.iter().filter(same);
        still.map(|(s, path)| (s.key(), path.clone())).collect()
    }
}

impl Looked {
    /// The user's list `name`, read.
    pub fn open(name: &str) -> Self {
        Self::at(cache_dir().map(|d| d.join(name)))
    }

    /// The cache kept in `file` (none: kept in memory alone), read.
    pub fn at(file: Option<PathBuf>) -> Self {
        let text = file.as_ref().and_then(|f| fs::read_to_string(f).ok());
        let files = text
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(Seen::parse)
            .collect();
        Self { file, files }
    }

    /// Whether `path`, as it is now, was found so for `names`.
    pub fn knows(&self, path: &Path, names: &[&str]) -> bool {
        Seen::of(path, names).is_some_and(|s| self.files.contains_key(&s))
    }

    /// The libraries whose paths are known.
    pub fn with_paths(&self) -> WithPaths {
        let known = self
            .files
            .iter()
            .filter_map(|(s, p)| Some((*s, p.clone()?)));
        WithPaths(known.collect())
    }

    /// `path`, as it is now, was found so for `names`; the kernel's name of the file when it was
    /// not known before.
    pub fn remember(&mut self, path: &Path, names: &[&str]) -> Option<FileKey> {
        let seen = Seen::of(path, names)?;
        if self.files.insert(seen, Some(path.to_path_buf())).is_some() {
            return None;
        }
        if let Some(file) = &self.file
            && let Err(e) = append(file, &seen.line(path), self.files.len() > MAX_LINES)
        {
            tracing::debug!(file = %file.display(), error = %e, "libraries looked at not kept");
        }
        Some(seen.key())
    }
}

/// Appends `line` to `file` (one write: whole lines from sessions side by side), or starts the
/// file again with it.
fn append(file: &Path, line: &str, again: bool) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(!again)
        .write(true)
        .truncate(again)
        .open(file)?;
    f.write_all(line.as_bytes())
}

/// `$XDG_CACHE_HOME/leaktracer`, else `~/.cache/leaktracer`.
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("leaktracer"))
}

#[cfg(test)]
mod tests {
    use super::Looked;

    #[test]
    fn a_library_without_probes_is_known_until_it_changes_or_other_names_are_looked_for() {
        let dir = std::env::temp_dir().join(format!("lt-looked-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (lib, cache) = (dir.join("libx.so"), dir.join("cache/no-probes"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&lib, b"code").unwrap();
        let names = ["malloc", "c10::alloc_cpu"];
        let mut looked = Looked::at(Some(cache.clone()));
        assert!(!looked.knows(&lib, &names));
        let key = looked.remember(&lib, &names).unwrap();
        assert!(looked.knows(&lib, &names));
        assert_eq!(looked.remember(&lib, &names), None, "known already");
        // Kept for the next session; not for other names.
        let next = Looked::at(Some(cache.clone()));
        assert!(next.knows(&lib, &names));
        assert!(!next.knows(&lib, &["malloc"]));
        assert_eq!(std::fs::read_to_string(&cache).unwrap().lines().count(), 1);
        // Told to the kernel side by device and inode, while it is as it was, for those names.
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lib).unwrap());
        assert_eq!(key.ino, ino);
        assert_eq!(
            next.with_paths().unchanged(|_| names.to_vec()),
            [(key, lib.clone())]
        );
        assert!(next.with_paths().unchanged(|_| vec!["malloc"]).is_empty());
        // The file rewritten (a new inode, size and time): looked at again.
        std::fs::remove_file(&lib).unwrap();
        std::fs::write(&lib, b"other code").unwrap();
        assert!(!Looked::at(Some(cache.clone())).knows(&lib, &names));
        assert!(next.with_paths().unchanged(|_| names.to_vec()).is_empty());
        // A line that does not parse is skipped, the others read; a line without a path (as
        // earlier versions kept them) still tells, but is not told to the kernel side.
        let mut text = std::fs::read_to_string(&cache).unwrap();
        let pathless = text.split(" /").next().unwrap().to_string();
        text.insert_str(0, &format!("garbage 1 2\n{pathless}\n"));
        std::fs::write(&cache, text).unwrap();
        let mut again = Looked::at(Some(cache.clone()));
        assert_eq!(again.files.len(), 1);
        again.remember(&lib, &names);
        assert!(Looked::at(Some(cache.clone())).knows(&lib, &names));
        std::fs::write(&cache, format!("{pathless}\n")).unwrap();
        assert!(Looked::at(Some(cache)).with_paths().0.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
