//! Intel PERF_METRICS with the level-2 bytes: `intel-spr` (Golden Cove and Raptor Cove P-cores:
//! Sapphire/Emerald/Granite Rapids, the P-cores of Alder/Raptor/Meteor Lake) and `intel-lnc`
//! (Lion Cove: Lunar Lake and Arrow Lake P-cores).
//!
//! The `slots` leader and eight metric pseudo-events all live on fixed counter 3 and the
//! PERF_METRICS register (topdown-formulas.md §1.1, §1.3): level 2 costs no general-purpose
//! counter. The kernel reports each metric event as slot-scaled, floored counts (§1.2), so perf
//! divides by the sum of the four level-1 counts rather than by `slots`; so do we.

use super::{
    CounterSpec, LevelOne, LevelTwo, Model, bad_speculation_left_over, difference,
    floored_difference, ratio, value,
};

/// Which P-core generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    GoldenCove,
    LionCove,
}

pub struct IntelPerfMetricsL2 {
    generation: Generation,
}

/// `slots` and the eight metric events (§1.1: `event=0x00,umask=0x80..0x87`, slots `umask=0x4`).
const METRIC_EVENTS: [(&str, u64); 9] = [
    ("slots", 0x0400),
    ("topdown-retiring", 0x8000),
    ("topdown-bad-spec", 0x8100),
    ("topdown-fe-bound", 0x8200),
    ("topdown-be-bound", 0x8300),
    ("topdown-heavy-ops", 0x8400),
    ("topdown-br-mispredict", 0x8500),
    ("topdown-fetch-lat", 0x8600),
    ("topdown-mem-bound", 0x8700),
];

/// INT_MISC.UOP_DROPPING on Golden Cove (§1.5, SPR column: 0xAD/0x10).
const UOP_DROPPING_EVENT: (&str, u64) = ("INT_MISC.UOP_DROPPING", 0x10ad);

// Positions in `counters()`: `METRIC_EVENTS`, then UOP_DROPPING on Golden Cove only (Lion Cove's
// values end before it, and `value` reads 0 there).
const SLOTS: usize = 0;
const RETIRING: usize = 1;
const BAD_SPEC: usize = 2;
const FE_BOUND: usize = 3;
const BE_BOUND: usize = 4;
const HEAVY_OPS: usize = 5;
const BR_MISPREDICT: usize = 6;
const FETCH_LAT: usize = 7;
const MEM_BOUND: usize = 8;
const UOP_DROPPING: usize = 9;

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    vec![
        Box::new(IntelPerfMetricsL2 {
            generation: Generation::GoldenCove,
        }),
        Box::new(IntelPerfMetricsL2 {
            generation: Generation::LionCove,
        }),
    ]
}

impl Model for IntelPerfMetricsL2 {
    super::name_and_description!(self => match self.generation {
        Generation::GoldenCove => (
            "intel-spr",
            "Intel Sapphire/Emerald/Granite Rapids and ADL/RPL/MTL P-cores: perf metrics, TopDown L1 + L2",
        ),
        Generation::LionCove => (
            "intel-lnc",
            "Intel Lunar Lake/Arrow Lake P-cores (Lion Cove): perf metrics, TopDown L1 + L2",
        ),
    });

    fn counters(&self) -> Vec<CounterSpec> {
        let mut specs: Vec<CounterSpec> = METRIC_EVENTS
            .iter()
            .map(|(name, config)| CounterSpec::raw(name, *config).fixed())
            .collect();
        if self.generation == Generation::GoldenCove {
            specs.push(CounterSpec::raw(UOP_DROPPING_EVENT.0, UOP_DROPPING_EVENT.1));
        }
        specs
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |index: usize| value(values, index);
        let slots = get(SLOTS);
        let sum = get(RETIRING) + get(BAD_SPEC) + get(FE_BOUND) + get(BE_BOUND);
        let of_sum = |index: usize| ratio(get(index), sum);
        // Golden Cove subtracts the uops dropped by the frontend from the frontend buckets;
        // Lion Cove has no such term (TMA 5.2 note under §1.4).
        let dropping = match self.generation {
            Generation::GoldenCove => ratio(get(UOP_DROPPING), slots),
            Generation::LionCove => Some(0.0),
        };

        // §1.4, SPR/EMR/GNR column (P-json-x86 spr-metrics.json):
        // Frontend_Bound = fe/SUM - INT_MISC.UOP_DROPPING/SLOTS; Backend_Bound = be/SUM;
        // Retiring = ret/SUM.
        let frontend = difference(of_sum(FE_BOUND), dropping);
        let backend = of_sum(BE_BOUND);
        let retiring = of_sum(RETIRING);
        let level_one = LevelOne {
            retiring,
            bad_speculation: match self.generation {
                // Bad_Speculation = max(1 - (FE + BE + RET), 0): derived, as perf does.
                Generation::GoldenCove => bad_speculation_left_over(frontend, backend, retiring),
                // Lion Cove: Bad_Speculation = bad_spec/SUM directly (TMA 5.2, §1.4 notes).
                Generation::LionCove => of_sum(BAD_SPEC),
            },
            frontend_bound: frontend,
            backend_bound: backend,
        };
        // §1.4 level 2, SPR column; Lion Cove the same without the UOP_DROPPING term (the
        // reference gives no other difference for these eight).
        level_one.write_with_level_two(out, level, |level_one| {
            LevelTwo::with_siblings(
                level_one,
                floored_difference,
                // Fetch_Latency = fetch_lat/SUM - INT_MISC.UOP_DROPPING/SLOTS;
                // Fetch_Bandwidth = max(0, FE - Fetch_Latency)
                difference(of_sum(FETCH_LAT), dropping),
                // Branch_Mispredicts = br_mispredict/SUM;
                // Machine_Clears = max(0, BadSpec - Branch_Mispredicts)
                of_sum(BR_MISPREDICT),
                // Memory_Bound = mem_bound/SUM; Core_Bound = max(0, BE - Memory_Bound)
                of_sum(MEM_BOUND),
                // Heavy_Operations = heavy_ops/SUM; Light_Operations = max(0, RET - Heavy)
                of_sum(HEAVY_OPS),
            )
        });
    }

    super::weighed_by_slots_counter!(METRIC_EVENTS[SLOTS]);
}

#[cfg(test)]
mod tests {
    use crate::model::{CounterSource, CounterUse, base_model};

    #[test]
    fn every_topdown_event_is_on_the_fixed_counter() {
        let spr = base_model("intel-spr").unwrap();
        let counters = spr.counters();
        assert_eq!(counters.len(), 10);
        assert!(
            counters[..9]
                .iter()
                .all(|spec| spec.uses == CounterUse::Fixed)
        );
        assert_eq!(counters[9].uses, CounterUse::General);
        assert_eq!(
            counters[5].source,
            CounterSource::Perf {
                perf_type: 4,
                config: 0x8400
            }
        );
        assert_eq!(base_model("intel-lnc").unwrap().counters().len(), 9);
        assert!(base_model("intel-xyz").is_err());
    }

    #[test]
    fn clamps_bite_when_a_child_exceeds_its_parent() {
        // SUM = 1000: RET 0.1 but heavy 0.2 -> Light = max(0, -0.1) = 0.
        // slots, retiring, bad-spec, fe, be, heavy-ops, br-mispredict, fetch-lat, mem-bound,
        // UOP_DROPPING.
        let values = [1000, 100, 100, 300, 500, 200, 150, 400, 100, 0];
        let metrics = base_model("intel-spr").unwrap().metrics(&values, 2);
        assert_eq!(metrics["light_operations"], Some(0.0));
        // BadSpec = 1 - (0.3 + 0.5 + 0.1) = 0.1 (derived); BrMisp 0.15 > 0.1 -> clears 0.
        assert_eq!(metrics["machine_clears"], Some(0.0));
        // FetchLat 0.4 > FE 0.3 -> FetchBW 0.
        assert_eq!(metrics["fetch_bandwidth"], Some(0.0));
    }
}
