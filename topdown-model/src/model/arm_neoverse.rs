//! Arm Neoverse N1, N2, V1, V2, V3 and N3 (topdown-formulas.md §5, §6.3).
//!
//! Arm's TopDown counts *slots* with the STALL_SLOT events of PMUv3p4 (V1 and later): S slots
//! per cycle, S from the PMU's `caps/slots` (PMMIR_EL1) or the per-core table. Arm publishes its
//! formulas in percent (ARM-tel `metrics`, Linux `sbsa.json` and per-core `metrics.json`); here
//! they are fractions, the same formulas without the factor 100. N1 predates the slot events:
//! its methodology is cycle accounting (stalled cycles), reported in the frontend/backend
//! columns and said so in its description.
//!
//! Counter budget: CPU_CYCLES has its own counter; the six programmable counters hold the
//! level-1 set exactly (§5.4 "Counters and SMT"), so V3/N3's level-2 events form a second group.
//! Neoverse cores have no SMT.

use super::{CounterSpec, LevelOne, LevelTwo, Model, Positions, difference, ratio};
use crate::groups::LEVEL_TWO_GROUP;

/// The Neoverse cores with a TopDown model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    N1,
    /// N2 r0p3 and later.
    N2,
    /// N2 r0p0..r0p2: STALL_SLOT and STALL_SLOT_FRONTEND count one extra slot per cycle.
    N2Erratum,
    V1,
    V2,
    V3,
    N3,
}

impl Core {
    const ALL: [Core; 7] = [
        Core::N1,
        Core::N2,
        Core::N2Erratum,
        Core::V1,
        Core::V2,
        Core::V3,
        Core::N3,
    ];

    fn name(self) -> &'static str {
        match self {
            Core::N1 => "arm-neoverse-n1",
            Core::N2 => "arm-neoverse-n2",
            Core::N2Erratum => "arm-neoverse-n2-r0p0",
            Core::V1 => "arm-neoverse-v1",
            Core::V2 => "arm-neoverse-v2",
            Core::V3 => "arm-neoverse-v3",
            Core::N3 => "arm-neoverse-n3",
        }
    }

    /// Slots per cycle, ARM-tel `num_slots` (topdown-formulas.md §5.2).
    fn table_slots(self) -> u32 {
        match self {
            Core::N1 | Core::N2 | Core::N2Erratum | Core::N3 => 5,
            Core::V1 | Core::V2 => 8,
            Core::V3 => 10,
        }
    }

    fn description(self) -> &'static str {
        match self {
            Core::N1 => {
                "Arm Neoverse N1 cycle accounting (stalled cycles, not slots): frontend/backend only"
            }
            Core::N2 => "Arm Neoverse N2 r0p3+ slot-based TopDown, level 1",
            Core::N2Erratum => {
                "Arm Neoverse N2 r0p0-r0p2 (e.g. Yitian 710) with the STALL_SLOT erratum correction, level 1"
            }
            Core::V1 => "Arm Neoverse V1 slot-based TopDown, level 1",
            Core::V2 => "Arm Neoverse V2 slot-based TopDown, level 1",
            Core::V3 => "Arm Neoverse V3 slot-based TopDown, L1 + backend memory/core split",
            Core::N3 => "Arm Neoverse N3 slot-based TopDown, L1 + backend memory/core split",
        }
    }
}

super::input_ids! {
    /// The formulas' inputs: ids into [`EVENTS`] and `ArmNeoverse::at` (each core counts a
    /// different subset, so positions are resolved per core).
    mod input {
        CPU_CYCLES,
        BR_MIS_PRED,
        STALL_FRONTEND,
        STALL_BACKEND,
        OP_RETIRED,
        OP_SPEC,
        STALL_SLOT_BACKEND,
        STALL_SLOT_FRONTEND,
        STALL_SLOT,
        STALL_FRONTEND_FLUSH,
        STALL_BACKEND_MEMBOUND,
        STALL_BACKEND_CPUBOUND,
    }
}

/// Architected PMUv3 event numbers (topdown-formulas.md §5.1), named as Linux's sysfs does, by
/// input id.
const EVENTS: [(&str, u64); input::COUNT] = [
    ("cpu_cycles", 0x11),
    ("br_mis_pred", 0x10),
    ("stall_frontend", 0x23),
    ("stall_backend", 0x24),
    ("op_retired", 0x3a),
    ("op_spec", 0x3b),
    ("stall_slot_backend", 0x3d),
    ("stall_slot_frontend", 0x3e),
    ("stall_slot", 0x3f),
    ("stall_frontend_flush", 0x8162),
    ("stall_backend_membound", 0x8164),
    ("stall_backend_cpubound", 0x816a),
];

pub struct ArmNeoverse {
    core: Core,
    slots: u32,
    at: Positions<{ input::COUNT }>,
}

impl ArmNeoverse {
    pub fn new(core: Core) -> Self {
        Self::with_slots(core, 0)
    }

    /// With the slots per cycle the PMU reports (`caps/slots`); 0 keeps the table's.
    pub fn with_slots(core: Core, slots: u32) -> Self {
        Self {
            core,
            slots: if slots == 0 {
                core.table_slots()
            } else {
                slots
            },
            at: Positions::new(Self::inputs(core)),
        }
    }

    /// The inputs `core` counts, in counter order: CPU_CYCLES on its own counter, the level-1
    /// set on the six programmable ones, then V3/N3's level-2 group.
    fn inputs(core: Core) -> Vec<usize> {
        use input::*;
        // The slot-based level 1 of N2/V1/V2/V3/N3, but for the per-cycle term its FE and
        // BadSpec take (BR_MIS_PRED, or STALL_FRONTEND_FLUSH on V3/N3).
        let slot_level_one = [
            CPU_CYCLES,
            STALL_SLOT_FRONTEND,
            STALL_SLOT_BACKEND,
            STALL_SLOT,
            OP_SPEC,
            OP_RETIRED,
        ];
        match core {
            Core::N1 => vec![CPU_CYCLES, STALL_FRONTEND, STALL_BACKEND],
            Core::N2 | Core::N2Erratum | Core::V1 | Core::V2 => {
                [&slot_level_one[..], &[BR_MIS_PRED]].concat()
            }
            Core::V3 | Core::N3 => [
                &slot_level_one[..],
                &[
                    STALL_FRONTEND_FLUSH,
                    STALL_BACKEND,
                    STALL_BACKEND_MEMBOUND,
                    STALL_BACKEND_CPUBOUND,
                ],
            ]
            .concat(),
        }
    }
}

/// The model for a MIDR (topdown-formulas.md §6.3 part numbers). The N2 erratum correction
/// applies to variant 0, revision < 3 only, as Linux gates it (`neoverse-n2-v2/metrics.json`:
/// `strcmp_cpuid_str(0x410fd493) | strcmp_cpuid_str(0x410fd490) ^ 1`, James Clark's 2023 patch).
pub fn model_for_midr(
    part: u16,
    variant: u8,
    revision: u8,
    caps_slots: Option<u32>,
) -> Option<Box<dyn Model>> {
    let core = match part {
        0xd0c => Core::N1,
        0xd49 if variant == 0 && revision < 3 => Core::N2Erratum,
        0xd49 => Core::N2,
        0xd40 => Core::V1,
        0xd4f => Core::V2,
        0xd84 => Core::V3,
        0xd8e => Core::N3,
        _ => return None,
    };
    Some(Box::new(ArmNeoverse::with_slots(
        core,
        caps_slots.unwrap_or(0),
    )))
}

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    Core::ALL
        .iter()
        .map(|core| Box::new(ArmNeoverse::new(*core)) as Box<dyn Model>)
        .collect()
}

/// The model named `name` (as [`Model::name`] returns it, `@slots=N` included), if this file
/// has it.
pub fn by_name(name: &str) -> Option<Box<dyn Model>> {
    let (base, slots) = match name.split_once("@slots=") {
        Some((base, slots)) => (base, Some(slots.parse::<u32>().ok().filter(|s| *s > 0)?)),
        None => (name, None),
    };
    let core = Core::ALL.into_iter().find(|core| core.name() == base)?;
    Some(Box::new(ArmNeoverse::with_slots(core, slots.unwrap_or(0))))
}

impl Model for ArmNeoverse {
    fn name(&self) -> String {
        if self.slots == self.core.table_slots() {
            self.core.name().to_owned()
        } else {
            format!("{}@slots={}", self.core.name(), self.slots)
        }
    }

    fn base_name(&self) -> &'static str {
        self.core.name()
    }

    fn description(&self) -> &'static str {
        self.core.description()
    }

    fn counters(&self) -> Vec<CounterSpec> {
        Self::inputs(self.core)
            .into_iter()
            .map(|input| {
                let (name, config) = EVENTS[input];
                let spec = CounterSpec::raw(name, config);
                match input {
                    input::CPU_CYCLES => spec.fixed(),
                    // V3/N3's backend split: the only level-2 inputs.
                    input::STALL_BACKEND
                    | input::STALL_BACKEND_MEMBOUND
                    | input::STALL_BACKEND_CPUBOUND
                        if matches!(self.core, Core::V3 | Core::N3) =>
                    {
                        spec.in_group(LEVEL_TWO_GROUP)
                    }
                    _ => spec,
                }
            })
            .collect()
    }

    fn max_level(&self) -> u8 {
        match self.core {
            Core::V3 | Core::N3 => 2,
            _ => 1,
        }
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |input: usize| self.at.read(values, input);
        let cycles = get(input::CPU_CYCLES);
        let slots = self.slots as f64;
        let total_slots = slots * cycles;
        // r = OP_RETIRED / OP_SPEC: the share of issued operations that retired.
        let retired_share = ratio(get(input::OP_RETIRED), get(input::OP_SPEC));

        let level_one = match self.core {
            // Arm's N1 methodology stage 1, Cycle_Accounting (§5.3 N1 row):
            // frontend_stalled_cycles = STALL_FRONTEND/CPU_CYCLES,
            // backend_stalled_cycles = STALL_BACKEND/CPU_CYCLES.
            Core::N1 => LevelOne {
                frontend_bound: ratio(get(input::STALL_FRONTEND), cycles),
                backend_bound: ratio(get(input::STALL_BACKEND), cycles),
                ..LevelOne::default()
            },
            _ => {
                let (ssf, ss) = if self.core == Core::N2Erratum {
                    // §5.3 N2 r0p0-r0p2 row and the Yitian 710 seed ("real stall_slot_frontend
                    // = stall_slot_frontend - cpu_cycles", same for stall_slot; not backend).
                    (
                        get(input::STALL_SLOT_FRONTEND) - cycles,
                        get(input::STALL_SLOT) - cycles,
                    )
                } else {
                    (get(input::STALL_SLOT_FRONTEND), get(input::STALL_SLOT))
                };
                let ssb = get(input::STALL_SLOT_BACKEND);
                let mispredicts = get(input::BR_MIS_PRED);
                let flush = get(input::STALL_FRONTEND_FLUSH);
                // 1 - SS/(S*c): the slots that were not stalled.
                let issued = ratio(ss, total_slots).map(|stalled| 1.0 - stalled);
                let wasted = retired_share
                    .zip(issued)
                    .map(|(r, issued)| (1.0 - r) * issued);
                // The rows differ only in the per-cycle terms taken off FE and BE and added to
                // BadSpec: FE = SSF/(S*c) - fe_term/c; BE = SSB/(S*c) - be_term/c;
                // BadSpec = (1-r)(1 - SS/(S*c)) + bad_term/c; Retiring = r(1 - SS/(S*c)).
                let (fe_term, be_term, bad_term) = match self.core {
                    // §5.3 V1 row (S=8): FE = SSF/(8c) - 4*BR_MIS_PRED/c; BE = SSB/(8c);
                    // BadSpec = (1-r)(1 - SS/(8c)) + 4*BR_MIS_PRED/c; Retiring = r(1 - SS/(8c)).
                    Core::V1 => (4.0 * mispredicts, 0.0, 4.0 * mispredicts),
                    // §5.3 V3/N3 row: FE = SSF/(S*c) - STALL_FRONTEND_FLUSH/c; BE = SSB/(S*c);
                    // BadSpec = (1 - SS/(S*c))(1-r) + STALL_FRONTEND_FLUSH/c; Retiring = (1 - SS/(S*c))*r.
                    Core::V3 | Core::N3 => (flush, 0.0, flush),
                    // §5.3 N2 r0p3+/V2 row, and the N2 r0p0-r0p2 row with SSF and SS corrected
                    // above: FE = SSF/(S*c) - BR_MIS_PRED/c; BE = SSB/(S*c) - 3*BR_MIS_PRED/c;
                    // BadSpec = (1-r)(1 - SS/(S*c)) + 4*BR_MIS_PRED/c; Retiring = r(1 - SS/(S*c)).
                    _ => (mispredicts, 3.0 * mispredicts, 4.0 * mispredicts),
                };
                let per_cycle = |value: f64| ratio(value, cycles);
                LevelOne {
                    retiring: retired_share.zip(issued).map(|(r, issued)| r * issued),
                    bad_speculation: wasted
                        .zip(per_cycle(bad_term))
                        .map(|(wasted, term)| wasted + term),
                    frontend_bound: difference(ratio(ssf, total_slots), per_cycle(fe_term)),
                    backend_bound: difference(ratio(ssb, total_slots), per_cycle(be_term)),
                }
            }
        };
        level_one.write_with_level_two(out, level, |level_one| {
            if !matches!(self.core, Core::V3 | Core::N3) {
                // Arm publishes no slot-based level 2 for N1/N2/V1/V2 at all.
                return LevelTwo::default();
            }
            // Arm publishes the backend split of V3/N3 in stall *cycles* (§5.4,
            // Topdown_Backend: backend_mem_bound = STALL_BACKEND_MEMBOUND/STALL_BACKEND,
            // backend_core_bound = STALL_BACKEND_CPUBOUND/STALL_BACKEND). Weighting the
            // level-1 backend slots by those cycle shares is our composition, not Arm's.
            let stalled = get(input::STALL_BACKEND);
            let backend_share = |input: usize| {
                level_one
                    .backend_bound
                    .zip(ratio(get(input), stalled))
                    .map(|(be, share)| be * share)
            };
            LevelTwo {
                memory_bound: backend_share(input::STALL_BACKEND_MEMBOUND),
                core_bound: backend_share(input::STALL_BACKEND_CPUBOUND),
                ..LevelTwo::default()
            }
        });
    }

    fn weight_counter(&self) -> &'static str {
        EVENTS[input::CPU_CYCLES].0
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(self.at.read(values, input::CPU_CYCLES) * self.slots as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::values_of;

    /// The Yitian 710 (Neoverse N2) `perf stat` run of the seed: 4.4% retiring, 0.0% bad
    /// speculation, 23.3% frontend, 73.0% backend. Its formulas have no BR_MIS_PRED term (and
    /// the run did not count it): with BR_MIS_PRED = 0, Linux's per-core formulas are the
    /// seed's. perf multiplexed three groups there, each with its own cpu_cycles reading; one
    /// value (the retiring group's) serves all four here.
    fn yitian() -> [(&'static str, u64); 7] {
        [
            ("cpu_cycles", 3_922_334_305),
            ("stall_slot", 22_679_591_134),
            ("op_spec", 854_404_256),
            ("op_retired", 853_521_883),
            ("stall_slot_frontend", 8_492_337_939),
            ("stall_slot_backend", 14_317_243_430),
            ("br_mis_pred", 0),
        ]
    }

    fn percent(value: Option<f64>) -> f64 {
        (value.unwrap() * 1000.0).round() / 10.0
    }

    #[test]
    fn yitian_710_published_numbers_with_the_erratum_correction() {
        let model = ArmNeoverse::new(Core::N2Erratum);
        let metrics = model.metrics(&values_of(&model, &yitian()), 1);
        assert_eq!(percent(metrics["retiring"]), 4.4);
        assert_eq!(percent(metrics["bad_speculation"]), 0.0);
        assert_eq!(percent(metrics["frontend_bound"]), 23.3);
        assert_eq!(percent(metrics["backend_bound"]), 73.0);
        // By hand: c = 3,922,334,305, S*c = 19,611,671,525.
        // FE = (8,492,337,939 - c)/(S*c) = 4,570,003,634/19,611,671,525 = 0.2330247...
        // BE = 14,317,243,430/19,611,671,525 = 0.7300372...
        // issued = 1 - (22,679,591,134 - c)/(S*c) = 1 - 18,757,256,829/19,611,671,525 = 0.0435669...
        // r = 853,521,883/854,404,256 = 0.9989672...; RET = r*issued = 0.0435219...
        let close = |value: Option<f64>, expected: f64| (value.unwrap() - expected).abs() < 1e-6;
        assert!(close(metrics["frontend_bound"], 0.2330247));
        assert!(close(metrics["backend_bound"], 0.7300372));
        assert!(close(metrics["retiring"], 0.0435219));
        // The four do not sum to exactly 1 here: perf read stall_slot in another multiplexed
        // group than stall_slot_frontend/backend, so SS != SSF + SSB in this data.
    }

    #[test]
    fn without_the_correction_n2_r0p3_reads_the_same_counts_differently() {
        // FE = 8,492,337,939/19,611,671,525 = 0.4330247...: the extra slot per cycle of the
        // erratum lands in frontend, and retiring goes negative-ish small:
        // issued = 1 - 22,679,591,134/19,611,671,525 < 0.
        let model = ArmNeoverse::new(Core::N2);
        let metrics = model.metrics(&values_of(&model, &yitian()), 1);
        assert_eq!(percent(metrics["frontend_bound"]), 43.3);
        assert!(metrics["retiring"].unwrap() < 0.0);
    }

    #[test]
    fn midr_picks_the_model_as_linux_gates_the_erratum() {
        let name = |part, variant, revision, slots| {
            model_for_midr(part, variant, revision, slots).map(|model| model.name())
        };
        // 0x410FD490 r0p0, 0x410FD492 r0p2: corrected; 0x410FD493 r0p3: not.
        assert_eq!(
            name(0xd49, 0, 0, None).as_deref(),
            Some("arm-neoverse-n2-r0p0")
        );
        assert_eq!(
            name(0xd49, 0, 2, None).as_deref(),
            Some("arm-neoverse-n2-r0p0")
        );
        assert_eq!(name(0xd49, 0, 3, None).as_deref(), Some("arm-neoverse-n2"));
        assert_eq!(name(0xd40, 1, 2, None).as_deref(), Some("arm-neoverse-v1"));
        assert_eq!(name(0xd0c, 3, 1, None).as_deref(), Some("arm-neoverse-n1"));
        assert_eq!(name(0xd4f, 0, 0, None).as_deref(), Some("arm-neoverse-v2"));
        assert_eq!(name(0xd84, 0, 0, None).as_deref(), Some("arm-neoverse-v3"));
        assert_eq!(name(0xd8e, 0, 0, None).as_deref(), Some("arm-neoverse-n3"));
        assert_eq!(name(0xd4a, 0, 0, None), None);
        // caps/slots overrides the table; 0 (no PMMIR) keeps it.
        assert_eq!(
            name(0xd4f, 0, 0, Some(6)).as_deref(),
            Some("arm-neoverse-v2@slots=6")
        );
        assert_eq!(
            name(0xd4f, 0, 0, Some(0)).as_deref(),
            Some("arm-neoverse-v2")
        );
    }

    #[test]
    fn names_round_trip() {
        for model in models() {
            assert_eq!(by_name(&model.name()).unwrap().name(), model.name());
        }
        assert_eq!(
            by_name("arm-neoverse-v2@slots=6").unwrap().name(),
            "arm-neoverse-v2@slots=6"
        );
        assert!(by_name("arm-neoverse-v2@slots=x").is_none());
        assert!(by_name("arm-neoverse-v2@slots=0").is_none());
        assert!(by_name("arm-neoverse-e1").is_none());
    }

    #[test]
    fn level_one_uses_six_programmable_counters_and_the_cycle_counter() {
        for model in models() {
            let counters = model.counters();
            let general = counters
                .iter()
                .filter(|spec| spec.group == 0 && spec.uses == super::super::CounterUse::General)
                .count();
            assert!(general <= 6, "{}", model.name());
            assert_eq!(counters[0].name, "cpu_cycles");
        }
    }

    #[test]
    fn each_core_reads_its_inputs_from_its_own_counters() {
        for core in Core::ALL {
            let model = ArmNeoverse::new(core);
            let counters = model.counters();
            assert_eq!(counters.len(), ArmNeoverse::inputs(core).len());
            for (input, (name, _)) in EVENTS.iter().enumerate() {
                let position = model.at.of(input);
                assert_eq!(
                    position.map(|position| counters[position].name.as_str()),
                    counters
                        .iter()
                        .any(|spec| spec.name == *name)
                        .then_some(*name),
                    "{core:?} {name}"
                );
            }
        }
        // V3: STALL_FRONTEND_FLUSH where N2 has BR_MIS_PRED, then the level-2 group.
        let v3 = ArmNeoverse::new(Core::V3);
        assert_eq!(v3.at.of(input::STALL_FRONTEND_FLUSH), Some(6));
        assert_eq!(v3.at.of(input::STALL_BACKEND_CPUBOUND), Some(9));
        assert_eq!(v3.counters()[9].group, LEVEL_TWO_GROUP);
        assert_eq!(ArmNeoverse::new(Core::N1).counters()[2].group, 0);
    }
}
