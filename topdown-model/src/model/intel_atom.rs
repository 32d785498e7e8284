//! Intel E-cores (topdown-formulas.md §3): `intel-grt` (Gracemont: Alder/Raptor Lake E-cores,
//! ADL-N), `intel-cmt` (Crestmont: Meteor Lake E-cores, Sierra Forest, Grand Ridge) and
//! `intel-skt` (Skymont: Lunar/Arrow Lake E-cores).
//!
//! The E-core TopDown events are ordinary counters in slot units: no `slots` event, so
//! S = width * CPU_CLK_UNHALTED.CORE (§3.1). The E-core tree's level 2 has no memory/core split
//! in slots: it has Core_Bound (allocation restrictions) and Resource_Bound (the rest of
//! backend); topdown reports Resource_Bound in the `memory_bound` column and says so. E-cores
//! have no SMT. Gracemont has 6 general-purpose counters, Crestmont and Skymont 8.

use super::{CounterSpec, LevelOne, LevelTwo, Model, Positions, difference, ratio};
use crate::groups::LEVEL_TWO_GROUP;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Core {
    Gracemont,
    Crestmont,
    Skymont,
}

pub struct IntelAtom {
    core: Core,
    at: Positions<{ input::COUNT }>,
}

super::input_ids! {
    /// The formulas' inputs (ids into `IntelAtom::at`): Gracemont has no bad-speculation counter,
    /// so the positions differ per core.
    mod input {
        CLOCKS = "CPU_CLK_UNHALTED.CORE",
        FRONTEND = "TOPDOWN_FE_BOUND.ALL",
        BACKEND = "TOPDOWN_BE_BOUND.ALL",
        RETIRING = "TOPDOWN_RETIRING.ALL",
        BAD_SPECULATION = "TOPDOWN_BAD_SPECULATION.ALL",
        FRONTEND_LATENCY = "TOPDOWN_FE_BOUND.FRONTEND_LATENCY",
        FRONTEND_BANDWIDTH = "TOPDOWN_FE_BOUND.FRONTEND_BANDWIDTH",
        MISPREDICT = "TOPDOWN_BAD_SPECULATION.MISPREDICT",
        MACHINE_CLEARS = "TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS",
        ALLOC_RESTRICTIONS = "TOPDOWN_BE_BOUND.ALLOC_RESTRICTIONS",
    }
}

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    [Core::Gracemont, Core::Crestmont, Core::Skymont]
        .into_iter()
        .map(|core| Box::new(IntelAtom::new(core)) as Box<dyn Model>)
        .collect()
}

impl IntelAtom {
    fn new(core: Core) -> Self {
        Self {
            core,
            at: Positions::new(Self::layout(core).into_iter().map(|(input, _)| input)),
        }
    }

    /// The counters of `core`, each with the input it feeds, in counter order.
    fn layout(core: Core) -> Vec<(usize, CounterSpec)> {
        // The level-1 encodings that differ per core (`umask << 8 | event`); the clocks are the
        // architectural 0x3c/0x00 on all three.
        let (frontend, backend, retiring, bad_speculation) = match core {
            // §3.2: GRT TOPDOWN_RETIRING.ALL is 0xC2/0x00 (the UOPS_RETIRED.ALL code); BadSpec
            // is derived, so its counter is not needed.
            Core::Gracemont => (0x0071, 0x0074, 0x00c2, None),
            Core::Crestmont => (0x0071, 0x0074, 0x0072, Some(0x0073)),
            // §3.4 ARL-H atom (Skymont) encodings: retiring 0xc2/0x02, bad-spec 0x73/0x0,
            // fe-bound 0x9c/0x01, be-bound 0xa4/0x02 (they match Skymont TOPDOWN_*_ALL_P).
            Core::Skymont => (0x019c, 0x02a4, 0x02c2, Some(0x0073)),
        };
        let level_one = [
            (input::CLOCKS, CLOCKS, Some(0x003c)),
            (input::FRONTEND, FRONTEND, Some(frontend)),
            (input::BACKEND, BACKEND, Some(backend)),
            (input::RETIRING, RETIRING, Some(retiring)),
            (input::BAD_SPECULATION, BAD_SPECULATION, bad_speculation),
        ]
        .into_iter()
        .filter_map(|(input, name, config)| Some((input, name, config?)));
        // The same level-2 encodings on all three (Skymont's from lunarlake/pipeline.json,
        // cpu_atom: FRONTEND_LATENCY 0x71/0x72, FRONTEND_BANDWIDTH 0x71/0x8d, MISPREDICT
        // 0x73/0x04, MACHINE_CLEARS 0x73/0x03 (TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS),
        // ALLOC_RESTRICTIONS 0x74/0x01).
        let mut level_two = [
            (input::FRONTEND_LATENCY, FRONTEND_LATENCY, 0x7271),
            (input::FRONTEND_BANDWIDTH, FRONTEND_BANDWIDTH, 0x8d71),
            (input::MISPREDICT, MISPREDICT, 0x0473),
            (input::MACHINE_CLEARS, MACHINE_CLEARS, 0x0373),
            (input::ALLOC_RESTRICTIONS, ALLOC_RESTRICTIONS, 0x0174),
        ];
        if core == Core::Skymont {
            // Skymont's MACHINE_CLEARS came last, so the other counters keep their places (and
            // their synthetic syscalls).
            level_two[3..].rotate_left(1);
        }
        level_one
            .map(|entry| (entry, 0))
            .chain(level_two.map(|entry| (entry, LEVEL_TWO_GROUP)))
            .map(|((input, name, config), group)| {
                (input, CounterSpec::raw(name, config).in_group(group))
            })
            .collect()
    }

    /// Pipeline width (§3.1: E-core TMA `#Pipeline_Width`, perf adl/mtl/arl-metrics.json).
    fn width(&self) -> f64 {
        match self.core {
            Core::Gracemont => 5.0,
            Core::Crestmont => 6.0,
            Core::Skymont => 8.0,
        }
    }
}

impl Model for IntelAtom {
    super::name_and_description!(self => match self.core {
        Core::Gracemont => (
            "intel-grt",
            "Intel Gracemont E-cores (ADL/RPL, ADL-N): TopDown L1 + L2 (Resource_Bound shown as memory_bound)",
        ),
        Core::Crestmont => (
            "intel-cmt",
            "Intel Crestmont E-cores (MTL, SRF, GRR): TopDown L1 + L2 (Resource_Bound shown as memory_bound)",
        ),
        Core::Skymont => (
            "intel-skt",
            "Intel Skymont E-cores (LNL/ARL): TopDown L1 + L2 (Resource_Bound shown as memory_bound)",
        ),
    });

    fn counters(&self) -> Vec<CounterSpec> {
        Self::layout(self.core)
            .into_iter()
            .map(|(_, spec)| spec)
            .collect()
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |input: usize| self.at.read(values, input);
        // §3.3: S = width * CPU_CLK_UNHALTED.CORE.
        let slots = self.width() * get(input::CLOCKS);
        let per_slot = |input: usize| ratio(get(input), slots);
        let level_one = LevelOne {
            retiring: per_slot(input::RETIRING),
            bad_speculation: match self.core {
                // GRT: derived, (S - (FE_cnt + BE_cnt + RET_cnt))/S.
                Core::Gracemont => ratio(
                    slots - (get(input::FRONTEND) + get(input::BACKEND) + get(input::RETIRING)),
                    slots,
                ),
                // CMT (and Skymont, whose bad-spec event the kernel exposes): BAD_SPECULATION.ALL_P/S.
                Core::Crestmont | Core::Skymont => per_slot(input::BAD_SPECULATION),
            },
            frontend_bound: per_slot(input::FRONTEND),
            backend_bound: per_slot(input::BACKEND),
        };
        // §3.3 level 2: IFetch_Latency = FRONTEND_LATENCY/S; IFetch_Bandwidth =
        // FRONTEND_BANDWIDTH/S; Branch_Mispredicts = MISPREDICT/S; Machine_Clears =
        // MACHINE_CLEARS/S; Core_Bound = ALLOC_RESTRICTIONS/S; Resource_Bound = BE - Core_Bound.
        // Skymont has the same formulas with width 8 (perf lunarlake/lnl-metrics.json, Unit
        // cpu_atom: tma_ifetch_latency, tma_ifetch_bandwidth, tma_branch_mispredicts,
        // tma_machine_clears = TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS / slots, tma_core_bound,
        // tma_resource_bound).
        level_one.write_with_level_two(out, level, |level_one| {
            let core_bound = per_slot(input::ALLOC_RESTRICTIONS);
            LevelTwo {
                fetch_latency: per_slot(input::FRONTEND_LATENCY),
                fetch_bandwidth: per_slot(input::FRONTEND_BANDWIDTH),
                branch_mispredicts: per_slot(input::MISPREDICT),
                machine_clears: per_slot(input::MACHINE_CLEARS),
                core_bound,
                memory_bound: difference(level_one.backend_bound, core_bound),
                // light/heavy operations stay null: the E-core trees (perf adl/mtl/lnl
                // cpu_atom) have no level-2 split of Retiring.
                ..LevelTwo::default()
            }
        });
    }

    fn weight_counter(&self) -> &'static str {
        CLOCKS
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(self.at.read(values, input::CLOCKS) * self.width())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::base_model;

    #[test]
    fn encodings_follow_the_reference() {
        let config = |model: &str, name: &str| {
            base_model(model)
                .unwrap()
                .counters()
                .into_iter()
                .find(|spec| spec.name == name)
                .map(|spec| spec.source)
        };
        let raw = |config| {
            Some(crate::model::CounterSource::Perf {
                perf_type: 4,
                config,
            })
        };
        assert_eq!(config("intel-grt", RETIRING), raw(0x00c2));
        assert_eq!(config("intel-cmt", RETIRING), raw(0x0072));
        assert_eq!(config("intel-skt", RETIRING), raw(0x02c2));
        assert_eq!(config("intel-skt", FRONTEND), raw(0x019c));
        assert_eq!(config("intel-grt", FRONTEND_LATENCY), raw(0x7271));
        assert_eq!(config("intel-grt", BAD_SPECULATION), None);
        assert_eq!(config("intel-skt", FRONTEND_LATENCY), raw(0x7271));
        assert_eq!(config("intel-skt", ALLOC_RESTRICTIONS), raw(0x0174));
        assert_eq!(config("intel-skt", MACHINE_CLEARS), raw(0x0373));
    }

    #[test]
    fn skymont_reads_machine_clears_from_its_own_counter() {
        // perf's tma_machine_clears (lnl-metrics.json, cpu_atom): MACHINE_CLEARS / slots, not
        // BAD_SPECULATION.ALL_P - MISPREDICT.
        let skt = IntelAtom::new(Core::Skymont);
        assert_eq!(skt.counters().len(), 10);
        assert_eq!(skt.at.of(input::MACHINE_CLEARS), Some(9));
        assert_eq!(skt.max_level(), 2);
        // CLOCKS 100 (S = 800); BAD_SPECULATION.ALL 200, MISPREDICT 120, MACHINE_CLEARS 50
        // (the other 30 of bad speculation counted by neither sub-event).
        let metrics = skt.metrics(&[100, 0, 400, 0, 200, 0, 0, 120, 160, 50], 2);
        assert_eq!(metrics["bad_speculation"], Some(200.0 / 800.0));
        assert_eq!(metrics["branch_mispredicts"], Some(120.0 / 800.0));
        assert_eq!(metrics["machine_clears"], Some(50.0 / 800.0));
        assert_eq!(metrics["core_bound"], Some(160.0 / 800.0));
        assert_eq!(metrics["memory_bound"], Some(240.0 / 800.0));
        assert_eq!(metrics["light_operations"], None);
        // Level 1 opens none of the level-2 counters.
        let level_one: Vec<_> = skt
            .counters()
            .into_iter()
            .filter(|spec| spec.group == 0)
            .map(|spec| spec.name)
            .collect();
        assert!(
            !level_one.iter().any(|name| name == MACHINE_CLEARS),
            "{level_one:?}"
        );
    }

    #[test]
    fn slots_are_width_times_clocks() {
        assert_eq!(base_model("intel-grt").unwrap().slots(&[200]), Some(1000.0));
        assert_eq!(base_model("intel-cmt").unwrap().slots(&[200]), Some(1200.0));
        assert_eq!(base_model("intel-skt").unwrap().slots(&[200]), Some(1600.0));
    }

    #[test]
    fn gracemont_reads_level_two_one_position_earlier() {
        // No bad-speculation counter on Gracemont: its level-2 inputs sit one position before
        // Crestmont's, and its bad speculation is derived.
        let grt = IntelAtom::new(Core::Gracemont);
        let cmt = IntelAtom::new(Core::Crestmont);
        assert_eq!(grt.at.of(input::BAD_SPECULATION), None);
        assert_eq!(grt.at.of(input::FRONTEND_LATENCY), Some(4));
        assert_eq!(cmt.at.of(input::FRONTEND_LATENCY), Some(5));
        // CLOCKS 100 (S = 500 on GRT, 600 on CMT); FE 50, BE 100, RET 200, CMT bad-spec 60;
        // FRONTEND_LATENCY 20 on both.
        let grt_metrics = grt.metrics(&[100, 50, 100, 200, 20, 0, 0, 0, 0], 2);
        assert_eq!(grt_metrics["fetch_latency"], Some(20.0 / 500.0));
        assert_eq!(grt_metrics["bad_speculation"], Some(150.0 / 500.0));
        let cmt_metrics = cmt.metrics(&[100, 50, 100, 200, 60, 20, 0, 0, 0, 0], 2);
        assert_eq!(cmt_metrics["fetch_latency"], Some(20.0 / 600.0));
        assert_eq!(cmt_metrics["bad_speculation"], Some(60.0 / 600.0));
    }
}
