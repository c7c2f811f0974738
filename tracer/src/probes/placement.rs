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

/// Instructions of the prologue examined before giving up.
const MAX_PROLOGUE: usize = 12;

/// The chosen probe offset from the function start and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub offset: u64,
    pub reason: &'static str,
}

impl Placement {
    pub const fn entry(reason: &'static str) -> Self {
        Self { offset: 0, reason }
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
                return Placement::entry("first instruction is emulated");
            }
            if jumps_into(code, addr, offset) {
                return Placement::entry("a branch targets the prologue");
            }
            return Placement {
                offset,
                reason: "first emulated instruction; arguments intact",
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

/// Instructions the x86 uprobe code emulates instead of single-stepping.
fn is_emulated(i: &Instruction) -> bool {
    let push_reg =
        matches!(i.code(), Code::Push_r64 | Code::Push_r16) && i.op0_kind() == OpKind::Register;
    let rel_branch = i.is_jmp_short_or_near() || i.is_jcc_short_or_near() || i.is_call_near();
    push_reg || rel_branch
}

/// Whether `i` writes one of `args` (any width) or the stack pointer.
fn writes_any(info: &mut InstructionInfoFactory, i: &Instruction, args: &[Register]) -> bool {
    info.info(i).used_registers().iter().any(|u| {
        let written = matches!(
            u.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        );
        let reg = u.register().full_register();
        written && (reg == Register::RSP || args.contains(&reg))
    })
}

/// Whether any direct branch in `code` lands strictly inside (addr, addr + offset].
fn jumps_into(code: &[u8], addr: u64, offset: u64) -> bool {
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
        direct && t > addr && t <= addr + offset
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
        assert_eq!(p, Placement::entry("first instruction is emulated"));
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

    #[test]
    fn branch_into_prologue_falls_back_to_zero() {
        // test %rdi,%rdi ; je +2 ; push %rbp ; jmp back to the je (offset 3)
        let code = [0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3, 0xeb, 0xfa];
        assert_eq!(choose(&code, 0x1000, RDI).offset, 0);
    }
}
