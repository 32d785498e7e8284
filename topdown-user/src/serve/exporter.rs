//! The exporter's series: TopDown slots per category per cgroup, process and function,
//! accumulated from each refresh's deltas so every `_total` stays monotonic, bounded in number,
//! and expired when their entity stops counting.

use std::{
    collections::{BTreeMap, HashMap},
    sync::LazyLock,
    time::{Duration, Instant},
};

use prometheus::{
    TextEncoder,
    core::{Collector, Desc},
    proto::{self, LabelPair, MetricFamily, MetricType},
};

use crate::{
    aggregate::{Aggregate, Naming, ProcessCounts, SlotCounts},
    cgroup::container::describe,
    model::{L1_METRICS, L2_METRICS},
};

/// A series' identifying labels: `(name, value)` in `FamilyKind::labels` order.
type Labels = Vec<(String, String)>;

/// The value of identifying labels of the series that absorbs everything beyond `--max-series`.
pub const OTHER: &str = "other";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FamilyKind {
    Cgroup,
    Process,
    FunctionInclusive,
    FunctionExclusive,
}

impl FamilyKind {
    /// Slots per category: the identifying labels, then `category` and `model`.
    fn slots(self) -> Spec {
        match self {
            FamilyKind::Cgroup => spec(
                "topdown_cgroup_slots_total",
                "Pipeline slots per TopDown category, per cgroup v2",
                MetricType::COUNTER,
                &[
                    "cgroup",
                    "container",
                    "pod_uid",
                    "unit",
                    "category",
                    "model",
                ],
            ),
            FamilyKind::Process => spec(
                "topdown_process_slots_total",
                "Pipeline slots per TopDown category, per process name",
                MetricType::COUNTER,
                &["comm", "category", "model"],
            ),
            FamilyKind::FunctionInclusive => spec(
                "topdown_function_inclusive_slots_total",
                "Pipeline slots per TopDown category inside probed functions, callees included",
                MetricType::COUNTER,
                &["function", "target", "category", "model"],
            ),
            FamilyKind::FunctionExclusive => spec(
                "topdown_function_exclusive_slots_total",
                "Pipeline slots per TopDown category inside probed functions, probed callees excluded",
                MetricType::COUNTER,
                &["function", "target", "category", "model"],
            ),
        }
    }

    /// Counts of the `-e` events for the same entities: the identifying labels, then `event`.
    fn events(self) -> Spec {
        match self {
            FamilyKind::Cgroup => spec(
                "topdown_cgroup_events_total",
                "Counts of the -e events, per cgroup v2",
                MetricType::COUNTER,
                &["cgroup", "container", "pod_uid", "unit", "event"],
            ),
            FamilyKind::Process => spec(
                "topdown_process_events_total",
                "Counts of the -e events, per process name",
                MetricType::COUNTER,
                &["comm", "event"],
            ),
            FamilyKind::FunctionInclusive => spec(
                "topdown_function_inclusive_events_total",
                "Counts of the -e events inside probed functions, callees included",
                MetricType::COUNTER,
                &["function", "target", "event"],
            ),
            FamilyKind::FunctionExclusive => spec(
                "topdown_function_exclusive_events_total",
                "Counts of the -e events inside probed functions, probed callees excluded",
                MetricType::COUNTER,
                &["function", "target", "event"],
            ),
        }
    }
}

/// One entity's accumulated values.
struct Series {
    /// category -> accumulated slots (`total` is all of them).
    values: BTreeMap<String, f64>,
    /// `-e` event -> accumulated count.
    events: BTreeMap<String, u64>,
    calls: u64,
    last_change: Instant,
}

/// Exporter limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_series: usize,
    pub ttl: Duration,
}

pub struct Exporter {
    model: String,
    synthetic: bool,
    limits: Limits,
    series: HashMap<(FamilyKind, Labels), Series>,
    overflowed: u64,
    expired: u64,
    refreshes: u64,
    last_refresh_seconds: f64,
    /// The BPF side's diagnostics, cumulative.
    diagnostics: BTreeMap<&'static str, u64>,
    /// topdown's own BPF run time as a percentage of all CPUs, when measured.
    pub overhead_percent: Option<f64>,
    /// Function probes the overhead guard detached: `(function, target)`.
    pub detached_functions: Vec<(String, String)>,
    /// Times the function probes were re-attached (replaced binaries, SIGHUP, the guard).
    pub reattachments: u64,
    /// Entries in the BPF task and cgroup maps at the last refresh.
    pub map_entries: [(&'static str, usize); 2],
    /// `--config` reloads on SIGHUP, by outcome.
    pub config_reloads: Reloads,
}

/// Configuration reloads by outcome.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reloads {
    pub applied: u64,
    pub failed: u64,
}

impl Exporter {
    pub fn new(model: String, synthetic: bool, limits: Limits) -> Self {
        Self {
            model,
            synthetic,
            limits,
            series: HashMap::new(),
            overflowed: 0,
            expired: 0,
            refreshes: 0,
            last_refresh_seconds: 0.0,
            diagnostics: BTreeMap::new(),
            overhead_percent: None,
            detached_functions: Vec::new(),
            reattachments: 0,
            map_entries: [("tasks", 0), ("cgroups", 0)],
            config_reloads: Reloads::default(),
        }
    }

    /// New limits from a configuration reload; they apply from the next refresh.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Adds one refresh interval's report (deltas since the previous refresh).
    /// Records how long the last refresh took (exported as a gauge).
    pub fn set_refresh_duration(&mut self, took: Duration) {
        self.last_refresh_seconds = took.as_secs_f64();
    }

    /// Adds one refresh's counts (what was counted since the last refresh) to the series. The
    /// counts stay typed until here: metrics are evaluated on slot arrays, and functions are
    /// summed by id and named only for their labels.
    pub fn update(&mut self, counts: &Aggregate, naming: &Naming<'_>, now: Instant) {
        let level = naming.level;
        let weight = naming.weight_slot();
        let categories: Vec<&str> = match level {
            0 => Vec::new(),
            1 => L1_METRICS.to_vec(),
            _ => L1_METRICS
                .iter()
                .chain(L2_METRICS.iter())
                .copied()
                .collect(),
        };
        // Level-1 buckets some models add (AMD's smt_contention); not the hybrid per-core-type
        // `cpu_core.*` names.
        let extra: Vec<String> = naming
            .evaluator
            .evaluate(&counts.totals.0, level)
            .metrics
            .into_keys()
            .filter(|name| {
                !name.contains('.')
                    && !L1_METRICS.contains(&name.as_str())
                    && !L2_METRICS.contains(&name.as_str())
            })
            .collect();
        let category_slots = |slots: &SlotCounts| -> Vec<(String, f64)> {
            let total = slots.get(weight) as f64;
            let metrics = naming.evaluator.evaluate(&slots.0, level).metrics;
            let mut values = vec![("total".to_owned(), total)];
            for name in categories
                .iter()
                .map(|name| name.to_string())
                .chain(extra.iter().cloned())
            {
                if let Some(Some(fraction)) = metrics.get(&name) {
                    // A refresh's fraction can dip below 0 by the formulas' own rounding
                    // (e.g. Intel's dropped-uop correction); a counter never goes down.
                    values.push((name, (total * fraction).max(0.0)));
                }
            }
            values
        };
        let event_counts = |slots: &SlotCounts| -> Vec<(String, u64)> {
            naming
                .events
                .iter()
                .map(|(event, slot)| (event.clone(), slots.get(*slot)))
                .collect()
        };
        // Heaviest first in every family: with --max-series they keep their own series and the
        // rest fold into `other`.
        let mut cgroups = counts.cgroup_rows(naming.cgroup_paths, naming.cgroup_depth);
        cgroups.sort_by(|(_, a_path, a), (_, b_path, b)| {
            b.get(weight).cmp(&a.get(weight)).then(a_path.cmp(b_path))
        });
        for (id, path, slots) in &cgroups {
            let container = path
                .as_deref()
                .map(describe)
                .filter(|info| !info.is_empty());
            let container = container.as_ref();
            let labels: Labels = vec![
                (
                    "cgroup".to_owned(),
                    path.clone().unwrap_or_else(|| format!("id:{id}")),
                ),
                (
                    "container".to_owned(),
                    container.and_then(|c| c.id.clone()).unwrap_or_default(),
                ),
                (
                    "pod_uid".to_owned(),
                    container
                        .and_then(|c| c.pod_uid.clone())
                        .unwrap_or_default(),
                ),
                (
                    "unit".to_owned(),
                    container.and_then(|c| c.unit.clone()).unwrap_or_default(),
                ),
            ];
            self.add(
                FamilyKind::Cgroup,
                labels,
                category_slots(slots),
                event_counts(slots),
                0,
                now,
            );
        }
        let mut processes: Vec<&ProcessCounts> = counts.processes.iter().collect();
        processes.sort_by(|a, b| {
            b.counts
                .get(weight)
                .cmp(&a.counts.get(weight))
                .then(a.pid.cmp(&b.pid))
        });
        for process in processes {
            let labels = vec![("comm".to_owned(), process.comm.clone())];
            self.add(
                FamilyKind::Process,
                labels,
                category_slots(&process.counts),
                event_counts(&process.counts),
                0,
                now,
            );
        }
        let mut functions: Vec<_> = counts
            .function_totals()
            .into_iter()
            .map(|((id, _), total)| (naming.function(id), total))
            .collect();
        functions.sort_by(|((_, a_symbol), a), ((_, b_symbol), b)| {
            b.inclusive
                .get(weight)
                .cmp(&a.inclusive.get(weight))
                .then(a_symbol.cmp(b_symbol))
        });
        for ((target, symbol), total) in functions {
            let labels = vec![
                ("function".to_owned(), symbol),
                ("target".to_owned(), target),
            ];
            self.add(
                FamilyKind::FunctionInclusive,
                labels.clone(),
                category_slots(&total.inclusive),
                event_counts(&total.inclusive),
                total.calls,
                now,
            );
            self.add(
                FamilyKind::FunctionExclusive,
                labels,
                category_slots(&total.exclusive),
                event_counts(&total.exclusive),
                0,
                now,
            );
        }
        let d = &counts.diagnostics;
        for (name, value) in [
            ("readings", d.readings),
            ("read_errors", d.read_errors),
            ("not_running_readings", d.not_running_readings),
            ("task_map_full", d.task_map_full),
            ("cgroup_map_full", d.cgroup_map_full),
            ("probe_map_full", d.probe_map_full),
            ("missed_returns", d.missed_returns),
            ("overflows", d.overflows),
        ] {
            *self.diagnostics.entry(name).or_default() += value;
        }
        self.expire(now);
        self.refreshes += 1;
    }

    fn add(
        &mut self,
        family: FamilyKind,
        labels: Labels,
        values: Vec<(String, f64)>,
        events: Vec<(String, u64)>,
        calls: u64,
        now: Instant,
    ) {
        let changed = calls > 0
            || values.iter().any(|(_, value)| *value > 0.0)
            || events.iter().any(|(_, count)| *count > 0);
        let mut key = (family, labels);
        if !self.series.contains_key(&key) {
            if !changed {
                return;
            }
            if self.series.len() >= self.limits.max_series {
                // Beyond the bound: into this family's `other` series, so totals still add up.
                self.overflowed += 1;
                let other: Labels = key
                    .1
                    .iter()
                    .map(|(name, _)| (name.clone(), OTHER.to_owned()))
                    .collect();
                key = (family, other);
            }
        }
        let series = self.series.entry(key).or_insert_with(|| Series {
            values: BTreeMap::new(),
            events: BTreeMap::new(),
            calls: 0,
            last_change: now,
        });
        for (category, value) in values {
            *series.values.entry(category).or_default() += value;
        }
        for (event, count) in events {
            *series.events.entry(event).or_default() += count;
        }
        series.calls += calls;
        if changed {
            series.last_change = now;
        }
    }

    /// Drops series whose entity has not counted anything for the TTL (vanished processes,
    /// removed cgroups); Prometheus marks them stale.
    fn expire(&mut self, now: Instant) {
        let ttl = self.limits.ttl;
        let before = self.series.len();
        self.series.retain(|(_, labels), series| {
            labels.iter().all(|(_, value)| value == OTHER)
                || now.duration_since(series.last_change) < ttl
        });
        self.expired += (before - self.series.len()) as u64;
    }

    /// The Prometheus text exposition of every series and of the exporter itself, encoded
    /// straight from the live store (no registry is built per encode).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.collect())
    }
}

/// One exported family as `Desc` and the text encoder take it.
#[derive(Clone, Copy, Debug)]
struct Spec {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    /// Label names, in the order `Families::push` takes their values.
    labels: &'static [&'static str],
}

const fn spec(
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
) -> Spec {
    Spec {
        name,
        help,
        kind,
        labels,
    }
}

const CALLS: Spec = spec(
    "topdown_function_calls_total",
    "Calls of probed functions",
    MetricType::COUNTER,
    &["function", "target"],
);
const BUILD_INFO: Spec = spec(
    "topdown_build_info",
    "The model topdown counts with",
    MetricType::GAUGE,
    &["model", "synthetic", "version"],
);
const SERIES: Spec = spec(
    "topdown_series",
    "Series exported now",
    MetricType::GAUGE,
    &[],
);
const OVERFLOWED: Spec = spec(
    "topdown_series_overflow_total",
    "Entity updates folded into an other series because of --max-series",
    MetricType::COUNTER,
    &[],
);
const EXPIRED: Spec = spec(
    "topdown_series_expired_total",
    "Series dropped after --series-ttl without counts",
    MetricType::COUNTER,
    &[],
);
const REFRESHES: Spec = spec(
    "topdown_refreshes_total",
    "Map readings turned into series",
    MetricType::COUNTER,
    &[],
);
const REFRESH_DURATION: Spec = spec(
    "topdown_refresh_duration_seconds",
    "How long the last refresh took",
    MetricType::GAUGE,
    &[],
);
const BPF_EVENTS: Spec = spec(
    "topdown_bpf_events_total",
    "BPF-side diagnostics: readings, read errors, full maps, missed returns",
    MetricType::COUNTER,
    &["kind"],
);
const OVERHEAD: Spec = spec(
    "topdown_overhead_percent",
    "topdown's BPF run time over the last refresh, percent of all CPUs",
    MetricType::GAUGE,
    &[],
);
const DETACHED: Spec = spec(
    "topdown_probes_detached_total",
    "Function probes the overhead guard (--max-overhead) detached",
    MetricType::COUNTER,
    &["function", "target"],
);
const REATTACHMENTS: Spec = spec(
    "topdown_probe_reattachments_total",
    "Re-attachments of the function probes (replaced binaries, SIGHUP, overhead guard)",
    MetricType::COUNTER,
    &[],
);
const RELOADS: Spec = spec(
    "topdown_config_reloads_total",
    "--config reloads on SIGHUP, by result (failed: the running configuration stayed)",
    MetricType::COUNTER,
    &["result"],
);
const MAP_ENTRIES: Spec = spec(
    "topdown_bpf_map_entries",
    "Entries in topdown's BPF maps (bounded by --max-tasks, --max-cgroups)",
    MetricType::GAUGE,
    &["map"],
);

const KINDS: [FamilyKind; 4] = [
    FamilyKind::Cgroup,
    FamilyKind::Process,
    FamilyKind::FunctionInclusive,
    FamilyKind::FunctionExclusive,
];

/// Every family the exporter may export.
fn specs() -> impl Iterator<Item = Spec> {
    KINDS
        .into_iter()
        .flat_map(|kind| [kind.slots(), kind.events()])
        .chain([
            CALLS,
            BUILD_INFO,
            SERIES,
            OVERFLOWED,
            EXPIRED,
            REFRESHES,
            REFRESH_DURATION,
            BPF_EVENTS,
            OVERHEAD,
            DETACHED,
            REATTACHMENTS,
            RELOADS,
            MAP_ENTRIES,
        ])
}

/// The descriptors a `Registry` checks on registration. The names and labels are constants
/// (a unit test builds every one), so none is ever left out.
static DESCS: LazyLock<Vec<Desc>> = LazyLock::new(|| {
    specs()
        .filter_map(|spec| {
            Desc::new(
                spec.name.to_owned(),
                spec.help.to_owned(),
                spec.labels
                    .iter()
                    .map(|label| (*label).to_owned())
                    .collect(),
                HashMap::new(),
            )
            .ok()
        })
        .collect()
});

/// The families of one collection, keyed (and so ordered) by name as `Registry::gather` orders
/// them.
#[derive(Default)]
struct Families(BTreeMap<&'static str, MetricFamily>);

impl Families {
    /// Adds one sample; `values` are the values of `spec.labels`, in that order.
    fn push(&mut self, spec: Spec, values: &[&str], value: f64) {
        debug_assert_eq!(values.len(), spec.labels.len(), "{}", spec.name);
        let mut labels: Vec<LabelPair> = spec
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name((*name).to_owned());
                pair.set_value((*value).to_owned());
                pair
            })
            .collect();
        // Label pairs by name, as the crate's own metrics write them.
        labels.sort();
        let mut metric = proto::Metric::from_label(labels);
        if spec.kind == MetricType::GAUGE {
            let mut gauge = proto::Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        } else {
            let mut counter = proto::Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        }
        self.0
            .entry(spec.name)
            .or_insert_with(|| {
                let mut family = MetricFamily::default();
                family.set_name(spec.name.to_owned());
                family.set_help(spec.help.to_owned());
                family.set_field_type(spec.kind);
                family
            })
            .mut_metric()
            .push(metric);
    }

    /// The families by name, each one's samples by label values: `Registry::gather`'s order
    /// (prometheus 0.14, src/registry.rs), so the exposition is stable across scrapes.
    fn finish(self) -> Vec<MetricFamily> {
        self.0
            .into_values()
            .map(|mut family| {
                family.mut_metric().sort_by(|a, b| {
                    let values = |metric: &proto::Metric| {
                        metric
                            .get_label()
                            .iter()
                            .map(|pair| pair.value().to_owned())
                            .collect::<Vec<_>>()
                    };
                    a.get_label()
                        .len()
                        .cmp(&b.get_label().len())
                        .then_with(|| values(a).cmp(&values(b)))
                });
                family
            })
            .collect()
    }
}

/// The exporter is a collector over its live series: each collection reads the store as the
/// last refresh left it, so the exporter can also be registered with any `Registry`.
impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        DESCS.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = Families::default();
        let mut values: Vec<&str> = Vec::new();
        for ((kind, labels), series) in &self.series {
            values.clear();
            values.extend(labels.iter().map(|(_, value)| value.as_str()));
            let identifying = values.len();
            for (category, value) in &series.values {
                values.extend([category.as_str(), self.model.as_str()]);
                families.push(kind.slots(), &values, value.max(0.0));
                values.truncate(identifying);
            }
            for (event, count) in &series.events {
                values.push(event);
                families.push(kind.events(), &values, *count as f64);
                values.truncate(identifying);
            }
            if *kind == FamilyKind::FunctionInclusive && series.calls > 0 {
                families.push(CALLS, &values, series.calls as f64);
            }
        }
        let synthetic = self.synthetic.to_string();
        families.push(
            BUILD_INFO,
            &[&self.model, &synthetic, env!("CARGO_PKG_VERSION")],
            1.0,
        );
        families.push(SERIES, &[], self.series.len() as f64);
        families.push(OVERFLOWED, &[], self.overflowed as f64);
        families.push(EXPIRED, &[], self.expired as f64);
        families.push(REFRESHES, &[], self.refreshes as f64);
        families.push(REFRESH_DURATION, &[], self.last_refresh_seconds);
        for (name, value) in &self.diagnostics {
            families.push(BPF_EVENTS, &[name], *value as f64);
        }
        if let Some(percent) = self.overhead_percent {
            families.push(OVERHEAD, &[], percent);
        }
        // A function detached twice (re-attached in between) counts twice.
        let mut detached: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (function, target) in &self.detached_functions {
            *detached.entry((function, target)).or_default() += 1;
        }
        for ((function, target), count) in detached {
            families.push(DETACHED, &[function, target], count as f64);
        }
        families.push(REATTACHMENTS, &[], self.reattachments as f64);
        for (result, count) in [
            ("applied", self.config_reloads.applied),
            ("failed", self.config_reloads.failed),
        ] {
            families.push(RELOADS, &[result], count as f64);
        }
        for (map, count) in self.map_entries {
            families.push(MAP_ENTRIES, &[map], count as f64);
        }
        families.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{
        aggregate::{CallCounts, Naming, ProcessCounts, SlotCounts},
        model::{CounterSpec, Metrics, Model, ratio},
        report::Diagnostics,
    };
    use topdown_common::{CallKey, ROOT_FUNCTION};

    /// A model for these tests: counters `slots`, `retired` and `dropped`; retiring =
    /// (retired - dropped) / slots, which a refresh's rounding can make negative, and unknown
    /// where `retired` exceeds `slots` (an inconsistent reading).
    struct Retiring;

    impl Model for Retiring {
        fn name(&self) -> String {
            "test-retiring".to_owned()
        }
        fn base_name(&self) -> &'static str {
            "test-retiring"
        }
        fn description(&self) -> &'static str {
            "exporter tests"
        }
        fn counters(&self) -> Vec<CounterSpec> {
            ["slots", "retired", "dropped"]
                .iter()
                .map(|name| CounterSpec::raw(name, 0))
                .collect()
        }
        fn max_level(&self) -> u8 {
            1
        }
        fn metrics(&self, values: &[u64], _level: u8) -> Metrics {
            let (slots, retired, dropped) = (values[0], values[1], values[2]);
            let retiring = (retired <= slots)
                .then(|| ratio(retired as f64 - dropped as f64, slots as f64))
                .flatten();
            L1_METRICS
                .iter()
                .map(|name| {
                    (
                        name.to_string(),
                        (*name == "retiring").then_some(retiring).flatten(),
                    )
                })
                .collect()
        }
        fn weight_counter(&self) -> &'static str {
            "slots"
        }
        fn slots(&self, values: &[u64]) -> Option<f64> {
            values.first().map(|slots| *slots as f64)
        }
    }

    /// The slots: the model's counters, then the `-e` event `cache-misses`.
    static SLOT_NAMES: LazyLock<Vec<String>> = LazyLock::new(|| {
        ["slots", "retired", "dropped", "cache-misses"]
            .map(str::to_owned)
            .to_vec()
    });
    static NO_PATHS: LazyLock<HashMap<u64, String>> = LazyLock::new(HashMap::new);

    /// `[slots, retired, dropped, cache-misses]`.
    fn slots(values: [u64; 4]) -> SlotCounts {
        let mut counts = SlotCounts::ZERO;
        counts.0[..4].copy_from_slice(&values);
        counts
    }

    fn naming<'a>(
        paths: &'a HashMap<u64, String>,
        functions: &'a [(String, String)],
        events: bool,
    ) -> Naming<'a> {
        let mut naming = Naming::new(&Retiring, &SLOT_NAMES, 1, paths, None, functions);
        if events {
            naming.events = vec![("cache-misses".to_owned(), 3)];
        }
        naming
    }

    /// A refresh's counts with processes `(comm, [slots, retired, dropped, cache-misses])`.
    fn refresh(processes: &[(&str, [u64; 4])]) -> Aggregate {
        Aggregate {
            processes: processes
                .iter()
                .enumerate()
                .map(|(index, (comm, values))| ProcessCounts {
                    pid: index as u32 + 1,
                    comm: (*comm).to_owned(),
                    threads: 1,
                    counts: slots(*values),
                })
                .collect(),
            diagnostics: Diagnostics {
                readings: 3,
                ..Diagnostics::default()
            },
            ..Aggregate::default()
        }
    }

    fn update(exporter: &mut Exporter, counts: &Aggregate, now: Instant) {
        exporter.update(counts, &naming(&NO_PATHS, &[], false), now);
    }

    fn limits(max_series: usize, ttl_s: u64) -> Limits {
        Limits {
            max_series,
            ttl: Duration::from_secs(ttl_s),
        }
    }

    fn value(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    const DOCKER_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// An exporter holding one series of every family and every self-describing series.
    fn every_family() -> Exporter {
        let mut counts = refresh(&[("nginx", [1000, 250, 0, 12]), ("a\"b", [7, 8, 0, 0])]);
        counts.cgroups = vec![(42, slots([600, 300, 0, 3])), (7, slots([5, 0, 0, 0]))];
        counts.calls = vec![CallCounts {
            key: CallKey {
                function: 0,
                parent: ROOT_FUNCTION,
                tgid: 0,
                _pad: 0,
            },
            calls: 3,
            inclusive: slots([90, 90, 0, 2]),
            exclusive: slots([30, 30, 0, 1]),
            callee_calls: 0,
        }];
        counts.diagnostics.read_errors = 2;
        counts.diagnostics.missed_returns = 1;
        let paths = HashMap::from([(42, format!("/system.slice/docker-{DOCKER_ID}.scope"))]);
        let functions = [("/usr/bin/app".to_owned(), "leaf".to_owned())];
        let mut exporter = Exporter::new("intel-icl".into(), true, limits(5, 300));
        exporter.update(&counts, &naming(&paths, &functions, true), Instant::now());
        exporter.set_refresh_duration(Duration::from_millis(250));
        exporter.overhead_percent = Some(0.5);
        exporter.detached_functions = vec![("leaf".to_owned(), "/usr/bin/app".to_owned())];
        exporter.reattachments = 2;
        exporter.map_entries = [("tasks", 9), ("cgroups", 2)];
        exporter.config_reloads = Reloads {
            applied: 1,
            failed: 4,
        };
        exporter
    }

    /// The exposition before the collector rewrite, byte for byte (families by name, samples
    /// by label values, label pairs by name, escaped label values).
    #[test]
    fn the_exposition_is_byte_exact() {
        let expected = EVERY_FAMILY
            .replace("VERSION", env!("CARGO_PKG_VERSION"))
            .replace("DOCKER_ID", DOCKER_ID);
        assert_eq!(every_family().encode().unwrap(), expected);
    }

    /// Registered with a registry, the collector gathers what `encode` writes.
    #[test]
    fn the_collector_registers_and_gathers_the_same_text() {
        assert_eq!(
            DESCS.len(),
            specs().count(),
            "every family has a descriptor"
        );
        let exporter = every_family();
        let text = exporter.encode().unwrap();
        let registry = prometheus::Registry::new();
        registry.register(Box::new(exporter)).unwrap();
        let gathered = TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert_eq!(gathered, text);
    }

    /// Before any refresh the exporter already describes itself.
    #[test]
    fn a_new_exporter_encodes_its_own_series() {
        let exporter = Exporter::new("amd-zen4".into(), false, limits(10, 60));
        let text = exporter.encode().unwrap();
        let info = format!(
            r#"topdown_build_info{{model="amd-zen4",synthetic="false",version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|line| line == info), "{text}");
        assert_eq!(
            value(&text, "topdown_refreshes_total "),
            Some(0.0),
            "{text}"
        );
        assert_eq!(value(&text, "topdown_series "), Some(0.0), "{text}");
        assert!(!text.contains("topdown_process_slots_total"), "{text}");
    }

    const EVERY_FAMILY: &str = r##"# HELP topdown_bpf_events_total BPF-side diagnostics: readings, read errors, full maps, missed returns
# TYPE topdown_bpf_events_total counter
topdown_bpf_events_total{kind="cgroup_map_full"} 0
topdown_bpf_events_total{kind="missed_returns"} 1
topdown_bpf_events_total{kind="not_running_readings"} 0
topdown_bpf_events_total{kind="overflows"} 0
topdown_bpf_events_total{kind="probe_map_full"} 0
topdown_bpf_events_total{kind="read_errors"} 2
topdown_bpf_events_total{kind="readings"} 3
topdown_bpf_events_total{kind="task_map_full"} 0
# HELP topdown_bpf_map_entries Entries in topdown's BPF maps (bounded by --max-tasks, --max-cgroups)
# TYPE topdown_bpf_map_entries gauge
topdown_bpf_map_entries{map="cgroups"} 2
topdown_bpf_map_entries{map="tasks"} 9
# HELP topdown_build_info The model topdown counts with
# TYPE topdown_build_info gauge
topdown_build_info{model="intel-icl",synthetic="true",version="VERSION"} 1
# HELP topdown_cgroup_events_total Counts of the -e events, per cgroup v2
# TYPE topdown_cgroup_events_total counter
topdown_cgroup_events_total{cgroup="/system.slice/docker-DOCKER_ID.scope",container="0123456789ab",event="cache-misses",pod_uid="",unit="docker-DOCKER_ID.scope"} 3
topdown_cgroup_events_total{cgroup="id:7",container="",event="cache-misses",pod_uid="",unit=""} 0
# HELP topdown_cgroup_slots_total Pipeline slots per TopDown category, per cgroup v2
# TYPE topdown_cgroup_slots_total counter
topdown_cgroup_slots_total{category="retiring",cgroup="/system.slice/docker-DOCKER_ID.scope",container="0123456789ab",model="intel-icl",pod_uid="",unit="docker-DOCKER_ID.scope"} 300
topdown_cgroup_slots_total{category="retiring",cgroup="id:7",container="",model="intel-icl",pod_uid="",unit=""} 0
topdown_cgroup_slots_total{category="total",cgroup="/system.slice/docker-DOCKER_ID.scope",container="0123456789ab",model="intel-icl",pod_uid="",unit="docker-DOCKER_ID.scope"} 600
topdown_cgroup_slots_total{category="total",cgroup="id:7",container="",model="intel-icl",pod_uid="",unit=""} 5
# HELP topdown_config_reloads_total --config reloads on SIGHUP, by result (failed: the running configuration stayed)
# TYPE topdown_config_reloads_total counter
topdown_config_reloads_total{result="applied"} 1
topdown_config_reloads_total{result="failed"} 4
# HELP topdown_function_calls_total Calls of probed functions
# TYPE topdown_function_calls_total counter
topdown_function_calls_total{function="leaf",target="/usr/bin/app"} 3
# HELP topdown_function_exclusive_events_total Counts of the -e events inside probed functions, probed callees excluded
# TYPE topdown_function_exclusive_events_total counter
topdown_function_exclusive_events_total{event="cache-misses",function="other",target="other"} 1
# HELP topdown_function_exclusive_slots_total Pipeline slots per TopDown category inside probed functions, probed callees excluded
# TYPE topdown_function_exclusive_slots_total counter
topdown_function_exclusive_slots_total{category="retiring",function="other",model="intel-icl",target="other"} 30
topdown_function_exclusive_slots_total{category="total",function="other",model="intel-icl",target="other"} 30
# HELP topdown_function_inclusive_events_total Counts of the -e events inside probed functions, callees included
# TYPE topdown_function_inclusive_events_total counter
topdown_function_inclusive_events_total{event="cache-misses",function="leaf",target="/usr/bin/app"} 2
# HELP topdown_function_inclusive_slots_total Pipeline slots per TopDown category inside probed functions, callees included
# TYPE topdown_function_inclusive_slots_total counter
topdown_function_inclusive_slots_total{category="retiring",function="leaf",model="intel-icl",target="/usr/bin/app"} 90
topdown_function_inclusive_slots_total{category="total",function="leaf",model="intel-icl",target="/usr/bin/app"} 90
# HELP topdown_overhead_percent topdown's BPF run time over the last refresh, percent of all CPUs
# TYPE topdown_overhead_percent gauge
topdown_overhead_percent 0.5
# HELP topdown_probe_reattachments_total Re-attachments of the function probes (replaced binaries, SIGHUP, overhead guard)
# TYPE topdown_probe_reattachments_total counter
topdown_probe_reattachments_total 2
# HELP topdown_probes_detached_total Function probes the overhead guard (--max-overhead) detached
# TYPE topdown_probes_detached_total counter
topdown_probes_detached_total{function="leaf",target="/usr/bin/app"} 1
# HELP topdown_process_events_total Counts of the -e events, per process name
# TYPE topdown_process_events_total counter
topdown_process_events_total{comm="a\"b",event="cache-misses"} 0
topdown_process_events_total{comm="nginx",event="cache-misses"} 12
# HELP topdown_process_slots_total Pipeline slots per TopDown category, per process name
# TYPE topdown_process_slots_total counter
topdown_process_slots_total{category="retiring",comm="nginx",model="intel-icl"} 250
topdown_process_slots_total{category="total",comm="a\"b",model="intel-icl"} 7
topdown_process_slots_total{category="total",comm="nginx",model="intel-icl"} 1000
# HELP topdown_refresh_duration_seconds How long the last refresh took
# TYPE topdown_refresh_duration_seconds gauge
topdown_refresh_duration_seconds 0.25
# HELP topdown_refreshes_total Map readings turned into series
# TYPE topdown_refreshes_total counter
topdown_refreshes_total 1
# HELP topdown_series Series exported now
# TYPE topdown_series gauge
topdown_series 6
# HELP topdown_series_expired_total Series dropped after --series-ttl without counts
# TYPE topdown_series_expired_total counter
topdown_series_expired_total 0
# HELP topdown_series_overflow_total Entity updates folded into an other series because of --max-series
# TYPE topdown_series_overflow_total counter
topdown_series_overflow_total 1
"##;

    #[test]
    fn deltas_accumulate_into_monotonic_category_counters() {
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(100, 300));
        let start = Instant::now();
        update(
            &mut exporter,
            &refresh(&[("nginx", [1000, 250, 0, 0])]),
            start,
        );
        // A refresh whose fraction is negative (rounding in a formula) adds 0, never subtracts.
        update(&mut exporter, &refresh(&[("nginx", [500, 0, 5, 0])]), start);
        let text = exporter.encode().unwrap();
        let total =
            r#"topdown_process_slots_total{category="total",comm="nginx",model="intel-icl"}"#;
        let retiring =
            r#"topdown_process_slots_total{category="retiring",comm="nginx",model="intel-icl"}"#;
        assert_eq!(value(&text, total), Some(1500.0), "{text}");
        assert_eq!(value(&text, retiring), Some(250.0), "{text}");
        assert_eq!(
            value(&text, r#"topdown_bpf_events_total{kind="readings"}"#),
            Some(6.0)
        );
    }

    #[test]
    fn extra_events_accumulate_per_entity_beside_the_slots() {
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(100, 300));
        let now = Instant::now();
        // Without -e, no event family at all.
        update(&mut exporter, &refresh(&[("nginx", [10, 0, 0, 0])]), now);
        assert!(
            !exporter
                .encode()
                .unwrap()
                .contains("topdown_process_events_total")
        );
        let with_event = |exporter: &mut Exporter, slots_count: u64, misses: u64| {
            exporter.update(
                &refresh(&[("nginx", [slots_count, 0, 0, misses])]),
                &naming(&NO_PATHS, &[], true),
                now,
            );
        };
        with_event(&mut exporter, 10, 7);
        with_event(&mut exporter, 10, 5);
        let text = exporter.encode().unwrap();
        assert_eq!(
            value(
                &text,
                r#"topdown_process_events_total{comm="nginx",event="cache-misses"}"#
            ),
            Some(12.0),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                r#"topdown_process_slots_total{category="total",comm="nginx",model="intel-icl"}"#
            ),
            Some(30.0),
            "{text}"
        );
    }

    #[test]
    fn series_beyond_the_limit_fold_into_other() {
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(2, 300));
        let now = Instant::now();
        update(
            &mut exporter,
            &refresh(&[
                ("a", [10, 0, 0, 0]),
                ("b", [20, 0, 0, 0]),
                ("c", [30, 0, 0, 0]),
                ("d", [40, 0, 0, 0]),
            ]),
            now,
        );
        let text = exporter.encode().unwrap();
        // The two heaviest keep their series; `other` holds a and b.
        assert_eq!(exporter.series_count(), 3);
        for (comm, slots) in [("d", 40.0), ("c", 30.0), ("other", 30.0)] {
            assert_eq!(
                value(
                    &text,
                    &format!(r#"topdown_process_slots_total{{category="total",comm="{comm}""#)
                ),
                Some(slots),
                "{text}"
            );
        }
        assert_eq!(value(&text, "topdown_series_overflow_total"), Some(2.0));
    }

    #[test]
    fn idle_series_expire_after_the_ttl() {
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(100, 60));
        let start = Instant::now();
        update(
            &mut exporter,
            &refresh(&[("gone", [10, 0, 0, 0]), ("busy", [10, 0, 0, 0])]),
            start,
        );
        update(
            &mut exporter,
            &refresh(&[("busy", [10, 0, 0, 0])]),
            start + Duration::from_secs(61),
        );
        assert_eq!(exporter.series_count(), 1);
        let text = exporter.encode().unwrap();
        assert!(!text.contains(r#"comm="gone""#), "{text}");
        assert_eq!(value(&text, "topdown_series_expired_total"), Some(1.0));
        // An entity that never counted gets no series at all.
        update(
            &mut exporter,
            &refresh(&[("quiet", [0, 0, 0, 0])]),
            start + Duration::from_secs(62),
        );
        assert_eq!(exporter.series_count(), 1);
    }
}
