//! TopDown models: which counters a microarchitecture needs and how raw counter deltas become
//! level-1/level-2 fractions.
//!
//! A model is pure: it never touches the kernel. The counter layer (`crate::counters`) opens what
//! [`Model::counters`] lists, the BPF side attributes the deltas per counter slot, and the report
//! layer calls [`Model::metrics`] on whatever sums it has (a task, a process, a function, the
//! totals). `topdown report -i` rebuilds the model from its name alone, so a recording made on a
//! production host can be re-analysed elsewhere.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

pub mod intel_icl;
pub mod software;
pub mod synthetic;

/// Raw counter values by counter name (the Linux perf event name, e.g. `slots`).
pub type Counts = BTreeMap<String, u64>;

/// Metric name -> fraction in 0..1 (`None` where the model cannot compute it).
pub type Metrics = BTreeMap<String, Option<f64>>;

/// Level-1 TopDown metric names, in report order.
pub const L1_METRICS: [&str; 4] = [
    "retiring",
    "bad_speculation",
    "frontend_bound",
    "backend_bound",
];

/// Level-2 TopDown metric names, in report order (children of the L1 names above, in pairs).
pub const L2_METRICS: [&str; 8] = [
    "light_operations",
    "heavy_operations",
    "branch_mispredicts",
    "machine_clears",
    "fetch_latency",
    "fetch_bandwidth",
    "memory_bound",
    "core_bound",
];

/// Where a counter's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterSource {
    /// `perf_event_attr.type` and `.config` as given (hardware, raw or software PMU).
    Perf { perf_type: u32, config: u64 },
    /// A tracepoint counted per CPU (`PERF_TYPE_TRACEPOINT`); its id is looked up in tracefs
    /// when the counter is opened.
    Tracepoint { group: String, name: String },
}

/// One counter a model needs. The first counter of [`Model::counters`] is the group leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSpec {
    /// The Linux perf event name (`slots`, `topdown-retiring`, `INT_MISC.UOP_DROPPING`,
    /// `cpu-clock`): what the user sees and what `--synthetic` overrides name.
    pub name: String,
    pub source: CounterSource,
}

/// A TopDown model: a set of counters and the formulas over them.
pub trait Model: Send + Sync {
    /// The model's name as `--pmu` takes it (`intel-icl`, `software`, `synthetic:intel-icl`).
    fn name(&self) -> String;

    /// The underlying hardware model's name (`intel-icl` for `synthetic:intel-icl`); the name a
    /// recording stores so `report -i` can rebuild the formulas.
    fn base_name(&self) -> &'static str;

    /// One line for `topdown list` and report headers.
    fn description(&self) -> &'static str;

    /// Counters to open, leader first.
    fn counters(&self) -> Vec<CounterSpec>;

    /// Highest TopDown level this model computes (0: no TopDown at all, e.g. `software`).
    fn max_level(&self) -> u8;

    /// Metrics at `level` (1 or 2) from raw counts. Level 2 includes the level-1 metrics. Every
    /// name of [`L1_METRICS`] (and [`L2_METRICS`] at level 2) is present; `None` where this model
    /// cannot compute one or a denominator is zero.
    fn metrics(&self, counts: &Counts, level: u8) -> Metrics;

    /// The counter that measures "how much" (slots, or cpu-clock nanoseconds): reports sort by
    /// it and show each entity's share of it.
    fn weight_counter(&self) -> &'static str;

    /// True when the counters are syscall tracepoints standing in for hardware events.
    fn is_synthetic(&self) -> bool {
        false
    }

    /// For synthetic models: counter name -> `group:tracepoint` it is mapped to.
    fn synthetic_map(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// The hardware (or software) models known by name, for `--pmu` and `report -i`.
pub const MODEL_NAMES: [&str; 2] = ["software", "intel-icl"];

/// Builds a non-synthetic model by its `--pmu` name.
pub fn base_model(name: &str) -> Result<Box<dyn Model>> {
    match name {
        "software" => Ok(Box::new(software::Software)),
        "intel-icl" => Ok(Box::new(intel_icl::IntelIcl)),
        other => bail!(
            "unknown model '{other}': expected one of {} (or synthetic:<model>)",
            MODEL_NAMES.join(", ")
        ),
    }
}

/// Builds the model for a recorded or requested name, synthetic or not.
///
/// `synthetic_overrides` are the `--synthetic COUNTER=GROUP:TRACEPOINT` pairs; they are only
/// allowed with a `synthetic:` model.
pub fn model_by_name(
    name: &str,
    synthetic_overrides: &[(String, String)],
) -> Result<Box<dyn Model>> {
    if let Some(inner) = name.strip_prefix("synthetic:") {
        let inner = base_model(inner)?;
        return Ok(Box::new(synthetic::Synthetic::new(
            inner,
            synthetic_overrides,
        )?));
    }
    if !synthetic_overrides.is_empty() {
        bail!("--synthetic only applies to a synthetic model: use --pmu synthetic:{name}");
    }
    base_model(name)
}

/// `num / den`, or `None` when `den` is zero (perf's `d_ratio` gives 0 there; a report is
/// clearer with "no data").
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    if den == 0.0 { None } else { Some(num / den) }
}
