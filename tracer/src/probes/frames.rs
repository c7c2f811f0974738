//! How a process's heap stacks are taken (`--unwind`): by the kernel's frame-pointer walk, or as
//! raw stack copies that user space unwinds with the call-frame information (`.eh_frame`).
//!
//! The walk is cheap and exact for code built with frame pointers. Programs built the way
//! distributions and users build them (x86-64 `-O2`) have none: the walk stops at the allocator's
//! caller, or follows a register that holds something else. The copies cost more per allocation
//! (docs/performance.md), most of it in user space, where each record is unwound: a program that
//! makes a million allocations from thousands of sites at start-up (libtorch's static
//! initialisation) is unwound slower than it allocates. So `auto` copies only for executables
//! without frame pointers, where the walk is wrong for every allocation.
//!
//! A program with frame pointers that allocates through code without them (libstdc++'s
//! `operator new`, glibc's `strdup`) loses one frame to the walk: the one that called that
//! code (the walk goes from the frameless function to its caller's caller). `--unwind cfi`
//! gets it back, at the copies' cost.
//! Python interpreters keep the walk: their lines come from the interpreter's own frames.

use std::{fs::File, path::Path};

use gimli::{BaseAddresses, CallFrameInstruction, CieOrFde, EhFrame, UnwindSection, X86_64};
use memmap2::Mmap;
use object::{Object, ObjectSection};

use crate::model::HeapUnwind;

/// What decides how an executable's heap stacks are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeTraits {
    /// Most of its functions keep a frame pointer (their call-frame rules are based on `rbp`).
    pub frame_pointers: bool,
    /// It is a CPython interpreter.
    pub python: bool,
}

impl CodeTraits {
    /// Reads the traits of the ELF file at `path`; None when it cannot be read or parsed.
    pub fn of(path: &Path) -> Option<Self> {
        let file = File::open(path).ok()?;
        // SAFETY: a read-only private mapping; every offset read is bounds-checked by the parsers.
        let map = unsafe { Mmap::map(&file) }.ok()?;
        let elf = object::File::parse(&*map).ok()?;
        let frame_pointers = elf
            .section_by_name(".eh_frame")
            .and_then(|s| Some((s.address(), s.data().ok()?)))
            .is_some_and(|(addr, data)| frame_pointer_share(addr, data) >= 0.5);
        Some(Self {
            frame_pointers,
            python: crate::python::interp::version_of(&path.to_string_lossy()).is_some(),
        })
    }

    /// Whether heap stacks go as raw copies under `mode`.
    pub fn wants_cfi(self, mode: HeapUnwind) -> bool {
        match mode {
            HeapUnwind::FramePointers => false,
            HeapUnwind::Cfi => true,
            HeapUnwind::Auto => !self.python && !self.frame_pointers,
        }
    }
}

/// The share of the functions described in an `.eh_frame` section (at address `addr`) with a
/// frame whose canonical frame address is computed from `rbp` somewhere in their body: 1.0 for
/// code built with frame pointers, near 0 for code without (only functions that realign or
/// `alloca` their stack keep one then). Functions without a frame of their own (leaves that push
/// nothing, `_start`) and the PLT (whose rule is an expression) count for neither.
pub fn frame_pointer_share(addr: u64, data: &[u8]) -> f64 {
    let eh = EhFrame::new(data, gimli::LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(addr);
    let mut entries = eh.entries(&bases);
    let (mut functions, mut with_fp) = (0u64, 0u64);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|eh, bases, o| eh.cie_from_offset(bases, o)) else {
            continue;
        };
        let (mut frame, mut rbp, mut expression) = (false, false, false);
        let mut rules = fde.instructions(&eh, &bases);
        while let Ok(Some(rule)) = rules.next() {
            match rule {
                CallFrameInstruction::DefCfa { register, .. }
                | CallFrameInstruction::DefCfaRegister { register } => {
                    frame = true;
                    rbp |= register == X86_64::RBP;
                }
                CallFrameInstruction::DefCfaOffset { .. } => frame = true,
                CallFrameInstruction::DefCfaExpression { .. } => expression = true,
                _ => {}
            }
        }
        if frame && !expression {
            functions += 1;
            with_fp += u64::from(rbp);
        }
    }
    if functions == 0 {
        return 0.0;
    }
    with_fp as f64 / functions as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traits(frame_pointers: bool, python: bool) -> CodeTraits {
        CodeTraits {
            frame_pointers,
            python,
        }
    }

    #[test]
    fn auto_copies_stacks_only_where_the_walk_is_wrong() {
        let auto = HeapUnwind::Auto;
        assert!(!traits(true, false).wants_cfi(auto), "frame pointers");
        assert!(traits(false, false).wants_cfi(auto), "none");
        assert!(
            !traits(false, true).wants_cfi(auto),
            "Python: its own frames"
        );
        assert!(traits(true, true).wants_cfi(HeapUnwind::Cfi));
        assert!(!traits(false, false).wants_cfi(HeapUnwind::FramePointers));
    }

    #[test]
    fn an_empty_section_describes_no_function() {
        assert_eq!(frame_pointer_share(0x1000, &[]), 0.0);
    }
}
