//! The exporter's series: TopDown slots per category per cgroup, process and function,
//! accumulated from each refresh's deltas so every `_total` stays monotonic, bounded in number,
//! and expired when their entity stops counting.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use prometheus::{
    CounterVec, Encoder as _, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::{
    model::{L1_METRICS, L2_METRICS},
    report::{Entity, Report},
};

/// Label sets as prometheus-client takes them.
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
    fn metric(self) -> &'static str {
        match self {
            FamilyKind::Cgroup => "topdown_cgroup_slots_total",
            FamilyKind::Process => "topdown_process_slots_total",
            FamilyKind::FunctionInclusive => "topdown_function_inclusive_slots_total",
            FamilyKind::FunctionExclusive => "topdown_function_exclusive_slots_total",
        }
    }

    /// The identifying labels, in the order `update` builds them.
    fn labels(self) -> &'static [&'static str] {
        match self {
            FamilyKind::Cgroup => &["cgroup", "container", "pod_uid", "unit"],
            FamilyKind::Process => &["comm"],
            FamilyKind::FunctionInclusive | FamilyKind::FunctionExclusive => {
                &["function", "target"]
            }
        }
    }

    /// The family of `-e` event counts for the same entities.
    fn events_metric(self) -> &'static str {
        match self {
            FamilyKind::Cgroup => "topdown_cgroup_events_total",
            FamilyKind::Process => "topdown_process_events_total",
            FamilyKind::FunctionInclusive => "topdown_function_inclusive_events_total",
            FamilyKind::FunctionExclusive => "topdown_function_exclusive_events_total",
        }
    }

    fn events_help(self) -> &'static str {
        match self {
            FamilyKind::Cgroup => "Counts of the -e events, per cgroup v2",
            FamilyKind::Process => "Counts of the -e events, per process name",
            FamilyKind::FunctionInclusive => {
                "Counts of the -e events inside probed functions, callees included"
            }
            FamilyKind::FunctionExclusive => {
                "Counts of the -e events inside probed functions, probed callees excluded"
            }
        }
    }

    fn help(self) -> &'static str {
        match self {
            FamilyKind::Cgroup => "Pipeline slots per TopDown category, per cgroup v2",
            FamilyKind::Process => "Pipeline slots per TopDown category, per process name",
            FamilyKind::FunctionInclusive => {
                "Pipeline slots per TopDown category inside probed functions, callees included"
            }
            FamilyKind::FunctionExclusive => {
                "Pipeline slots per TopDown category inside probed functions, probed callees excluded"
            }
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

    /// The Prometheus text exposition of every series and of the exporter itself.
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let registry = Registry::new();
        let mut families: BTreeMap<FamilyKind, CounterVec> = BTreeMap::new();
        let mut event_families: BTreeMap<FamilyKind, IntCounterVec> = BTreeMap::new();
        // Only with -e: an empty family would still print its HELP and TYPE lines.
        let has_events = self.series.values().any(|series| !series.events.is_empty());
        for kind in [
            FamilyKind::Cgroup,
            FamilyKind::Process,
            FamilyKind::FunctionInclusive,
            FamilyKind::FunctionExclusive,
        ] {
            let mut names: Vec<&str> = kind.labels().to_vec();
            names.extend(["category", "model"]);
            let family = CounterVec::new(Opts::new(kind.metric(), kind.help()), &names)?;
            registry.register(Box::new(family.clone()))?;
            families.insert(kind, family);
            if has_events {
                let mut names: Vec<&str> = kind.labels().to_vec();
                names.push("event");
                let events = IntCounterVec::new(
                    Opts::new(kind.events_metric(), kind.events_help()),
                    &names,
                )?;
                registry.register(Box::new(events.clone()))?;
                event_families.insert(kind, events);
            }
        }
        let calls = IntCounterVec::new(
            Opts::new("topdown_function_calls_total", "Calls of probed functions"),
            FamilyKind::FunctionInclusive.labels(),
        )?;
        registry.register(Box::new(calls.clone()))?;
        for ((kind, labels), series) in &self.series {
            let Some(family) = families.get(kind) else {
                continue;
            };
            let mut values: Vec<&str> = labels.iter().map(|(_, value)| value.as_str()).collect();
            for (category, value) in &series.values {
                values.push(category);
                values.push(&self.model);
                family
                    .get_metric_with_label_values(&values)?
                    .inc_by(value.max(0.0));
                values.truncate(labels.len());
            }
            if let Some(events) = event_families.get(kind) {
                for (event, count) in &series.events {
                    values.push(event);
                    events.get_metric_with_label_values(&values)?.inc_by(*count);
                    values.truncate(labels.len());
                }
            }
            if *kind == FamilyKind::FunctionInclusive && series.calls > 0 {
                calls
                    .get_metric_with_label_values(&values)?
                    .inc_by(series.calls);
            }
        }
        let info = IntGaugeVec::new(
            Opts::new("topdown_build_info", "The model topdown counts with"),
            &["model", "synthetic", "version"],
        )?;
        info.get_metric_with_label_values(&[
            &self.model,
            &self.synthetic.to_string(),
            env!("CARGO_PKG_VERSION"),
        ])?
        .set(1);
        registry.register(Box::new(info))?;
        let gauge = |name: &str, help: &str, value: i64| -> Result<(), prometheus::Error> {
            let gauge = IntGauge::new(name, help)?;
            gauge.set(value);
            registry.register(Box::new(gauge))
        };
        gauge(
            "topdown_series",
            "Series exported now",
            self.series.len() as i64,
        )?;
        let counter = |name: &str, help: &str, value: u64| -> Result<(), prometheus::Error> {
            let counter = IntCounter::new(name, help)?;
            counter.inc_by(value);
            registry.register(Box::new(counter))
        };
        counter(
            "topdown_series_overflow_total",
            "Entity updates folded into an other series because of --max-series",
            self.overflowed,
        )?;
        counter(
            "topdown_series_expired_total",
            "Series dropped after --series-ttl without counts",
            self.expired,
        )?;
        counter(
            "topdown_refreshes_total",
            "Map readings turned into series",
            self.refreshes,
        )?;
        let refresh = Gauge::new(
            "topdown_refresh_duration_seconds",
            "How long the last refresh took",
        )?;
        refresh.set(self.last_refresh_seconds);
        registry.register(Box::new(refresh))?;
        let diagnostics = IntCounterVec::new(
            Opts::new(
                "topdown_bpf_events_total",
                "BPF-side diagnostics: readings, read errors, full maps, missed returns",
            ),
            &["kind"],
        )?;
        for (name, value) in &self.diagnostics {
            diagnostics
                .get_metric_with_label_values(&[name])?
                .inc_by(*value);
        }
        registry.register(Box::new(diagnostics))?;
        if let Some(percent) = self.overhead_percent {
            let overhead = Gauge::new(
                "topdown_overhead_percent",
                "topdown's BPF run time over the last refresh, percent of all CPUs",
            )?;
            overhead.set(percent);
            registry.register(Box::new(overhead))?;
        }
        let detached = IntCounterVec::new(
            Opts::new(
                "topdown_probes_detached_total",
                "Function probes the overhead guard (--max-overhead) detached",
            ),
            &["function", "target"],
        )?;
        for (function, target) in &self.detached_functions {
            detached
                .get_metric_with_label_values(&[function, target])?
                .inc();
        }
        registry.register(Box::new(detached))?;
        counter(
            "topdown_probe_reattachments_total",
            "Re-attachments of the function probes (replaced binaries, SIGHUP, overhead guard)",
            self.reattachments,
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "topdown_config_reloads_total",
                "--config reloads on SIGHUP, by result (failed: the running configuration stayed)",
            ),
            &["result"],
        )?;
        for (result, count) in [
            ("applied", self.config_reloads.applied),
            ("failed", self.config_reloads.failed),
        ] {
            reloads
                .get_metric_with_label_values(&[result])?
                .inc_by(count);
        }
        registry.register(Box::new(reloads))?;
        let entries = IntGaugeVec::new(
            Opts::new(
                "topdown_bpf_map_entries",
                "Entries in topdown's BPF maps (bounded by --max-tasks, --max-cgroups)",
            ),
            &["map"],
        )?;
        for (map, count) in self.map_entries {
            entries
                .get_metric_with_label_values(&[map])?
                .set(count as i64);
        }
        registry.register(Box::new(entries))?;
        let mut text = Vec::new();
        TextEncoder::new().encode(&registry.gather(), &mut text)?;
        String::from_utf8(text).map_err(|err| prometheus::Error::Msg(err.to_string()))
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
