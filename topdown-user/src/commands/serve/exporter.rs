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
    proto::{MetricFamily, MetricType},
};

use super::{
    distributions::{self, CallHistograms},
    duty_cycle::Window,
    families::{Families, Spec, spec},
};
use crate::{
    cgroup::container::describe_cgroup,
    model::{L1_METRICS, L2_METRICS},
    session::aggregate::{Aggregate, Naming, SlotCounts},
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
    /// Spans per kind and key (`--span`, `--postgres`).
    Span,
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
            FamilyKind::Span => spec(
                "topdown_span_slots_total",
                "Pipeline slots per TopDown category from start to end of spans (queries), per kind and key",
                MetricType::COUNTER,
                &["span", "key", "text", "category", "model"],
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
            FamilyKind::Span => spec(
                "topdown_span_events_total",
                "Counts of the -e events from start to end of spans, per kind and key",
                MetricType::COUNTER,
                &["span", "key", "text", "event"],
            ),
        }
    }
}

impl FamilyKind {
    fn is_function(self) -> bool {
        matches!(
            self,
            FamilyKind::FunctionInclusive | FamilyKind::FunctionExclusive
        )
    }
}

/// One entity's accumulated values.
struct Series {
    /// category -> accumulated slots (`total` is all of them), in the order the model names
    /// them: every entity of a family brings its categories in that same order, so each one
    /// is found at its position (a name lookup per value was most of a refresh's exporter
    /// update at 12500 processes).
    values: Vec<(String, f64)>,
    /// `-e` event -> accumulated count.
    events: BTreeMap<String, Tally>,
    calls: Tally,
    /// Calls counted by `--duty-cycle`d probes, as counted (not scaled).
    sampled_calls: u64,
    /// Spans whose end never came (span series).
    abandoned: u64,
    last_change: Instant,
}

impl Series {
    /// A series with nothing counted yet, created `now`.
    fn new(now: Instant) -> Self {
        Self {
            values: Vec::new(),
            events: BTreeMap::new(),
            calls: Tally::default(),
            sampled_calls: 0,
            abandoned: 0,
            last_change: now,
        }
    }

    /// Adds one entity's values (`ratio`: sampled over that fraction of the time); names are
    /// copied only into a series that does not have them yet.
    fn accumulate(
        &mut self,
        values: Vec<(&str, f64)>,
        events: Vec<(&str, u64)>,
        calls: u64,
        ratio: Option<f64>,
        changed: bool,
        now: Instant,
    ) {
        for (position, (category, value)) in values.into_iter().enumerate() {
            let value = match ratio {
                Some(ratio) => value / ratio,
                None => value,
            };
            let at = match self.values.get(position) {
                Some((name, _)) if name == category => Some(position),
                _ => self.values.iter().position(|(name, _)| name == category),
            };
            match at {
                Some(at) => self.values[at].1 += value,
                None => self.values.push((category.to_owned(), 0.0 + value)),
            }
        }
        for (event, count) in events {
            match self.events.get_mut(event) {
                Some(tally) => tally.add(count, ratio),
                None => self
                    .events
                    .entry(event.to_owned())
                    .or_default()
                    .add(count, ratio),
            }
        }
        self.calls.add(calls, ratio);
        if ratio.is_some() {
            self.sampled_calls += calls;
        }
        if changed {
            self.last_change = now;
        }
    }
}

/// An accumulated count: what was counted exactly, plus what was estimated from
/// `--duty-cycle` samples. The exact part stays an integer, so a series that was never sampled
/// exports exactly what it always did.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    exact: u64,
    estimated: f64,
}

impl Tally {
    /// Adds `count`, counted over a fraction `ratio` of the time when sampled.
    fn add(&mut self, count: u64, ratio: Option<f64>) {
        match ratio {
            None => self.exact += count,
            Some(ratio) => self.estimated += count as f64 / ratio,
        }
    }

    fn value(self) -> f64 {
        self.exact as f64 + self.estimated
    }
}

/// `--duty-cycle` as exported: the probes' state and what the closed windows measured.
#[derive(Clone, Copy, Debug)]
struct Sampling {
    attached: bool,
    /// The last closed window's measured fraction (none closed yet: `None`).
    ratio: Option<f64>,
    attached_seconds: f64,
    window_seconds: f64,
    /// Function series get this on top of `--series-ttl`: their counts arrive once a period.
    period: Duration,
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
    /// Keyed by labels a machine's processes and cgroups choose: a randomly seeded hash.
    series: HashMap<(FamilyKind, Labels), Series, foldhash::fast::RandomState>,
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
    /// With `--duty-cycle`: function series are estimates from its windows.
    sampling: Option<Sampling>,
    /// Per-call histograms of the functions with series of their own.
    histograms: CallHistograms,
    /// Per-span histograms of the span kinds and keys with series of their own.
    span_histograms: CallHistograms,
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
            series: HashMap::default(),
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
            sampling: None,
            histograms: CallHistograms::new(distributions::FUNCTIONS),
            span_histograms: CallHistograms::new(distributions::SPANS),
        }
    }

    /// `--duty-cycle`: function counts now arrive by window (`add_window`), scaled, and the
    /// sampling series are exported. The probes start attached.
    pub fn start_sampling(&mut self, period: Duration) {
        self.sampling = Some(Sampling {
            attached: true,
            ratio: None,
            attached_seconds: 0.0,
            window_seconds: 0.0,
            period,
        });
    }

    /// Whether the duty-cycled probes are attached now.
    pub fn set_attached(&mut self, attached: bool) {
        if let Some(sampling) = &mut self.sampling {
            sampling.attached = attached;
        }
    }

    /// Adds a closed `--duty-cycle` window's function counts, each divided by the window's
    /// measured fraction: the series estimate what the function did over the whole window.
    pub fn add_window(&mut self, window: Window, naming: &Naming<'_>, now: Instant) {
        let ratio = window.ratio();
        if let Some(sampling) = &mut self.sampling {
            sampling.ratio = Some(ratio);
            sampling.attached_seconds += window.attached.as_secs_f64();
            sampling.window_seconds += window.elapsed.as_secs_f64();
        }
        let counts = Aggregate {
            calls: window.calls,
            ..Aggregate::default()
        };
        let valuation = Valuation::new(naming);
        self.add_functions(&counts, &valuation, naming, now, Some(ratio));
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
        let weight = naming.weight_slot();
        let valuation = Valuation::new(naming);
        let category_slots = |slots: &SlotCounts| valuation.slots(slots);
        let event_counts = |slots: &SlotCounts| valuation.events(slots);
        // Heaviest first in every family: with --max-series they keep their own series and the
        // rest fold into `other`.
        let cgroups =
            counts.cgroup_rows_by_weight(naming.cgroup_paths, naming.cgroup_depth, weight);
        for (id, path, slots) in &cgroups {
            let container = describe_cgroup(path.as_deref());
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
                None,
                now,
            );
        }
        for process in counts.processes_by_weight(weight) {
            let labels = vec![("comm".to_owned(), process.comm.to_string())];
            self.add(
                FamilyKind::Process,
                labels,
                category_slots(&process.counts),
                event_counts(&process.counts),
                0,
                None,
                now,
            );
        }
        // With --duty-cycle, serve holds the function counts back for `add_window`.
        self.add_functions(counts, &valuation, naming, now, None);
        let series = &self.series;
        self.histograms.update(
            counts,
            naming,
            &|slots| valuation.owned_slots(slots),
            &|labels| series.contains_key(&function_key(labels)),
        );
        let d = &counts.diagnostics;
        for (name, value) in [
            ("readings", d.readings),
            ("read_errors", d.read_errors),
            ("not_running_readings", d.not_running_readings),
            ("task_map_full", d.task_map_full),
            ("cgroup_map_full", d.cgroup_map_full),
            ("probe_map_full", d.probe_map_full),
            ("histogram_full", d.histogram_full),
            ("missed_returns", d.missed_returns),
            ("overflows", d.overflows),
        ] {
            *self.diagnostics.entry(name).or_default() += value;
        }
        self.expire(now);
        self.refreshes += 1;
    }

    /// Adds each probed function's counts; `ratio`: the fraction of the time they were
    /// counted, when sampled by `--duty-cycle`.
    fn add_functions(
        &mut self,
        counts: &Aggregate,
        valuation: &Valuation<'_, '_>,
        naming: &Naming<'_>,
        now: Instant,
        ratio: Option<f64>,
    ) {
        let mut functions: Vec<_> = counts
            .function_totals()
            .into_iter()
            .map(|((id, _), total)| (naming.function(id), total))
            .collect();
        functions.sort_by(|((_, a_symbol), a), ((_, b_symbol), b)| {
            b.inclusive
                .get(naming.weight_slot())
                .cmp(&a.inclusive.get(naming.weight_slot()))
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
                valuation.slots(&total.inclusive),
                valuation.events(&total.inclusive),
                total.calls,
                ratio,
                now,
            );
            self.add(
                FamilyKind::FunctionExclusive,
                labels,
                valuation.slots(&total.exclusive),
                valuation.events(&total.exclusive),
                0,
                ratio,
                now,
            );
        }
    }

    /// Adds one entity's counts to its series; `ratio`: sampled over that fraction of the time
    /// (`--duty-cycle`), so every value is divided by it.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        family: FamilyKind,
        labels: Labels,
        values: Vec<(&str, f64)>,
        events: Vec<(&str, u64)>,
        calls: u64,
        ratio: Option<f64>,
        now: Instant,
    ) {
        let changed = calls > 0
            || values.iter().any(|(_, value)| *value > 0.0)
            || events.iter().any(|(_, count)| *count > 0);
        let mut key = (family, labels);
        // One lookup for the series that exist (nearly all of them after the first refresh).
        if let Some(series) = self.series.get_mut(&key) {
            series.accumulate(values, events, calls, ratio, changed, now);
            return;
        }
        if !changed {
            return;
        }
        if self.series.len() >= self.limits.max_series {
            // Beyond the bound: into this family's `other` series, so totals still add up.
            self.overflowed += 1;
            key = (family, other_labels(&key.1));
        }
        self.series
            .entry(key)
            .or_insert_with(|| Series::new(now))
            .accumulate(values, events, calls, ratio, changed, now);
    }

    /// The span series of `labels`, or (a new key beyond `--max-series`) the `other` one,
    /// created if missing, as `add` chooses.
    /// `count_overflow`: a fold here is an update of its own (`add` did not see it).
    fn span_series(&mut self, labels: Labels, now: Instant, count_overflow: bool) -> &mut Series {
        let mut key = (FamilyKind::Span, labels);
        if !self.series.contains_key(&key) && self.series.len() >= self.limits.max_series {
            if count_overflow {
                self.overflowed += 1;
            }
            key.1 = other_labels(&key.1);
        }
        self.series.entry(key).or_insert_with(|| Series::new(now))
    }

    /// Adds one refresh's spans (`--span`, `--postgres`), heaviest first, so that with
    /// `--max-series` the heaviest keys keep their own series and the rest fold into `other`.
    pub fn add_spans(
        &mut self,
        counts: &Aggregate,
        naming: &Naming<'_>,
        spans: &crate::spans::report::SpanNaming,
        now: Instant,
    ) {
        let valuation = Valuation::new(naming);
        for span in crate::spans::report::merge(spans, &counts.spans, naming.weight_slot()) {
            let labels = vec![
                ("span".to_owned(), spans.kind_name(span.kind)),
                ("key".to_owned(), span.key),
                ("text".to_owned(), span.text.unwrap_or_default()),
            ];
            // `add` creates (or folds) only series whose entity counted something.
            let added = span.calls > 0 || !span.counts.is_zero();
            self.add(
                FamilyKind::Span,
                labels.clone(),
                valuation.slots(&span.counts),
                valuation.events(&span.counts),
                span.calls,
                None,
                now,
            );
            if span.abandoned > 0 {
                let series = self.span_series(labels.clone(), now, !added);
                series.abandoned += span.abandoned;
                series.last_change = now;
            }
            // A histogram only for a key with a series of its own, as for functions: `other`
            // would mix unrelated keys' spans.
            let owner: Vec<String> = labels.into_iter().map(|(_, value)| value).collect();
            if !span.buckets.is_empty() && self.series.contains_key(&span_key(&owner)) {
                self.span_histograms
                    .add(owner, &span.buckets, &|slots| valuation.owned_slots(slots));
            }
        }
    }

    /// Drops series whose entity has not counted anything for the TTL (vanished processes,
    /// removed cgroups); Prometheus marks them stale.
    fn expire(&mut self, now: Instant) {
        let ttl = self.limits.ttl;
        let function_ttl = ttl + self.sampling.map_or(Duration::ZERO, |s| s.period);
        let before = self.series.len();
        self.series.retain(|(kind, labels), series| {
            let ttl = if kind.is_function() {
                function_ttl
            } else {
                ttl
            };
            labels.iter().all(|(_, value)| value == OTHER)
                || now.duration_since(series.last_change) < ttl
        });
        self.expired += (before - self.series.len()) as u64;
        let series = &self.series;
        self.histograms
            .retain(&|labels| series.contains_key(&function_key(labels)));
        self.span_histograms
            .retain(&|labels| series.contains_key(&span_key(labels)));
    }

    /// The Prometheus text exposition of every series and of the exporter itself, encoded
    /// straight from the live store (no registry is built per encode).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.collect())
    }
}

/// The labels of the series that absorbs `labels`' entity beyond `--max-series`: the same
/// names, each valued `OTHER`.
fn other_labels(labels: &Labels) -> Labels {
    labels
        .iter()
        .map(|(name, _)| (name.clone(), OTHER.to_owned()))
        .collect()
}

/// The key of the series of kind `kind` whose labels `names` have `values`: for a histogram's
/// owner (its label values), the series whose presence exports it.
fn series_key(kind: FamilyKind, names: &[&str], values: &[String]) -> (FamilyKind, Labels) {
    (
        kind,
        names
            .iter()
            .zip(values)
            .map(|(name, value)| ((*name).to_owned(), value.clone()))
            .collect(),
    )
}

/// A span kind and key's series (label values `span`, `key`, `text`).
fn span_key(values: &[String]) -> (FamilyKind, Labels) {
    series_key(FamilyKind::Span, &["span", "key", "text"], values)
}

/// A function's inclusive series (label values `function`, `target`).
fn function_key(values: &[String]) -> (FamilyKind, Labels) {
    series_key(
        FamilyKind::FunctionInclusive,
        &["function", "target"],
        values,
    )
}

/// What one entity's slots become: the weight counter's total and each category's share of it,
/// and the `-e` events' counts.
struct Valuation<'n, 'a> {
    naming: &'n Naming<'a>,
    weight: usize,
    /// The level's categories, then level-1 buckets some models add (AMD's smt_contention);
    /// not the hybrid per-core-type `cpu_core.*` names. Each with its position among the
    /// evaluator's metric names, resolved once so that each entity is evaluated by position.
    categories: Vec<(String, Option<usize>)>,
    /// How many metrics the evaluator writes at this level.
    metric_count: usize,
}

/// Metrics evaluated on the stack for up to this many names (every built-in model and hybrid
/// pairing has fewer); more take one allocation per entity.
const INLINE_METRICS: usize = 64;

impl<'n, 'a> Valuation<'n, 'a> {
    fn new(naming: &'n Naming<'a>) -> Self {
        let level = naming.level;
        let mut categories: Vec<String> = match level {
            0 => Vec::new(),
            1 => L1_METRICS.iter().map(|name| name.to_string()).collect(),
            _ => L1_METRICS
                .iter()
                .chain(L2_METRICS.iter())
                .map(|name| name.to_string())
                .collect(),
        };
        let names = naming.evaluator.metric_names(level);
        let mut extras: Vec<String> = names
            .iter()
            .filter(|name| {
                !name.contains('.')
                    && !L1_METRICS.contains(&name.as_str())
                    && !L2_METRICS.contains(&name.as_str())
            })
            .cloned()
            .collect();
        // In name order, as the metrics map listed them.
        extras.sort();
        extras.dedup();
        categories.extend(extras);
        let categories = categories
            .into_iter()
            .map(|name| {
                let index = names.iter().position(|metric| *metric == name);
                (name, index)
            })
            .collect();
        Self {
            naming,
            weight: naming.weight_slot(),
            categories,
            metric_count: names.len(),
        }
    }

    /// `total` and each category's slots.
    fn slots(&self, slots: &SlotCounts) -> Vec<(&str, f64)> {
        let total = slots.get(self.weight) as f64;
        let mut inline = [None; INLINE_METRICS];
        let mut heap = Vec::new();
        let metrics: &mut [Option<f64>] = if self.metric_count <= INLINE_METRICS {
            &mut inline[..self.metric_count]
        } else {
            heap.resize(self.metric_count, None);
            &mut heap
        };
        self.naming
            .evaluator
            .evaluate_into(&slots.0, self.naming.level, metrics);
        let mut values = Vec::with_capacity(self.categories.len() + 1);
        values.push(("total", total));
        for (name, index) in &self.categories {
            if let Some(Some(fraction)) = index.map(|index| metrics[index]) {
                // A refresh's fraction can dip below 0 by the formulas' own rounding
                // (e.g. Intel's dropped-uop correction); a counter never goes down.
                values.push((name.as_str(), (total * fraction).max(0.0)));
            }
        }
        values
    }

    /// `slots` with names of their own, as the histograms keep them across refreshes.
    fn owned_slots(&self, slots: &SlotCounts) -> Vec<(String, f64)> {
        self.slots(slots)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }

    fn events(&self, slots: &SlotCounts) -> Vec<(&'n str, u64)> {
        self.naming
            .events
            .iter()
            .map(|(event, slot)| (event.as_str(), slots.get(*slot)))
            .collect()
    }
}

const CALLS: Spec = spec(
    "topdown_function_calls_total",
    "Calls of probed functions",
    MetricType::COUNTER,
    &["function", "target"],
);
const SPAN_CALLS: Spec = spec(
    "topdown_span_calls_total",
    "Spans (queries) that ended, per kind and key",
    MetricType::COUNTER,
    &["span", "key", "text"],
);
const SPAN_ABANDONED: Spec = spec(
    "topdown_span_abandoned_total",
    "Spans (queries) whose end never came (an error), per kind and key",
    MetricType::COUNTER,
    &["span", "key", "text"],
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

const SAMPLED_CALLS: Spec = spec(
    "topdown_function_sampled_calls_total",
    "Calls of probed functions counted while --duty-cycle had the probes attached, not scaled",
    MetricType::COUNTER,
    &["function", "target"],
);
const SAMPLED_RATIO: Spec = spec(
    "topdown_function_sampled_ratio",
    "Measured fraction of the last closed --duty-cycle window the function probes were attached; that window's function counts were divided by it",
    MetricType::GAUGE,
    &[],
);
const ATTACHED_SECONDS: Spec = spec(
    "topdown_function_attached_seconds_total",
    "Seconds the --duty-cycle function probes were attached, over the closed windows",
    MetricType::COUNTER,
    &[],
);
const WINDOW_SECONDS: Spec = spec(
    "topdown_function_window_seconds_total",
    "Seconds the closed --duty-cycle windows span: the time the function estimates cover",
    MetricType::COUNTER,
    &[],
);
const PROBES_ATTACHED: Spec = spec(
    "topdown_function_probes_attached",
    "Whether the --duty-cycle function probes are attached now (1) or not (0)",
    MetricType::GAUGE,
    &[],
);

/// The help of the function families under `--duty-cycle`, which marks them as estimates.
static ESTIMATED_HELP: LazyLock<HashMap<&'static str, String>> = LazyLock::new(|| {
    [FamilyKind::FunctionInclusive, FamilyKind::FunctionExclusive]
        .into_iter()
        .flat_map(|kind| [kind.slots(), kind.events()])
        .chain([CALLS])
        .map(|spec| {
            (
                spec.name,
                format!(
                    "{} (estimated under --duty-cycle: each window's counts divided by its topdown_function_sampled_ratio)",
                    spec.help
                ),
            )
        })
        .collect()
});

impl Spec {
    /// This family with its help marking its values as estimates, where it is a function
    /// family.
    fn estimated(self) -> Spec {
        match ESTIMATED_HELP.get(self.name) {
            Some(help) => Spec {
                help: help.as_str(),
                ..self
            },
            None => self,
        }
    }
}

const KINDS: [FamilyKind; 5] = [
    FamilyKind::Cgroup,
    FamilyKind::Process,
    FamilyKind::FunctionInclusive,
    FamilyKind::FunctionExclusive,
    FamilyKind::Span,
];

/// Every family the exporter may export.
fn specs() -> impl Iterator<Item = Spec> {
    KINDS
        .into_iter()
        .flat_map(|kind| [kind.slots(), kind.events()])
        .chain([
            CALLS,
            SPAN_CALLS,
            SPAN_ABANDONED,
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
            SAMPLED_CALLS,
            SAMPLED_RATIO,
            ATTACHED_SECONDS,
            WINDOW_SECONDS,
            PROBES_ATTACHED,
            distributions::CALL_SLOTS,
            distributions::P99_BAND_SLOTS,
            distributions::P99_BAND_LE,
            distributions::SPAN_SLOTS,
            distributions::SPAN_P99_BAND_SLOTS,
            distributions::SPAN_P99_BAND_LE,
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
            let mark = |spec: Spec| {
                if self.sampling.is_some() && kind.is_function() {
                    spec.estimated()
                } else {
                    spec
                }
            };
            values.clear();
            values.extend(labels.iter().map(|(_, value)| value.as_str()));
            let identifying = values.len();
            for (category, value) in &series.values {
                values.extend([category.as_str(), self.model.as_str()]);
                families.push(mark(kind.slots()), &values, value.max(0.0));
                values.truncate(identifying);
            }
            for (event, count) in &series.events {
                values.push(event);
                families.push(mark(kind.events()), &values, count.value());
                values.truncate(identifying);
            }
            if *kind == FamilyKind::FunctionInclusive && series.calls.value() > 0.0 {
                families.push(mark(CALLS), &values, series.calls.value());
            }
            if *kind == FamilyKind::FunctionInclusive && series.sampled_calls > 0 {
                families.push(SAMPLED_CALLS, &values, series.sampled_calls as f64);
            }
            if *kind == FamilyKind::Span {
                families.push(SPAN_CALLS, &values, series.calls.value());
                if series.abandoned > 0 {
                    families.push(SPAN_ABANDONED, &values, series.abandoned as f64);
                }
            }
        }
        if let Some(sampling) = &self.sampling {
            families.push(
                PROBES_ATTACHED,
                &[],
                if sampling.attached { 1.0 } else { 0.0 },
            );
            if let Some(ratio) = sampling.ratio {
                families.push(SAMPLED_RATIO, &[], ratio);
            }
            families.push(ATTACHED_SECONDS, &[], sampling.attached_seconds);
            families.push(WINDOW_SECONDS, &[], sampling.window_seconds);
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
        self.histograms.collect(&mut families, &self.model);
        self.span_histograms.collect(&mut families, &self.model);
        families.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{
        model::{CounterSpec, Metrics, Model, ratio},
        report::Diagnostics,
        session::aggregate::{CallCounts, Naming, ProcessCounts, SlotCounts},
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
        fn metric_names(&self, level: u8) -> Vec<String> {
            crate::model::metric_names_of_map(self, level)
        }
        fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
            crate::model::metrics_into_from_map(self, values, level, out)
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
                    comm: (*comm).into(),
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
            unwound: 0,
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
topdown_bpf_events_total{kind="histogram_full"} 0
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

    /// Query spans: one series per kind and key, heaviest first; beyond `--max-series` the
    /// lighter keys fold into `other` (their calls and abandoned spans with them).
    #[test]
    fn span_series_are_bounded_with_the_heaviest_keys_kept() {
        use crate::spans::{
            KindInfo,
            report::{SpanAggregate, SpanCounts, SpanNaming},
        };
        use topdown_common::usdt::{SpanKey, key_type, span_flags};
        let naming_spans = SpanNaming {
            kinds: vec![KindInfo {
                name: "query".into(),
                normalize_text: true,
                note_is_query_id: true,
                folds_into: None,
            }],
            hit_probes: Vec::new(),
        };
        let span = |id: u64, flags: u32, spans: u64, weight: u64| SpanCounts {
            key: SpanKey {
                kind: 0,
                flags,
                key_type: key_type::NOTE,
                bucket: topdown_common::histogram::bucket(weight / spans),
                key: id,
            },
            spans,
            text: 0,
            counts: slots([weight, weight / 2, 0, 0]),
        };
        let counts = Aggregate {
            spans: SpanAggregate {
                spans: vec![
                    span(1, 0, 5, 100),
                    span(2, 0, 3, 300),
                    span(3, 0, 2, 50),
                    span(3, span_flags::ABANDONED, 1, 7),
                    span(4, 0, 4, 200),
                ],
                ..SpanAggregate::default()
            },
            ..Aggregate::default()
        };
        let mut exporter = Exporter::new("intel-icl".into(), false, limits(2, 300));
        exporter.add_spans(
            &counts,
            &naming(&NO_PATHS, &[], false),
            &naming_spans,
            Instant::now(),
        );
        let text = exporter.encode().unwrap();
        assert_eq!(exporter.series_count(), 3, "{text}");
        for (key, slots, calls) in [("2", 300.0, 3.0), ("4", 200.0, 4.0), ("other", 150.0, 7.0)] {
            assert_eq!(
                value(
                    &text,
                    &format!(
                        r#"topdown_span_slots_total{{category="total",key="{key}",model="intel-icl",span="#
                    )
                ),
                Some(slots),
                "{key}: {text}"
            );
            assert_eq!(
                value(&text, &format!(r#"topdown_span_calls_total{{key="{key}""#)),
                Some(calls),
                "{key}: {text}"
            );
        }
        assert_eq!(
            value(&text, r#"topdown_span_abandoned_total{key="other""#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(value(&text, "topdown_series_overflow_total"), Some(2.0));
        // A histogram per key with a series of its own (3 spans of 100 slots: [96, 112); 4 of
        // 50: [48, 56)), none for `other`.
        let histogram = |key: &str, le: &str| {
            value(
                &text,
                &format!(
                    r#"topdown_span_call_slots_bucket{{key="{key}",span="query",text="",le="{le}"}}"#
                ),
            )
        };
        assert_eq!(histogram("2", "111"), Some(3.0), "{text}");
        assert_eq!(histogram("2", "+Inf"), Some(3.0), "{text}");
        assert_eq!(histogram("4", "55"), Some(4.0), "{text}");
        assert_eq!(
            value(
                &text,
                r#"topdown_span_call_slots_sum{key="2",span="query",text=""}"#
            ),
            Some(300.0)
        );
        assert_eq!(
            value(
                &text,
                r#"topdown_span_p99_band_le{key="4",span="query",text=""}"#
            ),
            Some(55.0)
        );
        assert_eq!(
            value(
                &text,
                r#"topdown_span_p99_band_slots{category="total",key="2",model="intel-icl",span="query",text=""}"#
            ),
            Some(300.0)
        );
        assert!(
            !text.contains(r#"topdown_span_call_slots_count{key="other""#),
            "{text}"
        );
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

    /// A closed `--duty-cycle` window of `leaf` calls: `[slots, retired, dropped, cache-misses]`
    /// inclusive and exclusive.
    fn window(attached_ms: u64, elapsed_ms: u64, calls: u64, values: [u64; 4]) -> Window {
        Window {
            attached: Duration::from_millis(attached_ms),
            elapsed: Duration::from_millis(elapsed_ms),
            calls: vec![CallCounts {
                key: CallKey {
                    function: 0,
                    parent: ROOT_FUNCTION,
                    tgid: 0,
                    _pad: 0,
                },
                calls,
                unwound: 0,
                callee_calls: 0,
                inclusive: slots(values),
                exclusive: slots(values),
            }],
        }
    }

    #[test]
    fn sampled_windows_are_scaled_by_their_fraction_and_marked_as_estimates() {
        let functions = [("/usr/bin/app".to_owned(), "leaf".to_owned())];
        let naming = naming(&NO_PATHS, &functions, true);
        let mut exporter = Exporter::new("intel-icl".into(), true, limits(100, 300));
        exporter.start_sampling(Duration::from_secs(4));
        let now = Instant::now();
        // Refreshes carry no function counts under --duty-cycle; processes stay exact.
        exporter.update(&refresh(&[("app", [7, 0, 0, 1])]), &naming, now);
        let text = exporter.encode().unwrap();
        assert_eq!(value(&text, "topdown_function_probes_attached "), Some(1.0));
        assert!(!text.contains("topdown_function_sampled_ratio"), "{text}");
        assert_eq!(
            value(&text, "topdown_function_window_seconds_total "),
            Some(0.0)
        );
        exporter.set_attached(false);
        // Attached 1 s of 4 s: 3 calls stand for 12, 90 slots for 360, 2 misses for 8.
        exporter.add_window(window(1000, 4000, 3, [90, 90, 0, 2]), &naming, now);
        let label = r#"function="leaf",target="/usr/bin/app""#;
        let text = exporter.encode().unwrap();
        for (series, expected) in [
            (format!("topdown_function_calls_total{{{label}}}"), 12.0),
            (
                format!("topdown_function_sampled_calls_total{{{label}}}"),
                3.0,
            ),
            (
                r#"topdown_function_inclusive_slots_total{category="total",function="leaf",model="intel-icl",target="/usr/bin/app"}"#.to_owned(),
                360.0,
            ),
            (
                r#"topdown_function_exclusive_slots_total{category="retiring",function="leaf",model="intel-icl",target="/usr/bin/app"}"#.to_owned(),
                360.0,
            ),
            (
                format!(
                    r#"topdown_function_inclusive_events_total{{event="cache-misses",{label}}}"#
                ),
                8.0,
            ),
            (
                r#"topdown_process_slots_total{category="total",comm="app",model="intel-icl"}"#
                    .to_owned(),
                7.0,
            ),
            ("topdown_function_sampled_ratio ".to_owned(), 0.25),
            ("topdown_function_attached_seconds_total ".to_owned(), 1.0),
            ("topdown_function_window_seconds_total ".to_owned(), 4.0),
            ("topdown_function_probes_attached ".to_owned(), 0.0),
        ] {
            assert_eq!(value(&text, &series), Some(expected), "{series}\n{text}");
        }
        for family in [
            "topdown_function_calls_total",
            "topdown_function_inclusive_slots_total",
            "topdown_function_exclusive_slots_total",
            "topdown_function_inclusive_events_total",
            "topdown_function_exclusive_events_total",
        ] {
            let help = text
                .lines()
                .find(|line| line.starts_with(&format!("# HELP {family} ")))
                .unwrap();
            assert!(
                help.ends_with("(estimated under --duty-cycle: each window's counts divided by its topdown_function_sampled_ratio)"),
                "{help}"
            );
        }
        assert!(
            !text.lines().any(
                |line| line.starts_with("# HELP topdown_process_slots_total")
                    && line.contains("estimated")
            ),
            "{text}"
        );
        // The next window, attached half of it: 1 call stands for 2.
        exporter.add_window(window(2000, 4000, 1, [10, 10, 0, 0]), &naming, now);
        let text = exporter.encode().unwrap();
        assert_eq!(
            value(&text, &format!("topdown_function_calls_total{{{label}}}")),
            Some(14.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("topdown_function_sampled_calls_total{{{label}}}")
            ),
            Some(4.0)
        );
        assert_eq!(value(&text, "topdown_function_sampled_ratio "), Some(0.5));
        assert_eq!(
            value(&text, "topdown_function_attached_seconds_total "),
            Some(3.0)
        );
        assert_eq!(
            value(&text, "topdown_function_window_seconds_total "),
            Some(8.0)
        );
    }

    #[test]
    fn sampled_function_series_outlive_the_ttl_by_a_period() {
        let functions = [("/usr/bin/app".to_owned(), "leaf".to_owned())];
        let naming = naming(&NO_PATHS, &functions, false);
        let mut exporter = Exporter::new("intel-icl".into(), true, limits(100, 60));
        exporter.start_sampling(Duration::from_secs(120));
        let start = Instant::now();
        exporter.add_window(window(5000, 120_000, 1, [10, 0, 0, 0]), &naming, start);
        exporter.update(
            &refresh(&[("app", [1, 0, 0, 0])]),
            &naming,
            start + Duration::from_secs(61),
        );
        let text = exporter.encode().unwrap();
        assert!(
            text.contains("topdown_function_calls_total{"),
            "a function series waits for the next window: {text}"
        );
        exporter.update(
            &refresh(&[("app", [1, 0, 0, 0])]),
            &naming,
            start + Duration::from_secs(181),
        );
        let text = exporter.encode().unwrap();
        assert!(!text.contains("topdown_function_calls_total{"), "{text}");
        assert!(text.contains(r#"comm="app""#), "{text}");
    }
}
