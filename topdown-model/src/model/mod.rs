//! TopDown models: which counters a microarchitecture needs and how raw counter deltas become
//! level-1/level-2 fractions.
//!
//! A model is pure: it never touches the kernel. The counter layer (topdown's `session::counters`)
//! opens what [`Model::counters`] lists, the BPF side attributes the deltas per counter slot, and
//! the report layer evaluates [`Model::metrics`] on whatever sums it has (a task, a process, a
//! function, the totals) through an [`Evaluator`], which resolves the model's counters to those
//! slots once per report. Formulas read their inputs by position in [`Model::counters`], never
//! by name. `topdown report -i` rebuilds the model from its name alone, so a recording made on
//! a production host can be re-analysed elsewhere.

use anyhow::{Result, bail};

pub use crate::named::{Name, NamedMap};

pub mod amd_zen;
pub mod arm_neoverse;
pub mod derived;
#[cfg(test)]
mod encodings;
pub mod evaluate;
#[cfg(test)]
mod golden;
pub mod hybrid;
pub mod intel_atom;
pub mod intel_core;
pub mod intel_icl;
pub mod intel_knl;
pub mod intel_spr;
pub mod software;
pub mod synthetic;
pub mod with_events;

pub use evaluate::{Evaluation, Evaluator, Scaled, evaluate};

/// Raw counter values by counter name (the Linux perf event name, e.g. `slots`).
pub type Counts = NamedMap<u64>;

/// Metric name -> fraction in 0..1 (`None` where the model cannot compute it).
pub type Metrics = NamedMap<Option<f64>>;

/// One level of the TopDown tree from the one list of its nodes: the const `$names`, their
/// metric names in report order, and the struct `$level` a model's evaluation fills by name,
/// whose `write` puts it at `$at` in [`standard_metric_names`]' order.
macro_rules! metric_level {
    ($(#[$names_meta:meta])* pub const $names:ident;
     $(#[$level_meta:meta])* pub struct $level:ident at $at:ident { $($node:ident,)* }) => {
        $(#[$names_meta])*
        pub const $names: [&str; [$(stringify!($node)),*].len()] = [$(stringify!($node)),*];

        $(#[$level_meta])*
        #[derive(Default)]
        pub struct $level {
            $(pub $node: Option<f64>,)*
        }

        impl $level {
            fn write(&self, out: &mut [Option<f64>]) {
                out[$at..$at + $names.len()].copy_from_slice(&[$(self.$node),*]);
            }
        }
    };
}

metric_level! {
    /// Level-1 TopDown metric names, in report order.
    pub const L1_METRICS;
    /// Level 1 of one evaluation, by name: [`LevelOne::write_with_level_two`] writes it in
    /// [`L1_METRICS`]' order for the models' `metrics_into`.
    pub struct LevelOne at LEVEL_ONE_AT {
        retiring,
        bad_speculation,
        frontend_bound,
        backend_bound,
    }
}

metric_level! {
    /// Level-2 TopDown metric names, in report order (children of the L1 names above, in pairs).
    pub const L2_METRICS;
    /// Level 2 of one evaluation, by name, written in [`L2_METRICS`]' order. A model without
    /// some of these nodes leaves them at the default, `None`.
    pub struct LevelTwo at LEVEL_TWO_AT {
        // One line per level-1 parent, in L1_METRICS' order.
        light_operations, heavy_operations,
        branch_mispredicts, machine_clears,
        fetch_latency, fetch_bandwidth,
        memory_bound, core_bound,
    }
}

/// Where a counter's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterSource {
    /// `perf_event_attr.type` and `.config` as given (hardware, raw or software PMU).
    Perf { perf_type: u32, config: u64 },
    /// A tracepoint counted per CPU (`PERF_TYPE_TRACEPOINT`); its id is looked up in tracefs
    /// when the counter is opened.
    Tracepoint { group: String, name: String },
    /// A user's `-e` event, with its own config words and privilege modifiers.
    Event(crate::events::attr::EventAttr),
}

/// Which hardware counter an event occupies, for the counter budget (`crate::schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterUse {
    /// A general-purpose (programmable) counter.
    General,
    /// A fixed counter or metric register the event always lands on (Intel `slots` and the
    /// `topdown-*` metric events on fixed counter 3, Arm's dedicated cycle counter, Intel's
    /// fixed CPU_CLK_UNHALTED.THREAD when the NMI watchdog does not hold it). Free of the
    /// general budget.
    Fixed,
    /// Not a hardware counter (software and tracepoint events).
    Software,
}

/// One counter a model needs. The first counter of group 0 in [`Model::counters`] is the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSpec {
    /// The Linux perf event name (`slots`, `topdown-retiring`, `INT_MISC.UOP_DROPPING`,
    /// `cpu-clock`): what the user sees and what `--synthetic` overrides name.
    pub name: String,
    pub source: CounterSource,
    /// Scheduling group. Groups 0-7 hold what level 1 needs (group 0 alone unless level 1 itself
    /// exceeds the PMU), groups 8-15 the level-2 extras (`crate::groups::LEVEL_TWO_GROUP`).
    /// The counter budget merges groups into one
    /// pinned group when everything fits, and otherwise lets them rotate and scales them by
    /// enabled/running time, marking what they feed as estimated. Events whose ratio a formula
    /// takes should share a group so that the ratio is exact even when rotating.
    pub group: u8,
    pub uses: CounterUse,
}

/// `PERF_TYPE_RAW`: a raw event of the CPU's core PMU (the `cpu` PMU on x86, the PMUv3 on
/// arm64); hybrid parts rewrite it to the `cpu_core`/`cpu_atom` PMU type when opening.
pub const PERF_TYPE_RAW: u32 = 4;

impl CounterSpec {
    /// A raw core-PMU event on a general-purpose counter, in group 0.
    pub fn raw(name: &str, config: u64) -> Self {
        Self {
            name: name.to_owned(),
            source: CounterSource::Perf {
                perf_type: PERF_TYPE_RAW,
                config,
            },
            group: 0,
            uses: CounterUse::General,
        }
    }

    /// The same event on a fixed counter (see [`CounterUse::Fixed`]).
    pub fn fixed(mut self) -> Self {
        self.uses = CounterUse::Fixed;
        self
    }

    /// The same event in scheduling group `group`.
    pub fn in_group(mut self, group: u8) -> Self {
        self.group = group;
        self
    }
}

/// A TopDown model: a set of counters and the formulas over them.
pub trait Model: Send + Sync {
    /// The model's name as `--pmu` takes it (`intel-icl`, `software`, `synthetic:intel-icl`);
    /// by default its [`Model::base_name`], for models that take no parameters.
    fn name(&self) -> String {
        self.base_name().to_owned()
    }

    /// The underlying hardware model's name (`intel-icl` for `synthetic:intel-icl`); the name a
    /// recording stores so `report -i` can rebuild the formulas.
    fn base_name(&self) -> &'static str;

    /// The name a recording stores so `report -i` can rebuild the formulas: the model's own
    /// name with any `synthetic:` taken off (parameters such as a hybrid pairing or an Arm
    /// `@slots=N` stay in it).
    fn recorded_name(&self) -> String {
        self.name()
    }

    /// One line for `topdown list` and report headers.
    fn description(&self) -> &'static str;

    /// Counters to open, leader first.
    fn counters(&self) -> Vec<CounterSpec>;

    /// Highest TopDown level this model computes (0: no TopDown at all, e.g. `software`).
    fn max_level(&self) -> u8;

    /// Metrics at `level` (1 or 2) from `values`, one per counter of [`Model::counters`] in that
    /// order (a counter past the end of `values` reads as 0; [`Evaluator`] decides what a missing
    /// counter makes unknown). Level 2 includes the level-1 metrics. Every name of
    /// [`L1_METRICS`] (and [`L2_METRICS`] at level 2) is present; `None` where this model cannot
    /// compute one or a denominator is zero.
    ///
    /// The default names what [`Model::metrics_into`] writes ([`metrics_by_name`]). A model
    /// whose metrics are a map of its own (the hybrid model's per-core-type names) overrides
    /// it, and then gives [`Model::metric_names`] and [`Model::metrics_into`] from that map
    /// ([`metric_names_of_map`], [`metrics_into_from_map`]).
    fn metrics(&self, values: &[u64], level: u8) -> Metrics {
        metrics_by_name(self, values, level)
    }

    /// The names of the metrics at `level`, in the order [`Model::metrics_into`] writes them.
    /// Callers resolve the names they want to positions once (per report, per exporter
    /// refresh), then read each entity's metrics by position.
    ///
    /// The default: [`L1_METRICS`], this model's [`Model::extra_l1_metrics`] and, at level 2,
    /// [`L2_METRICS`] ([`standard_metric_names`]).
    fn metric_names(&self, level: u8) -> Vec<String> {
        standard_metric_names(level, self.extra_l1_metrics())
    }

    /// The typed evaluation: the metrics of [`Model::metrics`], written into `out` by position
    /// in [`Model::metric_names`] (`out` is that long). It runs once per entity of a refresh
    /// (100,000 tasks, 12,500 processes), so models implement it without allocating.
    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]);

    /// The counter that measures "how much" (slots, or cpu-clock nanoseconds): reports sort by
    /// it and show each entity's share of it.
    fn weight_counter(&self) -> &'static str;

    /// Level-1 buckets beyond the four of [`L1_METRICS`] that this model reports (AMD's
    /// `smt_contention`); they appear in `metrics` at every level and in every report.
    fn extra_l1_metrics(&self) -> &'static [&'static str] {
        &[]
    }

    /// Pipeline slots `values` (as for [`Model::metrics`]) cover, for weighing this model
    /// against another (a hybrid part's two core types): the `slots` count, or cycles times the
    /// width for cycle-weighted models; `None` where there is no such notion.
    fn slots(&self, values: &[u64]) -> Option<f64>;

    /// True when the counters are syscall tracepoints standing in for hardware events.
    fn is_synthetic(&self) -> bool {
        false
    }

    /// For synthetic models: counter name -> `group:tracepoint` it is mapped to.
    fn synthetic_map(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// The [`Model`] methods of a wrapper that changes which counters are opened but not the
/// formulas over them (`synthetic:`, a model with `-e` events): each is its `self.inner`'s. The
/// wrapper's values begin with the inner model's own counters (the same counters counted
/// otherwise, or the events after them), so the formulas read them unchanged.
macro_rules! formulas_of_inner {
    () => {
        fn base_name(&self) -> &'static str {
            self.inner.base_name()
        }

        fn recorded_name(&self) -> String {
            self.inner.recorded_name()
        }

        fn max_level(&self) -> u8 {
            self.inner.max_level()
        }

        fn metrics(&self, values: &[u64], level: u8) -> $crate::model::Metrics {
            self.inner.metrics(values, level)
        }

        fn metric_names(&self, level: u8) -> Vec<String> {
            self.inner.metric_names(level)
        }

        fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
            self.inner.metrics_into(values, level, out)
        }

        fn weight_counter(&self) -> &'static str {
            self.inner.weight_counter()
        }

        fn extra_l1_metrics(&self) -> &'static [&'static str] {
            self.inner.extra_l1_metrics()
        }

        fn slots(&self, values: &[u64]) -> Option<f64> {
            self.inner.slots(values)
        }
    };
}
use formulas_of_inner;

/// [`Model::metric_names`] and [`Model::metrics_into`] of a model whose [`Model::metrics`]
/// builds its own map ([`metric_names_of_map`], [`metrics_into_from_map`]).
macro_rules! typed_metrics_from_map {
    () => {
        fn metric_names(&self, level: u8) -> Vec<String> {
            $crate::model::metric_names_of_map(self, level)
        }

        fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
            $crate::model::metrics_into_from_map(self, values, level, out)
        }
    };
}
use typed_metrics_from_map;

/// [`Model::base_name`] and [`Model::description`] from one place: `"name", "description"` for
/// a model with one variant, or `self => expression` giving the `(name, description)` pair of
/// `self`'s variant, so that each variant's name and `topdown list` line stand together.
macro_rules! name_and_description {
    ($name:literal, $description:literal) => {
        fn base_name(&self) -> &'static str {
            $name
        }

        fn description(&self) -> &'static str {
            $description
        }
    };
    ($self:ident => $name_and_description:expr) => {
        fn base_name(&$self) -> &'static str {
            $name_and_description.0
        }

        fn description(&$self) -> &'static str {
            $name_and_description.1
        }
    };
}
pub(crate) use name_and_description;

/// [`Model::weight_counter`] and [`Model::slots`] of a model whose counter `$events[$slots]`
/// (of its `(name, config)` table) counts the pipeline slots themselves: the PERF_METRICS
/// models' `slots` leader.
macro_rules! weighed_by_slots_counter {
    ($events:ident[$slots:ident]) => {
        fn weight_counter(&self) -> &'static str {
            $events[$slots].0
        }

        fn slots(&self, values: &[u64]) -> Option<f64> {
            Some($crate::model::value(values, $slots))
        }
    };
}
use weighed_by_slots_counter;

/// A module `$module` of a model's input ids: `usize` consts numbered 0, 1, 2, ... in the order
/// given, and `COUNT`, how many there are. Ids for [`Positions`] and for positions in a counter
/// list, numbered by the compiler rather than by hand. An input given as `NAME = "EVENT.NAME"`
/// also gets a `&str` const `NAME` beside the module: the perf event name it is opened by, so
/// that each input's id and event name are listed once (with the doc comments given for it).
macro_rules! input_ids {
    ($(#[$module_meta:meta])* mod $module:ident {
        $($(#[$meta:meta])* $name:ident $(= $event:literal)?,)*
    }) => {
        $($crate::model::input_ids!(@event_name [$(#[$meta])*] $name $($event)?);)*
        $(#[$module_meta])*
        mod $module {
            #[allow(clippy::upper_case_acronyms, non_camel_case_types)]
            enum Id {
                $($name,)*
            }
            $($(#[$meta])* pub const $name: usize = Id::$name as usize;)*
            // Only models whose variants count different inputs size a `Positions` with it.
            #[allow(dead_code)]
            pub const COUNT: usize = [$(stringify!($name),)*].len();
        }
    };
    (@event_name [$($meta:tt)*] $name:ident $event:literal) => {
        $($meta)*
        const $name: &str = $event;
    };
    (@event_name [$($meta:tt)*] $name:ident) => {};
}
use input_ids;

/// Every non-synthetic model, in `topdown list` order: software, then Intel, AMD, Arm.
pub fn all_models() -> Vec<Box<dyn Model>> {
    let mut models: Vec<Box<dyn Model>> = vec![Box::new(software::Software)];
    models.extend(intel_core::models());
    models.extend(intel_icl::models());
    models.extend(intel_spr::models());
    models.extend(intel_atom::models());
    models.extend(intel_knl::models());
    models.extend(amd_zen::models());
    models.extend(arm_neoverse::models());
    models
}

/// The names `--pmu` and `report -i` accept (besides `synthetic:<name>` and `auto`).
pub fn model_names() -> Vec<String> {
    all_models().iter().map(|model| model.name()).collect()
}

/// Builds a non-synthetic model by its `--pmu` name.
pub fn base_model(name: &str) -> Result<Box<dyn Model>> {
    if let Some((core, atom)) = hybrid::parse_name(name) {
        return Ok(Box::new(hybrid::Hybrid::new(
            base_model(core)?,
            base_model(atom)?,
        )));
    }
    if name.starts_with("hybrid:") {
        bail!(
            "bad hybrid model '{name}': expected hybrid:<P-core model>+<E-core model>, e.g. hybrid:intel-spr+intel-grt"
        );
    }
    // Arm's names also take a PMU's own slots per cycle (`@slots=N`), which no listed model has.
    let found = all_models()
        .into_iter()
        .find(|model| model.name() == name)
        .or_else(|| arm_neoverse::by_name(name));
    match found {
        Some(model) => Ok(model),
        None => bail!(
            "unknown model '{name}': expected one of {} (or synthetic:<model>; `topdown list` shows them)",
            model_names().join(", ")
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

/// The metric order of the models with a typed evaluation: [`L1_METRICS`], then at level 2
/// [`L2_METRICS`], then `extra` (buckets such as AMD's `smt_contention`, at every level).
pub fn standard_metric_names(level: u8, extra: &[&str]) -> Vec<String> {
    let level_two: &[&str] = if level >= 2 { &L2_METRICS } else { &[] };
    L1_METRICS
        .iter()
        .chain(level_two)
        .chain(extra)
        .map(|name| (*name).to_owned())
        .collect()
}

/// Where the level-1 metrics start in [`standard_metric_names`]' order; the level-2 ones start
/// at [`LEVEL_TWO_AT`] and the extras after those at level 2, at [`L1_METRICS`]' end at level 1.
pub const LEVEL_ONE_AT: usize = 0;
pub const LEVEL_TWO_AT: usize = L1_METRICS.len();

impl LevelOne {
    /// Writes this level 1 into `out` and, at `level` 2, the level 2 that `level_two` computes
    /// from it: the level test of every model's [`Model::metrics_into`], so that level 2 is only
    /// computed when it is asked for.
    pub fn write_with_level_two(
        &self,
        out: &mut [Option<f64>],
        level: u8,
        level_two: impl FnOnce(&LevelOne) -> LevelTwo,
    ) {
        self.write(out);
        if level >= 2 {
            level_two(self).write(out);
        }
    }
}

impl LevelTwo {
    /// Level 2 where the formulas give one child of each level-1 node and derive its sibling
    /// as what the parent leaves over it: `remainder(parent, child)`, [`floored_difference`]
    /// where perf clamps at zero (icl- and spr-metrics.json: tma_fetch_bandwidth =
    /// `max(0, tma_frontend_bound - tma_fetch_latency)`, likewise tma_machine_clears,
    /// tma_core_bound and tma_light_operations), [`difference`] where TMA does not (§2.2
    /// SNB-SKL: Fetch_Bandwidth = FE - Fetch_Latency, likewise Machine_Clears, Core_Bound and
    /// Light_Operations).
    pub fn with_siblings(
        parents: &LevelOne,
        remainder: fn(Option<f64>, Option<f64>) -> Option<f64>,
        fetch_latency: Option<f64>,
        branch_mispredicts: Option<f64>,
        memory_bound: Option<f64>,
        heavy_operations: Option<f64>,
    ) -> Self {
        Self {
            light_operations: remainder(parents.retiring, heavy_operations),
            heavy_operations,
            branch_mispredicts,
            machine_clears: remainder(parents.bad_speculation, branch_mispredicts),
            fetch_latency,
            fetch_bandwidth: remainder(parents.frontend_bound, fetch_latency),
            memory_bound,
            core_bound: remainder(parents.backend_bound, memory_bound),
        }
    }
}

/// Where a model's [`standard_metric_names`] extras start at `level`.
pub fn extras_at(level: u8) -> usize {
    if level >= 2 {
        LEVEL_TWO_AT + L2_METRICS.len()
    } else {
        LEVEL_TWO_AT
    }
}

/// [`Model::metrics`] of a model with a typed evaluation: its [`Model::metrics_into`] named by
/// its [`Model::metric_names`].
pub fn metrics_by_name(model: &(impl Model + ?Sized), values: &[u64], level: u8) -> Metrics {
    let names = model.metric_names(level);
    let mut out = vec![None; names.len()];
    model.metrics_into(values, level, &mut out);
    names.into_iter().zip(out).collect()
}

/// [`Model::metric_names`] of a model whose [`Model::metrics`] builds its own map: the map's
/// keys, taken on zeroes (they name the same metrics whatever the values).
pub fn metric_names_of_map(model: &(impl Model + ?Sized), level: u8) -> Vec<String> {
    let zeroes = vec![0; model.counters().len()];
    model
        .metrics(&zeroes, level)
        .into_keys()
        .map(String::from)
        .collect()
}

/// [`Model::metrics_into`] of a model whose [`Model::metrics`] builds its own map: the map's
/// values, which come in key order, the order of [`metric_names_of_map`].
pub fn metrics_into_from_map(
    model: &(impl Model + ?Sized),
    values: &[u64],
    level: u8,
    out: &mut [Option<f64>],
) {
    for (slot, value) in out
        .iter_mut()
        .zip(model.metrics(values, level).into_values())
    {
        *slot = value;
    }
}

/// The value at `index` of a model's counter values (see [`Model::metrics`]) as a float; 0 past
/// the end, so a model variant without that counter reads nothing.
pub fn value(values: &[u64], index: usize) -> f64 {
    values.get(index).copied().unwrap_or(0) as f64
}

/// Where each input of a model sits in its [`Model::counters`] list, for models whose variants
/// list different counters (an input id is a file's own `const`, 0..N). Built once with the
/// model, so formulas index values instead of matching names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Positions<const N: usize>([usize; N]);

impl<const N: usize> Positions<N> {
    /// `inputs[k]` is the input id of counter `k`; inputs that no counter has read as 0.
    pub fn new(inputs: impl IntoIterator<Item = usize>) -> Self {
        let mut positions = [usize::MAX; N];
        for (position, input) in inputs.into_iter().enumerate() {
            positions[input] = position;
        }
        Self(positions)
    }

    /// The value of `input` among `values` (see [`Model::metrics`]); 0 where this variant has no
    /// counter for it.
    pub fn read(&self, values: &[u64], input: usize) -> f64 {
        value(values, self.0[input])
    }

    /// The position of `input`, if this variant counts it.
    pub fn of(&self, input: usize) -> Option<usize> {
        (self.0[input] != usize::MAX).then_some(self.0[input])
    }
}

/// `counts` by name in `model`'s counter order (0 where absent), for tests that state their
/// inputs by name.
#[cfg(test)]
pub(crate) fn values_of(model: &dyn Model, counts: &[(&str, u64)]) -> Vec<u64> {
    model
        .counters()
        .iter()
        .map(|spec| {
            counts
                .iter()
                .find(|(name, _)| *name == spec.name)
                .map_or(0, |(_, value)| *value)
        })
        .collect()
}

/// `a - b`: a child TMA derives as what its parent leaves over its sibling, unclamped (§2.2
/// SNB-SKL: Fetch_Bandwidth = FE - Fetch_Latency); `None` if either is unknown.
pub fn difference(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b).map(|(a, b)| a - b)
}

/// `max(0, a - b)`: a child perf derives as what its parent leaves over its sibling,
/// clamped at zero as perf's metrics do (e.g. icl-metrics.json tma_fetch_bandwidth:
/// `max(0, tma_frontend_bound - tma_fetch_latency)`); `None` if either is unknown.
pub fn floored_difference(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b).map(|(a, b)| (a - b).max(0.0))
}

/// Bad Speculation where perf derives it from the other three level-1 metrics (icl- and
/// spr-metrics.json tma_bad_speculation: `max(1 - (tma_frontend_bound + tma_backend_bound +
/// tma_retiring), 0)`); `None` if any of them is unknown.
pub fn bad_speculation_left_over(
    frontend: Option<f64>,
    backend: Option<f64>,
    retiring: Option<f64>,
) -> Option<f64> {
    let (frontend, backend, retiring) = (frontend?, backend?, retiring?);
    Some((1.0 - (frontend + backend + retiring)).max(0.0))
}

/// `num / den`, or `None` when `den` is zero (perf's `d_ratio` gives 0 there; a report is
/// clearer with "no data").
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    if den == 0.0 { None } else { Some(num / den) }
}

#[cfg(test)]
mod tests {
    use super::{all_models, base_model};

    #[test]
    fn no_counts_mean_no_data_in_every_model() {
        let mut models = all_models();
        models.push(base_model("hybrid:intel-spr+intel-grt").expect("hybrid pairing"));
        for model in models {
            for values in [&[][..], &vec![0; model.counters().len()][..]] {
                let metrics = model.metrics(values, 2);
                assert!(metrics.values().all(Option::is_none), "{}", model.name());
            }
        }
    }
}
