//! Reading a shared object's exported functions: address, size and machine code, so that
//! placement.rs can decide where to probe them. Files are mapped, not read: CUDA and PyTorch
//! libraries run to hundreds of megabytes and only their symbol tables are looked at.

use std::{fs::File, path::Path};

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable};

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
        self.functions(&[name]).pop().flatten()
    }

    /// [`ElfFile::function`] of each of `names`, in one pass over the symbols: libtorch's tables
    /// hold hundreds of thousands, and a process that maps a library waits for this.
    pub fn functions(&self, names: &[&str]) -> Vec<Option<Function>> {
        self.scan(names, |file, sym| {
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
        })
    }

    /// Which of `names` the file defines as functions, in one pass.
    pub fn defines(&self, names: &[&str]) -> Vec<bool> {
        let found = self.scan(names, |_, _| Some(()));
        found.iter().map(Option::is_some).collect()
    }

    /// `make` of the first defined function named each of `names` (see [`ElfFile::function`]).
    fn scan<T>(
        &self,
        names: &[&str],
        make: impl Fn(&object::File<'_>, &object::Symbol<'_, '_>) -> Option<T>,
    ) -> Vec<Option<T>> {
        let mut found: Vec<Option<T>> = names.iter().map(|_| None).collect();
        let Some(file) = self.parsed() else {
            return found;
        };
        let wanted: Vec<Wanted> = names.iter().map(|n| Wanted::new(n)).collect();
        let defined = file
            .dynamic_symbols()
            .chain(file.symbols())
            .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text);
        for sym in defined {
            let Ok(name) = sym.name() else { continue };
            for (w, f) in wanted.iter().zip(found.iter_mut()) {
                if f.is_none() && w.is(name) {
                    *f = make(&file, &sym);
                }
            }
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        found
    }

    /// The addresses of the PLT stubs through which the file's code calls `name` (a function of
    /// another library): the stubs that jump through the GOT slot of its `JUMP_SLOT` relocation.
    pub fn plt_stubs(&self, name: &str) -> Vec<u64> {
        let Some(file) = self.parsed() else {
            return Vec::new();
        };
        let Some(slot) = got_slot(&file, name) else {
            return Vec::new();
        };
        let plts = file
            .sections()
            .filter(|s| matches!(s.name(), Ok(".plt" | ".plt.sec")));
        let mut stubs = Vec::new();
        for section in plts {
            let Ok(data) = section.data() else { continue };
            let mut decoder = Decoder::with_ip(64, data, section.address(), DecoderOptions::NONE);
            stubs.extend(decoder.iter().filter_map(|i| {
                let through = i.flow_control() == FlowControl::IndirectBranch
                    && i.is_ip_rel_memory_operand()
                    && i.ip_rel_memory_address() == slot;
                // Stubs are 16 bytes, aligned; an IBT one (`.plt.sec`) starts with `endbr64`.
                through.then_some(i.ip() & !15)
            }));
        }
        stubs
    }

    /// Whether the file is statically linked (no program interpreter).
    pub fn is_static_executable(&self) -> bool {
        self.parsed().is_some_and(|f| {
            f.section_by_name(".interp").is_none() && f.kind() == object::ObjectKind::Executable
        })
    }
}

/// The GOT slot that the dynamic linker fills with `name`'s address (its `JUMP_SLOT`).
fn got_slot(file: &object::File<'_>, name: &str) -> Option<u64> {
    let symbols = file.dynamic_symbol_table()?;
    file.dynamic_relocations()?.find_map(|(offset, r)| {
        let object::RelocationTarget::Symbol(index) = r.target() else {
            return None;
        };
        let sym = symbols.symbol_by_index(index).ok()?;
        (sym.name().ok()? == name).then_some(offset)
    })
}

/// A function name looked up: a C name as is, a C++ one (`ns::function`) by its demangled name,
/// tried only on symbols that hold its last part as the mangling writes it.
struct Wanted<'n> {
    name: &'n str,
    cxx: Option<String>,
}

impl<'n> Wanted<'n> {
    fn new(name: &'n str) -> Self {
        let cxx = name
            .rsplit_once("::")
            .map(|(_, last)| format!("{}{last}", last.len()));
        Self { name, cxx }
    }

    fn is(&self, sym: &str) -> bool {
        match &self.cxx {
            None => sym == self.name,
            Some(piece) => {
                (sym.starts_with("_Z") || sym.starts_with("_R"))
                    && sym.contains(piece)
                    && demangled(sym) == self.name
            }
        }
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
