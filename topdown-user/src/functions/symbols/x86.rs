//! x86-64 machine code as uprobes see it: where a function leaves (its exit instructions), and
//! what the kernel does with a probed instruction (refuses it, emulates it, or single-steps
//! it out of line).
//!
//! The kernel's rules are those of `arch/x86/kernel/uprobes.c` (Linux 6.18):
//! `uprobe_init_insn` (refused prefixes and opcodes), `branch_setup_xol_ops` and
//! `push_setup_xol_ops` (the emulated instructions); the NOP encodings it compares against
//! are `x86_nops` from `arch/x86/include/asm/nops.h`.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind, Register};
use topdown_common::pt_regs_word;

/// How one exit instruction leaves its function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// `ret`.
    Return,
    /// A direct jump out of the function (a tail call) to this address of the file.
    Jump(u64),
    /// A jump through a register or memory: a tail call or a jump table, told apart at run time.
    Indirect(IndirectOperand),
    /// A jump whose target cannot be computed (segment-relative, 32-bit addressing): an exit
    /// whose callee's end cannot be known.
    Unknown,
}

/// The operand of `jmp *...`, as BPF recomputes it from the probe's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndirectOperand {
    /// `pt_regs_word` indices, `NONE` when absent.
    pub base: u8,
    pub index: u8,
    pub scale: u8,
    /// The target is read from memory at the operand's address (else the register is it).
    pub memory: bool,
    /// For rip-relative operands, relative to the jump's own address.
    pub displacement: i64,
}

/// One exit instruction at `address` (in the file's address space).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub address: u64,
    /// Its offset in the file, where the uprobe goes (filled in by the ELF reader, which
    /// knows the segments).
    pub offset: u64,
    pub kind: ExitKind,
    /// What the kernel does with a probe there.
    pub probe: ProbeCheck,
}

/// What the kernel does with a uprobe on an instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeCheck {
    /// Emulated in the trap handler (nop, push, jmp, call, jcc): the cheap case.
    Emulated,
    /// Copied out of line and single-stepped: a second trap per hit.
    SingleStep,
    /// The kernel refuses the probe (attaching fails), for this reason.
    Refused(&'static str),
}

/// The exits of the code `code` at `address`; `inside` are the function's own ranges (its body
/// first, then its cold fragments): jumps into them are not exits, except to the function's
/// first instruction, a tail call to itself that enters it (and its entry probe) again.
/// Decoding stops at the first invalid instruction (data or padding) rather than guess at
/// boundaries.
pub fn exits(code: &[u8], address: u64, inside: &[(u64, u64)]) -> Vec<Exit> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let entry = inside.first().map(|(start, _)| *start);
    let within = |target: u64| {
        Some(target) != entry
            && inside
                .iter()
                .any(|(start, end)| target >= *start && target < *end)
    };
    let mut exits = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        let at = (instruction.ip() - address) as usize;
        let bytes = &code[at..at + instruction.len()];
        let kind = match instruction.flow_control() {
            FlowControl::Return => Some(ExitKind::Return),
            FlowControl::UnconditionalBranch => {
                let target = instruction.near_branch_target();
                (target != 0 && !within(target)).then_some(ExitKind::Jump(target))
            }
            FlowControl::IndirectBranch if instruction.code() == Code::Jmp_rm64 => {
                // `notrack jmp`: GCC emits it only for switch jump tables under
                // -fcf-protection (their targets have no endbr64); the kernel refuses a probe
                // on it (a DS prefix) anyway.
                if prefixes(bytes).contains(&0x3e) {
                    None
                } else {
                    Some(
                        indirect_operand(&instruction)
                            .map_or(ExitKind::Unknown, ExitKind::Indirect),
                    )
                }
            }
            _ => None,
        };
        if let Some(kind) = kind {
            exits.push(Exit {
                address: instruction.ip(),
                offset: 0,
                kind,
                probe: check(bytes),
            });
        }
    }
    exits
}

fn indirect_operand(instruction: &iced_x86::Instruction) -> Option<IndirectOperand> {
    match instruction.op0_kind() {
        OpKind::Register => Some(IndirectOperand {
            base: pt_regs_index(instruction.op0_register())?,
            index: pt_regs_word::NONE,
            scale: 0,
            memory: false,
            displacement: 0,
        }),
        OpKind::Memory => {
            if instruction.segment_prefix() == Register::FS
                || instruction.segment_prefix() == Register::GS
            {
                return None;
            }
            if instruction.is_ip_rel_memory_operand() {
                return Some(IndirectOperand {
                    base: pt_regs_word::IP,
                    index: pt_regs_word::NONE,
                    scale: 0,
                    memory: true,
                    displacement: instruction
                        .memory_displacement64()
                        .wrapping_sub(instruction.ip()) as i64,
                });
            }
            let base = match instruction.memory_base() {
                Register::None => pt_regs_word::NONE,
                register => pt_regs_index(register)?,
            };
            let index = match instruction.memory_index() {
                Register::None => pt_regs_word::NONE,
                register => pt_regs_index(register)?,
            };
            Some(IndirectOperand {
                base,
                index,
                scale: instruction.memory_index_scale() as u8,
                memory: true,
                displacement: instruction.memory_displacement64() as i64,
            })
        }
        _ => None,
    }
}

/// A 64-bit general register's word in x86-64 `struct pt_regs`; `None` for anything else
/// (32-bit addressing is not recomputed).
fn pt_regs_index(register: Register) -> Option<u8> {
    Some(match register {
        Register::R15 => 0,
        Register::R14 => 1,
        Register::R13 => 2,
        Register::R12 => 3,
        Register::RBP => 4,
        Register::RBX => 5,
        Register::R11 => 6,
        Register::R10 => 7,
        Register::R9 => 8,
        Register::R8 => 9,
        Register::RAX => 10,
        Register::RCX => 11,
        Register::RDX => 12,
        Register::RSI => 13,
        Register::RDI => 14,
        Register::RSP => pt_regs_word::SP,
        _ => return None,
    })
}

/// The legacy prefixes in front of an instruction.
fn prefixes(bytes: &[u8]) -> &[u8] {
    let count = bytes
        .iter()
        .take_while(|byte| {
            matches!(
                byte,
                0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3
            )
        })
        .count();
    &bytes[..count]
}

/// How a function's code uses the return address its caller pushed, as far as a straight
/// reading of its instructions from the entry tells (up to the first `call`, `ret` or change
/// of `rsp` that is not a push, pop or add/sub of a constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnAddressUse {
    /// It loads its return address from the stack (`mov (%rsp),%rax` in `__sigsetjmp`,
    /// `getcontext`, `dlopen` asking who called it).
    Reads,
    /// It jumps, with the return address still on top of the stack, to this address of the
    /// file (`setjmp` is `mov $1,%esi; jmp __sigsetjmp`): it uses the return address as the
    /// function there does.
    TailJump(u64),
    /// Neither was found.
    Unused,
}

/// A uretprobe replaces the return address on the stack with the kernel's trampoline when
/// the function is entered: a function that reads it saves or compares the trampoline
/// instead, and `setjmp` then makes `longjmp` jump into the trampoline with no return
/// pending there (bash's `[ -n "$X" ]` failed and looped forever under `-u 'libc:*'`, issue
/// 21). Reading stops at the first branch other than a tail jump: code past it may run with
/// the return address popped.
pub fn return_address_use(code: &[u8], address: u64) -> ReturnAddressUse {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    // Bytes pushed since the entry: the return address is at `depth(%rsp)`.
    let mut depth: i64 = 0;
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        for operand in 0..instruction.op_count() {
            if instruction.op_kind(operand) == OpKind::Memory
                && instruction.memory_base() == Register::RSP
                && instruction.memory_index() == Register::None
                && instruction.memory_displacement64() as i64 == depth
                && instruction.mnemonic() != Mnemonic::Lea
            {
                return ReturnAddressUse::Reads;
            }
        }
        match instruction.flow_control() {
            FlowControl::Next => {}
            FlowControl::UnconditionalBranch if depth == 0 => {
                return match instruction.near_branch_target() {
                    0 => ReturnAddressUse::Unused,
                    target => ReturnAddressUse::TailJump(target),
                };
            }
            _ => return ReturnAddressUse::Unused,
        }
        let writes_rsp = instruction.op_count() > 0
            && instruction.op0_kind() == OpKind::Register
            && instruction.op0_register() == Register::RSP;
        let constant = matches!(
            instruction.op1_kind(),
            OpKind::Immediate8to64 | OpKind::Immediate32to64
        );
        match instruction.mnemonic() {
            Mnemonic::Push | Mnemonic::Pop => {
                depth -= i64::from(instruction.stack_pointer_increment());
            }
            Mnemonic::Sub if writes_rsp && constant => depth += instruction.immediate(1) as i64,
            Mnemonic::Add if writes_rsp && constant => depth -= instruction.immediate(1) as i64,
            _ if writes_rsp || instruction.stack_pointer_increment() != 0 => {
                return ReturnAddressUse::Unused;
            }
            _ => {}
        }
        if depth < 0 {
            // Popped its own return address (vfork): what it does with it is not followed.
            return ReturnAddressUse::Unused;
        }
    }
    ReturnAddressUse::Unused
}

/// `good_insns_64` of arch/x86/kernel/uprobes.c: one bit per first opcode byte the kernel
/// accepts a probe on (64-bit tasks), rows of 16 from opcode 0x00.
const GOOD_INSNS_64: [u16; 16] = [
    0b1011_1111_0011_1111, // 00: 06 07 0e invalid
    0b0011_1111_0011_1111, // 10: 16 17 1e 1f
    0b0111_1111_0111_1111, // 20: 27 2f
    0b0111_1111_0111_1111, // 30: 37 3f
    0xffff,                // 40
    0xffff,                // 50
    0b0000_1111_1111_1000, // 60: 60 61 62 6c-6f
    0xffff,                // 70
    0b1111_1111_1111_1011, // 80: 82
    0b1111_1011_1111_1111, // 90: 9a
    0xffff,                // a0
    0xffff,                // b0
    0b0000_1111_1111_1111, // c0: cc-cf
    0b1111_1111_1000_1111, // d0: d4 d5 d6
    0b0000_1011_0000_1111, // e0: e4-e7 ea ec-ef
    0b1111_0011_1110_1101, // f0: f1 f4 fa fb
];

/// `x86_nops[1..=8]` (arch/x86/include/asm/nops.h, `BYTES_NOP1`..`BYTES_NOP8`): exact byte
/// sequences the kernel emulates as NOPs.
const X86_NOPS: [&[u8]; 8] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// Why the kernel would "emulate" an instruction that is no branch as one, and so never run
/// it: `branch_setup_xol_ops` (arch/x86/kernel/uprobes.c, Linux 6.18) switches on OPCODE1
/// alone, the opcode byte its decoder reports past any VEX/EVEX prefix, and reads neither the
/// prefix nor REX. A vector instruction whose opcode byte is that of `jcc` (0x70-0x7f), `jmp`
/// (0xe9, 0xeb) or `call` (0xe8), e.g. EVEX `vpbroadcastb %esi,%ymm17` (`62 e2 7d 28 7a ce`,
/// opcode 0x7a = `jp`), the first instruction of glibc's `__strchr_evex`, is skipped or
/// turned into a jump or a push: the probed program computes something else (bash's printf
/// printed its format strings raw, issue 21). `xchg %eax,%r8d` (`41 90`) is no `nop` either,
/// though the kernel emulates any 0x90 as one. `None`: no such confusion.
fn misread_as_branch(opcode: u8, vex: bool, rex: Option<u8>) -> Option<&'static str> {
    let branch_byte = matches!(opcode, 0x70..=0x7f | 0xe8 | 0xe9 | 0xeb | 0x90);
    if vex && branch_byte {
        return Some(
            "a VEX/EVEX instruction whose opcode byte the kernel emulates as a jump, call or nop \
             instead of running it",
        );
    }
    if opcode == 0x90 && rex.is_some_and(|rex| rex & 0x1 != 0) {
        return Some("xchg with r8, which the kernel emulates as a nop instead of running it");
    }
    None
}

/// What the kernel does with a uprobe on the instruction starting `code`.
pub fn check(code: &[u8]) -> ProbeCheck {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let instruction = decoder.decode();
    if instruction.is_invalid() {
        return ProbeCheck::Refused("its first instruction cannot be decoded");
    }
    let bytes = &code[..instruction.len()];
    // uprobe_init_insn: the kernel's decoder knows neither AMD's FMA4 nor XOP (-ENOEXEC).
    if instruction.cpuid_features().iter().any(|feature| {
        matches!(
            feature,
            iced_x86::CpuidFeature::FMA4
                | iced_x86::CpuidFeature::XOP
                | iced_x86::CpuidFeature::TBM
        )
    }) {
        return ProbeCheck::Refused("AMD FMA4/XOP instruction, unknown to the kernel's decoder");
    }
    let prefix = prefixes(bytes);
    // is_prefix_bad(): es, cs, ss, ds and lock.
    if prefix
        .iter()
        .any(|byte| matches!(byte, 0x26 | 0x2e | 0x36 | 0x3e | 0xf0))
    {
        return ProbeCheck::Refused(if prefix.contains(&0xf0) {
            "lock prefix"
        } else {
            "segment prefix"
        });
    }
    let mut at = prefix.len();
    let rex = bytes.get(at).copied().filter(|byte| byte & 0xf0 == 0x40);
    if rex.is_some() {
        at += 1;
    }
    // OPCODE1 as the kernel's decoder reports it: past a VEX/EVEX prefix, the opcode byte.
    let opcode = match bytes.get(at) {
        Some(0xc5) => bytes.get(at + 2),
        Some(0xc4) => bytes.get(at + 3),
        Some(0x62) => bytes.get(at + 4),
        other => other,
    }
    .copied()
    .unwrap_or(0);
    let vex = matches!(bytes.get(at), Some(0xc4 | 0xc5 | 0x62));
    // insn_masking_exception(): mov to ss.
    if opcode == 0x8e && bytes.get(at + 1).is_some_and(|modrm| (modrm >> 3) & 7 == 2) {
        return ProbeCheck::Refused("mov to ss");
    }
    if GOOD_INSNS_64[usize::from(opcode >> 4)] & (1 << (opcode & 0xf)) == 0 {
        return ProbeCheck::Refused("an opcode the kernel does not probe");
    }
    // branch_setup_xol_ops.
    if X86_NOPS.get(bytes.len().wrapping_sub(1)) == Some(&bytes) {
        return ProbeCheck::Emulated;
    }
    if let Some(why) = misread_as_branch(opcode, vex, rex) {
        return ProbeCheck::Refused(why);
    }
    if !vex {
        let second = bytes.get(at + 1).copied().unwrap_or(0);
        let branch = matches!(opcode, 0xeb | 0xe9 | 0xe8 | 0x70..=0x7f)
            || (opcode == 0x0f && (0x80..=0x8f).contains(&second));
        if branch {
            // 16-bit overrides of branches are refused (-ENOTSUPP).
            return if prefix.contains(&0x66) {
                ProbeCheck::Refused("operand-size prefix on a branch")
            } else {
                ProbeCheck::Emulated
            };
        }
        if opcode == 0x90 {
            return ProbeCheck::Emulated;
        }
        // push_setup_xol_ops: `push reg`, alone or with REX 0x41 only.
        if (0x50..=0x57).contains(&opcode)
            && (bytes.len() == 1 || (bytes.len() == 2 && rex == Some(0x41)))
        {
            return ProbeCheck::Emulated;
        }
    }
    ProbeCheck::SingleStep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_rets_and_tail_calls_out() {
        // push rbp; mov rbp,rsp; jne +2 (inside); pop rbp; ret; jmp rel32 to 0x2000 (outside);
        // jmp -3 (inside: a loop).
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x75, 0x02, 0x5d, 0xc3, 0xe9, 0xf3, 0x0f, 0x00, 0x00, 0xeb,
            0xfd,
        ];
        let found = exits(&code, 0x1000, &[(0x1000, 0x100f)]);
        let kinds: Vec<(u64, ExitKind)> = found.into_iter().map(|e| (e.address, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![(0x1007, ExitKind::Return), (0x1008, ExitKind::Jump(0x2000))]
        );
    }

    #[test]
    fn a_jump_back_to_the_entry_is_a_tail_call_to_itself() {
        // nop; jmp -3 (to the function's first byte).
        let code = [0x90, 0xeb, 0xfd];
        let found = exits(&code, 0x1000, &[(0x1000, 0x1003)]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, ExitKind::Jump(0x1000));
    }

    #[test]
    fn a_jump_into_a_cold_fragment_is_not_an_exit() {
        // jmp rel32 to 0x2000, which is the function's cold fragment.
        let code = [0xe9, 0xfb, 0x0f, 0x00, 0x00];
        assert!(exits(&code, 0x1000, &[(0x1000, 0x1005), (0x2000, 0x2010)]).is_empty());
    }

    #[test]
    fn indirect_jumps_keep_their_operand_and_notrack_is_a_jump_table() {
        // jmp *0x80(%rax); jmp *%rdx; jmp *0x10(%rip); jmp *(%rax,%rcx,8); notrack jmp *%rax
        let code = [
            0xff, 0xa0, 0x80, 0x00, 0x00, 0x00, 0xff, 0xe2, 0xff, 0x25, 0x10, 0x00, 0x00, 0x00,
            0xff, 0x24, 0xc8, 0x3e, 0xff, 0xe0,
        ];
        let found = exits(&code, 0x1000, &[(0x1000, 0x1014)]);
        let operands: Vec<IndirectOperand> = found
            .iter()
            .map(|exit| match &exit.kind {
                ExitKind::Indirect(operand) => *operand,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(operands.len(), 4, "{found:?}");
        assert_eq!((operands[0].base, operands[0].displacement), (10, 0x80));
        assert!(operands[0].memory);
        assert_eq!((operands[1].base, operands[1].memory), (12, false));
        // rip-relative: next instruction (0x100e) + 0x10, relative to the jump at 0x1008.
        assert_eq!(
            (operands[2].base, operands[2].displacement),
            (pt_regs_word::IP, 0x16)
        );
        assert_eq!(
            (operands[3].base, operands[3].index, operands[3].scale),
            (10, 11, 8)
        );
    }

    #[test]
    fn functions_that_read_their_return_address() {
        // glibc 2.36 __sigsetjmp: mov %rbx,(%rdi); mov %rbp,%rax; ...; mov (%rsp),%rax.
        let sigsetjmp = [
            0x48, 0x89, 0x1f, 0x48, 0x89, 0xe8, 0x48, 0x89, 0x47, 0x08, 0x48, 0x8d, 0x54, 0x24,
            0x08, 0x48, 0x8b, 0x04, 0x24,
        ];
        assert_eq!(
            return_address_use(&sigsetjmp, 0x1000),
            ReturnAddressUse::Reads
        );
        // setjmp: mov $1,%esi; jmp rel32 (to 0x2000).
        let setjmp = [0xbe, 0x01, 0, 0, 0, 0xe9, 0xf6, 0x0f, 0, 0];
        assert_eq!(
            return_address_use(&setjmp, 0x1000),
            ReturnAddressUse::TailJump(0x2000)
        );
        // push %rbx; sub $0x10,%rsp; mov 0x18(%rsp),%rax: the return address, 24 bytes up.
        let deeper = [0x53, 0x48, 0x83, 0xec, 0x10, 0x48, 0x8b, 0x44, 0x24, 0x18];
        assert_eq!(return_address_use(&deeper, 0), ReturnAddressUse::Reads);
        // push %rbp; mov %rsp,%rbp; mov 0x8(%rsp),%rax reads it too.
        assert_eq!(
            return_address_use(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x8b, 0x44, 0x24, 0x08], 0),
            ReturnAddressUse::Reads
        );
        // push %rbx; mov (%rsp),%rax reads the saved rbx; lea (%rsp),%rax reads nothing;
        // push %rbp; call: a jump with something pushed is a call's business.
        for code in [
            &[0x53, 0x48, 0x8b, 0x04, 0x24][..],
            &[0x48, 0x8d, 0x04, 0x24, 0xc3],
            &[0x55, 0xe8, 0, 0, 0, 0],
            &[0x55, 0xe9, 0, 0, 0, 0],
        ] {
            assert_eq!(
                return_address_use(code, 0),
                ReturnAddressUse::Unused,
                "{code:x?}"
            );
        }
    }

    #[test]
    fn the_kernels_probe_rules() {
        // push %rbp; push %r12; nopl 0(%rax,%rax); jmp; call; jcc; pause.
        for code in [
            &[0x55][..],
            &[0x41, 0x54],
            &[0x0f, 0x1f, 0x44, 0x00, 0x00],
            &[0xeb, 0x00],
            &[0xe8, 0, 0, 0, 0],
            &[0x0f, 0x84, 0, 0, 0, 0],
            &[0xf3, 0x90],
        ] {
            assert_eq!(check(code), ProbeCheck::Emulated, "{code:x?}");
        }
        // endbr64; mov %rsp,%rbp; sub $8,%rsp; ret; push %rbp with REX.W (48 55).
        for code in [
            &[0xf3, 0x0f, 0x1e, 0xfa][..],
            &[0x48, 0x89, 0xe5],
            &[0x48, 0x83, 0xec, 0x08],
            &[0xc3],
            &[0x48, 0x55],
        ] {
            assert_eq!(check(code), ProbeCheck::SingleStep, "{code:x?}");
        }
        // lock cmpxchg %ecx,(%rdx); cs nop; int3; data16 jmp.
        assert_eq!(
            check(&[0xf0, 0x0f, 0xb1, 0x0a]),
            ProbeCheck::Refused("lock prefix")
        );
        assert!(matches!(check(&[0xcc]), ProbeCheck::Refused(_)));
        assert!(matches!(check(&[0x66, 0xe9, 0, 0]), ProbeCheck::Refused(_)));
        // Misread as branches: EVEX vpbroadcastb %esi,%ymm17 (__strchr_evex's first
        // instruction, opcode 0x7a = jp); VEX vpshufd $0x1b,%xmm1,%xmm0 (0x70 = jo); VEX vpor
        // %xmm2,%xmm1,%xmm0 (0xeb = jmp); VEX vpsubsb (0xe8 = call); xchg %eax,%r8d (41 90).
        for code in [
            &[0x62, 0xe2, 0x7d, 0x28, 0x7a, 0xce][..],
            &[0xc5, 0xf9, 0x70, 0xc1, 0x1b],
            &[0xc5, 0xf1, 0xeb, 0xc2],
            &[0xc5, 0xf1, 0xe8, 0xc2],
            &[0x41, 0x90],
        ] {
            assert!(
                matches!(check(code), ProbeCheck::Refused(why) if why.contains("instead of running it")),
                "{code:x?}: {:?}",
                check(code)
            );
        }
        // Vector instructions with other opcode bytes are single-stepped as before:
        // vaddps %xmm2,%xmm1,%xmm0 (c5 f0 58 c2), EVEX vpminub %ymm19,%ymm18,%ymm19.
        assert_eq!(check(&[0xc5, 0xf0, 0x58, 0xc2]), ProbeCheck::SingleStep);
        assert_eq!(
            check(&[0x62, 0xa1, 0x6d, 0x20, 0xda, 0xdb]),
            ProbeCheck::SingleStep
        );
        // vfmaddsd (FMA4): c4 e3 f9 6b c2 10
        assert!(matches!(
            check(&[0xc4, 0xe3, 0xf9, 0x6b, 0xc2, 0x10]),
            ProbeCheck::Refused(_)
        ));
    }
}
