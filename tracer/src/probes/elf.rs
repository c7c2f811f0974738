//! Reading a shared object's exported functions: address, size and machine code, so that
//! placement.rs can decide where to probe them. Files are mapped, not read: CUDA and PyTorch
//! libraries run to hundreds of megabytes and only their symbol tables are looked at.

use std::{fs::File, path::Path};

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSymbol};

/// One exported function of an ELF file.
#[derive(Clone, Debug)]
pub struct Function {
    /// The symbol's (mangled) name, to attach by.
    pub symbol: String,
    /// Virtual address in the file's own address space.
    pub addr: u64,
    /// The function's bytes (as much as the symbol size says, at most 4 KiB).
    pub code: Vec<u8>,
}

/// The exported functions of one ELF file that leaktracer looks up.
pub struct ElfFile {
    data: Mmap,
}

impl ElfFile {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: a read-only private mapping; a library replaced on disk while mapped is the one
        // hazard, and the parse below checks every offset it reads.
        let data = unsafe { Mmap::map(&file)? };
        object::File::parse(&*data)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(Self { data })
    }

    fn parsed(&self) -> Option<object::File<'_>> {
        object::File::parse(&*self.data).ok()
    }

    /// Looks up a defined function by name: a C name as is, a C++ one (`ns::function`) by its
    /// demangled name, whatever its parameters (dynamic table first, then the static one).
    pub fn function(&self, name: &str) -> Option<Function> {
        let file = self.parsed()?;
        let cxx = name
            .rsplit_once("::")
            .map(|(_, last)| format!("{}{last}", last.len()));
        let matches = |sym: &str| match &cxx {
            None => sym == name,
            Some(piece) => {
                (sym.starts_with("_Z") || sym.starts_with("_R"))
                    && sym.contains(piece)
                    && demangled(sym) == name
            }
        };
        let sym = file.dynamic_symbols().chain(file.symbols()).find(|s| {
            s.is_definition() && s.kind() == object::SymbolKind::Text && s.name().is_ok_and(matches)
        })?;
        let section = file.section_by_index(sym.section_index()?).ok()?;
        let data = section.data().ok()?;
        let start = usize::try_from(sym.address().checked_sub(section.address())?).ok()?;
        let len = usize::try_from(sym.size().clamp(1, 4096)).ok()?;
        let code = data
            .get(start..start.saturating_add(len).min(data.len()))?
            .to_vec();
        Some(Function {
            symbol: sym.name().ok()?.to_string(),
            addr: sym.address(),
            code,
        })
    }

    /// Whether the file is statically linked (no program interpreter).
    pub fn is_static_executable(&self) -> bool {
        self.parsed().is_some_and(|f| {
            f.section_by_name(".interp").is_none() && f.kind() == object::ObjectKind::Executable
        })
    }
}

/// A C++ or Rust symbol's qualified function name without its parameters or hash
/// ("c10::alloc_cpu", "harness::train_step").
fn demangled(sym: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(sym) {
        let rust = format!("{d:#}");
        if !rust.contains('(') {
            return rust;
        }
    }
    let Ok(s) = cpp_demangle::Symbol::new(sym) else {
        return String::new();
    };
    let opts = cpp_demangle::DemangleOptions::new()
        .no_params()
        .no_return_type();
    s.demangle_with_options(&opts).unwrap_or_default()
}

/// Whether the ELF file at `path` is statically linked (no program interpreter): it maps no libc, so
/// heap probes in a libc cannot see its allocations. `None` when it is not a readable ELF file (a
/// script, for instance: its interpreter decides).
pub fn is_static_executable(path: &Path) -> Option<bool> {
    ElfFile::open(path).ok().map(|f| f.is_static_executable())
}

#[cfg(test)]
mod tests {
    #[test]
    fn demangles_to_the_qualified_name() {
        assert_eq!(super::demangled("_ZN3c109alloc_cpuEm"), "c10::alloc_cpu");
        assert_eq!(super::demangled("malloc"), "");
        assert_eq!(
            super::demangled("_ZN7harness10train_step17h0123456789abcdefE"),
            "harness::train_step"
        );
    }
}
