//! `/proc/cpuinfo`: vendor, family/model/stepping and the `hypervisor` flag on x86, the MIDR
//! fields per CPU on arm64.
//!
//! x86 prints `cpu family`, `model` and `stepping` in decimal (`arch/x86/kernel/cpu/proc.c`,
//! `show_cpuinfo`), while perf's cpuid strings and Intel's tables use hex: convert, never
//! compare the printed text (topdown-formulas.md §6.1, §6.2). arm64 prints `CPU implementer`,
//! `CPU variant` and `CPU part` in hex and `CPU revision` in decimal
//! (`arch/arm64/kernel/cpuinfo.c`, `c_show`).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

use super::arm::Midr;

/// What /proc/cpuinfo says about the CPU. x86 fields come from the first processor (every
/// processor of a system has the same family/model, hybrid parts included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// `vendor_id` (x86 only): `GenuineIntel`, `AuthenticAMD`, `HygonGenuine`...
    pub vendor_id: Option<String>,
    /// `model name` (x86 only).
    pub model_name: Option<String>,
    pub family: Option<u32>,
    pub model: Option<u32>,
    /// `None` when the kernel printed `stepping: unknown`.
    pub stepping: Option<u32>,
    /// The `hypervisor` flag: CPUID leaf 1 ECX bit 31, set by every mainstream hypervisor.
    pub hypervisor: bool,
    /// arm64: MIDR fields per `processor` number.
    pub midrs: BTreeMap<u32, Midr>,
}

impl CpuInfo {
    /// Parses the text of /proc/cpuinfo. Errors name the processor and field; the caller adds
    /// the path.
    pub fn parse(text: &str) -> Result<Self> {
        let mut info = CpuInfo::default();
        let mut x86_done = false;
        for block in text.split("\n\n") {
            let fields: Vec<(&str, &str)> = block
                .lines()
                .filter_map(|line| line.split_once(':'))
                .map(|(key, value)| (key.trim(), value.trim()))
                .collect();
            if fields.is_empty() {
                continue;
            }
            let get = |name: &str| {
                fields
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|&(_, value)| value)
            };
            let processor = match get("processor") {
                Some(number) => Some(
                    number
                        .parse::<u32>()
                        .with_context(|| format!("'processor' is '{number}', expected a CPU number"))?,
                ),
                None => None,
            };
            let context = || match processor {
                Some(cpu) => format!("processor {cpu}"),
                None => "a block without a 'processor' line".to_owned(),
            };

            if get("flags").is_some_and(|flags| flags.split_whitespace().any(|f| f == "hypervisor"))
            {
                info.hypervisor = true;
            }
            if !x86_done && let Some(vendor) = get("vendor_id") {
                x86_done = true;
                info.vendor_id = Some(vendor.to_owned());
                info.model_name = get("model name").map(str::to_owned);
                info.family = decimal(get("cpu family"), "cpu family").with_context(context)?;
                info.model = decimal(get("model"), "model").with_context(context)?;
                info.stepping = decimal(get("stepping"), "stepping").with_context(context)?;
            }
            if let Some(implementer) = get("CPU implementer") {
                let Some(cpu) = processor else {
                    bail!("'CPU implementer' in {}: cannot tell which CPU it describes", context());
                };
                let field = |name: &str| {
                    get(name).with_context(|| {
                        format!("processor {cpu} has 'CPU implementer' but no '{name}'")
                    })
                };
                let midr = Midr {
                    implementer: hex(implementer, "CPU implementer").with_context(context)? as u8,
                    variant: hex(field("CPU variant")?, "CPU variant").with_context(context)? as u8,
                    // cpuinfo prints `CPU architecture: 8`, not the MIDR field; every Armv8+
                    // core has 0xF there ("defined by CPUID scheme").
                    architecture: 0xf,
                    part: hex(field("CPU part")?, "CPU part").with_context(context)? as u16,
                    revision: decimal(Some(field("CPU revision")?), "CPU revision")
                        .with_context(context)?
                        .unwrap_or(0) as u8,
                };
                info.midrs.insert(cpu, midr);
            }
        }
        Ok(info)
    }
}

/// A decimal field; `unknown` (x86 `stepping` on CPUs without CPUID) is `None`.
fn decimal(value: Option<&str>, name: &str) -> Result<Option<u32>> {
    match value {
        None | Some("unknown") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .with_context(|| format!("'{name}' is '{text}', expected a decimal number")),
    }
}

/// A `0x`-prefixed hex field, at most 12 bits wide (the widest MIDR field, `CPU part`).
fn hex(text: &str, name: &str) -> Result<u32> {
    let value = text
        .strip_prefix("0x")
        .and_then(|digits| u32::from_str_radix(digits, 16).ok())
        .with_context(|| format!("'{name}' is '{text}', expected a 0x-prefixed hex number"))?;
    if value > 0xfff {
        bail!("'{name}' is '{text}', too large for a MIDR field");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
        model\t\t: 17\nmodel name\t: AMD EPYC 9654 96-Core Processor\nstepping\t: 1\n\
        flags\t\t: fpu vme de pse tsc msr hypervisor lahf_lm\n\n\
        processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
        stepping\t: 1\nflags\t\t: fpu vme de pse tsc msr hypervisor lahf_lm\n\n";

    const ARM: &str = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\n\
        CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\n\
        CPU revision\t: 1\n\nprocessor\t: 1\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n\
        CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd49\nCPU revision\t: 3\n\n";

    #[test]
    fn x86_fields_are_decimal() -> Result<()> {
        let info = CpuInfo::parse(X86)?;
        assert_eq!(info.vendor_id.as_deref(), Some("AuthenticAMD"));
        assert_eq!(info.model_name.as_deref(), Some("AMD EPYC 9654 96-Core Processor"));
        assert_eq!((info.family, info.model, info.stepping), (Some(25), Some(0x11), Some(1)));
        assert!(info.hypervisor);
        assert!(info.midrs.is_empty());
        Ok(())
    }

    #[test]
    fn hypervisor_is_a_whole_word() -> Result<()> {
        let info = CpuInfo::parse(&X86.replace(" hypervisor", " hypervisor_x"))?;
        assert!(!info.hypervisor);
        Ok(())
    }

    #[test]
    fn unknown_stepping_is_none() -> Result<()> {
        let info = CpuInfo::parse(&X86.replace("stepping\t: 1", "stepping\t: unknown"))?;
        assert_eq!(info.stepping, None);
        Ok(())
    }

    #[test]
    fn arm_midr_per_processor() -> Result<()> {
        let info = CpuInfo::parse(ARM)?;
        assert_eq!(info.vendor_id, None);
        assert_eq!(info.midrs.len(), 2);
        assert_eq!(info.midrs.get(&0).map(Midr::raw), Some(0x413f_d0c1));
        assert_eq!(info.midrs.get(&1).map(Midr::raw), Some(0x410f_d493));
        Ok(())
    }

    #[test]
    fn malformed_fields_are_named() {
        let err = |text: &str| match CpuInfo::parse(text) {
            Ok(info) => panic!("should fail, got {info:?}"),
            Err(err) => format!("{err:#}"),
        };
        assert_eq!(
            err(&X86.replacen("model\t\t: 17", "model\t\t: 0x11", 1)),
            "processor 0: 'model' is '0x11', expected a decimal number: \
             invalid digit found in string"
        );
        assert_eq!(
            err(&ARM.replacen("CPU part\t: 0xd0c", "CPU part\t: d0c", 1)),
            "processor 0: 'CPU part' is 'd0c', expected a 0x-prefixed hex number"
        );
        assert_eq!(
            err(&ARM.replacen("CPU variant\t: 0x3\n", "", 1)),
            "processor 0 has 'CPU implementer' but no 'CPU variant'"
        );
        assert!(err("processor\t: x\n").contains("'processor' is 'x'"));
    }
}
