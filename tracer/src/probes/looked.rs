//! Libraries looked at in earlier runs that define none of the functions leaktracer probes, by
//! file (device, inode, size, modification time) and the names looked for: a process that maps
//! one is not held while the library's tables are searched again. A Trainer job's import waited
//! 0.26 s on such looks, most of it on libraries that hold none (libtorch_cpu's 76 MB of names
//! took 44 ms to search, libtorch_cuda's 37, libtriton's 26). Kept a line a library in
//! `$XDG_CACHE_HOME/leaktracer/no-probes` (else `~/.cache/leaktracer/no-probes`), appended.

use std::{
    collections::HashSet,
    fs,
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// Bumped when a look at the same names may find otherwise (the way tables are searched).
const FORMAT: u64 = 1;
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

    fn line(&self) -> String {
        let Self {
            dev,
            ino,
            size,
            mtime_ns,
            names,
        } = self;
        format!("{dev} {ino} {size} {mtime_ns} {names}\n")
    }

    fn parse(line: &str) -> Option<Self> {
        let mut f = line.split_ascii_whitespace();
        let seen = Self {
            dev: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            size: f.next()?.parse().ok()?,
            mtime_ns: f.next()?.parse().ok()?,
            names: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(seen)
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

/// The libraries known to define none of the names looked for, and where they are kept.
pub struct Looked {
    file: Option<PathBuf>,
    none: HashSet<Seen>,
}

impl Looked {
    /// The user's cache, read.
    pub fn open() -> Self {
        Self::at(default_file())
    }

    /// The cache kept in `file` (none: kept in memory alone), read.
    pub fn at(file: Option<PathBuf>) -> Self {
        let text = file.as_ref().and_then(|f| fs::read_to_string(f).ok());
        let none = text
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(Seen::parse)
            .collect();
        Self { file, none }
    }

    /// Whether `path`, as it is now, was looked at for `names` and defines none of them.
    pub fn defines_none(&self, path: &Path, names: &[&str]) -> bool {
        Seen::of(path, names).is_some_and(|s| self.none.contains(&s))
    }

    /// `path`, as it is now, defines none of `names`.
    pub fn remember_none(&mut self, path: &Path, names: &[&str]) {
        let Some(seen) = Seen::of(path, names) else {
            return;
        };
        if !self.none.insert(seen) {
            return;
        }
        let Some(file) = &self.file else {
            return;
        };
        if let Err(e) = append(file, &seen, self.none.len() > MAX_LINES) {
            tracing::debug!(file = %file.display(), error = %e, "libraries without probes not kept");
        }
    }
}

/// Appends `seen`'s line to `file` (one write: whole lines from sessions side by side), or
/// starts the file again with it.
fn append(file: &Path, seen: &Seen, again: bool) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(!again)
        .write(true)
        .truncate(again)
        .open(file)?;
    f.write_all(seen.line().as_bytes())
}

/// `$XDG_CACHE_HOME/leaktracer/no-probes`, else `~/.cache/leaktracer/no-probes`.
fn default_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("leaktracer/no-probes"))
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
        assert!(!looked.defines_none(&lib, &names));
        looked.remember_none(&lib, &names);
        assert!(looked.defines_none(&lib, &names));
        // Kept for the next session; not for other names.
        let next = Looked::at(Some(cache.clone()));
        assert!(next.defines_none(&lib, &names));
        assert!(!next.defines_none(&lib, &["malloc"]));
        assert_eq!(std::fs::read_to_string(&cache).unwrap().lines().count(), 1);
        // The file rewritten (a new inode, size and time): looked at again.
        std::fs::remove_file(&lib).unwrap();
        std::fs::write(&lib, b"other code").unwrap();
        assert!(!Looked::at(Some(cache.clone())).defines_none(&lib, &names));
        // A line that does not parse is skipped, the others read.
        let mut text = std::fs::read_to_string(&cache).unwrap();
        text.insert_str(0, "garbage 1 2\n");
        std::fs::write(&cache, text).unwrap();
        let mut again = Looked::at(Some(cache.clone()));
        assert_eq!(again.none.len(), 1);
        again.remember_none(&lib, &names);
        assert!(Looked::at(Some(cache)).defines_none(&lib, &names));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
