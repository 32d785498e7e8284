//! `software`: on-CPU time from the `cpu-clock` software event. No TopDown: the fallback when no
//! TopDown PMU exists (a VM without a virtual PMU), announced by the caller.

use super::{CounterSource, CounterSpec, CounterUse, Model, value};

/// `PERF_COUNT_SW_CPU_CLOCK` (include/uapi/linux/perf_event.h).
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// `PERF_TYPE_SOFTWARE`.
const PERF_TYPE_SOFTWARE: u32 = 1;
/// Position of `cpu-clock`, the one counter.
const CPU_CLOCK: usize = 0;

pub struct Software;

impl Model for Software {
    super::name_and_description!(
        "software",
        "on-CPU time (cpu-clock, ns); no TopDown breakdown"
    );

    fn counters(&self) -> Vec<CounterSpec> {
        vec![CounterSpec {
            name: "cpu-clock".to_owned(),
            source: CounterSource::Perf {
                perf_type: PERF_TYPE_SOFTWARE,
                config: PERF_COUNT_SW_CPU_CLOCK,
            },
            group: 0,
            uses: CounterUse::Software,
        }]
    }

    fn max_level(&self) -> u8 {
        0
    }

    /// No TopDown: every metric unknown.
    fn metrics_into(&self, _values: &[u64], _level: u8, out: &mut [Option<f64>]) {
        out.fill(None);
    }

    fn weight_counter(&self) -> &'static str {
        "cpu-clock"
    }

    /// cpu-clock nanoseconds stand in for slots: the only measure of how much ran.
    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(value(values, CPU_CLOCK))
    }
}
