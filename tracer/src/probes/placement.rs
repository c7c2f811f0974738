//! Where to put each uprobe inside a function. A breakpoint on an instruction the kernel cannot
//! emulate is executed out of line with a single step, which costs ~150 µs on a nested VM (glibc's
//! `free` starts with `test %rdi,%rdi`). The kernel emulates `push reg`, `jmp rel`, `jcc rel` and
//! `call rel`, so the probe goes on the first such instruction of the function's straight-line
//! prologue, provided nothing before it changes the argument registers or the stack pointer (the
//! return probe reads the return address at [rsp]) and nothing else in the function jumps past the
//! start into that prologue. When unsure: offset 0.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    OpKind, Register,
};
use tracer_common::CallSite;

/// Instructions of the prologue examined before giving up.
const MAX_PROLOGUE: usize = 12;

/// The chosen probe offset from the function start and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub offset: u64,
    pub reason: &'static str,
    /// The probed instruction is one the kernel emulates (one trap a hit).
    pub emulated: bool,
}

impl Placement {
    pub const fn entry(reason: &'static str) -> Self {
        Self {
            offset: 0,
            reason,
            emulated: false,
        }
    }
}

/// Chooses the probe offset for a function whose machine code is `code`, loaded at `addr`, that
/// takes its arguments in `args`.
pub fn choose(code: &[u8], addr: u64, args: &[Register]) -> Placement {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut instr = Instruction::default();
    for _ in 0..MAX_PROLOGUE {
        if !decoder.can_decode() {
            return Placement::entry("function ends in its prologue");
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return Placement::entry("undecodable instruction");
        }
        if is_emulated(&instr) {
            let offset = instr.ip() - addr;
            if offset == 0 {
                return Placement {
                    emulated: true,
                    ..Placement::entry("first instruction is emulated")
                };
            }
            if jumps_into(code, addr, offset) {
                return Placement::entry("a branch targets the prologue");
            }
            return Placement {
                offset,
                reason: "first emulated instruction; arguments intact",
                emulated: true,
            };
        }
        if instr.flow_control() != FlowControl::Next {
            return Placement::entry("control flow before an emulated instruction");
        }
        if writes_any(&mut info, &instr, args) {
            return Placement::entry("prologue changes an argument register or the stack pointer");
        }
    }
    Placement::entry("no emulated instruction in the prologue")
}

/// The slot of a table of functions that the function `code` (loaded at `addr`) jumps through
/// (`jmp *disp(%rip)`, CPython's `PyObject_Free` calling the object allocator its `_PyObject`
/// table holds), found in its straight-line code (conditional branches are passed): the slot's
/// address in the same address space as `addr`. None when it has none.
pub fn jump_slot(code: &[u8], addr: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    for _ in 0..MAX_PROLOGUE {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instr);
        match instr.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch => continue,
            FlowControl::IndirectBranch if instr.is_ip_rel_memory_operand() => {
                return Some(instr.ip_rel_memory_address());
            }
            _ => return None,
        }
    }
    None
}

/// The register that holds argument `r` of a function called with one more argument before it
/// (a table's function: its context first): RDI's argument in RSI, RSI's in RDX…
pub fn next_argument(r: Register) -> Option<Register> {
    const ORDER: [Register; 6] = [
        Register::RDI,
        Register::RSI,
        Register::RDX,
        Register::RCX,
        Register::R8,
        Register::R9,
    ];
    let at = ORDER.iter().position(|&x| x == r)?;
    ORDER.get(at + 1).copied()
}

/// Instructions of a function examined for the call [`after_call`] looks for.
const MAX_TO_CALL: usize = 48;

/// Where one probe can stand for an allocator's entry and return probes: right after its call
/// to a function that returns the block through an out-parameter, `f(&slot, align, n)`
/// (`c10::alloc_cpu` calling `posix_memalign`). The function must keep a frame pointer (the
/// caller's frame is found from it, as at a return), pass `&slot` as `lea disp(%rbp),%rdi` and
/// `n` from a callee-saved register, and reach the probe only from the call, with nothing
/// between the two that changes the result, `n`, the frame pointer or memory. The probe goes on
/// the first emulated instruction after the call (the test of the result's branch). None when
/// anything differs: the entry and return probes are kept.
pub fn after_call(code: &[u8], addr: u64, callee: &[u64]) -> Option<(u64, CallSite)> {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let head: Vec<Instruction> = decoder.iter().take(2).collect();
    let frame = matches!(&head[..], [push, mov]
        if push.code() == Code::Push_r64 && push.op0_register() == Register::RBP
            && mov.code() == Code::Mov_rm64_r64 && mov.op0_register() == Register::RBP
            && mov.op1_register() == Register::RSP);
    if !frame {
        return None;
    }
    let (site, set_up) = arguments_of_call(&mut decoder, &mut info, callee)?;
    let kept = [
        Register::RAX,
        Register::RBP,
        Register::RSP,
        CALL_SITE_REGISTERS[site.size_reg as usize],
    ];
    for instr in decoder.iter().take(MAX_PROLOGUE) {
        if is_emulated(&instr) {
            if jumps_between(code, addr, set_up, instr.ip()) {
                return None;
            }
            return Some((instr.ip() - addr, site));
        }
        if instr.flow_control() != FlowControl::Next
            || writes(&mut info, &instr, &kept)
            || writes_memory(&mut info, &instr)
        {
            return None;
        }
    }
    None
}

/// Decodes on to the first call to one of `callee`, and reads from the straight-line code before
/// it the slot (`lea disp(%rbp),%rdi`) and the size's register (`mov %reg,%rdx`) it is passed:
/// the call site, and the address of the first of the two instructions that set them up. None
/// at a return, a jump or a write of the frame pointer first.
fn arguments_of_call(
    decoder: &mut Decoder<'_>,
    info: &mut InstructionInfoFactory,
    callee: &[u64],
) -> Option<(CallSite, u64)> {
    // Each with the ip of the instruction that set it up.
    let mut slot: Option<(i32, u64)> = None; // rdi's displacement from rbp
    let mut size: Option<(u8, u64)> = None; // the register rdx came from
    for instr in decoder.iter().take(MAX_TO_CALL) {
        if instr.is_call_near() && callee.contains(&instr.near_branch_target()) {
            let ((slot_disp, slot_ip), (size_reg, size_ip)) = (slot?, size?);
            return Some((
                CallSite {
                    size_reg,
                    slot_disp,
                },
                slot_ip.min(size_ip),
            ));
        }
        if matches!(
            instr.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) || writes(info, &instr, &[Register::RBP])
        {
            return None;
        }
        if instr.flow_control() != FlowControl::Next
            && instr.flow_control() != FlowControl::ConditionalBranch
        {
            (slot, size) = (None, None); // another call: rdi and rdx are the callee's to change
            continue;
        }
        if writes(info, &instr, &[Register::RDI]) {
            slot = frame_slot(&instr).map(|d| (d, instr.ip()));
        }
        if writes(info, &instr, &[Register::RDX]) {
            size = saved_source(&instr).map(|r| (r, instr.ip()));
        } else if let Some((r, _)) = size
            && writes(info, &instr, &[CALL_SITE_REGISTERS[r as usize]])
        {
            size = None;
        }
    }
    None
}

/// The registers a [`CallSite`]'s `size_reg` names, by index.
const CALL_SITE_REGISTERS: [Register; 5] = [
    Register::RBX,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// `lea disp(%rbp),%rdi`: the displacement.
fn frame_slot(i: &Instruction) -> Option<i32> {
    let lea = i.code() == Code::Lea_r64_m
        && i.op0_register() == Register::RDI
        && i.memory_base() == Register::RBP
        && i.memory_index() == Register::None;
    lea.then(|| i.memory_displacement64() as i64 as i32)
}

/// `mov %reg,%rdx` from a register of [`CALL_SITE_REGISTERS`]: its index.
fn saved_source(i: &Instruction) -> Option<u8> {
    if !matches!(i.code(), Code::Mov_rm64_r64 | Code::Mov_r64_rm64)
        || i.op0_register() != Register::RDX
        || i.op1_kind() != OpKind::Register
    {
        return None;
    }
    let at = CALL_SITE_REGISTERS
        .iter()
        .position(|r| *r == i.op1_register())?;
    Some(at as u8)
}

/// Whether `i` writes memory.
fn writes_memory(info: &mut InstructionInfoFactory, i: &Instruction) -> bool {
    info.info(i).used_memory().iter().any(|m| {
        matches!(
            m.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        )
    })
}

/// Instructions the x86 uprobe code emulates instead of single-stepping.
fn is_emulated(i: &Instruction) -> bool {
    let push_reg =
        matches!(i.code(), Code::Push_r64 | Code::Push_r16) && i.op0_kind() == OpKind::Register;
    let rel_branch = i.is_jmp_short_or_near() || i.is_jcc_short_or_near() || i.is_call_near();
    push_reg || rel_branch
}

/// Whether `i` writes one of `args` (any width) or the stack pointer.
fn writes_any(info: &mut InstructionInfoFactory, i: &Instruction, args: &[Register]) -> bool {
    writes(info, i, args) || writes(info, i, &[Register::RSP])
}

/// Whether `i` writes one of `regs` (any width).
fn writes(info: &mut InstructionInfoFactory, i: &Instruction, regs: &[Register]) -> bool {
    info.info(i).used_registers().iter().any(|u| {
        let written = matches!(
            u.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        );
        written && regs.contains(&u.register().full_register())
    })
}

/// Whether any direct branch in `code` lands strictly inside (addr, addr + offset].
fn jumps_into(code: &[u8], addr: u64, offset: u64) -> bool {
    jumps_between(code, addr, addr, addr + offset)
}

/// Whether any direct branch in `code` (loaded at `addr`) lands strictly inside (from, to].
fn jumps_between(code: &[u8], addr: u64, from: u64, to: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    decoder.iter().any(|i| {
        let direct = matches!(
            i.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) && matches!(
            i.op0_kind(),
            OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
        );
        let t = i.near_branch_target();
        direct && t > from && t <= to
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RDI: &[Register] = &[Register::RDI];

    #[test]
    fn free_probe_moves_past_the_null_test() {
        // test %rdi,%rdi ; je +0xbf ; push %rbp ; lea -0x10(%rdi),%rsi ; ret...
        let code = [
            0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55, 0x48, 0x8d, 0x77, 0xf0, 0xc3,
        ];
        assert_eq!(choose(&code, 0x1000, RDI).offset, 3);
    }

    #[test]
    fn malloc_push_first_stays_at_zero() {
        let code = [0x41, 0x54, 0x55, 0x53, 0xc3];
        let p = choose(&code, 0x1000, RDI);
        assert_eq!(
            p,
            Placement {
                emulated: true,
                ..Placement::entry("first instruction is emulated")
            }
        );
    }

    /// CPython 3.11's `PyObject_Free` (pyenv's build): `mov %rdi,%rsi ; mov _PyObject(%rip),%rdi ;
    /// jmp *_PyObject+0x20(%rip)`.
    const PY_OBJECT_FREE: [u8; 16] = [
        0x48, 0x89, 0xfe, 0x48, 0x8b, 0x3d, 0xe6, 0xcf, 0x2a, 0x00, 0xff, 0x25, 0x00, 0xd0, 0x2a,
        0x00,
    ];

    #[test]
    fn a_wrapper_that_jumps_through_a_table_gives_its_slot() {
        let p = choose(&PY_OBJECT_FREE, 0x1af270, RDI);
        assert!(!p.emulated, "the pointer is moved out of rdi first: {p:?}");
        assert_eq!(jump_slot(&PY_OBJECT_FREE, 0x1af270), Some(0x45c280));
        // PyObject_Malloc: mov %rdi,%rsi ; test %rdi,%rdi ; js ; mov _PyObject(%rip),%rdi ;
        // jmp *_PyObject+8(%rip): its slot past the branch, and its probe on the branch (the
        // size still in rdi).
        let malloc = [
            0x48, 0x89, 0xfe, 0x48, 0x85, 0xff, 0x78, 0x10, 0x48, 0x8b, 0x3d, 0x71, 0xd0, 0x2a,
            0x00, 0xff, 0x25, 0x73, 0xd0, 0x2a, 0x00,
        ];
        assert_eq!(jump_slot(&malloc, 0x1af1e0), Some(0x45c268));
        assert_eq!(choose(&malloc, 0x1af1e0, RDI).offset, 6);
        // A function that returns first has no slot.
        assert_eq!(jump_slot(&[0xc3], 0x1000), None);
    }

    #[test]
    fn the_tables_function_is_probed_with_its_arguments_one_register_on() {
        // _PyObject_Free(ctx, p): test %rsi,%rsi ; je ; mov %rsi,%rcx ; lea …(%rip),%rdx
        let code = [
            0x48, 0x85, 0xf6, 0x74, 0x7b, 0x48, 0x89, 0xf1, 0x48, 0x8d, 0x15, 0x31, 0x8a, 0x3c,
            0x00,
        ];
        let args: Vec<Register> = RDI.iter().filter_map(|&r| next_argument(r)).collect();
        assert_eq!(args, [Register::RSI]);
        let p = choose(&code, 0x1aede0, &args);
        assert_eq!((p.offset, p.emulated), (3, true));
        assert_eq!(next_argument(Register::R9), None);
    }

    #[test]
    fn cmp_then_push_moves_to_push() {
        // cmpb $0,0x141b46(%rip) ; push %r12 (posix_memalign)
        let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54, 0xc3];
        assert_eq!(
            choose(
                &code,
                0x1000,
                &[Register::RDI, Register::RSI, Register::RDX]
            )
            .offset,
            7
        );
    }

    #[test]
    fn clobbered_argument_falls_back_to_zero() {
        // reallocarray: mov %rsi,%rax ; mul %rdx (writes rdx) ; mov %rax,%rsi ; jo +5
        let code = [
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05, 0xc3,
        ];
        let args = [Register::RDI, Register::RSI, Register::RDX];
        assert_eq!(choose(&code, 0x1000, &args).offset, 0);
    }

    #[test]
    fn stack_pointer_change_falls_back_to_zero() {
        // sub $0x58,%rsp ; push %rbx
        let code = [0x48, 0x83, 0xec, 0x58, 0x53, 0xc3];
        assert_eq!(choose(&code, 0x1000, RDI).offset, 0);
    }

    /// `c10::alloc_cpu` of the PyTorch 2.11 wheel, up to the branch on posix_memalign's result.
    const ALLOC_CPU: &str = "55 48 89 e5 41 57 41 56 41 55 41 54 53 48 81 ec a8 02 00 00 48 8b 05 \
        c5 2c 09 00 48 8d 48 18 48 8b 05 92 2b 09 00 66 48 0f 6e c9 48 89 8d a0 fd ff ff 48 83 c0 \
        10 66 48 0f 6e d0 66 0f 6c ca 0f 29 8d 90 fd ff ff 48 85 ff 0f 84 61 08 00 00 48 89 fb 0f \
        88 00 0a 00 00 e8 f3 cc f9 ff 48 8d bd b8 fd ff ff 48 89 da 48 89 c6 e8 41 c7 f9 ff 41 89 \
        c5 85 c0 0f 84 2e 03 00 00";
    const ALLOC_CPU_AT: u64 = 0x91fd0;
    const POSIX_MEMALIGN_PLT: u64 = 0x2e780;

    fn bytes(hex: &str) -> Vec<u8> {
        hex.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    #[test]
    fn alloc_cpu_is_probed_at_the_branch_after_posix_memalign() {
        let code = bytes(ALLOC_CPU);
        let (offset, site) = after_call(&code, ALLOC_CPU_AT, &[POSIX_MEMALIGN_PLT]).unwrap();
        // 0x92044: je after `call posix_memalign; mov %eax,%r13d; test %eax,%eax`
        assert_eq!(offset, 0x92044 - ALLOC_CPU_AT);
        assert_eq!(
            site,
            CallSite {
                size_reg: 0,
                slot_disp: -0x248
            }
        ); // rbx, -0x248(%rbp)
        assert_eq!(CallSite::of_cookie(site.cookie()), site);
    }

    #[test]
    fn alloc_cpu_without_the_callee_keeps_entry_and_return() {
        let code = bytes(ALLOC_CPU);
        assert_eq!(after_call(&code, ALLOC_CPU_AT, &[0x2e790]), None);
    }

    #[test]
    fn result_register_changed_after_the_call_keeps_entry_and_return() {
        let mut code = bytes(ALLOC_CPU);
        // `mov %eax,%r13d` becomes `mov %ebx,%eax` then `nop`: the result is lost
        let at = code.len() - 11;
        assert_eq!(&code[at..at + 3], &[0x41, 0x89, 0xc5]);
        code[at..at + 3].copy_from_slice(&[0x89, 0xd8, 0x90]);
        assert_eq!(after_call(&code, ALLOC_CPU_AT, &[POSIX_MEMALIGN_PLT]), None);
    }

    #[test]
    fn size_register_changed_before_the_call_keeps_entry_and_return() {
        let mut code = bytes(ALLOC_CPU);
        // `mov %rax,%rsi` before the call becomes `mov %rax,%rbx`: n's register overwritten
        let at = code.len() - 19;
        assert_eq!(&code[at..at + 3], &[0x48, 0x89, 0xc6]);
        code[at + 2] = 0xc3;
        assert_eq!(after_call(&code, ALLOC_CPU_AT, &[POSIX_MEMALIGN_PLT]), None);
    }

    #[test]
    fn branch_into_prologue_falls_back_to_zero() {
        // test %rdi,%rdi ; je +2 ; push %rbp ; jmp back to the je (offset 3)
        let code = [0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3, 0xeb, 0xfa];
        assert_eq!(choose(&code, 0x1000, RDI).offset, 0);
    }
}
