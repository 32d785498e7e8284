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
    model::{L1_METRICS, L2_METRICS},
    report::{Entity, Report},
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

    pub fn update(&mut self, report: &Report, now: Instant) {
        let weight = report.weight_counter.clone();
        let categories: Vec<&str> = match report.level {
            0 => Vec::new(),
            1 => L1_METRICS.to_vec(),
            _ => L1_METRICS
                .iter()
                .chain(L2_METRICS.iter())
                .copied()
                .collect(),
        };
        let extra: Vec<String> = report
            .totals
            .metrics
            .keys()
            .filter(|name| {
                !name.contains('.')
                    && !L1_METRICS.contains(&name.as_str())
                    && !L2_METRICS.contains(&name.as_str())
            })
            .cloned()
            .collect();
        let category_slots = |entity: &Entity| -> Vec<(String, f64)> {
            let total = entity.counters.get(&weight).copied().unwrap_or(0) as f64;
            let mut values = vec![("total".to_owned(), total)];
            for name in categories
                .iter()
                .map(|name| name.to_string())
                .chain(extra.iter().cloned())
            {
                if let Some(Some(fraction)) = entity.metrics.get(&name) {
                    // A refresh's fraction can dip below 0 by the formulas' own rounding
                    // (e.g. Intel's dropped-uop correction); a counter never goes down.
                    values.push((name, (total * fraction).max(0.0)));
                }
            }
            values
        };
        let event_counts = |entity: &Entity| -> Vec<(String, u64)> {
            report
                .extra_events
                .iter()
                .map(|event| {
                    (
                        event.clone(),
                        entity.counters.get(event).copied().unwrap_or(0),
                    )
                })
                .collect()
        };
        for cgroup in &report.cgroups {
            let mut labels: Labels = vec![(
                "cgroup".to_owned(),
                cgroup
                    .path
                    .clone()
                    .unwrap_or_else(|| format!("id:{}", cgroup.id)),
            )];
            let container = cgroup.container.as_ref();
            labels.push((
                "container".to_owned(),
                container.and_then(|c| c.id.clone()).unwrap_or_default(),
            ));
            labels.push((
                "pod_uid".to_owned(),
                container
                    .and_then(|c| c.pod_uid.clone())
                    .unwrap_or_default(),
            ));
            labels.push((
                "unit".to_owned(),
                container.and_then(|c| c.unit.clone()).unwrap_or_default(),
            ));
            self.add(
                FamilyKind::Cgroup,
                labels,
                category_slots(&cgroup.entity),
                event_counts(&cgroup.entity),
                0,
                now,
            );
        }
        for process in &report.processes {
            let labels = vec![("comm".to_owned(), process.comm.clone())];
            self.add(
                FamilyKind::Process,
                labels,
                category_slots(&process.entity),
                event_counts(&process.entity),
                0,
                now,
            );
        }
        for function in &report.functions {
            let labels = vec![
                ("function".to_owned(), function.symbol.clone()),
                ("target".to_owned(), function.target.clone()),
            ];
            self.add(
                FamilyKind::FunctionInclusive,
                labels.clone(),
                category_slots(&function.inclusive),
                event_counts(&function.inclusive),
                function.calls,
                now,
            );
            self.add(
                FamilyKind::FunctionExclusive,
                labels,
                category_slots(&function.exclusive),
                event_counts(&function.exclusive),
                0,
                now,
            );
        }
        let d = &report.diagnostics;
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

    /// A refresh's report with processes `(comm, slots, retiring fraction)`.
    fn report(processes: &[(&str, u64, Option<f64>)]) -> Report {
        let processes: Vec<serde_json::Value> = processes
            .iter()
            .enumerate()
            .map(|(index, (comm, slots, retiring))| {
                serde_json::json!({
                    "pid": index + 1, "comm": comm, "threads": 1,
                    "counters": { "slots": slots },
                    "metrics": { "retiring": retiring, "bad_speculation": null,
                                 "frontend_bound": null, "backend_bound": null },
                })
            })
            .collect();
        let empty = serde_json::json!({ "counters": {}, "metrics": {} });
        serde_json::from_value(serde_json::json!({
            "topdown_version": "0", "model": "intel-icl", "synthetic": false, "level": 1,
            "counter_names": ["slots"], "weight_counter": "slots", "duration_s": 1.0,
            "scope": "system-wide",
            "totals": { "counters": {}, "metrics": { "retiring": null } },
            "idle": empty, "untracked": empty, "dropped": empty,
            "processes": processes,
            "diagnostics": { "readings": 3, "not_running_readings": 0, "read_errors": 0,
                             "task_map_full": 0, "exit_records_lost": 0 }
        }))
        .expect("a report")
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

    /// An exporter holding one series of every family and every self-describing series.
    fn every_family() -> Exporter {
        let mut report = report(&[("nginx", 1000, Some(0.25)), ("a\"b", 7, None)]);
        report.extra_events = vec!["cache-misses".to_owned()];
        report.processes[0]
            .entity
            .counters
            .insert("cache-misses".to_owned(), 12);
        let entity = |slots: u64, retiring: f64, misses: u64| {
            serde_json::json!({
                "counters": { "slots": slots, "cache-misses": misses },
                "metrics": { "retiring": retiring },
            })
        };
        let mut cgroup = entity(600, 0.5, 3);
        cgroup["id"] = serde_json::json!(42);
        cgroup["path"] = serde_json::json!("/system.slice/docker-abc.scope");
        cgroup["container"] = serde_json::json!({ "id": "abc", "unit": "docker-abc.scope" });
        let mut unnamed = entity(5, 0.0, 0);
        unnamed["id"] = serde_json::json!(7);
        report.cgroups = serde_json::from_value(serde_json::json!([cgroup, unnamed])).unwrap();
        report.functions = serde_json::from_value(serde_json::json!([{
            "target": "/usr/bin/app", "symbol": "leaf", "calls": 3,
            "inclusive": entity(90, 1.0, 2), "exclusive": entity(30, 1.0, 1),
        }]))
        .unwrap();
        report.diagnostics.read_errors = 2;
        report.diagnostics.missed_returns = 1;
        let mut exporter = Exporter::new("intel-icl".into(), true, limits(5, 300));
        exporter.update(&report, Instant::now());
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
        let expected = EVERY_FAMILY.replace("VERSION", env!("CARGO_PKG_VERSION"));
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
topdown_cgroup_events_total{cgroup="/system.slice/docker-abc.scope",container="abc",event="cache-misses",pod_uid="",unit="docker-abc.scope"} 3
topdown_cgroup_events_total{cgroup="id:7",container="",event="cache-misses",pod_uid="",unit=""} 0
# HELP topdown_cgroup_slots_total Pipeline slots per TopDown category, per cgroup v2
# TYPE topdown_cgroup_slots_total counter
topdown_cgroup_slots_total{category="retiring",cgroup="/system.slice/docker-abc.scope",container="abc",model="intel-icl",pod_uid="",unit="docker-abc.scope"} 300
topdown_cgroup_slots_total{category="retiring",cgroup="id:7",container="",model="intel-icl",pod_uid="",unit=""} 0
topdown_cgroup_slots_total{category="total",cgroup="/system.slice/docker-abc.scope",container="abc",model="intel-icl",pod_uid="",unit="docker-abc.scope"} 600
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
        exporter.update(&report(&[("nginx", 1000, Some(0.25))]), start);
        // A refresh whose fraction is negative (rounding in a formula) adds 0, never subtracts.
        exporter.update(&report(&[("nginx", 500, Some(-0.01))]), start);
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
        let with_event = |slots: u64, misses: u64| {
            let mut report = report(&[("nginx", slots, None)]);
            report.extra_events = vec!["cache-misses".to_owned()];
            report.processes[0]
                .entity
                .counters
                .insert("cache-misses".to_owned(), misses);
            report
        };
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(100, 300));
        let now = Instant::now();
        // Without -e, no event family at all.
        exporter.update(&report(&[("nginx", 10, None)]), now);
        assert!(
            !exporter
                .encode()
                .unwrap()
                .contains("topdown_process_events_total")
        );
        exporter.update(&with_event(10, 7), now);
        exporter.update(&with_event(10, 5), now);
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
        exporter.update(
            &report(&[
                ("a", 10, None),
                ("b", 20, None),
                ("c", 30, None),
                ("d", 40, None),
            ]),
            now,
        );
        let text = exporter.encode().unwrap();
        // Two series plus `other` holding c and d.
        assert_eq!(exporter.series_count(), 3);
        assert_eq!(
            value(
                &text,
                r#"topdown_process_slots_total{category="total",comm="other""#
            ),
            Some(70.0),
            "{text}"
        );
        assert_eq!(value(&text, "topdown_series_overflow_total"), Some(2.0));
    }

    #[test]
    fn idle_series_expire_after_the_ttl() {
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(100, 60));
        let start = Instant::now();
        exporter.update(&report(&[("gone", 10, None), ("busy", 10, None)]), start);
        exporter.update(
            &report(&[("busy", 10, None)]),
            start + Duration::from_secs(61),
        );
        assert_eq!(exporter.series_count(), 1);
        let text = exporter.encode().unwrap();
        assert!(!text.contains(r#"comm="gone""#), "{text}");
        assert_eq!(value(&text, "topdown_series_expired_total"), Some(1.0));
        // An entity that never counted gets no series at all.
        exporter.update(
            &report(&[("quiet", 0, None)]),
            start + Duration::from_secs(62),
        );
        assert_eq!(exporter.series_count(), 1);
    }
}
