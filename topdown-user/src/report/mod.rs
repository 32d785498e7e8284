//! The result of a run, as data, and its renderers (table, JSON, CSV, SVG, pprof, folded
//! stacks).
//!
//! [`Report`] is exactly what `--format json` writes and what `topdown report -i` reads back.
//! Metrics are always derivable from `counters` with the recorded model, so `report -i`
//! recomputes them instead of trusting the file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Counts, Name};

pub mod csv;
pub mod entity;
pub mod folded;
pub mod json;
pub mod layout;
pub mod pprof;
pub mod stacks;
pub mod svg;
pub mod svg_distribution;
pub mod svg_parts;
mod svg_spans;
pub mod table;
mod table_bands;
mod table_spans;

pub use entity::Entity;

/// One run's (or one interval's) results.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// The topdown version that wrote this.
    pub topdown_version: String,
    /// The hardware model whose formulas apply (`intel-icl`, `software`): never `synthetic:`.
    pub model: String,
    /// True when the counters were syscall tracepoints standing in for hardware events.
    pub synthetic: bool,
    /// For synthetic runs: counter name -> `group:tracepoint`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub synthetic_map: BTreeMap<String, String>,
    /// TopDown level the metrics were computed at (0 for the software model).
    pub level: u8,
    /// Counter names in the model's order (leader first).
    pub counter_names: Vec<String>,
    /// `-e` events among the counters, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_events: Vec<String>,
    /// Ratios of `-e` events reported per entity (Knights Landing's offcore average latency:
    /// `crate::model::derived`), each entity's values in its `derived`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub derived: Vec<DerivedEntry>,
    /// The counter reports sort and weigh by (`slots`, `cpu-clock`).
    pub weight_counter: String,
    /// Seconds covered by this report (the interval's length in `-I` mode).
    pub duration_s: f64,
    /// `-I` mode: 1-based interval number and seconds since start at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<IntervalInfo>,
    /// What was traced: `system-wide`, `pid 123,456`, `command: make -j4`.
    pub scope: String,
    /// Everything counted on all CPUs (= tasks + idle + untracked + dropped); with `-- CMD`,
    /// from the command's start to its end.
    pub totals: Entity,
    /// The idle task (pid 0) on all CPUs.
    pub idle: Entity,
    /// Tasks outside the `-p`/`-- CMD` scope.
    pub untracked: Entity,
    /// Counts of tasks that did not fit in the task map.
    pub dropped: Entity,
    /// `-- CMD`: the command's own counts over its run, all its threads and processes
    /// (= totals - idle - untracked). Shares in the table are of this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Entity>,
    /// `-- CMD` with BPF: everything counted on all CPUs from the start of counting to the
    /// command's start (topdown's start-up, attaching, the probe calibration). In no other
    /// figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_command: Option<Entity>,
    /// Per thread (present with `--by task`).
    #[serde(default)]
    pub tasks: Vec<TaskEntry>,
    /// Per process (present with `--by process`).
    #[serde(default)]
    pub processes: Vec<ProcessEntry>,
    /// Per cgroup v2 (present with `--by cgroup`).
    #[serde(default)]
    pub cgroups: Vec<CgroupEntry>,
    /// `--cgroup-depth`: each cgroup entry includes its descendants' counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_depth: Option<usize>,
    /// Per probed function (`-u`), per process too with `--by function,task`.
    ///
    /// Always written, even empty: a `-u` run in which no probed call completed must still say
    /// "no functions" rather than look like a run without `-u` (that is what `overflows` tells).
    #[serde(default)]
    pub functions: Vec<FunctionEntry>,
    /// Caller -> callee edges among the probed functions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_tree: Vec<CallEdge>,
    /// With `-u`: probed calls not recorded because 64 were already open on the thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflows: Option<u64>,
    /// With `-u`: probed calls whose end was never seen (longjmp, `exit()` inside a probed
    /// function): left out of every total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_returns: Option<u64>,
    /// With `-u`: the function probes' own cost, measured at start and subtracted from the
    /// function figures (`crate::functions::calibration`); absent with `--no-compensation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_compensation: Option<crate::functions::calibration::record::CompensationReport>,
    /// Per span kind and key (`--span`, `--postgres`; `crate::spans::report`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<crate::spans::report::SpanEntry>,
    /// Hits of each `-U` probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usdt: Vec<crate::spans::report::UsdtEntry>,
    /// With spans or `-U`: their anomalies, summed over the CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_diagnostics: Option<topdown_common::usdt::SpanStats>,
    /// Per CPU totals.
    #[serde(default)]
    pub cpus: Vec<CpuEntry>,
    pub diagnostics: Diagnostics,
}

impl Report {
    /// Refuses an interval of an `-I` recording to a format (`output`: what it does, e.g.
    /// `--format pprof writes`) that shows one whole run.
    pub fn check_whole_run(&self, output: &str) -> anyhow::Result<()> {
        match &self.interval {
            Some(interval) => Err(crate::error::fail(
                crate::error::Failure::Usage,
                format!(
                    "{output} one whole run, but this is interval {} of an -I recording: record without -I",
                    interval.index
                ),
            )),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IntervalInfo {
    pub index: u64,
    pub end_s: f64,
}

/// A figure derived from two counters (`crate::model::derived::DerivedFigure`), as recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DerivedEntry {
    pub name: String,
    pub numerator: String,
    pub denominator: String,
    pub unit: String,
}

impl DerivedEntry {
    pub fn of(figure: &crate::model::derived::DerivedFigure) -> Self {
        Self {
            name: figure.name.clone(),
            numerator: figure.numerator.clone(),
            denominator: figure.denominator.clone(),
            unit: figure.unit.to_owned(),
        }
    }

    fn figure(&self) -> crate::model::derived::DerivedFigure {
        crate::model::derived::DerivedFigure {
            name: self.name.clone(),
            numerator: self.numerator.clone(),
            denominator: self.denominator.clone(),
            unit: "",
        }
    }
}

/// Every entity of a report, mutably: totals, idle, untracked, dropped, the command's, tasks,
/// processes, cgroups, functions (inclusive and exclusive) and call-tree edges, spans, and
/// the buckets of every distribution.
fn for_each_entity_mut(report: &mut Report, visit: impl FnMut(&mut Entity)) {
    use crate::functions::distribution::Distribution;
    let Report {
        totals,
        idle,
        untracked,
        dropped,
        command,
        before_command,
        tasks,
        processes,
        cgroups,
        functions,
        call_tree,
        spans,
        ..
    } = report;
    let functions = functions.iter_mut().flat_map(|function| {
        [&mut function.inclusive, &mut function.exclusive]
            .into_iter()
            .chain(
                function
                    .distribution
                    .iter_mut()
                    .flat_map(Distribution::entities_mut),
            )
    });
    let spans = spans.iter_mut().flat_map(|span| {
        std::iter::once(&mut span.entity).chain(
            span.distribution
                .iter_mut()
                .flat_map(Distribution::entities_mut),
        )
    });
    [totals, idle, untracked, dropped]
        .into_iter()
        .chain(command.as_mut())
        .chain(before_command.as_mut())
        .chain(tasks.iter_mut().map(|task| &mut task.entity))
        .chain(processes.iter_mut().map(|process| &mut process.entity))
        .chain(cgroups.iter_mut().map(|cgroup| &mut cgroup.entity))
        .chain(functions)
        .chain(call_tree.iter_mut().map(|edge| &mut edge.inclusive))
        .chain(spans)
        .for_each(visit);
}

/// Fills every entity's `derived` values from its counters (the report's figures, recomputed
/// like the metrics: never trusted from a file).
pub fn fill_derived(report: &mut Report) {
    // Each figure's name once, shared by every entity's map.
    let figures: Vec<_> = report
        .derived
        .iter()
        .map(|entry| (Name::from(&entry.name), entry.figure()))
        .collect();
    for_each_entity_mut(report, |entity| {
        entity.derived = figures
            .iter()
            .filter_map(|(name, figure)| figure.value(&entity.counters).map(|value| (name, value)))
            .collect();
    });
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskEntry {
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    /// The thread ended during the run.
    pub exited: bool,
    #[serde(flatten)]
    pub entity: Entity,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessEntry {
    pub pid: u32,
    pub comm: String,
    pub threads: u32,
    #[serde(flatten)]
    pub entity: Entity,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CgroupEntry {
    /// cgroup v2 id (0 for the bucket of counts whose cgroup did not fit the map).
    pub id: u64,
    /// Path relative to the cgroup v2 root (`/` is the root); `null` if it vanished unseen.
    pub path: Option<String>,
    /// Container, pod and systemd unit read from the path; `null` outside any.
    pub container: Option<crate::cgroup::container::ContainerInfo>,
    #[serde(flatten)]
    pub entity: Entity,
}

/// One probed function's totals.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FunctionEntry {
    /// The binary or library it is in.
    pub target: String,
    /// Demangled name.
    pub symbol: String,
    /// The process, with `--by function,task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub calls: u64,
    /// Of `calls`, those that ended by unwinding (an exception or panic caught above, a thread
    /// cancelled or leaving by `pthread_exit`): counted up to the moment unwinding ended.
    #[serde(default)]
    pub unwound: u64,
    /// How its returns were probed (`uretprobe` or `exit`), and why (`--returns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_probe: Option<crate::functions::unwinding::ReturnProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_probe_reason: Option<String>,
    /// The kernel single-steps its first instruction (not one of the emulated nop, push, jmp,
    /// call, jcc): each call costs a second trap.
    #[serde(default)]
    pub entry_single_step: bool,
    /// Counts from entry to return, probed callees included.
    pub inclusive: Entity,
    /// Inclusive minus the inclusive counts of probed callees.
    pub exclusive: Entity,
    /// Its calls by inclusive weight per call, each bucket with its own TopDown split
    /// (`crate::functions::distribution`); absent where no call was recorded in a histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<crate::functions::distribution::Distribution>,
}

/// A caller -> callee edge of the probed call tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CallEdge {
    /// The probed caller's symbol, or `null` for calls with no probed caller.
    pub caller: Option<String>,
    pub callee: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub calls: u64,
    pub inclusive: Entity,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CpuEntry {
    pub cpu: u32,
    pub counters: Counts,
}

/// How trustworthy the numbers are.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Diagnostics {
    /// Successful counter readings by the BPF programs.
    pub readings: u64,
    /// Readings where the counter group had not been running the whole time since the previous
    /// one (multiplexing or a pinned group in error state): those deltas cover less time.
    pub not_running_readings: u64,
    /// Readings that failed; their deltas were attributed at the next successful reading.
    pub read_errors: u64,
    /// Task map insertions refused because the map was full (raise `--max-tasks`).
    pub task_map_full: u64,
    /// Exit records the ring buffer could not take (collected from the map instead).
    pub exit_records_lost: u64,
    /// Cgroup map insertions refused because the map was full (raise `--max-cgroups`).
    #[serde(default)]
    pub cgroup_map_full: u64,
    /// Function entries not recorded because 64 probed calls were already open on the thread
    /// (the kernel's uretprobe nesting limit).
    #[serde(default)]
    pub overflows: u64,
    /// Probed calls whose end was never seen (longjmp, `exit()` inside a probed function,
    /// unwinding that no probed catch point ended): left out of every total.
    #[serde(default)]
    pub missed_returns: u64,
    /// Returns that matched no recorded entry.
    #[serde(default)]
    pub unmatched_returns: u64,
    /// Probe hits whose counters could not be read consistently.
    #[serde(default)]
    pub probe_read_failures: u64,
    /// Shadow stacks or function entries that did not fit their maps.
    #[serde(default)]
    pub probe_map_full: u64,
    /// Probed calls in the function totals but in no per-call histogram: their bucket was new
    /// and the histogram map full (raise `--max-buckets`).
    #[serde(default)]
    pub histogram_full: u64,
    /// Probed calls that ended in a tail call to a function whose end cannot be known (its
    /// returns are not probed: another library, a PLT stub, no symbol): their inclusive figure
    /// stops at the jump.
    #[serde(default)]
    pub tail_calls_cut: u64,
    /// Go: goroutines with open probed frames found on another thread than the one they were
    /// last seen joining, without their leaving it seen; what they ran there is not in their
    /// calls.
    #[serde(default)]
    pub goroutine_switches_lost: u64,
    /// Processes that moved themselves to another cgroup while the one they left was unknown:
    /// their counts since their CPU's last reading went to the cgroup they moved to.
    #[serde(default)]
    pub unsplit_migrations: u64,
    /// Tasks found running although no `sched_switch` reported their arrival (the kernel does
    /// not fire it for every switch); with `-p`, `-- CMD` or `-G` those arriving after an
    /// untraced task's reading are credited from it (docs/accuracy.md, Unseen switches).
    #[serde(default)]
    pub unseen_switches: u64,
    /// Readings credited to a traced task found running while no reading covered its arrival
    /// (an unseen switch out of a process not known yet to leave unseen, after switches
    /// between untraced tasks that took none): what ran on its CPU since the last reading,
    /// untraced tasks included, is in its counts (docs/accuracy.md, Unseen switches).
    #[serde(default)]
    pub unseen_arrivals: u64,
    /// Without BPF (`--no-bpf`): tasks of the command whose own counts could not be told apart
    /// (still running at the end, or exit readings lost): their counts are in the command's
    /// main thread.
    #[serde(default)]
    pub unsplit_tasks: u64,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
    /// The probed call tree as an icicle graph plus per-function exclusive TopDown bars.
    Svg,
    /// Gzipped profile.proto: one sample per call path with its exclusive values.
    Pprof,
    /// Collapsed stacks, one `frame;frame WEIGHT` line per call path.
    Folded,
}

/// What an SVG frame's width measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// The report's weight counter (`slots`, `cycles`, `cpu-clock`), inclusive.
    Slots,
    /// Probed calls: the edge's own and, nested inside, its callees'.
    Calls,
}

/// Breakdowns a report shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum By {
    Task,
    Process,
    Cgroup,
    Function,
    /// Spans per kind and key (`--span`, `--postgres`; `--by query` says the same).
    Span,
}

/// Recomputes every metric from its counters with `model` at `level` (the file's metrics are
/// never trusted: they may come from another version or have been edited).
pub fn recompute(report: &mut Report, model: &dyn crate::model::Model, level: u8) {
    report.level = level;
    let evaluator = crate::model::Evaluator::new(model, &report.counter_names);
    for_each_entity_mut(report, |entity| {
        let evaluation = evaluator.evaluate_named(&entity.counters, level);
        entity.metrics = evaluation.metrics;
        entity.estimated = evaluation.estimated;
    });
    // Percentiles, like metrics, follow from what the file counted, not from what it says.
    let distributions = report
        .functions
        .iter_mut()
        .filter_map(|function| function.distribution.as_mut())
        .chain(
            report
                .spans
                .iter_mut()
                .filter_map(|span| span.distribution.as_mut()),
        );
    for distribution in distributions {
        distribution.percentiles = distribution.estimate_percentiles();
    }
    fill_derived(report);
}

/// Reads a JSON result: one object, or one object per line (`-I` mode).
pub fn load_reports(path: &std::path::Path) -> anyhow::Result<Vec<Report>> {
    load_results(path)
}

/// Reads a JSON result as `T` (a [`Report`], or a view of one with more fields): one object,
/// or one object per line (`-I` mode).
pub fn load_results<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> anyhow::Result<Vec<T>> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(path).map_err(|err| {
        crate::error::fail(
            crate::error::Failure::Usage,
            format!("cannot read {}: {err}", path.display()),
        )
    })?;
    if let Ok(report) = serde_json::from_str::<T>(&text) {
        return Ok(vec![report]);
    }
    let mut reports = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let report = serde_json::from_str(line)
            .map_err(|err| {
                crate::error::fail(
                    crate::error::Failure::Usage,
                    format!(
                        "{} line {}: not a topdown JSON result ({err})",
                        path.display(),
                        number + 1
                    ),
                )
            })
            .with_context(|| format!("reading {}", path.display()))?;
        reports.push(report);
    }
    if reports.is_empty() {
        return Err(crate::error::fail(
            crate::error::Failure::Usage,
            format!("{} holds no topdown result", path.display()),
        ));
    }
    Ok(reports)
}

/// Writes `report` in `format`, showing the `by` breakdowns (SVG: the call tree, sized by
/// `weight`).
pub fn render(
    report: &Report,
    format: Format,
    by: &[By],
    weight: Weight,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    match format {
        Format::Table => table::write_table(report, by, out),
        Format::Json => json::write_json_line(report, out),
        Format::Csv => csv::write_csv(report, by, out),
        Format::Svg => svg::write_svg(report, weight, out),
        Format::Pprof => pprof::write_pprof(report, by, out),
        Format::Folded => folded::write_folded(report, by, weight, out),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cgroup::container::ContainerInfo;
    use crate::model::Model;

    /// Counts for every counter of `model`, different per `seed` so rows can be told apart.
    fn counts(model: &dyn Model, seed: u64) -> Counts {
        model
            .counters()
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let value = match index {
                    0 => 10_000 * seed,
                    _ => (700 + 311 * index as u64) * seed + index as u64,
                };
                (spec.name.clone(), value)
            })
            .collect()
    }

    /// An entity with counters and the metrics `model` gives them at `level`.
    fn entity(model: &dyn Model, level: u8, seed: u64) -> Entity {
        let counters = counts(model, seed);
        let evaluation = crate::model::evaluate(model, &counters, level);
        Entity {
            counters,
            metrics: evaluation.metrics,
            estimated: evaluation.estimated,
            ..Entity::default()
        }
    }

    /// `report` rendered in `format` (a text one), by `by`, weighed by slots.
    fn rendered(report: &Report, format: Format, by: &[By]) -> String {
        let mut bytes = Vec::new();
        render(report, format, by, Weight::Slots, &mut bytes).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    /// The words of the first line of `text` that `pick` picks; the test fails, showing `text`,
    /// where none does.
    pub(crate) fn words_of_line(text: &str, pick: impl Fn(&str) -> bool) -> Vec<String> {
        text.lines()
            .find(|line| pick(line))
            .unwrap_or_else(|| panic!("no such line in:\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// A system-wide second of `intel-icl` at level 1, weighed by `slots`, its one counter, in
    /// which nothing was counted: zero entities, every breakdown empty, no diagnostics. Tests
    /// fill in what they look at.
    pub(crate) fn empty_report() -> Report {
        Report {
            topdown_version: "0".into(),
            model: "intel-icl".into(),
            synthetic: false,
            synthetic_map: BTreeMap::new(),
            level: 1,
            counter_names: vec!["slots".into()],
            extra_events: Vec::new(),
            derived: Vec::new(),
            weight_counter: "slots".into(),
            duration_s: 1.0,
            interval: None,
            scope: "system-wide".into(),
            totals: Entity::default(),
            idle: Entity::default(),
            untracked: Entity::default(),
            dropped: Entity::default(),
            command: None,
            before_command: None,
            tasks: Vec::new(),
            processes: Vec::new(),
            cgroups: Vec::new(),
            cgroup_depth: None,
            functions: Vec::new(),
            call_tree: Vec::new(),
            overflows: None,
            missed_returns: None,
            probe_compensation: None,
            spans: Vec::new(),
            usdt: Vec::new(),
            span_diagnostics: None,
            cpus: Vec::new(),
            diagnostics: Diagnostics::default(),
        }
    }

    /// A report of `model_name` at `level` with every kind of entity: totals, idle, untracked,
    /// dropped, two tasks, a process, two functions (one per process), an edge and a cgroup.
    pub(crate) fn report_of(model_name: &str, level: u8) -> Report {
        let model = crate::model::base_model(model_name).unwrap();
        let model = model.as_ref();
        Report {
            model: model_name.into(),
            level,
            counter_names: model.counters().into_iter().map(|spec| spec.name).collect(),
            weight_counter: model.weight_counter().into(),
            duration_s: 1.5,
            interval: Some(IntervalInfo {
                index: 3,
                end_s: 4.5,
            }),
            totals: entity(model, level, 20),
            idle: entity(model, level, 1),
            untracked: entity(model, level, 2),
            dropped: entity(model, level, 3),
            command: Some(entity(model, level, 17)),
            before_command: Some(entity(model, level, 9)),
            tasks: vec![
                TaskEntry {
                    tid: 101,
                    tgid: 100,
                    comm: "worker, \"one\"".into(),
                    exited: false,
                    entity: entity(model, level, 4),
                },
                TaskEntry {
                    tid: 102,
                    tgid: 100,
                    comm: "worker2".into(),
                    exited: true,
                    entity: entity(model, level, 5),
                },
            ],
            processes: vec![ProcessEntry {
                pid: 100,
                comm: "server".into(),
                threads: 2,
                entity: entity(model, level, 9),
            }],
            cgroups: vec![CgroupEntry {
                id: 77,
                path: Some("/system.slice/a, \"b\".service".into()),
                container: Some(ContainerInfo {
                    runtime: Some("docker".into()),
                    id: Some("0123456789ab".into()),
                    ..ContainerInfo::default()
                }),
                entity: entity(model, level, 11),
            }],
            functions: vec![
                FunctionEntry {
                    target: "/usr/bin/server".into(),
                    symbol: "parse<i32>".into(),
                    pid: Some(100),
                    calls: 42,
                    unwound: 0,
                    return_probe: None,
                    return_probe_reason: None,
                    entry_single_step: false,
                    inclusive: entity(model, level, 7),
                    exclusive: entity(model, level, 6),
                    distribution: None,
                },
                FunctionEntry {
                    target: "/lib/libc.so.6".into(),
                    symbol: "malloc".into(),
                    pid: None,
                    calls: 9,
                    unwound: 0,
                    return_probe: None,
                    return_probe_reason: None,
                    entry_single_step: false,
                    inclusive: entity(model, level, 8),
                    exclusive: entity(model, level, 8),
                    distribution: None,
                },
            ],
            call_tree: vec![CallEdge {
                caller: Some("parse<i32>".into()),
                callee: "malloc".into(),
                pid: Some(100),
                calls: 9,
                inclusive: entity(model, level, 8),
            }],
            overflows: Some(0),
            missed_returns: Some(0),
            ..empty_report()
        }
    }

    pub(crate) fn full_report(level: u8) -> Report {
        report_of("intel-icl", level)
    }

    /// Every entity of a report, named, in a fixed order.
    fn entities(report: &Report) -> Vec<(String, &Entity)> {
        let mut all = vec![
            ("totals".to_owned(), &report.totals),
            ("idle".to_owned(), &report.idle),
            ("untracked".to_owned(), &report.untracked),
            ("dropped".to_owned(), &report.dropped),
        ];
        all.extend(report.command.iter().map(|c| ("command".to_owned(), c)));
        all.extend(
            report
                .before_command
                .iter()
                .map(|b| ("before_command".to_owned(), b)),
        );
        all.extend(
            report
                .tasks
                .iter()
                .map(|t| (format!("task {}", t.tid), &t.entity)),
        );
        all.extend(
            report
                .processes
                .iter()
                .map(|p| (format!("process {}", p.pid), &p.entity)),
        );
        all.extend(
            report
                .cgroups
                .iter()
                .map(|c| (format!("cgroup {}", c.id), &c.entity)),
        );
        for function in &report.functions {
            all.push((
                format!("{} inclusive", function.symbol),
                &function.inclusive,
            ));
            all.push((
                format!("{} exclusive", function.symbol),
                &function.exclusive,
            ));
        }
        all.extend(
            report
                .call_tree
                .iter()
                .map(|e| (format!("edge -> {}", e.callee), &e.inclusive)),
        );
        all
    }

    /// Recomputing a level-1 recording at level 2 (and back) must reach every entity: a
    /// level-2 header over level-1 function or cgroup metrics would show nothing for them.
    #[test]
    fn recompute_reaches_every_entity() {
        for model_name in ["intel-icl", "intel-spr"] {
            let model = crate::model::base_model(model_name).unwrap();
            let mut report = report_of(model_name, 1);
            recompute(&mut report, model.as_ref(), 2);
            assert_eq!(report.level, 2);
            let level_two = report_of(model_name, 2);
            assert_eq!(report, level_two, "{model_name}");
            for (name, entity) in entities(&report) {
                assert_eq!(entity.metrics.len(), 12, "{model_name} {name}");
                let expected = crate::model::evaluate(model.as_ref(), &entity.counters, 2);
                assert_eq!(entity.metrics, expected.metrics, "{model_name} {name}");
            }
            // intel-spr computes level 2 from PERF_METRICS: real values, not just keys.
            if model_name == "intel-spr" {
                let memory = report.functions[0].inclusive.metrics["memory_bound"];
                assert!(memory.is_some_and(|v| v > 0.0), "{memory:?}");
            }
            recompute(&mut report, model.as_ref(), 1);
            assert_eq!(report, report_of(model_name, 1), "{model_name}");
            for (name, entity) in entities(&report) {
                assert_eq!(entity.metrics.len(), 4, "{model_name} {name}");
            }
        }
    }

    /// `report -l 2` over a level-1 recording renders in all three formats, with the level-2
    /// columns for every breakdown.
    /// Knights Landing's offcore average latency (OUTSTANDING / ANY_RESPONSE counts, in core
    /// cycles) is recomputed from each entity's counters and written by every format.
    #[test]
    fn derived_offcore_latency_is_recomputed_and_rendered() {
        let outstanding = "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING";
        let responses = "knl::OFFCORE_RESPONSE_1:DMND_DATA_RD:ANY_RESPONSE";
        let model = crate::model::base_model("intel-knl").unwrap();
        let mut report = report_of("intel-knl", 1);
        report
            .counter_names
            .extend([outstanding.to_owned(), responses.to_owned()]);
        report.extra_events = vec![outstanding.to_owned(), responses.to_owned()];
        report.derived = vec![DerivedEntry {
            name: "offcore_latency".into(),
            numerator: outstanding.into(),
            denominator: responses.into(),
            unit: "core cycles".into(),
        }];
        report.totals.counters.insert(outstanding, 3000);
        report.totals.counters.insert(responses, 12);
        report.tasks[0].entity.counters.insert(outstanding, 500);
        report.tasks[0].entity.counters.insert(responses, 0);
        // A value in the file is never trusted.
        report.totals.derived.insert("offcore_latency", 1.0);
        recompute(&mut report, model.as_ref(), 1);
        assert_eq!(report.totals.derived.get("offcore_latency"), Some(&250.0));
        // Nothing below the line: no figure rather than infinity.
        assert!(report.tasks[0].entity.derived.is_empty());
        assert!(report.idle.derived.is_empty());

        let by = [By::Task];
        let json = rendered(&report, Format::Json, &by);
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back.derived, report.derived);
        assert_eq!(back.totals.derived.get("offcore_latency"), Some(&250.0));
        let csv = rendered(&report, Format::Csv, &by);
        let mut reader = ::csv::Reader::from_reader(csv.as_bytes());
        let header = reader.headers().unwrap().clone();
        let column = header
            .iter()
            .position(|name| name == "offcore_latency")
            .unwrap();
        let total = reader.records().next().unwrap().unwrap();
        assert_eq!(&total[column], "250");
        let text = rendered(&report, Format::Table, &by);
        assert!(text.contains("offcore_latency (core cycles)"), "{text}");
        assert!(text.contains("250.0"), "{text}");
    }

    #[test]
    fn recomputed_reports_render_in_every_format() {
        let by = [By::Task, By::Process, By::Cgroup, By::Function];
        let model = crate::model::base_model("intel-spr").unwrap();
        let mut report = report_of("intel-spr", 1);
        recompute(&mut report, model.as_ref(), 2);

        let json = rendered(&report, Format::Json, &by);
        // serde_json parses floats to within an ULP (no `float_roundtrip`): compare counters
        // exactly and metrics by key and value to 1e-12.
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back.level, 2);
        for ((name, read), (_, written)) in entities(&back).into_iter().zip(entities(&report)) {
            assert_eq!(read.counters, written.counters, "{name}");
            assert!(
                read.metrics.keys().eq(written.metrics.keys()),
                "{name}: {:?}",
                read.metrics
            );
            for (key, value) in &read.metrics {
                let expected = written.metrics[key];
                assert_eq!(value.is_some(), expected.is_some(), "{name} {key}");
                let difference = (value.unwrap_or(0.0) - expected.unwrap_or(0.0)).abs();
                assert!(difference < 1e-12, "{name} {key}: {value:?} {expected:?}");
            }
        }

        let csv = rendered(&report, Format::Csv, &by);
        let mut reader = ::csv::Reader::from_reader(csv.as_bytes());
        let header = reader.headers().unwrap().clone();
        let memory = header.iter().position(|h| h == "memory_bound").unwrap();
        let kind = header.iter().position(|h| h == "kind").unwrap();
        let rows: Vec<::csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        let function = rows.iter().find(|row| &row[kind] == "function").unwrap();
        assert_eq!(
            function[memory].parse::<f64>().ok(),
            report.functions[0].inclusive.metrics["memory_bound"]
        );
        let cgroup = rows.iter().find(|row| &row[kind] == "cgroup").unwrap();
        assert_eq!(
            cgroup[memory].parse::<f64>().ok(),
            report.cgroups[0].entity.metrics["memory_bound"]
        );

        let table = rendered(&report, Format::Table, &by);
        assert!(table.contains("parse<i32>"), "{table}");
        assert!(table.contains("system.slice"), "{table}");
    }

    /// A distribution survives `--format json` -> `report -i`: buckets, bounds and counters as
    /// written; metrics and percentiles recomputed from them (a level-2 replay of a level-1
    /// recording gives every bucket its level-2 split), never taken from the file.
    #[test]
    fn distributions_round_trip_and_are_recomputed() {
        use crate::functions::distribution::{BucketCounts, Distribution};
        use crate::session::aggregate::SlotCounts;
        let model = crate::model::base_model("intel-spr").unwrap();
        let names: Vec<String> = model.counters().into_iter().map(|spec| spec.name).collect();
        let evaluator = crate::model::Evaluator::new(model.as_ref(), &names);
        let entity = |counts: &SlotCounts| {
            let evaluation = evaluator.evaluate(&counts.0, 1);
            Entity {
                counters: counts.named(&names),
                metrics: evaluation.metrics,
                estimated: evaluation.estimated,
                ..Entity::default()
            }
        };
        let mut fast = SlotCounts::ZERO;
        let mut slow = SlotCounts::ZERO;
        for slot in 0..names.len() {
            fast.0[slot] = 10_000 + 37 * slot as u64;
            slow.0[slot] = 30_000 + 911 * slot as u64;
        }
        let mut report = report_of("intel-spr", 1);
        report.functions[0].distribution = Some(Distribution::of(
            "slots",
            [
                BucketCounts {
                    bucket: topdown_common::histogram::bucket(10),
                    calls: 1000,
                    counts: fast,
                },
                BucketCounts {
                    bucket: topdown_common::histogram::bucket(1000),
                    calls: 30,
                    counts: slow,
                },
            ],
            &entity,
        ));
        let written = report.functions[0].distribution.clone().unwrap();
        let json = rendered(&report, Format::Json, &[By::Function]);
        let mut edited: serde_json::Value = serde_json::from_str(&json).unwrap();
        let distribution = &mut edited["functions"][0]["distribution"];
        assert_eq!(distribution["weight"], "slots");
        assert_eq!(distribution["buckets"][0]["low"], 10);
        assert_eq!(distribution["buckets"][1]["high"], 1024);
        assert_eq!(distribution["buckets"][1]["calls"], 30);
        // Edited figures are recomputed, not trusted.
        distribution["percentiles"]["p50"] = serde_json::json!(1e9);
        distribution["buckets"][0]["metrics"]["retiring"] = serde_json::json!(2.0);
        let mut back: Report = serde_json::from_value(edited).unwrap();
        recompute(&mut back, model.as_ref(), 1);
        let read = back.functions[0].distribution.as_ref().unwrap();
        assert_eq!(read.buckets.len(), 2);
        for (read, written) in read.buckets.iter().zip(&written.buckets) {
            assert_eq!(
                (read.low, read.high, read.calls, &read.entity.counters),
                (
                    written.low,
                    written.high,
                    written.calls,
                    &written.entity.counters
                )
            );
            for (key, value) in &read.entity.metrics {
                let expected = written.entity.metrics[key];
                assert!((value.unwrap() - expected.unwrap()).abs() < 1e-12, "{key}");
            }
        }
        assert_eq!(read.percentiles, written.percentiles);
        recompute(&mut back, model.as_ref(), 2);
        let level_two = back.functions[0].distribution.as_ref().unwrap();
        for bucket in &level_two.buckets {
            assert_eq!(bucket.entity.metrics.len(), 12);
            let expected = crate::model::evaluate(model.as_ref(), &bucket.entity.counters, 2);
            assert_eq!(bucket.entity.metrics, expected.metrics);
        }
        // The table's fast and slow lines.
        let table = rendered(&back, Format::Table, &[By::Function]);
        let band = |label: &str| {
            words_of_line(&table, |line| {
                line.starts_with("parse<i32>") && line.contains(&format!(" {label} "))
            })
        };
        assert_eq!(
            band("p50")[1..7],
            ["100", "p50", "11", "[10,", "12)", "1000"],
            "{table}"
        );
        assert_eq!(
            band("p99")[1..7],
            ["100", "p99", "980", "[896,", "1024)", "30"],
            "{table}"
        );
    }

    /// A `-u` run with no completed call still says so: `"functions": []`, not no key.
    #[test]
    fn json_has_functions_even_when_none_completed() {
        let mut report = full_report(1);
        report.functions.clear();
        report.call_tree.clear();
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["functions"], serde_json::json!([]));
        // Files written before the key was always present still read.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("functions");
        let back: Report = serde_json::from_value(old).unwrap();
        assert_eq!(back, report);
    }
}
