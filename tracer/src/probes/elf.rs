//! Reading a shared object's exported functions: address, size and machine code, so that
//! placement.rs can decide where to probe them. Files are mapped, not read: CUDA and PyTorch
//! libraries run to hundreds of megabytes and only their symbol tables are looked at.
//!
//! A process that maps a library waits while it is looked at, and libtorch_cpu's tables hold
//! 600,000 symbols (76 MB of names): walking them all took 50–60 ms. So the names wanted are
//! first searched for in the tables' strings (~3 ms for 72 MB a name); only the symbols whose
//! names hold one are looked at (most tables hold none, and the look ends there).

use std::{fs::File, path::Path};

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use memchr::memmem::Finder;
use memmap2::Mmap;
use object::{
    Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SectionIndex,
    elf::{SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC, Sym64},
    read::elf::{ElfFile64, SectionHeader as _, Sym as _},
};

type Elf<'d> = ElfFile64<'d, Endianness>;

/// One exported function of an ELF file.
#[derive(Clone, Debug)]
pub struct Function {
    /// Virtual address in the file's own address space.
    pub addr: u64,
    /// Where its first byte is in the file: what a probe is attached at.
    pub file_offset: u64,
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
        Elf::parse(&*data).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(Self { data })
    }

    fn parsed(&self) -> Option<Elf<'_>> {
        Elf::parse(&*self.data).ok()
    }

    /// Looks up a defined function by name: a C name as is, a C++ one (`ns::function`) by its
    /// demangled name, whatever its parameters (dynamic table first, then the static one).
    pub fn function(&self, name: &str) -> Option<Function> {
        self.functions(&[name]).pop().flatten()
    }

    /// [`ElfFile::function`] of each of `names`, in one look at the tables.
    pub fn functions(&self, names: &[&str]) -> Vec<Option<Function>> {
        self.scan(names, |file, sym| {
            let endian = file.endian();
            let index = SectionIndex(usize::from(sym.st_shndx(endian)));
            let section = file.elf_section_table().section(index).ok()?;
            let data = section.data(endian, file.data()).ok()?;
            let addr = sym.st_value(endian);
            let start = addr.checked_sub(section.sh_addr(endian))?;
            let len = usize::try_from(sym.st_size(endian).clamp(1, 4096)).ok()?;
            let from = usize::try_from(start).ok()?;
            let code = data.get(from..from.saturating_add(len).min(data.len()))?;
            Some(Function {
                addr,
                file_offset: section.sh_offset(endian).checked_add(start)?,
                code: code.to_vec(),
            })
        })
    }

    /// Which of `names` the file defines as functions, in one look.
    pub fn defines(&self, names: &[&str]) -> Vec<bool> {
        let found = self.scan(names, |_, _| Some(()));
        found.iter().map(Option::is_some).collect()
    }

    /// `make` of the first defined function named each of `names` (see [`ElfFile::function`]):
    /// the dynamic table first, then the static one for the names not found yet.
    fn scan<T>(
        &self,
        names: &[&str],
        make: impl Fn(&Elf<'_>, &Sym64<Endianness>) -> Option<T>,
    ) -> Vec<Option<T>> {
        let mut found: Vec<Option<T>> = names.iter().map(|_| None).collect();
        let Some(file) = self.parsed() else {
            return found;
        };
        let wanted: Vec<Wanted> = names.iter().map(|n| Wanted::new(n)).collect();
        let needles: Vec<Finder> = wanted.iter().map(|w| Finder::new(&w.needle)).collect();
        let endian = file.endian();
        for table in [file.elf_dynamic_symbol_table(), file.elf_symbol_table()] {
            if found.iter().all(Option::is_some) {
                break;
            }
            let Some(strings) = file
                .elf_section_table()
                .section(table.string_section())
                .ok()
                .and_then(|s| s.data(endian, file.data()).ok())
            else {
                continue;
            };
            self.populate(strings);
            let holders = Holders::find(&needles, strings);
            if holders.is_empty() {
                continue;
            }
            for sym in table.symbols() {
                let kind = sym.st_type();
                if sym.st_shndx(endian) == SHN_UNDEF || (kind != STT_FUNC && kind != STT_GNU_IFUNC)
                {
                    continue;
                }
                let at = sym.st_name(endian);
                for w in holders.of(at) {
                    if found[w].is_some() {
                        continue;
                    }
                    let name = name_at(strings, at);
                    if name.is_some_and(|n| wanted[w].is(n)) {
                        found[w] = make(&file, sym);
                    }
                }
            }
        }
        found
    }

    /// Maps `part` of the file in at once: faulting 72 MB of names in page by page took longer
    /// than searching them. (A kernel without MADV_POPULATE_READ faults them in as before.)
    fn populate(&self, part: &[u8]) {
        let offset = (part.as_ptr() as usize).wrapping_sub(self.data.as_ptr() as usize);
        let _ = self
            .data
            .advise_range(memmap2::Advice::PopulateRead, offset, part.len());
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
fn got_slot(file: &Elf<'_>, name: &str) -> Option<u64> {
    let symbols = file.dynamic_symbol_table()?;
    file.dynamic_relocations()?.find_map(|(offset, r)| {
        let object::RelocationTarget::Symbol(index) = r.target() else {
            return None;
        };
        let sym = symbols.symbol_by_index(index).ok()?;
        (sym.name().ok()? == name).then_some(offset)
    })
}

/// The name at `at` in a string table.
fn name_at(strings: &[u8], at: u32) -> Option<&str> {
    let rest = strings.get(usize::try_from(at).ok()?..)?;
    let end = memchr::memchr(0, rest)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Where a string table holds the wanted names' needles: for each occurrence, the names that
/// start between its string's start and the occurrence hold it (tables share the tails of
/// names), as (string start, occurrence, wanted index), by string start.
struct Holders(Vec<(u32, u32, usize)>);

impl Holders {
    fn find(needles: &[Finder<'_>], strings: &[u8]) -> Self {
        let mut found: Vec<(u32, u32, usize)> = Vec::new();
        for (w, needle) in needles.iter().enumerate() {
            found.extend(needle.find_iter(strings).filter_map(|at| {
                let start = memchr::memrchr(0, &strings[..at]).map_or(0, |p| p + 1);
                Some((u32::try_from(start).ok()?, u32::try_from(at).ok()?, w))
            }));
        }
        found.sort_unstable();
        Self(found)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The wanted names whose needle the name at `at` holds. Only the occurrences in the
    /// string `at` is in can: those with the nearest string start at or below it.
    fn of(&self, at: u32) -> impl Iterator<Item = usize> + '_ {
        let end = self.0.partition_point(|h| h.0 <= at);
        let start = self.0[..end]
            .last()
            .map_or(end, |last| self.0[..end].partition_point(|h| h.0 < last.0));
        self.0[start..end]
            .iter()
            .filter(move |h| at <= h.1)
            .map(|h| h.2)
    }
}

/// A function name looked up: a C name as is, a C++ one (`ns::function`) by its demangled name.
/// `needle` is what every name that may be it holds: a C name and its terminating zero, a C++
/// name's parts as the mangling writes them (`3c109alloc_cpu`).
struct Wanted<'n> {
    name: &'n str,
    cxx: bool,
    needle: String,
}

impl<'n> Wanted<'n> {
    fn new(name: &'n str) -> Self {
        let cxx = name.contains("::");
        let needle = if cxx {
            name.split("::")
                .map(|p| format!("{}{p}", p.len()))
                .collect()
        } else {
            format!("{name}\0")
        };
        Self { name, cxx, needle }
    }

    fn is(&self, sym: &str) -> bool {
        if self.cxx {
            (sym.starts_with("_Z") || sym.starts_with("_R")) && demangled(sym) == self.name
        } else {
            sym == self.name
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
    use super::{ElfFile, Holders, Wanted};
    use memchr::memmem::Finder;

    #[test]
    fn names_that_share_a_tail_hold_the_needle_and_others_do_not() {
        // "xcudaMalloc" at 1, its tail "cudaMalloc" at 2 (a table shares tails), "cudaMallocHost"
        // at 13, "foo" at 28.
        let strings = b"\0xcudaMalloc\0cudaMallocHost\0foo\0";
        let wanted = [Wanted::new("cudaMalloc"), Wanted::new("c10::alloc_cpu")];
        let needles: Vec<Finder> = wanted.iter().map(|w| Finder::new(&w.needle)).collect();
        let holders = Holders::find(&needles, strings);
        let of = |at| holders.of(at).collect::<Vec<_>>();
        assert_eq!((of(1), of(2), of(3)), (vec![0], vec![0], vec![]));
        assert_eq!((of(13), of(28), of(0)), (vec![], vec![], vec![]));
        assert_eq!(wanted[1].needle, "3c109alloc_cpu");
    }

    #[inline(never)]
    #[unsafe(no_mangle)]
    extern "C" fn leaktracer_elf_test_target(x: u64) -> u64 {
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(7)
    }

    #[inline(never)]
    fn mangled_target(x: u64) -> u64 {
        x.wrapping_mul(0x2545_f491_4f6c_dd1d).rotate_left(11)
    }

    /// A function looked up by name, C or Rust (demangled), in the dynamic or the static table:
    /// its address as the `object` crate's own symbol walk gives it, and its bytes at the file
    /// offset a probe would be attached at.
    #[test]
    fn functions_are_found_with_their_address_and_file_offset() {
        use object::{Object, ObjectSymbol};
        std::hint::black_box((
            leaktracer_elf_test_target(1),
            mangled_target as fn(u64) -> u64,
        ));
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let exe = std::env::current_exe().unwrap();
        let cases = [
            (libc.into(), "malloc"),
            (exe.clone(), "leaktracer_elf_test_target"),
            (exe, "tracer::probes::elf::tests::mangled_target"),
        ];
        for (path, name) in cases {
            let elf = ElfFile::open(&path).unwrap();
            let [Some(f), None] = &elf.functions(&[name, "no_such_function"])[..] else {
                panic!("{name} in {}", path.display());
            };
            let data = std::fs::read(&path).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let oracle = file
                .dynamic_symbols()
                .chain(file.symbols())
                .find(|s| {
                    s.name() == Ok(name) || s.name().is_ok_and(|n| super::demangled(n) == name)
                })
                .unwrap();
            assert_eq!(f.addr, oracle.address(), "{name}");
            let at = usize::try_from(f.file_offset).unwrap();
            assert_eq!(&data[at..at + f.code.len()], &f.code[..], "{name}");
            assert!(f.code.len() > 4, "{name}");
        }
    }

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
