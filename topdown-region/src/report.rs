//! The regions as a topdown JSON result (the schema `topdown --format json` writes and
//! `topdown report -i FILE` reads: topdown-user's `report::Report`), so the tool renders them:
//! one `functions` entry per region and thread with `target: "region"`, one `tasks` entry per
//! thread. Metrics come from the model's formulas through `topdown_model`'s [`Evaluator`];
//! `report -i` recomputes them from the counters anyway.
//!
//! topdown-user's structs are not used directly: that crate is the BPF tool, too heavy for a
//! library linked into programs. The schema is checked against the real `topdown report -i`
//! in `tests/report_cli.rs`.

use std::collections::BTreeMap;

use serde::Serialize;
use topdown_model::model::{Evaluator, Metrics};

use crate::regions::{Snapshot, ThreadRecord, with_setup};

/// What `functions[].target` says for a region.
pub const TARGET: &str = "region";

#[derive(Serialize)]
struct Report {
    topdown_version: String,
    model: String,
    synthetic: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    synthetic_map: BTreeMap<String, String>,
    level: u8,
    counter_names: Vec<String>,
    weight_counter: String,
    duration_s: f64,
    scope: String,
    totals: Entity,
    idle: Entity,
    untracked: Entity,
    dropped: Entity,
    tasks: Vec<Task>,
    processes: Vec<Process>,
    cgroups: Vec<()>,
    functions: Vec<Function>,
    call_tree: Vec<Edge>,
    overflows: u64,
    missed_returns: u64,
    cpus: Vec<()>,
    diagnostics: Diagnostics,
}

#[derive(Serialize, Default)]
struct Entity {
    counters: BTreeMap<String, u64>,
    metrics: Metrics,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    estimated: Vec<String>,
}

#[derive(Serialize)]
struct Task {
    tid: u32,
    tgid: u32,
    comm: String,
    exited: bool,
    #[serde(flatten)]
    entity: Entity,
}

#[derive(Serialize)]
struct Process {
    pid: u32,
    comm: String,
    threads: u32,
    #[serde(flatten)]
    entity: Entity,
}

#[derive(Serialize)]
struct Function {
    target: String,
    symbol: String,
    /// The thread id: region totals are per thread.
    pid: u32,
    calls: u64,
    inclusive: Entity,
    exclusive: Entity,
}

#[derive(Serialize)]
struct Edge {
    caller: Option<String>,
    callee: String,
    /// The thread id, as in [`Function`].
    pid: u32,
    calls: u64,
    inclusive: Entity,
}

/// topdown's diagnostics, with the region library's misuse in the function-probe fields that
/// mean the same thing.
#[derive(Serialize, Default)]
struct Diagnostics {
    readings: u64,
    not_running_readings: u64,
    read_errors: u64,
    task_map_full: u64,
    exit_records_lost: u64,
    /// Begins past the depth limit (`-u`: calls past 64 nested).
    overflows: u64,
    /// Regions never ended: open at thread exit, or closed by a mismatched end.
    missed_returns: u64,
    /// Ends with no matching begin.
    unmatched_returns: u64,
    probe_read_failures: u64,
}

/// The snapshot as one line of topdown JSON.
pub fn to_json(snapshot: &Snapshot) -> Result<String, String> {
    with_setup(|setup| {
        let Some(setup) = setup else {
            return Err(format!(
                "no report: the library has no model ({})",
                snapshot.setup_error.as_deref().unwrap_or("not set up")
            ));
        };
        let model = setup.model.as_ref();
        let evaluator = Evaluator::new(model, &snapshot.slot_names);
        let entity = |values: &[u64]| -> Entity {
            let counters: BTreeMap<String, u64> = snapshot
                .slot_names
                .iter()
                .cloned()
                .zip(values.iter().copied())
                .collect();
            let evaluation = evaluator.evaluate(values, snapshot.level);
            Entity {
                counters,
                metrics: evaluation.metrics,
                estimated: evaluation.estimated,
            }
        };
        let width = snapshot.slot_names.len();
        let mut totals = vec![0u64; width];
        let mut diagnostics = Diagnostics::default();
        let mut paths: Vec<String> = Vec::new();
        let pid = std::process::id();
        let mut tasks: Vec<Task> = Vec::new();
        let mut functions: Vec<Function> = Vec::new();
        let mut call_tree: Vec<Edge> = Vec::new();
        for thread in &snapshot.threads {
            for (total, value) in totals.iter_mut().zip(&thread.outermost) {
                *total = total.saturating_add(*value);
            }
            add_diagnostics(&mut diagnostics, thread);
            let path = format!("{} ({})", thread.path.name(), thread.reason);
            if !paths.contains(&path) {
                paths.push(path);
            }
            tasks.push(Task {
                tid: thread.tid,
                tgid: pid,
                comm: thread.comm.clone(),
                exited: thread.exited,
                entity: entity(&thread.outermost),
            });
            functions.extend(thread.regions.iter().map(|region| Function {
                target: TARGET.to_owned(),
                symbol: region.name.clone(),
                pid: thread.tid,
                calls: region.calls,
                inclusive: entity(&region.inclusive),
                exclusive: entity(&region.exclusive),
            }));
            call_tree.extend(thread.edges.iter().map(|edge| Edge {
                caller: edge.caller.clone(),
                callee: edge.callee.clone(),
                pid: thread.tid,
                calls: edge.calls,
                inclusive: entity(&edge.inclusive),
            }));
        }
        let report = Report {
            topdown_version: env!("CARGO_PKG_VERSION").to_owned(),
            model: model.recorded_name(),
            synthetic: model.is_synthetic(),
            synthetic_map: model.synthetic_map().into_iter().collect(),
            level: if model.max_level() == 0 {
                0
            } else {
                snapshot.level
            },
            counter_names: snapshot.slot_names.clone(),
            weight_counter: model.weight_counter().to_owned(),
            duration_s: snapshot.duration_s,
            scope: format!(
                "regions of pid {pid} (per thread: the pid column is the thread id; counters read by {})",
                paths.join(", ")
            ),
            processes: vec![Process {
                pid,
                comm: current_process_comm(),
                threads: snapshot.threads.len() as u32,
                entity: entity(&totals),
            }],
            totals: entity(&totals),
            idle: entity(&vec![0; width]),
            untracked: entity(&vec![0; width]),
            dropped: entity(&vec![0; width]),
            tasks,
            cgroups: Vec::new(),
            overflows: diagnostics.overflows,
            missed_returns: diagnostics.missed_returns,
            functions,
            call_tree,
            cpus: Vec::new(),
            diagnostics,
        };
        serde_json::to_string(&report).map_err(|err| format!("writing JSON: {err}"))
    })
}

fn add_diagnostics(diagnostics: &mut Diagnostics, thread: &ThreadRecord) {
    let misuse = &thread.misuse;
    diagnostics.readings += thread.readings - thread.read_errors.min(thread.readings);
    diagnostics.not_running_readings += thread.multiplexed_readings;
    diagnostics.read_errors += thread.read_errors;
    diagnostics.overflows += misuse.too_deep;
    diagnostics.missed_returns += misuse.open_at_exit + misuse.abandoned;
    diagnostics.unmatched_returns += misuse.unmatched_ends + misuse.unknown_ends;
}

fn current_process_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|text| text.trim_end().to_owned())
        .unwrap_or_default()
}

/// Writes the snapshot's JSON to `path`.
pub fn write_json(snapshot: &Snapshot, path: &std::path::Path) -> Result<(), String> {
    let mut text = to_json(snapshot)?;
    text.push('\n');
    std::fs::write(path, text).map_err(|err| format!("writing {}: {err}", path.display()))
}

/// A short text summary: each thread's path and each region's calls, counts and metrics.
pub fn summary(snapshot: &Snapshot) -> String {
    let mut text = String::new();
    if let Some(err) = &snapshot.setup_error {
        text += &format!("topdown-region: no counters: {err}\n");
    }
    with_setup(|setup| {
        let evaluator =
            setup.map(|setup| Evaluator::new(setup.model.as_ref(), &snapshot.slot_names));
        text += &format!(
            "topdown-region: model {} level {}, counters: {}\n",
            snapshot.model,
            snapshot.level,
            snapshot.slot_names.join(" ")
        );
        for thread in &snapshot.threads {
            text += &format!(
                "thread {} ({}){}: {} — {}\n",
                thread.tid,
                thread.comm,
                if thread.exited { ", exited" } else { "" },
                thread.path.name(),
                thread.reason
            );
            let misuse = &thread.misuse;
            if *misuse != Default::default() {
                text += &format!(
                    "  misuse: {} unmatched ends, {} mismatched ends ({} regions abandoned), {} unknown ends, {} too deep, {} open at exit\n",
                    misuse.unmatched_ends,
                    misuse.mismatched_ends,
                    misuse.abandoned,
                    misuse.unknown_ends,
                    misuse.too_deep,
                    misuse.open_at_exit
                );
            }
            for region in &thread.regions {
                let counts: Vec<String> = snapshot
                    .slot_names
                    .iter()
                    .zip(region.inclusive.iter().zip(&region.exclusive))
                    .map(|(name, (inclusive, exclusive))| {
                        format!("{name}={inclusive} (excl {exclusive})")
                    })
                    .collect();
                text += &format!(
                    "  {} calls={} {}\n",
                    region.name,
                    region.calls,
                    counts.join(" ")
                );
                if let Some(evaluator) = &evaluator
                    && snapshot.level > 0
                {
                    let metrics = evaluator
                        .evaluate(&region.exclusive, snapshot.level)
                        .metrics;
                    let shown: Vec<String> = metrics
                        .iter()
                        .filter_map(|(name, value)| {
                            value.map(|value| format!("{name} {:.1}%", value * 100.0))
                        })
                        .collect();
                    if !shown.is_empty() {
                        text += &format!("    exclusive: {}\n", shown.join(", "));
                    }
                }
            }
        }
    });
    text
}
