//! The JSON results `topdown diff` compares, read into typed entities keyed so that two runs
//! of the same program (other pids, another host, another build directory) line up.
//!
//! Keys: a function by its symbol and its binary's file name (`parse (app)`), summed over
//! processes; a call-tree edge by caller and callee symbols; a process by its `comm`, summed
//! over processes of that name; a cgroup by its path; a span (issue 23's `spans[]`, written by
//! `--span`/`--postgres`) by its kind and key. Kinds a file does not have are absent, and
//! fields diff does not know are ignored. Every interval of an `-I` file is summed into one
//! run. Metrics are recomputed from the summed counters with the recorded model, never read.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::{
    error::{Failure, fail},
    model::Counts,
    report::Report,
};

/// What an entity is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Function,
    Edge,
    Span,
    Process,
    Cgroup,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Function,
        Kind::Edge,
        Kind::Span,
        Kind::Process,
        Kind::Cgroup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Function => "function",
            Kind::Edge => "edge",
            Kind::Span => "span",
            Kind::Process => "process",
            Kind::Cgroup => "cgroup",
        }
    }

    /// Whether the kind counts calls, so that its cost is per call (else the total weight).
    pub fn has_calls(self) -> bool {
        matches!(self, Kind::Function | Kind::Edge | Kind::Span)
    }
}

/// An entity, as it is matched between runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: Kind,
    pub name: String,
}

/// One entity's counts in one run (summed over its processes and intervals).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub calls: u64,
    /// Inclusive counts (the only ones for processes, cgroups, edges and spans).
    pub counters: Counts,
    /// Functions: exclusive counts (own work, probed callees taken out).
    pub exclusive: Option<Counts>,
}

impl Observed {
    fn add(&mut self, calls: u64, counters: &Counts, exclusive: Option<&Counts>) {
        self.calls += calls;
        add_counts(&mut self.counters, counters);
        if let Some(exclusive) = exclusive {
            add_counts(self.exclusive.get_or_insert_with(Counts::new), exclusive);
        }
    }
}

fn add_counts(into: &mut Counts, from: &Counts) {
    for (name, value) in from {
        let sum = into.entry(name.clone()).or_default();
        *sum = sum.saturating_add(*value);
    }
}

/// One run: a JSON result file.
#[derive(Clone, Debug)]
pub struct Run {
    pub path: PathBuf,
    pub model: String,
    pub weight_counter: String,
    pub level: u8,
    pub counter_names: Vec<String>,
    pub synthetic: bool,
    pub entities: BTreeMap<Key, Observed>,
    /// The first interval's report with the call tree summed over intervals and processes
    /// (for the differential icicle's layout).
    pub report: Report,
}

/// A span of issue 23's `spans[]`; only what diff needs.
#[derive(Clone, Debug, Deserialize)]
struct SpanRecord {
    kind: String,
    key: serde_json::Value,
    #[serde(default)]
    calls: u64,
    #[serde(default)]
    counters: Counts,
}

/// A result file as diff reads it: the report and what other versions add.
#[derive(Deserialize)]
struct Recording {
    #[serde(flatten)]
    report: Report,
    #[serde(default)]
    spans: Vec<SpanRecord>,
}

fn file_name(target: &str) -> &str {
    Path::new(target)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(target)
}

/// `kind: key`, or the kind alone for kinds without a key (their key is empty).
fn span_name(span: &SpanRecord) -> String {
    let key = match &span.key {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if key.is_empty() {
        span.kind.clone()
    } else {
        format!("{}: {key}", span.kind)
    }
}

pub fn edge_name(caller: Option<&str>, callee: &str) -> String {
    format!("{} -> {callee}", caller.unwrap_or("(root)"))
}

/// Reads one run. Errors name the file and are usage errors (exit 2).
pub fn load(path: &Path) -> anyhow::Result<Run> {
    let recordings: Vec<Recording> = crate::report::load_results(path)
        .map_err(|err| fail(Failure::Usage, format!("{err:#}")))?;
    let mut entities: BTreeMap<Key, Observed> = BTreeMap::new();
    let mut add =
        |kind: Kind, name: String, calls: u64, counters: &Counts, exclusive: Option<&Counts>| {
            entities
                .entry(Key { kind, name })
                .or_default()
                .add(calls, counters, exclusive);
        };
    let mut first: Option<Report> = None;
    let mut edges: BTreeMap<(Option<String>, String), crate::report::CallEdge> = BTreeMap::new();
    for recording in recordings {
        let report = recording.report;
        if let Some(first) = &first
            && (first.model != report.model || first.counter_names != report.counter_names)
        {
            return Err(fail(
                Failure::Usage,
                format!(
                    "{}: its intervals were recorded with different models or counters",
                    path.display()
                ),
            ));
        }
        for function in &report.functions {
            add(
                Kind::Function,
                format!("{} ({})", function.symbol, file_name(&function.target)),
                function.calls,
                &function.inclusive.counters,
                Some(&function.exclusive.counters),
            );
        }
        for edge in &report.call_tree {
            add(
                Kind::Edge,
                edge_name(edge.caller.as_deref(), &edge.callee),
                edge.calls,
                &edge.inclusive.counters,
                None,
            );
            let merged = edges
                .entry((edge.caller.clone(), edge.callee.clone()))
                .or_insert_with(|| crate::report::CallEdge {
                    caller: edge.caller.clone(),
                    callee: edge.callee.clone(),
                    pid: None,
                    calls: 0,
                    inclusive: crate::report::Entity::default(),
                });
            merged.calls += edge.calls;
            add_counts(&mut merged.inclusive.counters, &edge.inclusive.counters);
        }
        for process in &report.processes {
            add(
                Kind::Process,
                process.comm.clone(),
                0,
                &process.entity.counters,
                None,
            );
        }
        for cgroup in &report.cgroups {
            let name = cgroup
                .path
                .clone()
                .unwrap_or_else(|| format!("(cgroup {})", cgroup.id));
            add(Kind::Cgroup, name, 0, &cgroup.entity.counters, None);
        }
        for span in &recording.spans {
            add(
                Kind::Span,
                span_name(span),
                span.calls,
                &span.counters,
                None,
            );
        }
        if first.is_none() {
            first = Some(report);
        }
    }
    let Some(mut report) = first else {
        return Err(fail(
            Failure::Usage,
            format!("{} holds no topdown result", path.display()),
        ));
    };
    report.call_tree = edges.into_values().collect();
    report.interval = None;
    Ok(Run {
        path: path.to_owned(),
        model: report.model.clone(),
        weight_counter: report.weight_counter.clone(),
        level: report.level,
        counter_names: report.counter_names.clone(),
        synthetic: report.synthetic,
        entities,
        report,
    })
}

/// Checks that every run can be compared with the first: same model, the same kind of
/// counters (synthetic or not) and the same weight counter.
pub fn check_comparable(runs: &[&Run]) -> anyhow::Result<()> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    for run in &runs[1..] {
        // Each refusal names both files, what each was, and what runs to compare instead.
        let differ = |first_was: String, run_was: String, advice: &str| {
            Err(fail(
                Failure::Usage,
                format!(
                    "{} {first_was} and {} {run_was}: {advice}",
                    first.path.display(),
                    run.path.display(),
                ),
            ))
        };
        if run.model != first.model {
            return differ(
                format!("was recorded with model {}", first.model),
                format!("with {}", run.model),
                "compare runs of one model",
            );
        }
        if run.synthetic != first.synthetic {
            let synthetic = |run: &Run| {
                if run.synthetic {
                    "synthetic counters"
                } else {
                    "hardware counters"
                }
            };
            return differ(
                format!("was counted with {}", synthetic(first)),
                format!("with {}", synthetic(run)),
                "compare runs counted alike",
            );
        }
        if run.weight_counter != first.weight_counter {
            return differ(
                format!("weighs by {}", first.weight_counter),
                format!("by {}", run.weight_counter),
                "compare runs with one weight counter",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(kind: &str, key: serde_json::Value) -> SpanRecord {
        SpanRecord {
            kind: kind.to_owned(),
            key,
            calls: 1,
            counters: Counts::default(),
        }
    }

    #[test]
    fn spans_are_named_by_kind_and_key_or_kind_alone() {
        assert_eq!(span_name(&span("batch", "".into())), "batch");
        assert_eq!(span_name(&span("batch", serde_json::Value::Null)), "batch");
        assert_eq!(
            span_name(&span("query", "SELECT $1".into())),
            "query: SELECT $1"
        );
        assert_eq!(span_name(&span("request", 42.into())), "request: 42");
    }
}
