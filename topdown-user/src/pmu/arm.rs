//! Arm MIDR_EL1 decoding and the Neoverse cores that have a TopDown methodology.

use std::fmt;

use anyhow::{Context, Result, bail};

/// Arm Ltd's implementer code in MIDR_EL1 (`CPU implementer: 0x41` in /proc/cpuinfo).
pub const ARM_IMPLEMENTER: u8 = 0x41;

/// MIDR_EL1 split into its fields: [31:24] implementer, [23:20] variant, [19:16] architecture
/// (0xF on every Armv8+ core), [15:4] part number, [3:0] revision (topdown-formulas.md §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Midr {
    pub implementer: u8,
    pub variant: u8,
    pub architecture: u8,
    pub part: u16,
    pub revision: u8,
}

impl Midr {
    /// Decodes a raw MIDR_EL1 value; the upper 32 bits (RES0) are ignored.
    pub fn from_raw(raw: u64) -> Self {
        Self {
            implementer: ((raw >> 24) & 0xff) as u8,
            variant: ((raw >> 20) & 0xf) as u8,
            architecture: ((raw >> 16) & 0xf) as u8,
            part: ((raw >> 4) & 0xfff) as u16,
            revision: (raw & 0xf) as u8,
        }
    }

    /// The 32-bit register value, as perf's arm64 cpuid strings print it (`0x410fd493`).
    pub fn raw(&self) -> u32 {
        (u32::from(self.implementer) << 24)
            | (u32::from(self.variant & 0xf) << 20)
            | (u32::from(self.architecture & 0xf) << 16)
            | (u32::from(self.part & 0xfff) << 4)
            | u32::from(self.revision & 0xf)
    }

    /// Parses `/sys/devices/system/cpu/cpuN/regs/identification/midr_el1`, which the kernel
    /// prints as `0x%016llx` (`0x00000000410fd493`).
    pub fn parse_sysfs(text: &str) -> Result<Self> {
        let text = text.trim();
        let Some(hex) = text.strip_prefix("0x") else {
            bail!("'{text}' is not a 0x-prefixed hexadecimal MIDR_EL1 value");
        };
        let raw = u64::from_str_radix(hex, 16)
            .with_context(|| format!("'{text}' is not a hexadecimal MIDR_EL1 value"))?;
        Ok(Self::from_raw(raw))
    }

    /// `(variant, revision)`: Arm's rNpM, ordered as releases are.
    pub fn rev(&self) -> (u8, u8) {
        (self.variant, self.revision)
    }

    /// The Neoverse core this is, if it is one this program has TopDown data for.
    pub fn neoverse(&self) -> Option<Neoverse> {
        if self.implementer != ARM_IMPLEMENTER {
            return None;
        }
        NEOVERSE
            .iter()
            .find(|(part, _)| *part == self.part)
            .map(|&(_, core)| core)
    }

    /// Neoverse N2 before r0p3 counts one extra STALL_SLOT_FRONTEND (and so STALL_SLOT) per
    /// cycle. Source: topdown-formulas.md §5.4, Linux
    /// `tools/perf/pmu-events/arch/arm64/arm/neoverse-n2-v2/metrics.json` (James Clark's patch
    /// "Update stall_slot workaround for N2 r0p3": the fix applies to "any version of N2" that is
    /// not ">= r0p3"), and Arm telemetry-solution `neoverse-n2.json` (r0p0-r0p2) versus
    /// `neoverse-n2-r0p3.json`.
    pub fn has_n2_stall_slot_erratum(&self) -> bool {
        self.neoverse() == Some(Neoverse::N2) && self.rev() < (0, 3)
    }
}

/// `0x410fd493 (r0p3)`.
impl fmt::Display for Midr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:#010x} (r{}p{})",
            self.raw(),
            self.variant,
            self.revision
        )
    }
}

/// Neoverse cores with a TopDown methodology (topdown-formulas.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Neoverse {
    N1,
    N2,
    N3,
    V1,
    V2,
    V3,
}

/// MIDR part numbers: topdown-formulas.md §5.2 and §6.3 (ARM-software/data `cpus.json`; the
/// same numbers as Linux `arch/arm64/include/asm/cputype.h`, `ARM_CPU_PART_NEOVERSE_*`).
const NEOVERSE: [(u16, Neoverse); 6] = [
    (0xd0c, Neoverse::N1),
    (0xd40, Neoverse::V1),
    (0xd49, Neoverse::N2),
    (0xd4f, Neoverse::V2),
    (0xd84, Neoverse::V3),
    (0xd8e, Neoverse::N3),
];

impl Neoverse {
    pub fn name(self) -> &'static str {
        match self {
            Neoverse::N1 => "Neoverse N1",
            Neoverse::N2 => "Neoverse N2",
            Neoverse::N3 => "Neoverse N3",
            Neoverse::V1 => "Neoverse V1",
            Neoverse::V2 => "Neoverse V2",
            Neoverse::V3 => "Neoverse V3",
        }
    }

    /// Dispatch slots per cycle from Arm's telemetry data (topdown-formulas.md §5.2). The kernel
    /// exports the same number as `caps/slots` when the core has PMUv3p4 (all but N1); N1's
    /// TopDown is cycle-based, so its width is unused.
    pub fn slots(self) -> u32 {
        match self {
            Neoverse::N1 | Neoverse::N2 | Neoverse::N3 => 5,
            Neoverse::V1 | Neoverse::V2 => 8,
            Neoverse::V3 => 10,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_reencodes() {
        let midr = Midr::from_raw(0x413f_d0c1);
        assert_eq!(
            midr,
            Midr {
                implementer: 0x41,
                variant: 3,
                architecture: 0xf,
                part: 0xd0c,
                revision: 1
            }
        );
        assert_eq!(midr.raw(), 0x413f_d0c1);
        assert_eq!(midr.to_string(), "0x413fd0c1 (r3p1)");
        assert_eq!(midr.neoverse(), Some(Neoverse::N1));
    }

    #[test]
    fn parses_the_sysfs_register_file() -> Result<()> {
        let midr = Midr::parse_sysfs("0x00000000410fd493\n")?;
        assert_eq!(midr.raw(), 0x410f_d493);
        assert_eq!(midr.neoverse(), Some(Neoverse::N2));
        assert!(Midr::parse_sysfs("410fd493").is_err());
        assert!(Midr::parse_sysfs("0xzz").is_err());
        assert!(Midr::parse_sysfs("").is_err());
        Ok(())
    }

    #[test]
    fn n2_erratum_is_before_r0p3_only() {
        let n2 = |raw| Midr::from_raw(raw).has_n2_stall_slot_erratum();
        assert!(n2(0x410f_d490));
        assert!(n2(0x410f_d492));
        assert!(!n2(0x410f_d493));
        assert!(!n2(0x410f_d494));
        // A later variant is a later release, whatever its revision.
        assert!(!n2(0x411f_d490));
        // Not an N2 (V2), and not Arm's part numbering (another implementer).
        assert!(!n2(0x410f_d4f0));
        assert!(!n2(0x4e0f_d490));
    }
}
