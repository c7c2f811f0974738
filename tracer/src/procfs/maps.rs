//! /proc/PID/maps: a process's executable file mappings, to resolve return addresses to
//! (file, offset) and to find the code to probe.

use std::sync::Arc;

/// One executable file mapping.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    path: Arc<str>,
}

/// Executable mappings of one process, sorted by start address.
#[derive(Clone, Debug, Default)]
pub struct ProcMaps {
    maps: Vec<Mapping>,
}

impl ProcMaps {
    /// Reads /proc/PID/maps; `None` when the process is gone (or a zombie without memory).
    pub fn read(pid: u32) -> Option<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let parsed = Self::parse(&text);
        (!parsed.maps.is_empty()).then_some(parsed)
    }

    fn parse(text: &str) -> Self {
        let mut maps: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
        maps.sort_by_key(|m| m.start);
        Self { maps }
    }

    /// The file and file offset behind `addr`.
    pub fn resolve(&self, addr: u64) -> Option<(&Arc<str>, u64)> {
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        let m = &self.maps[i];
        (addr < m.end).then(|| (&m.path, addr - m.start + m.file_offset))
    }

    /// Where the byte at `file_offset` of `path` is mapped (the inverse of [`ProcMaps::resolve`]).
    pub fn address_of(&self, path: &str, file_offset: u64) -> Option<u64> {
        self.maps.iter().find_map(|m| {
            let within = file_offset.checked_sub(m.file_offset)?;
            (*m.path == *path && within < m.end - m.start).then_some(m.start + within)
        })
    }

    /// Every executable file mapping: (start, end, file offset, path), in address order.
    pub fn mappings(&self) -> impl Iterator<Item = (u64, u64, u64, &Arc<str>)> {
        self.maps
            .iter()
            .map(|m| (m.start, m.end, m.file_offset, &m.path))
    }

    /// Every mapped file with executable pages, once each, in address order.
    pub fn paths(&self) -> impl Iterator<Item = &Arc<str>> {
        let mut last: Option<&Arc<str>> = None;
        self.maps.iter().filter_map(move |m| {
            let new = last != Some(&m.path);
            last = Some(&m.path);
            new.then_some(&m.path)
        })
    }

    /// Whether one of `files` is mapped with executable pages.
    pub fn maps_any(&self, files: &[std::path::PathBuf]) -> bool {
        self.paths()
            .any(|p| files.iter().any(|f| f.as_os_str() == &**p))
    }

    /// Paths of the mapped files whose name starts with `prefix` (e.g. "libc.so").
    pub fn libraries(&self, prefix: &str) -> Vec<Arc<str>> {
        let mut out: Vec<Arc<str>> = Vec::new();
        for m in &self.maps {
            let name = m.path.rsplit('/').next().unwrap_or(&m.path);
            if name.starts_with(prefix) && !out.contains(&m.path) {
                out.push(m.path.clone());
            }
        }
        out
    }
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.split_ascii_whitespace();
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path: String = it.collect::<Vec<_>>().join(" ");
    if !perms.contains('x') || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: Arc::from(path.trim_end_matches(" (deleted)")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 123 /usr/bin/fixture
55d0c0001000-55d0c0002000 r-xp 00001000 fe:01 123 /usr/bin/fixture
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f1000028000-7f100019d000 r-xp 00028000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn resolves_addresses_to_file_offsets() {
        let m = ProcMaps::parse(MAPS);
        let (path, off) = m.resolve(0x55d0c0001234).unwrap();
        assert_eq!(&**path, "/usr/bin/fixture");
        assert_eq!(off, 0x1234);
        let (path, off) = m.resolve(0x7f1000028010).unwrap();
        assert_eq!(&**path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(off, 0x28010);
        assert!(
            m.resolve(0x7f0000000010).is_none(),
            "anonymous memory has no module"
        );
        assert!(
            m.resolve(0x55d0c0000010).is_none(),
            "non-executable mapping"
        );
        assert_eq!(m.libraries("libc.so").len(), 1);
    }
}
