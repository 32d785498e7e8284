//! Intel E-cores (topdown-formulas.md §3): `intel-grt` (Gracemont: Alder/Raptor Lake E-cores,
//! ADL-N), `intel-cmt` (Crestmont: Meteor Lake E-cores, Sierra Forest, Grand Ridge) and
//! `intel-skt` (Skymont: Lunar/Arrow Lake E-cores).
//!
//! The E-core TopDown events are ordinary counters in slot units: no `slots` event, so
//! S = width * CPU_CLK_UNHALTED.CORE (§3.1). The E-core tree's level 2 has no memory/core split
//! in slots: it has Core_Bound (allocation restrictions) and Resource_Bound (the rest of
//! backend); topdown reports Resource_Bound in the `memory_bound` column and says so. E-cores
//! have no SMT. Gracemont has 6 general-purpose counters, Crestmont and Skymont 8.

use super::{CounterSpec, Counts, L1_METRICS, L2_METRICS, Metrics, Model, ratio};
use crate::groups::LEVEL_TWO_GROUP;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Core {
    Gracemont,
    Crestmont,
    Skymont,
}

pub struct IntelAtom {
    core: Core,
}

const CLOCKS: &str = "CPU_CLK_UNHALTED.CORE";
const FRONTEND: &str = "TOPDOWN_FE_BOUND.ALL";
const BAD_SPECULATION: &str = "TOPDOWN_BAD_SPECULATION.ALL";
const BACKEND: &str = "TOPDOWN_BE_BOUND.ALL";
const RETIRING: &str = "TOPDOWN_RETIRING.ALL";
const FRONTEND_LATENCY: &str = "TOPDOWN_FE_BOUND.FRONTEND_LATENCY";
const FRONTEND_BANDWIDTH: &str = "TOPDOWN_FE_BOUND.FRONTEND_BANDWIDTH";
const MISPREDICT: &str = "TOPDOWN_BAD_SPECULATION.MISPREDICT";
const MACHINE_CLEARS: &str = "TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS";
const ALLOC_RESTRICTIONS: &str = "TOPDOWN_BE_BOUND.ALLOC_RESTRICTIONS";

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    [Core::Gracemont, Core::Crestmont, Core::Skymont]
        .into_iter()
        .map(|core| Box::new(IntelAtom { core }) as Box<dyn Model>)
        .collect()
}

/// The model named `name` (as [`Model::name`] returns it), if this file has it.
pub fn by_name(name: &str) -> Option<Box<dyn Model>> {
    models().into_iter().find(|model| model.name() == name)
}

impl IntelAtom {
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
    fn name(&self) -> String {
        self.base_name().to_owned()
    }

    fn base_name(&self) -> &'static str {
        match self.core {
            Core::Gracemont => "intel-grt",
            Core::Crestmont => "intel-cmt",
            Core::Skymont => "intel-skt",
        }
    }

    fn description(&self) -> &'static str {
        match self.core {
            Core::Gracemont => {
                "Intel Gracemont E-cores (ADL/RPL, ADL-N): TopDown L1 + L2 (Resource_Bound shown as memory_bound)"
            }
            Core::Crestmont => {
                "Intel Crestmont E-cores (MTL, SRF, GRR): TopDown L1 + L2 (Resource_Bound shown as memory_bound)"
            }
            Core::Skymont => "Intel Skymont E-cores (LNL/ARL): TopDown L1",
        }
    }

    fn counters(&self) -> Vec<CounterSpec> {
        let level_two = LEVEL_TWO_GROUP;
        match self.core {
            // §3.2: GRT TOPDOWN_RETIRING.ALL is 0xC2/0x00 (the UOPS_RETIRED.ALL code); BadSpec
            // is derived, so its counter is not needed.
            Core::Gracemont | Core::Crestmont => {
                let mut specs = vec![
                    CounterSpec::raw(CLOCKS, 0x003c),
                    CounterSpec::raw(FRONTEND, 0x0071),
                    CounterSpec::raw(BACKEND, 0x0074),
                ];
                if self.core == Core::Gracemont {
                    specs.push(CounterSpec::raw(RETIRING, 0x00c2));
                } else {
                    specs.push(CounterSpec::raw(RETIRING, 0x0072));
                    specs.push(CounterSpec::raw(BAD_SPECULATION, 0x0073));
                }
                specs.extend([
                    CounterSpec::raw(FRONTEND_LATENCY, 0x7271).in_group(level_two),
                    CounterSpec::raw(FRONTEND_BANDWIDTH, 0x8d71).in_group(level_two),
                    CounterSpec::raw(MISPREDICT, 0x0473).in_group(level_two),
                    CounterSpec::raw(MACHINE_CLEARS, 0x0373).in_group(level_two),
                    CounterSpec::raw(ALLOC_RESTRICTIONS, 0x0174).in_group(level_two),
                ]);
                specs
            }
            // §3.4 ARL-H atom (Skymont) encodings: retiring 0xc2/0x02, bad-spec 0x73/0x0,
            // fe-bound 0x9c/0x01, be-bound 0xa4/0x02 (they match Skymont TOPDOWN_*_ALL_P).
            Core::Skymont => vec![
                CounterSpec::raw(CLOCKS, 0x003c),
                CounterSpec::raw(FRONTEND, 0x019c),
                CounterSpec::raw(BACKEND, 0x02a4),
                CounterSpec::raw(RETIRING, 0x02c2),
                CounterSpec::raw(BAD_SPECULATION, 0x0073),
            ],
        }
    }

    fn max_level(&self) -> u8 {
        match self.core {
            // The reference gives no Skymont level-2 encodings.
            Core::Skymont => 1,
            _ => 2,
        }
    }

    fn metrics(&self, counts: &Counts, level: u8) -> Metrics {
        let get = |name: &str| counts.get(name).copied().unwrap_or(0) as f64;
        // §3.3: S = width * CPU_CLK_UNHALTED.CORE.
        let slots = self.width() * get(CLOCKS);
        let per_slot = |name: &str| ratio(get(name), slots);
        let frontend = per_slot(FRONTEND);
        let backend = per_slot(BACKEND);
        let retiring = per_slot(RETIRING);
        let bad_speculation = match self.core {
            // GRT: derived, (S - (FE_cnt + BE_cnt + RET_cnt))/S.
            Core::Gracemont => ratio(
                slots - (get(FRONTEND) + get(BACKEND) + get(RETIRING)),
                slots,
            ),
            // CMT (and Skymont, whose bad-spec event the kernel exposes): BAD_SPECULATION.ALL_P/S.
            Core::Crestmont | Core::Skymont => per_slot(BAD_SPECULATION),
        };
        let mut metrics: Metrics = [
            ("retiring", retiring),
            ("bad_speculation", bad_speculation),
            ("frontend_bound", frontend),
            ("backend_bound", backend),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        debug_assert!(L1_METRICS.iter().all(|name| metrics.contains_key(*name)));
        if level < 2 {
            return metrics;
        }
        metrics.extend(L2_METRICS.iter().map(|name| ((*name).to_owned(), None)));
        if self.core == Core::Skymont {
            return metrics;
        }
        // §3.3 level 2: IFetch_Latency = FRONTEND_LATENCY/S; IFetch_Bandwidth =
        // FRONTEND_BANDWIDTH/S; Branch_Mispredicts = MISPREDICT/S; Machine_Clears =
        // MACHINE_CLEARS/S; Core_Bound = ALLOC_RESTRICTIONS/S; Resource_Bound = BE - Core_Bound.
        let core_bound = per_slot(ALLOC_RESTRICTIONS);
        let resource_bound = backend.zip(core_bound).map(|(be, core)| be - core);
        for (name, value) in [
            ("fetch_latency", per_slot(FRONTEND_LATENCY)),
            ("fetch_bandwidth", per_slot(FRONTEND_BANDWIDTH)),
            ("branch_mispredicts", per_slot(MISPREDICT)),
            ("machine_clears", per_slot(MACHINE_CLEARS)),
            ("core_bound", core_bound),
            ("memory_bound", resource_bound),
        ] {
            metrics.insert(name.to_owned(), value);
        }
        metrics
    }

    fn weight_counter(&self) -> &'static str {
        CLOCKS
    }

    fn slots(&self, counts: &Counts) -> Option<f64> {
        counts
            .get(CLOCKS)
            .map(|clocks| *clocks as f64 * self.width())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_follow_the_reference() {
        let config = |model: &str, name: &str| {
            by_name(model)
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
    }

    #[test]
    fn slots_are_width_times_clocks() {
        let counts: Counts = [(CLOCKS.to_owned(), 200)].into_iter().collect();
        assert_eq!(by_name("intel-grt").unwrap().slots(&counts), Some(1000.0));
        assert_eq!(by_name("intel-cmt").unwrap().slots(&counts), Some(1200.0));
        assert_eq!(by_name("intel-skt").unwrap().slots(&counts), Some(1600.0));
    }

    #[test]
    fn zero_counts_mean_no_data() {
        for model in models() {
            let metrics = model.metrics(&Counts::new(), 2);
            assert!(metrics.values().all(Option::is_none), "{}", model.name());
        }
    }
}
