//! Reading a shared object's exported functions: address, size and machine code, so that
//! placement.rs can decide where to probe them.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol};

/// One exported function of an ELF file.
#[derive(Clone, Debug)]
pub struct Function {
    /// Virtual address in the file's own address space.
    pub addr: u64,
    /// The function's bytes (as much as the symbol size says, at most 4 KiB).
    pub code: Vec<u8>,
}

/// The exported functions of one ELF file that leaktracer looks up.
pub struct ElfFile {
    data: Vec<u8>,
}

impl ElfFile {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            data: std::fs::read(path)?,
        })
    }

    /// Looks up a defined function symbol by name (dynamic table first, then the static one).
    pub fn function(&self, name: &str) -> Option<Function> {
        let file = object::File::parse(&*self.data).ok()?;
        let sym = file.dynamic_symbols().chain(file.symbols()).find(|s| {
            s.is_definition() && s.name() == Ok(name) && s.kind() == object::SymbolKind::Text
        })?;
        let section = file.section_by_index(sym.section_index()?).ok()?;
        let data = section.data().ok()?;
        let start = usize::try_from(sym.address().checked_sub(section.address())?).ok()?;
        let len = usize::try_from(sym.size().clamp(1, 4096)).ok()?;
        let code = data
            .get(start..start.saturating_add(len).min(data.len()))?
            .to_vec();
        Some(Function {
            addr: sym.address(),
            code,
        })
    }
}

/// Whether the ELF file at `path` is statically linked (no program interpreter): it maps no libc, so
/// heap probes in a libc cannot see its allocations. `None` when it is not a readable ELF file (a
/// script, for instance: its interpreter decides).
pub fn is_static_executable(path: &Path) -> Option<bool> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let interp = file.section_by_name(".interp").is_some();
    Some(!interp && file.kind() == object::ObjectKind::Executable)
}
