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

use tracer_common::{TRACED_CFI, TRACED_LEAF};

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

    /// How heap stacks are taken under `mode`. `auto`: copies where the walk would stop at the
    /// first function (code without frame pointers), the walk with leaf words where the program
    /// keeps frame pointers (the libraries it calls may not), and the plain walk for Python,
    /// whose lines come from the interpreter's frames.
    pub fn heap_stacks(self, mode: HeapUnwind) -> HeapStacks {
        match mode {
            HeapUnwind::FramePointers => HeapStacks::Walk,
            HeapUnwind::Cfi => HeapStacks::Copy,
            HeapUnwind::Auto if self.python => HeapStacks::Walk,
            HeapUnwind::Auto if self.frame_pointers => HeapStacks::WalkWithLeaf,
            HeapUnwind::Auto => HeapStacks::Copy,
        }
    }
}

/// How a process's heap stacks are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapStacks {
    /// The kernel's frame-pointer walk.
    Walk,
    /// The walk, and the top of the stack for user space to unwind the frameless functions
    /// between the allocator and the program (`TRACED_LEAF`).
    WalkWithLeaf,
    /// Raw stack copies, unwound in user space (`TRACED_CFI`).
    Copy,
}

impl HeapStacks {
    /// The process's traced flags with this choice in them.
    pub fn flags(self, flags: u32) -> u32 {
        let flags = flags & !(TRACED_CFI | TRACED_LEAF);
        match self {
            Self::Walk => flags,
            Self::WalkWithLeaf => flags | TRACED_LEAF,
            Self::Copy => flags | TRACED_CFI,
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
        let stacks = |fp, py, mode| traits(fp, py).heap_stacks(mode);
        assert_eq!(stacks(true, false, auto), HeapStacks::WalkWithLeaf);
        assert_eq!(stacks(false, false, auto), HeapStacks::Copy);
        assert_eq!(stacks(false, true, auto), HeapStacks::Walk, "Python");
        assert_eq!(stacks(true, true, auto), HeapStacks::Walk, "Python");
        assert_eq!(stacks(true, true, HeapUnwind::Cfi), HeapStacks::Copy);
        let fp = HeapUnwind::FramePointers;
        assert_eq!(stacks(false, false, fp), HeapStacks::Walk);
    }

    #[test]
    fn a_choice_replaces_the_last_in_the_flags() {
        let on = tracer_common::TRACED_ON;
        assert_eq!(HeapStacks::Copy.flags(on | TRACED_LEAF), on | TRACED_CFI);
        assert_eq!(
            HeapStacks::WalkWithLeaf.flags(on | TRACED_CFI),
            on | TRACED_LEAF
        );
        assert_eq!(HeapStacks::Walk.flags(on | TRACED_CFI | TRACED_LEAF), on);
    }

    #[test]
    fn an_empty_section_describes_no_function() {
        assert_eq!(frame_pointer_share(0x1000, &[]), 0.0);
    }
}
