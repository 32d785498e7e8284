//! USDT argument specs (x86-64, AT&T syntax, as `sys/sdt.h` has the assembler write them):
//! `[-]SIZE@OPERAND`, the size in bytes (negative: signed), the operand a constant (`$5`), a
//! register (`%rbx`, `%r14d`, `%al`, `%ah`) or memory (`-144(%rbp)`, `(%rdi)`,
//! `8(%rax,%rcx,4)`, `sym(%rip)`, `40+sym(%rip)`). Parsed here into [`ArgSpec`], then lowered
//! per site into the BPF side's [`UsdtArg`].

use std::fmt;

use anyhow::{Result, bail};
use topdown_common::{
    pt_regs_word,
    usdt::{UsdtArg, arg_kind},
};

/// One argument, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    /// 1, 2, 4 or 8.
    pub size: u8,
    pub signed: bool,
    pub operand: Operand,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    Constant(i64),
    Register(Register),
    Memory {
        /// Displacement, and a symbol it is relative to (`sym+8`).
        displacement: i64,
        symbol: Option<String>,
        /// `None`: an absolute address (`displacement` alone).
        base: Option<Register>,
        index: Option<(Register, u8)>,
    },
}

/// A general-purpose register: its `pt_regs` word, and the bits of it the name covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Register {
    /// `pt_regs_word` index; `pt_regs_word::IP` for `%rip`.
    pub word: u8,
    /// Right shift before use: 8 for `%ah`, `%bh`, `%ch`, `%dh`.
    pub shift: u8,
}

/// x86-64 `struct pt_regs` order (arch/x86/include/asm/ptrace.h): r15 r14 r13 r12 bp bx r11
/// r10 r9 r8 ax cx dx si di orig_ax ip cs flags sp ss.
const LEGACY: [(&str, u8); 8] = [
    ("ax", 10),
    ("bx", 5),
    ("cx", 11),
    ("dx", 12),
    ("si", 13),
    ("di", 14),
    ("bp", 4),
    ("sp", 19),
];

/// `r8`..`r15`: words 9, 8, 7, 6, 3, 2, 1, 0.
const NUMBERED: [u8; 8] = [9, 8, 7, 6, 3, 2, 1, 0];

/// The register a name (without `%`) means; the width the name implies is not used: the
/// spec's size says how many bytes count.
pub fn register(name: &str) -> Option<Register> {
    let plain = |word| Some(Register { word, shift: 0 });
    if name == "rip" {
        return plain(pt_regs_word::IP);
    }
    if let Some(rest) = name.strip_prefix('r')
        && let Some(digits_end) = rest
            .find(|c: char| !c.is_ascii_digit())
            .or(Some(rest.len()))
        && digits_end > 0
    {
        let number: usize = rest[..digits_end].parse().ok()?;
        let suffix = &rest[digits_end..];
        if (8..=15).contains(&number) && ["", "d", "w", "b", "l"].contains(&suffix) {
            return plain(NUMBERED[number - 8]);
        }
    }
    for (legacy, word) in LEGACY {
        // rax, eax, ax
        if name.len() >= 2
            && name.ends_with(legacy)
            && matches!(&name[..name.len() - 2], "r" | "e" | "")
        {
            return plain(word);
        }
    }
    // al, bl, cl, dl; sil, dil, bpl, spl; ah, bh, ch, dh
    match name {
        "al" => plain(10),
        "bl" => plain(5),
        "cl" => plain(11),
        "dl" => plain(12),
        "sil" => plain(13),
        "dil" => plain(14),
        "bpl" => plain(4),
        "spl" => plain(19),
        "ah" => Some(Register { word: 10, shift: 8 }),
        "bh" => Some(Register { word: 5, shift: 8 }),
        "ch" => Some(Register { word: 11, shift: 8 }),
        "dh" => Some(Register { word: 12, shift: 8 }),
        _ => None,
    }
}

/// Splits a note's argument string into its specs.
pub fn parse_all(text: &str) -> Result<Vec<ArgSpec>> {
    text.split_whitespace().map(parse).collect()
}

/// Parses one spec, e.g. `-4@-20(%rbp)`.
pub fn parse(text: &str) -> Result<ArgSpec> {
    let (size, signed, operand) = match text.split_once('@') {
        Some((size, operand)) => {
            let value: i32 = size
                .parse()
                .map_err(|_| anyhow::anyhow!("argument '{text}': size '{size}' is not a number"))?;
            let bytes = value.unsigned_abs();
            if ![1, 2, 4, 8].contains(&bytes) {
                bail!("argument '{text}': size {value} is not 1, 2, 4 or 8 bytes");
            }
            (bytes as u8, value < 0, operand)
        }
        // Old notes have no size: a long.
        None => (8, true, text),
    };
    Ok(ArgSpec {
        size,
        signed,
        operand: operand_of(operand).map_err(|err| anyhow::anyhow!("argument '{text}': {err}"))?,
    })
}

fn operand_of(text: &str) -> Result<Operand> {
    if let Some(constant) = text.strip_prefix('$') {
        return Ok(Operand::Constant(integer(constant)?));
    }
    if let Some(name) = text.strip_prefix('%') {
        return match register(name) {
            Some(register) if register.word != pt_regs_word::IP => Ok(Operand::Register(register)),
            _ => bail!("'{text}' is not a general-purpose register"),
        };
    }
    let (displacement_text, inside) = match text.find('(') {
        Some(open) => {
            let inside = text[open + 1..]
                .strip_suffix(')')
                .ok_or_else(|| anyhow::anyhow!("'{text}': no closing parenthesis"))?;
            (&text[..open], Some(inside))
        }
        None => (text, None),
    };
    let (displacement, symbol) = displacement(displacement_text)?;
    let (base, index) = match inside {
        None => (None, None),
        Some(inside) => {
            let mut parts = inside.split(',').map(str::trim);
            let base = match parts.next() {
                Some("") | None => None,
                Some(name) => Some(named_register(name)?),
            };
            let index = match parts.next() {
                None => None,
                Some(name) => {
                    let register = named_register(name)?;
                    let scale = match parts.next() {
                        None => 1,
                        Some(scale) => scale
                            .parse::<u8>()
                            .ok()
                            .filter(|scale| [1, 2, 4, 8].contains(scale))
                            .ok_or_else(|| {
                                anyhow::anyhow!("scale '{scale}' is not 1, 2, 4 or 8")
                            })?,
                    };
                    Some((register, scale))
                }
            };
            if parts.next().is_some() {
                bail!("'{text}': too many parts in the memory operand");
            }
            (base, index)
        }
    };
    let rip = base.is_some_and(|base| base.word == pt_regs_word::IP);
    if rip && symbol.is_none() {
        // Text in a note has no instruction for `%rip` to be relative to: only a symbol
        // says where it points.
        bail!("'{text}': a %rip-relative operand without a symbol");
    }
    if symbol.is_some() && !rip && base.is_some() {
        bail!("'{text}': a symbol relative to a register other than %rip");
    }
    if index.is_some_and(|(register, _)| register.word == pt_regs_word::IP) {
        bail!("'{text}': %rip as an index");
    }
    Ok(Operand::Memory {
        displacement,
        symbol,
        base,
        index,
    })
}

fn named_register(text: &str) -> Result<Register> {
    text.strip_prefix('%')
        .and_then(register)
        .ok_or_else(|| anyhow::anyhow!("'{text}' is not a register"))
}

/// `-144`, `0x10`, `sym`, `sym+8`, `40+sym`, `sym-8`, or nothing.
fn displacement(text: &str) -> Result<(i64, Option<String>)> {
    if text.is_empty() {
        return Ok((0, None));
    }
    if let Ok(value) = integer(text) {
        return Ok((value, None));
    }
    let mut total = 0i64;
    let mut symbol = None;
    // Terms separated by + or - (a leading sign belongs to the first term).
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut terms = Vec::new();
    for at in 1..=bytes.len() {
        if at == bytes.len() || bytes[at] == b'+' || bytes[at] == b'-' {
            terms.push(&text[start..at]);
            start = at;
        }
    }
    for term in terms {
        let (negative, body) = match term.as_bytes().first() {
            Some(b'+') => (false, &term[1..]),
            Some(b'-') => (true, &term[1..]),
            _ => (false, term),
        };
        if let Ok(value) = integer(body) {
            total = if negative {
                total.wrapping_sub(value)
            } else {
                total.wrapping_add(value)
            };
        } else if !negative
            && symbol.is_none()
            && body
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '@'))
            && !body.is_empty()
        {
            symbol = Some(body.to_owned());
        } else {
            bail!("displacement '{text}' is not a number or symbol + number");
        }
    }
    Ok((total, symbol))
}

fn integer(text: &str) -> Result<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let value = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse::<u64>(),
    }
    .map_err(|_| anyhow::anyhow!("'{text}' is not a number"))?;
    let value = value as i64;
    Ok(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

impl ArgSpec {
    /// The BPF side's descriptor of this argument at a site at `site_address` of its file;
    /// `symbol` looks up the address of a symbol the operand names (in the same file).
    pub fn lower(
        &self,
        site_address: u64,
        symbol: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<UsdtArg> {
        let mut arg = UsdtArg {
            size: self.size,
            signed: u8::from(self.signed),
            base: pt_regs_word::NONE,
            index: pt_regs_word::NONE,
            scale: 1,
            ..UsdtArg::default()
        };
        match &self.operand {
            Operand::Constant(value) => {
                arg.kind = arg_kind::CONSTANT;
                arg.value = extend(*value as u64, self.size, self.signed) as i64;
            }
            Operand::Register(register) => {
                arg.kind = arg_kind::REGISTER;
                arg.base = register.word;
                arg.shift = register.shift;
            }
            Operand::Memory {
                displacement,
                symbol: name,
                base,
                index,
            } => {
                arg.kind = arg_kind::MEMORY;
                arg.value = *displacement;
                if let Some(name) = name {
                    let address = symbol(name)
                        .ok_or_else(|| anyhow::anyhow!("symbol '{name}' is not in the file"))?;
                    // Relative to the site's own address, which the probe's ip holds: the
                    // same load bias applies to both.
                    arg.value = arg
                        .value
                        .wrapping_add(address.wrapping_sub(site_address) as i64);
                }
                if let Some(base) = base {
                    arg.base = base.word;
                }
                if let Some((index, scale)) = index {
                    arg.index = index.word;
                    arg.scale = *scale;
                }
            }
        }
        Ok(arg)
    }
}

/// The low `size` bytes of `value`, zero- or sign-extended (what the BPF side does).
pub fn extend(value: u64, size: u8, signed: bool) -> u64 {
    if size >= 8 {
        return value;
    }
    let unused = 64 - 8 * u32::from(size);
    if signed {
        (((value << unused) as i64) >> unused) as u64
    } else {
        (value << unused) >> unused
    }
}

impl fmt::Display for ArgSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = if self.signed {
            -i32::from(self.size)
        } else {
            i32::from(self.size)
        };
        write!(f, "{size}@{:?}", self.operand)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(word: u8) -> Register {
        Register { word, shift: 0 }
    }

    #[test]
    fn every_operand_form_of_postgres_and_python() {
        assert_eq!(
            parse("8@%rbx").unwrap(),
            ArgSpec {
                size: 8,
                signed: false,
                operand: Operand::Register(reg(5))
            }
        );
        assert_eq!(
            parse("-4@%r14d").unwrap().operand,
            Operand::Register(reg(1))
        );
        assert!(parse("-4@%r14d").unwrap().signed);
        assert_eq!(parse("1@%sil").unwrap().operand, Operand::Register(reg(13)));
        assert_eq!(parse("1@%dil").unwrap().operand, Operand::Register(reg(14)));
        assert_eq!(
            parse("1@%ah").unwrap().operand,
            Operand::Register(Register { word: 10, shift: 8 })
        );
        assert_eq!(parse("2@%r9w").unwrap().operand, Operand::Register(reg(8)));
        assert_eq!(parse("1@%r15b").unwrap().operand, Operand::Register(reg(0)));
        assert_eq!(parse("8@%rsp").unwrap().operand, Operand::Register(reg(19)));
        assert_eq!(parse("-4@$-5").unwrap().operand, Operand::Constant(-5));
        assert_eq!(parse("4@$0x10").unwrap().operand, Operand::Constant(16));
        let rip = Some(reg(pt_regs_word::IP));
        for (spec, displacement, symbol, base, index) in [
            ("8@-144(%rbp)", -144, None, Some(reg(4)), None),
            ("4@(%r12)", 0, None, Some(reg(3)), None),
            (
                "-2@8(%rax,%rcx,4)",
                8,
                None,
                Some(reg(10)),
                Some((reg(11), 4)),
            ),
            ("8@(,%rdx,8)", 0, None, None, Some((reg(12), 8))),
            (
                "-4@40+CheckpointStats(%rip)",
                40,
                Some("CheckpointStats"),
                rip,
                None,
            ),
            ("-4@NBuffers(%rip)", 0, Some("NBuffers"), rip, None),
            ("8@counter+8(%rip)", 8, Some("counter"), rip, None),
        ] {
            let memory = Operand::Memory {
                displacement,
                symbol: symbol.map(str::to_owned),
                base,
                index,
            };
            assert_eq!(parse(spec).unwrap().operand, memory, "{spec}");
        }
        assert_eq!(parse_all("8@%rax -4@$0  1@-57(%rbp)").unwrap().len(), 3);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (bad, why) in [
            ("3@%rax", "size 3"),
            ("x@%rax", "not a number"),
            ("8@%xmm0", "not a general-purpose register"),
            ("8@%rip", "not a general-purpose register"),
            ("8@16(%rip)", "without a symbol"),
            ("8@(%rax,%rbx,3)", "scale '3'"),
            ("8@sym(%rax)", "other than %rip"),
            ("8@(%rax", "closing parenthesis"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn lowering_makes_symbols_relative_to_the_site_and_extends_constants() {
        let symbols = |name: &str| (name == "NBuffers").then_some(0x5000u64);
        let arg = parse("-4@8+NBuffers(%rip)")
            .unwrap()
            .lower(0x1000, &symbols)
            .unwrap();
        assert_eq!(arg.kind, arg_kind::MEMORY);
        assert_eq!(arg.base, pt_regs_word::IP);
        assert_eq!(arg.value, 0x4008);
        assert_eq!(arg.signed, 1);
        let missing = parse("8@other(%rip)").unwrap().lower(0x1000, &symbols);
        assert!(missing.unwrap_err().to_string().contains("'other'"));
        let constant = parse("-1@$255").unwrap().lower(0, &symbols).unwrap();
        assert_eq!(constant.value, -1);
        let unsigned = parse("2@$-1").unwrap().lower(0, &symbols).unwrap();
        assert_eq!(unsigned.value, 0xffff);
        assert_eq!(extend(0x1_8000_0000, 4, true), 0xffff_ffff_8000_0000);
        assert_eq!(extend(0x1_8000_0000, 4, false), 0x8000_0000);
    }

    /// Specs made of the grammar's characters never panic: they parse or say why.
    #[test]
    fn arbitrary_specs_never_panic() {
        for text in crate::spans::usdt::arbitrary_strings(
            "-@%$(),+x0189abcdeilpqrsw_",
            50_000,
            20,
            0x2545_f491_4f6c_dd1d,
        ) {
            if let Ok(spec) = parse(&text) {
                let _ = spec.lower(0x1000, &|_| Some(0x2000));
            }
        }
    }
}
