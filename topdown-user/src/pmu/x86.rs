//! x86 identification tables: Intel microarchitectures by family 6 model, AMD Zen generations
//! by family/model.
//!
//! These only name the CPU. Whether TopDown counters are usable is decided from the PMU's sysfs
//! events (see `classify`), because a VM or an old kernel can hide what the silicon has.

use std::fmt;

/// How an Intel core exposes TopDown (topdown-formulas.md §6.1, "Topdown source" column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntelTopdown {
    /// Generic counters, level 1 (§2): Sandy Bridge to Cascade Lake.
    Generic,
    /// PERF_METRICS, 4 level-1 bytes (§1.1): ICL, ICX, TGL, RKL.
    PerfMetricsL1,
    /// PERF_METRICS, 8 bytes with level 2 (§1.1): SPR, EMR, GNR.
    PerfMetricsL2,
    /// `cpu_core` PERF_METRICS plus `cpu_atom` TOPDOWN_* events (§3): ADL, RPL, MTL, LNL, ARL.
    Hybrid,
    /// E-cores only, TOPDOWN_* generic events (§3.2): SRF, GRR, ADL-N.
    EcoreOnly,
}

/// An Intel microarchitecture (topdown-formulas.md §6.1; perf's `GenuineIntel-6-<MODEL>` rows of
/// `tools/perf/pmu-events/arch/x86/mapfile.csv` and intel/perfmon `mapfile.csv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IntelUarch {
    /// Intel's code name abbreviation (`ICX`).
    pub short: &'static str,
    /// Marketing code name (`Ice Lake-SP`).
    pub name: &'static str,
    pub topdown: IntelTopdown,
}

const fn uarch(short: &'static str, name: &'static str, topdown: IntelTopdown) -> IntelUarch {
    IntelUarch {
        short,
        name,
        topdown,
    }
}

/// `(family 6 models, minimum stepping, uarch)`; the first row that matches wins. Model 0x55 is
/// split by stepping as perf's mapfile does (`GenuineIntel-6-55-[01234]` skylakex,
/// `GenuineIntel-6-55-[56789ABCDEF]` cascadelakex, which also covers Cooper Lake's 10/11).
const INTEL_FAMILY_6: &[(&[u32], u32, IntelUarch)] = {
    use IntelTopdown::*;
    &[
        (&[0x2a], 0, uarch("SNB", "Sandy Bridge", Generic)),
        (&[0x2d], 0, uarch("JKT", "Sandy Bridge-EP", Generic)),
        (&[0x3a], 0, uarch("IVB", "Ivy Bridge", Generic)),
        (&[0x3e], 0, uarch("IVT", "Ivy Bridge-EP", Generic)),
        (&[0x3c, 0x45, 0x46], 0, uarch("HSW", "Haswell", Generic)),
        (&[0x3f], 0, uarch("HSX", "Haswell-EP", Generic)),
        (&[0x3d, 0x47], 0, uarch("BDW", "Broadwell", Generic)),
        (&[0x4f], 0, uarch("BDX", "Broadwell-EP", Generic)),
        (&[0x56], 0, uarch("BDW-DE", "Broadwell-DE", Generic)),
        (&[0x4e, 0x5e], 0, uarch("SKL", "Skylake", Generic)),
        (&[0x8e, 0x9e], 0, uarch("KBL", "Kaby Lake/Coffee Lake", Generic)),
        (&[0xa5, 0xa6], 0, uarch("CML", "Comet Lake", Generic)),
        (&[0x55], 5, uarch("CLX", "Cascade Lake-SP", Generic)),
        (&[0x55], 0, uarch("SKX", "Skylake-SP", Generic)),
        (&[0x7d, 0x7e], 0, uarch("ICL", "Ice Lake", PerfMetricsL1)),
        (&[0x6a, 0x6c], 0, uarch("ICX", "Ice Lake-SP", PerfMetricsL1)),
        (&[0x8c, 0x8d], 0, uarch("TGL", "Tiger Lake", PerfMetricsL1)),
        (&[0xa7], 0, uarch("RKL", "Rocket Lake", PerfMetricsL1)),
        (&[0x8f], 0, uarch("SPR", "Sapphire Rapids", PerfMetricsL2)),
        (&[0xcf], 0, uarch("EMR", "Emerald Rapids", PerfMetricsL2)),
        (&[0xad, 0xae], 0, uarch("GNR", "Granite Rapids", PerfMetricsL2)),
        (&[0x97, 0x9a], 0, uarch("ADL", "Alder Lake", Hybrid)),
        (&[0xb7, 0xba, 0xbf], 0, uarch("RPL", "Raptor Lake", Hybrid)),
        // 0xB5 (Arrow Lake-U) is a Meteor Lake die: the §6.1 table lists it under MTL.
        (&[0xaa, 0xac, 0xb5], 0, uarch("MTL", "Meteor Lake", Hybrid)),
        (&[0xbd], 0, uarch("LNL", "Lunar Lake", Hybrid)),
        (&[0xc5, 0xc6], 0, uarch("ARL", "Arrow Lake", Hybrid)),
        (&[0xbe], 0, uarch("ADL-N", "Alder Lake-N", EcoreOnly)),
        (&[0xaf], 0, uarch("SRF", "Sierra Forest", EcoreOnly)),
        (&[0xb6], 0, uarch("GRR", "Grand Ridge", EcoreOnly)),
    ]
};

/// The Intel microarchitecture for a /proc/cpuinfo family/model/stepping (already decimal-
/// decoded), if §6.1 lists it. An unknown stepping matches the rows without a minimum.
pub fn intel_uarch(family: u32, model: u32, stepping: Option<u32>) -> Option<IntelUarch> {
    if family != 6 {
        return None;
    }
    INTEL_FAMILY_6
        .iter()
        .find(|(models, min_stepping, _)| {
            models.contains(&model) && stepping.unwrap_or(0) >= *min_stepping
        })
        .map(|&(_, _, uarch)| uarch)
}

/// AMD Zen generations that perf maps to an event directory (topdown-formulas.md §4, "Model
/// mapping"; Linux `tools/perf/pmu-events/arch/x86/mapfile.csv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Zen {
    Zen3,
    Zen4,
    Zen5,
}

impl Zen {
    /// The generation for a family/model, following perf's mapfile rows, which are matched in
    /// order against `AuthenticAMD-<family decimal>-<model hex>`:
    ///
    /// * `AuthenticAMD-25-([245][[:xdigit:]]|[[:xdigit:]])` -> amdzen3: family 0x19, models
    ///   0x00-0x0F, 0x20-0x2F, 0x40-0x5F. (The §4 prose says "0x20-0x5F"; the regex leaves
    ///   0x30-0x3F to the next row.)
    /// * `AuthenticAMD-25-[[:xdigit:]]+` -> amdzen4: every other family 0x19 model.
    /// * `AuthenticAMD-26-[[:xdigit:]]+` -> amdzen5: family 0x1A. ⚠ §4 notes newer kernels add
    ///   amdzen6 and narrow this row; not verified, so all of family 0x1A is Zen 5 here.
    pub fn from_family_model(family: u32, model: u32) -> Option<Zen> {
        match family {
            0x19 if model <= 0x0f || (0x20..=0x2f).contains(&model) => Some(Zen::Zen3),
            0x19 if (0x40..=0x5f).contains(&model) => Some(Zen::Zen3),
            0x19 => Some(Zen::Zen4),
            0x1a => Some(Zen::Zen5),
            _ => None,
        }
    }

    /// Whether the generation has pipeline-utilization (TopDown) events: perf's `amdzen4` and
    /// `amdzen5` directories have `pipeline.json` (groups PipelineL1/PipelineL2, §4.2);
    /// `amdzen3` has none.
    pub fn has_topdown(self) -> bool {
        self != Zen::Zen3
    }
}

impl fmt::Display for Zen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Zen::Zen3 => "Zen 3",
            Zen::Zen4 => "Zen 4",
            Zen::Zen5 => "Zen 5",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(family: u32, model: u32, stepping: Option<u32>) -> Option<&'static str> {
        intel_uarch(family, model, stepping).map(|u| u.short)
    }

    #[test]
    fn intel_models_from_the_table() {
        assert_eq!(short(6, 0x6a, Some(6)), Some("ICX"));
        assert_eq!(short(6, 0x8f, Some(8)), Some("SPR"));
        assert_eq!(short(6, 207, Some(2)), Some("EMR"));
        assert_eq!(short(6, 0x97, Some(2)), Some("ADL"));
        assert_eq!(short(6, 0x9e, Some(10)), Some("KBL"));
        assert_eq!(short(6, 0x01, Some(0)), None);
        assert_eq!(short(15, 0x6a, Some(6)), None);
        let icx = intel_uarch(6, 0x6a, Some(6));
        assert_eq!(icx.map(|u| u.topdown), Some(IntelTopdown::PerfMetricsL1));
    }

    #[test]
    fn model_0x55_splits_by_stepping() {
        assert_eq!(short(6, 0x55, Some(4)), Some("SKX"));
        assert_eq!(short(6, 0x55, Some(0)), Some("SKX"));
        assert_eq!(short(6, 0x55, Some(5)), Some("CLX"));
        assert_eq!(short(6, 0x55, Some(7)), Some("CLX"));
        assert_eq!(short(6, 0x55, Some(11)), Some("CLX"));
        assert_eq!(short(6, 0x55, None), Some("SKX"));
    }

    #[test]
    fn zen_follows_the_mapfile_regexes() {
        let zen = Zen::from_family_model;
        for model in [0x00, 0x01, 0x0f, 0x20, 0x21, 0x2f, 0x40, 0x44, 0x50, 0x5f] {
            assert_eq!(zen(0x19, model), Some(Zen::Zen3), "model {model:#x}");
        }
        for model in [0x10, 0x11, 0x1f, 0x30, 0x3f, 0x60, 0x61, 0x74, 0x7f, 0xa0, 0xaf] {
            assert_eq!(zen(0x19, model), Some(Zen::Zen4), "model {model:#x}");
        }
        for model in [0x00, 0x02, 0x11, 0x24, 0x44, 0x70] {
            assert_eq!(zen(0x1a, model), Some(Zen::Zen5), "model {model:#x}");
        }
        assert_eq!(zen(0x17, 0x31), None);
        assert_eq!(zen(0x18, 0x00), None);
        assert!(!Zen::Zen3.has_topdown());
        assert!(Zen::Zen4.has_topdown() && Zen::Zen5.has_topdown());
    }
}
