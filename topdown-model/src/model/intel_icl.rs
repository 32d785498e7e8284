//! `intel-icl`: Ice Lake / Tiger Lake / Rocket Lake / Ice Lake-SP with PERF_METRICS.
//!
//! Counters: the `slots` leader (fixed counter 3) and the four level-1 metric pseudo-events,
//! which the kernel reports as slot-scaled counts (topdown-formulas.md §1.2), plus the two
//! generic events perf's current L1 formulas use. These parts have no L2 metric bytes; their L2
//! needs ~15 generic events that do not fit one group, so this model is level 1 only.

use super::{CounterSpec, L1_METRICS, L2_METRICS, Metrics, Model, ratio, value};

/// (name, raw config) in group order; encodings from topdown-formulas.md §1.1 and §1.5.
const COUNTERS: [(&str, u64); 7] = [
    ("slots", 0x0400),
    ("topdown-retiring", 0x8000),
    ("topdown-bad-spec", 0x8100),
    ("topdown-fe-bound", 0x8200),
    ("topdown-be-bound", 0x8300),
    ("INT_MISC.UOP_DROPPING", 0x100d),
    ("INT_MISC.CLEARS_COUNT", 0x0104_010d),
];

// Positions in `COUNTERS`: what the formulas read.
const SLOTS: usize = 0;
const RETIRING: usize = 1;
const BAD_SPEC: usize = 2;
const FE_BOUND: usize = 3;
const BE_BOUND: usize = 4;
const UOP_DROPPING: usize = 5;
const CLEARS_COUNT: usize = 6;

pub struct IntelIcl;

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    vec![Box::new(IntelIcl)]
}

/// The model named `name` (as [`Model::name`] returns it), if this file has it.
pub fn by_name(name: &str) -> Option<Box<dyn Model>> {
    models().into_iter().find(|model| model.name() == name)
}

impl Model for IntelIcl {
    fn name(&self) -> String {
        "intel-icl".to_owned()
    }

    fn base_name(&self) -> &'static str {
        "intel-icl"
    }

    fn description(&self) -> &'static str {
        "Intel Ice Lake/Tiger Lake/Rocket Lake/Ice Lake-SP perf metrics, TopDown level 1"
    }

    fn counters(&self) -> Vec<CounterSpec> {
        COUNTERS
            .iter()
            .enumerate()
            .map(|(index, (name, config))| {
                let spec = CounterSpec::raw(name, *config);
                // slots and the four metric events live on fixed counter 3 and PERF_METRICS.
                if index < 5 { spec.fixed() } else { spec }
            })
            .collect()
    }

    fn max_level(&self) -> u8 {
        1
    }

    fn metrics(&self, values: &[u64], level: u8) -> Metrics {
        let get = |index: usize| value(values, index);
        let slots = get(SLOTS);
        let retiring_slots = get(RETIRING);
        let frontend_slots = get(FE_BOUND);
        let backend_slots = get(BE_BOUND);
        // The four metric counts are each floored by the kernel, so they sum to <= slots;
        // perf divides by their sum (topdown-formulas.md §1.2 conclusion, §1.4 "SUM").
        let sum = retiring_slots + get(BAD_SPEC) + frontend_slots + backend_slots;

        // topdown-formulas.md §1.4, ICL/ICX/TGL/RKL column (P-json-x86 icl-metrics.json):
        // Frontend_Bound = fe/SUM - INT_MISC.UOP_DROPPING/SLOTS
        let frontend = ratio(frontend_slots, sum)
            .zip(ratio(get(UOP_DROPPING), slots))
            .map(|(fe, dropping)| fe - dropping);
        // Backend_Bound = be/SUM + 5 * INT_MISC.CLEARS_COUNT/SLOTS
        let backend = ratio(backend_slots, sum)
            .zip(ratio(get(CLEARS_COUNT), slots))
            .map(|(be, clears)| be + 5.0 * clears);
        // Retiring = ret/SUM
        let retiring = ratio(retiring_slots, sum);
        // Bad_Speculation = max(1 - (FE + BE + RET), 0): derived; the raw topdown-bad-spec
        // only enters through SUM, as in perf.
        let bad_speculation = match (frontend, backend, retiring) {
            (Some(fe), Some(be), Some(ret)) => Some((1.0 - (fe + be + ret)).max(0.0)),
            _ => None,
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
        if level >= 2 {
            metrics.extend(L2_METRICS.iter().map(|name| ((*name).to_owned(), None)));
        }
        metrics
    }

    fn weight_counter(&self) -> &'static str {
        COUNTERS[SLOTS].0
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(value(values, SLOTS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CounterSource;

    fn close(value: Option<f64>, expected: f64) -> bool {
        value.is_some_and(|value| (value - expected).abs() < 1e-12)
    }

    #[test]
    fn level_one_as_perf_computes_it() {
        // SUM = 400+100+200+300 = 1000. FE = 200/1000 - 50/1000 = 0.15;
        // BE = 300/1000 + 5*10/1000 = 0.35; RET = 0.4; BadSpec = 1 - 0.9 = 0.1.
        let metrics = IntelIcl.metrics(&[1000, 400, 100, 200, 300, 50, 10], 1);
        assert!(close(metrics["frontend_bound"], 0.15));
        assert!(close(metrics["backend_bound"], 0.35));
        assert!(close(metrics["retiring"], 0.4));
        assert!(close(metrics["bad_speculation"], 0.1));
        assert_eq!(metrics.len(), 4);
    }

    #[test]
    fn bad_speculation_is_clamped_at_zero() {
        // SUM = 2000 (slots 1000 is smaller only in this constructed case). FE = 0.25 - 0;
        // BE = 0.5 + 5*200/1000 = 1.5; RET = 0.25: 1 - 2.0 < 0 -> 0.
        let metrics = IntelIcl.metrics(&[1000, 500, 0, 500, 1000, 0, 200], 1);
        assert!(close(metrics["backend_bound"], 1.5));
        assert_eq!(metrics["bad_speculation"], Some(0.0));
    }

    #[test]
    fn no_counts_means_no_metrics_and_level_two_is_null() {
        let metrics = IntelIcl.metrics(&[0; 7], 2);
        assert!(metrics.values().all(Option::is_none));
        for name in L1_METRICS.iter().chain(L2_METRICS.iter()) {
            assert!(metrics.contains_key(*name), "{name}");
        }
    }

    #[test]
    fn counters_put_slots_first() {
        let counters = IntelIcl.counters();
        assert_eq!(counters[0].name, "slots");
        assert_eq!(
            counters[0].source,
            CounterSource::Perf {
                perf_type: 4,
                config: 0x0400
            }
        );
        assert_eq!(counters.len(), 7);
    }
}
