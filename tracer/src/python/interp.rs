//! Finding the CPython interpreter a process runs: the file that holds it (libpython3.X.so, or
//! a python3.X executable built without the shared library), its version and where its data
//! symbols are in the process.

use std::{path::Path, sync::Arc};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::procfs::ProcMaps;

/// Bytes of `_Py_DebugOffsets` read from the interpreter's file: the words version.rs reads
/// (it checks the two agree).
pub const DEBUG_OFFSETS_LEN: usize = 73 * 8;

/// A CPython found in a process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// (major, minor), from the file's name.
    pub version: (u8, u8),
    pub path: Arc<str>,
    /// Where `PyCode_Type` is in the process: every code object points at it.
    pub code_type: u64,
    /// Where `_PyRuntime` (the runtime state: the GIL holder, the interpreters) is.
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault` as file offsets in `path`: the native frames that run Python.
    pub eval: Option<(u64, u64)>,
    /// 3.13+: the `_Py_DebugOffsets` that `_PyRuntime` starts with, as the file holds it.
    pub debug_offsets: Option<Vec<u8>>,
}

/// The interpreter `pid` runs, if any: the first mapped file named libpython3.X.so… or
/// python3.X that defines `PyCode_Type`.
pub fn detect(pid: u32) -> Option<Interpreter> {
    let maps = ProcMaps::read(pid)?;
    maps.paths()
        .filter_map(|p| Some((p, version_of(p)?)))
        .find_map(|(path, version)| {
            let (start, offset) = maps
                .mappings()
                .find(|(_, _, _, p)| *p == path)
                .map(|(s, _, o, _)| (s, o))?;
            let symbol = |name| data_symbol(Path::new(&**path), name, start, offset);
            Some(Interpreter {
                version,
                path: path.clone(),
                code_type: symbol("PyCode_Type")?,
                runtime: symbol("_PyRuntime")?,
                eval: function_range(Path::new(&**path), "_PyEval_EvalFrameDefault"),
                debug_offsets: (version >= (3, 13))
                    .then(|| symbol_bytes(Path::new(&**path), "_PyRuntime", DEBUG_OFFSETS_LEN))
                    .flatten(),
            })
        })
}

/// (3, 11) from ".../libpython3.11.so.1.0" or ".../python3.11".
pub fn version_of(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython3.")
        .or_else(|| name.strip_prefix("python3."))?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[minor.len()..];
    let named = after.is_empty() || after.starts_with(".so") || after.starts_with('d');
    named.then(|| Some((3, minor.parse().ok()?))).flatten()
}

/// `f` of the parsed ELF file at `path` and its symbol `name` (defined, and sized when `sized`).
fn with_symbol<T>(
    path: &Path,
    name: &str,
    sized: bool,
    f: impl FnOnce(&object::File, &object::Symbol) -> Option<T>,
) -> Option<T> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping, parsed with bounds checks.
    let data = unsafe { memmap2::Mmap::map(&file).ok()? };
    let elf = object::File::parse(&*data).ok()?;
    let sym = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(name) && (!sized || s.size() > 0))?;
    f(&elf, &sym)
}

/// The run-time address of data symbol `name` of the ELF file at `path`, whose executable pages
/// were mapped at `start` from file offset `offset`.
fn data_symbol(path: &Path, name: &str, start: u64, offset: u64) -> Option<u64> {
    with_symbol(path, name, false, |elf, sym| {
        let segment = elf.segments().find(|s| {
            let (o, len) = s.file_range();
            o <= offset && offset < o + len
        })?;
        let bias = start.checked_sub(segment.address() + (offset - segment.file_range().0))?;
        Some(sym.address() + bias)
    })
}

/// The first `len` bytes of initialized data symbol `name`, as the ELF file at `path` holds them.
fn symbol_bytes(path: &Path, name: &str, len: usize) -> Option<Vec<u8>> {
    use object::ObjectSection;
    with_symbol(path, name, false, |elf, sym| {
        let section = elf.section_by_index(sym.section_index()?).ok()?;
        let bytes = section.data_range(sym.address(), len as u64).ok()??;
        Some(bytes.to_vec())
    })
}

/// The file offsets `[start, end)` of function `name` in the ELF file at `path`.
fn function_range(path: &Path, name: &str) -> Option<(u64, u64)> {
    with_symbol(path, name, true, |elf, sym| {
        let segment = elf
            .segments()
            .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())?;
        let start = sym.address() - segment.address() + segment.file_range().0;
        Some((start, start + sym.size()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_file_name() {
        assert_eq!(version_of("/usr/lib/libpython3.11.so.1.0"), Some((3, 11)));
        assert_eq!(
            version_of("/root/.pyenv/versions/3.12.1/bin/python3.12"),
            Some((3, 12))
        );
        assert_eq!(version_of("/usr/bin/python3.13d"), Some((3, 13)));
        assert_eq!(
            version_of("/usr/lib/python3.11/lib-dynload/_ssl.cpython-311.so"),
            None
        );
        assert_eq!(version_of("/usr/bin/python3"), None);
    }
}
