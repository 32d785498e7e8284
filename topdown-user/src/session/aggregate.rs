//! Turns what the BPF side attributed into a [`Report`], in two typed steps:
//!
//! 1. [`Aggregate`]: per-slot counts ([`SlotCounts`], which add and subtract like numbers) per
//!    task, process, cgroup, call edge and CPU, cumulative or, in interval mode, the deltas
//!    since a previous snapshot. Ids stay ids (tids, cgroup ids, function ids).
//! 2. [`report_of`]: names the slots, evaluates the model's metrics, names functions and cgroups,
//!    rolls cgroups up by depth, sorts. Strings appear only here, at the output.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    ops::Sub,
};

use compact_str::CompactString;
use foldhash::fast::RandomState as FastHash;
use topdown_common::{
    CallKey, CallStats, CpuState, HistogramBucket, HistogramKey, MAX_COUNTERS, ROOT_FUNCTION,
    TaskCounters, histogram,
};

pub use crate::session::slot_counts::{SlotCounts, SlotNamer};
use crate::{
    functions::distribution::{BucketCounts, Distribution},
    model::{Evaluator, Model},
    report::{
        CallEdge, CgroupEntry, CpuEntry, Diagnostics, Entity, FunctionEntry, IntervalInfo,
        ProcessEntry, Report, TaskEntry,
    },
    session::bpf::{Snapshot, earlier_by_key},
};

impl Sub for Diagnostics {
    type Output = Self;
    /// What happened between two cumulative readings.
    fn sub(self, earlier: Self) -> Self {
        fieldwise!(
            u64::saturating_sub,
            Diagnostics {
                readings,
                not_running_readings,
                read_errors,
                task_map_full,
                exit_records_lost,
                cgroup_map_full,
                overflows,
                missed_returns,
                unmatched_returns,
                probe_read_failures,
                probe_map_full,
                tail_calls_cut,
                histogram_full,
                goroutine_switches_lost,
                unsplit_migrations,
                unseen_switches,
                unseen_arrivals,
                unsplit_tasks
            },
            self,
            earlier
        )
    }
}

/// Maps on a refresh's path, keyed by ids the kernel gives, not by anyone's input: a fast
/// hash, where the standard one (SipHash) measured a tenth of the aggregate at 100000 tasks.
type FastMap<K, V> = HashMap<K, V, FastHash>;

/// One thread's counts.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskCounts {
    pub tid: u32,
    pub tgid: u32,
    /// Inline, not allocated: a refresh builds one per thread on the machine.
    pub comm: CompactString,
    /// The thread ended (its exit record arrived).
    pub exited: bool,
    pub counts: SlotCounts,
}

/// One process's counts: the sum of its threads.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessCounts {
    pub pid: u32,
    /// The main thread's name (another thread's if the main thread was not seen).
    pub comm: CompactString,
    pub threads: u32,
    pub counts: SlotCounts,
}

/// One caller -> callee edge of the probed functions (`key.tgid` 0 unless split by process).
#[derive(Clone, Copy, Debug)]
pub struct CallCounts {
    pub key: CallKey,
    pub calls: u64,
    /// Of `calls`, those that ended by unwinding.
    pub unwound: u64,
    pub inclusive: SlotCounts,
    pub exclusive: SlotCounts,
    /// Returns of probed callees during these calls.
    pub callee_calls: u64,
}

/// One bucket of a per-call histogram (`topdown_common::histogram`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistogramCounts {
    pub key: HistogramKey,
    pub calls: u64,
    /// Returns of probed callees during these calls.
    pub callee_calls: u64,
    /// The calls' inclusive counts, summed.
    pub counts: SlotCounts,
}

impl HistogramCounts {
    fn of(key: &HistogramKey, bucket: &HistogramBucket) -> Self {
        Self {
            key: *key,
            calls: bucket.calls,
            callee_calls: bucket.callee_calls,
            counts: SlotCounts(bucket.counters),
        }
    }

    pub fn bucket(&self) -> BucketCounts {
        BucketCounts {
            bucket: self.key.bucket,
            calls: self.calls,
            counts: self.counts,
        }
    }
}

/// Everything counted, by entity, as typed counts: cumulative since the baseline, or the
/// deltas between two snapshots.
#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    /// Everything counted on all CPUs (= tasks + idle + untracked + dropped).
    pub totals: SlotCounts,
    pub idle: SlotCounts,
    pub untracked: SlotCounts,
    pub dropped: SlotCounts,
    /// Every task instance (exited ones first, in exit order); in interval mode only those
    /// that counted something.
    pub tasks: Vec<TaskCounts>,
    /// By pid.
    pub processes: Vec<ProcessCounts>,
    /// Each cgroup's own counts by cgroup id; id 0 holds what did not fit the cgroup map. In
    /// interval mode only cgroups that counted something.
    pub cgroups: Vec<(u64, SlotCounts)>,
    /// In interval mode only edges with calls in the interval.
    pub calls: Vec<CallCounts>,
    /// Per-call histogram buckets; in interval mode only those with calls in the interval.
    pub histograms: Vec<HistogramCounts>,
    /// Per CPU totals.
    pub cpus: Vec<(u32, SlotCounts)>,
    pub diagnostics: Diagnostics,
    /// Span totals and USDT hits (`crate::spans`).
    pub spans: crate::spans::report::SpanAggregate,
}

impl Aggregate {
    /// Everything in `current`, or (interval mode) what happened since `previous`.
    pub fn since(current: &Snapshot, previous: Option<&Snapshot>) -> Self {
        Self::between(current, previous, previous.is_some())
    }

    /// What happened since `start` (a command's start: `CountingSession::mark_command_start`),
    /// every task, cgroup and call edge of `current` listed, as in a whole run's report.
    pub fn since_start(current: &Snapshot, start: &Snapshot) -> Self {
        Self::between(current, Some(start), false)
    }

    /// The difference; `only_active` keeps only the tasks, cgroups and call edges that counted
    /// something since `previous` (interval mode).
    fn between(current: &Snapshot, previous: Option<&Snapshot>, only_active: bool) -> Self {
        let per_cpu =
            |snapshot: &Snapshot, pick: fn(&CpuState) -> &[u64; MAX_COUNTERS]| -> SlotCounts {
                snapshot
                    .cpus
                    .iter()
                    .map(|(_, state)| SlotCounts(*pick(state)))
                    .sum()
            };
        let delta = |pick: fn(&CpuState) -> &[u64; MAX_COUNTERS]| -> SlotCounts {
            let now = per_cpu(current, pick);
            match previous {
                Some(previous) => now - per_cpu(previous, pick),
                None => now,
            }
        };
        let tasks = task_deltas(current, previous, only_active);
        let processes = processes_of(&tasks);

        let cgroups_before: FastMap<u64, SlotCounts> = earlier_by_key(
            previous.map(|previous| previous.cgroups.as_slice()),
            |cgroup| SlotCounts(cgroup.counters),
        );
        let mut cgroups: Vec<(u64, SlotCounts)> = current
            .cgroups
            .iter()
            .map(|(id, cgroup)| {
                let now = SlotCounts(cgroup.counters);
                let before = cgroups_before.get(id).copied().unwrap_or_default();
                (*id, now - before)
            })
            .filter(|(_, counts)| !only_active || !counts.is_zero())
            .collect();
        let cgroup_dropped = delta(|state| &state.cgroup_dropped);
        if !cgroup_dropped.is_zero() {
            cgroups.push((0, cgroup_dropped));
        }

        // By index: an edge's stats are larger than the map's other bookkeeping.
        let calls_before: FastMap<CallKey, &CallStats> = earlier_by_key(
            previous.map(|previous| previous.calls.as_slice()),
            |stats| stats,
        );
        let calls = current
            .calls
            .iter()
            .map(|(key, stats)| {
                let now = CallCounts {
                    key: *key,
                    calls: stats.calls,
                    unwound: stats.unwound,
                    inclusive: SlotCounts(stats.inclusive),
                    exclusive: SlotCounts(stats.exclusive),
                    callee_calls: stats.callee_calls,
                };
                match calls_before.get(key) {
                    Some(old) => CallCounts {
                        calls: now.calls.saturating_sub(old.calls),
                        unwound: now.unwound.saturating_sub(old.unwound),
                        callee_calls: now.callee_calls.saturating_sub(old.callee_calls),
                        inclusive: now.inclusive - SlotCounts(old.inclusive),
                        exclusive: now.exclusive - SlotCounts(old.exclusive),
                        ..now
                    },
                    None => now,
                }
            })
            .filter(|call| !only_active || call.calls != 0)
            .collect();

        let histograms = histogram_deltas(current, previous);

        let cpus = current
            .cpus
            .iter()
            .map(|(cpu, state)| {
                let before = previous
                    .and_then(|previous| previous.cpus.iter().find(|(other, _)| other == cpu))
                    .map_or(SlotCounts::ZERO, |(_, state)| SlotCounts(state.total));
                (*cpu, SlotCounts(state.total) - before)
            })
            .collect();

        let diagnostics = match previous {
            Some(previous) => diagnostics_of(current) - diagnostics_of(previous),
            None => diagnostics_of(current),
        };

        Self {
            totals: delta(|state| &state.total),
            idle: delta(|state| &state.idle),
            untracked: delta(|state| &state.untracked),
            dropped: delta(|state| &state.dropped),
            tasks,
            processes,
            cgroups,
            calls,
            histograms,
            cpus,
            diagnostics,
            spans: crate::spans::report::SpanAggregate::since(
                &current.spans,
                previous.map(|previous| &previous.spans),
            ),
        }
    }
}

/// Every histogram bucket, or (interval mode) what each gained since `previous`.
fn histogram_deltas(current: &Snapshot, previous: Option<&Snapshot>) -> Vec<HistogramCounts> {
    let Some(previous) = previous else {
        return current
            .histograms
            .iter()
            .map(|(key, bucket)| HistogramCounts::of(key, bucket))
            .collect();
    };
    let before: FastMap<HistogramKey, &HistogramBucket> = previous
        .histograms
        .iter()
        .map(|(key, bucket)| (*key, bucket))
        .collect();
    current
        .histograms
        .iter()
        .map(|(key, bucket)| {
            let now = HistogramCounts::of(key, bucket);
            match before.get(key) {
                Some(old) => HistogramCounts {
                    calls: now.calls.saturating_sub(old.calls),
                    callee_calls: now.callee_calls.saturating_sub(old.callee_calls),
                    counts: now.counts - SlotCounts(old.counters),
                    ..now
                },
                None => now,
            }
        })
        .filter(|bucket| bucket.calls != 0)
        .collect()
}

/// One probed function's counts, summed over its callers (a `CallCounts` per caller edge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FunctionCounts {
    pub calls: u64,
    pub unwound: u64,
    pub inclusive: SlotCounts,
    pub exclusive: SlotCounts,
}

impl Aggregate {
    /// Per `(function id, tgid)` (tgid 0 unless functions are split by process), summed over
    /// callers.
    pub fn function_totals(&self) -> BTreeMap<(u32, u32), FunctionCounts> {
        let mut totals: BTreeMap<(u32, u32), FunctionCounts> = BTreeMap::new();
        for call in &self.calls {
            let total = totals
                .entry((call.key.function, call.key.tgid))
                .or_default();
            total.calls += call.calls;
            total.unwound += call.unwound;
            total.inclusive += call.inclusive;
            total.exclusive += call.exclusive;
        }
        totals
    }

    /// Per `(function id, tgid)`, its per-call histogram buckets.
    pub fn function_histograms(&self) -> BTreeMap<(u32, u32), Vec<BucketCounts>> {
        let mut buckets: BTreeMap<(u32, u32), Vec<BucketCounts>> = BTreeMap::new();
        for entry in &self.histograms {
            if entry.key.kind == histogram::FUNCTION {
                buckets
                    .entry((entry.key.owner, entry.key.tgid))
                    .or_default()
                    .push(entry.bucket());
            }
        }
        buckets
    }

    /// The threads heaviest first in slot `weight_slot`, ties by tid, as the report lists them.
    pub fn tasks_by_weight(&self, weight_slot: usize) -> Vec<&TaskCounts> {
        heaviest_first(&self.tasks, weight_slot, |task| (&task.counts, task.tid))
    }

    /// The processes heaviest first in slot `weight_slot`, ties by pid: the order the report
    /// lists them in and the exporter gives them series in (with `--max-series` the heaviest
    /// keep series of their own).
    pub fn processes_by_weight(&self, weight_slot: usize) -> Vec<&ProcessCounts> {
        heaviest_first(&self.processes, weight_slot, |process| {
            (&process.counts, process.pid)
        })
    }

    /// `cgroup_rows` heaviest first in slot `weight_slot`, ties by path, for the report and
    /// the exporter as `processes_by_weight`.
    pub fn cgroup_rows_by_weight(
        &self,
        paths: &HashMap<u64, String>,
        depth: Option<usize>,
        weight_slot: usize,
    ) -> Vec<(u64, Option<String>, SlotCounts)> {
        let mut rows = self.cgroup_rows(paths, depth);
        rows.sort_by(|(_, a_path, a), (_, b_path, b)| {
            b.get(weight_slot)
                .cmp(&a.get(weight_slot))
                .then(a_path.cmp(b_path))
        });
        rows
    }

    /// Each cgroup's counts with its path (from `paths`; unnamed ids keep `None`): flat, each
    /// cgroup's own counts, which add up to the non-idle total; or with `depth` one row per
    /// cgroup down to that depth holding its whole subtree (ids of ancestors unnamed in
    /// `paths` are 0).
    pub fn cgroup_rows(
        &self,
        paths: &HashMap<u64, String>,
        depth: Option<usize>,
    ) -> Vec<(u64, Option<String>, SlotCounts)> {
        use crate::cgroup::{ancestor_at, depth as depth_of};
        let own = self
            .cgroups
            .iter()
            .map(|(id, counts)| (*id, paths.get(id).cloned(), *counts));
        let Some(max_depth) = depth else {
            return own.collect();
        };
        let id_of: HashMap<&str, u64> = paths
            .iter()
            .map(|(id, path)| (path.as_str(), *id))
            .collect();
        let mut rolled: BTreeMap<String, (u64, SlotCounts)> = BTreeMap::new();
        for (_, path, counts) in own {
            let Some(path) = path else { continue };
            for level in 0..=depth_of(&path).min(max_depth) {
                let ancestor = ancestor_at(&path, level);
                let id = id_of.get(ancestor.as_str()).copied().unwrap_or(0);
                rolled.entry(ancestor).or_insert((id, SlotCounts::ZERO)).1 += counts;
            }
        }
        rolled
            .into_iter()
            .map(|(path, (id, counts))| (id, Some(path), counts))
            .collect()
    }
}

/// What an aggregate's slots and ids mean: the model and its evaluator (counters resolved to
/// slots once), the slot names, cgroup paths and probed functions. The exporter reads
/// aggregates through it; the report through [`ReportContext`], which adds what a report is
/// about.
pub struct Naming<'a> {
    pub model: &'a dyn Model,
    pub slot_names: &'a [String],
    pub level: u8,
    pub evaluator: Evaluator<'a>,
    /// cgroup id -> path (ids missing here have none).
    pub cgroup_paths: &'a HashMap<u64, String>,
    /// `--cgroup-depth`: cgroups roll up into their ancestors down to this depth.
    pub cgroup_depth: Option<usize>,
    /// Probed functions by id (the attach cookie): `(target, demangled symbol)`.
    pub functions: &'a [(String, String)],
    /// The `-e` events and their slots.
    pub events: Vec<(String, usize)>,
}

impl<'a> Naming<'a> {
    pub fn new(
        model: &'a dyn Model,
        slot_names: &'a [String],
        level: u8,
        cgroup_paths: &'a HashMap<u64, String>,
        cgroup_depth: Option<usize>,
        functions: &'a [(String, String)],
    ) -> Self {
        let events = model
            .counters()
            .into_iter()
            .filter(|spec| matches!(spec.source, crate::model::CounterSource::Event(_)))
            .filter_map(|spec| {
                let slot = slot_names.iter().position(|name| *name == spec.name)?;
                Some((spec.name, slot))
            })
            .collect();
        Self {
            model,
            slot_names,
            level,
            evaluator: Evaluator::new(model, slot_names),
            cgroup_paths,
            cgroup_depth,
            functions,
            events,
        }
    }

    /// The slot of the counter entities are weighed by (`slots`, `cpu-clock`).
    pub fn weight_slot(&self) -> usize {
        self.slot_names
            .iter()
            .position(|name| name == self.model.weight_counter())
            .unwrap_or(0)
    }

    /// `(target, symbol)` of a function id (`function #ID` if unknown).
    pub fn function(&self, id: u32) -> (String, String) {
        self.functions
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| (String::new(), format!("function #{id}")))
    }
}

/// What a report is about, besides the numbers.
pub struct ReportContext<'a> {
    pub model: &'a dyn Model,
    /// What each BPF slot holds (the counter plan's slot names, `crate::schedule`).
    pub slot_names: Vec<String>,
    pub level: u8,
    pub scope: String,
    pub duration_s: f64,
    pub interval: Option<IntervalInfo>,
    /// cgroup id -> path, for `--by cgroup` (ids missing here are reported without a path).
    pub cgroup_paths: &'a HashMap<u64, String>,
    /// `--cgroup-depth`: roll each cgroup up into its ancestors down to this depth.
    pub cgroup_depth: Option<usize>,
    /// Probed functions by id (the attach cookie): `(target, demangled symbol)`.
    pub functions: &'a [(String, String)],
    /// Each probed target's return mechanism and why.
    pub target_returns: &'a [crate::functions::unwinding::TargetReturns],
    /// Whether the report lists the caller -> callee edges (`call_tree`): `top` never shows
    /// them, and evaluating 10000 edges costs more than its whole screen.
    pub call_tree: bool,
    /// The probes' cost per call and per probed callee in the weight counter, by function id,
    /// where it was taken out of the per-call histograms (`crate::functions::distribution`).
    pub distribution_probe_costs:
        &'a dyn Fn(u32) -> Option<crate::functions::distribution::ProbeCost>,
    /// `-- CMD`: the report describes the command's run (its `command` entity).
    pub command_scope: bool,
    /// `-- CMD` with BPF: everything counted on all CPUs before the command started (topdown's
    /// start-up, the probe calibration), left out of every other figure.
    pub before_command: Option<SlotCounts>,
}

impl<'a> ReportContext<'a> {
    /// A system-wide one-second run with nothing probed and no cgroup names: what unit tests of
    /// the report steps start from.
    #[cfg(test)]
    pub(crate) fn system_wide_for_tests(
        model: &'a dyn Model,
        slot_names: Vec<String>,
        level: u8,
    ) -> Self {
        static NO_PATHS: std::sync::LazyLock<HashMap<u64, String>> =
            std::sync::LazyLock::new(HashMap::new);
        ReportContext {
            model,
            slot_names,
            level,
            scope: "system-wide".to_owned(),
            duration_s: 1.0,
            interval: None,
            cgroup_paths: &NO_PATHS,
            cgroup_depth: None,
            functions: &[],
            target_returns: &[],
            call_tree: true,
            distribution_probe_costs: &|_| None,
            command_scope: false,
            before_command: None,
        }
    }
}

/// Builds a report of everything in `current`, or (interval mode) of what happened since
/// `previous`.
pub fn build_report(
    ctx: &ReportContext<'_>,
    current: &Snapshot,
    previous: Option<&Snapshot>,
) -> Report {
    report_of(ctx, &Aggregate::since(current, previous))
}

/// Names, evaluates and sorts an aggregate into the report format.
pub fn report_of(ctx: &ReportContext<'_>, aggregate: &Aggregate) -> Report {
    let names = &ctx.slot_names;
    let evaluator = Evaluator::new(ctx.model, names);
    let namer = SlotNamer::new(names);
    let entity = |counts: &SlotCounts| -> Entity {
        let counters = namer.named(counts);
        let evaluation = evaluator.evaluate(&counts.0, ctx.level);
        Entity {
            counters,
            metrics: evaluation.metrics,
            estimated: evaluation.estimated,
            ..Entity::default()
        }
    };
    let weight_slot = names
        .iter()
        .position(|name| name == ctx.model.weight_counter())
        .unwrap_or(0);

    let task_entries = aggregate
        .tasks_by_weight(weight_slot)
        .into_iter()
        .map(|task| TaskEntry {
            tid: task.tid,
            tgid: task.tgid,
            comm: task.comm.to_string(),
            exited: task.exited,
            entity: entity(&task.counts),
        })
        .collect();

    let process_entries = aggregate
        .processes_by_weight(weight_slot)
        .into_iter()
        .map(|process| ProcessEntry {
            pid: process.pid,
            comm: process.comm.to_string(),
            threads: process.threads,
            entity: entity(&process.counts),
        })
        .collect();

    // Flat (each cgroup's own counts, which add up to the non-idle total), or with
    // `--cgroup-depth N` one entry per cgroup down to depth N holding its whole subtree.
    let cgroups = aggregate
        .cgroup_rows_by_weight(ctx.cgroup_paths, ctx.cgroup_depth, weight_slot)
        .into_iter()
        .map(|(id, path, counts)| CgroupEntry {
            id,
            container: crate::cgroup::container::describe_cgroup(path.as_deref()),
            path,
            entity: entity(&counts),
        })
        .collect();
    let (functions, call_tree) = function_entries(ctx, aggregate, weight_slot, &entity);
    let cpus = aggregate
        .cpus
        .iter()
        .map(|(cpu, counts)| CpuEntry {
            cpu: *cpu,
            counters: namer.named(counts),
        })
        .collect();
    let diagnostics = aggregate.diagnostics.clone();

    let mut report = Report {
        topdown_version: env!("CARGO_PKG_VERSION").to_owned(),
        model: ctx.model.recorded_name(),
        synthetic: ctx.model.is_synthetic(),
        synthetic_map: ctx.model.synthetic_map().into_iter().collect(),
        level: ctx.level,
        counter_names: names.clone(),
        extra_events: ctx
            .model
            .counters()
            .into_iter()
            .filter(|spec| matches!(spec.source, crate::model::CounterSource::Event(_)))
            .map(|spec| spec.name)
            .collect(),
        weight_counter: ctx.model.weight_counter().to_owned(),
        duration_s: ctx.duration_s,
        interval: ctx.interval.clone(),
        scope: ctx.scope.clone(),
        totals: entity(&aggregate.totals),
        idle: entity(&aggregate.idle),
        untracked: entity(&aggregate.untracked),
        dropped: entity(&aggregate.dropped),
        // What is in scope: everything neither idle nor another task's.
        command: ctx
            .command_scope
            .then(|| entity(&(aggregate.totals - aggregate.idle - aggregate.untracked))),
        before_command: ctx.before_command.as_ref().map(entity),
        tasks: task_entries,
        processes: process_entries,
        cgroups,
        cgroup_depth: ctx.cgroup_depth,
        overflows: (!ctx.functions.is_empty()).then_some(diagnostics.overflows),
        missed_returns: (!ctx.functions.is_empty()).then_some(diagnostics.missed_returns),
        probe_compensation: None,
        functions,
        call_tree,
        spans: Vec::new(),
        usdt: Vec::new(),
        span_diagnostics: None,
        cpus,
        diagnostics,
        derived: crate::model::derived::derived_figures(ctx.model)
            .iter()
            .map(crate::report::DerivedEntry::of)
            .collect(),
    };
    crate::report::fill_derived(&mut report);
    report
}

/// Every task instance's counts, or what each gained since `previous` (with `only_active`,
/// interval mode, only the tasks that gained something).
///
/// A tid can die and be reused within a run. Exit records that arrived since `previous` belong
/// to the instance that was live under that tid then, so they consume its previous value first;
/// live tasks then subtract whatever previous value is left for their tid.
fn task_deltas(
    current: &Snapshot,
    previous: Option<&Snapshot>,
    only_active: bool,
) -> Vec<TaskCounts> {
    let new_exits = match previous {
        Some(previous) => current.exited.get(previous.exited.len()..).unwrap_or(&[]),
        None => &current.exited,
    };
    let mut tasks = Vec::with_capacity(new_exits.len() + current.live.len());
    let mut visit =
        |tid: u32, task: &TaskCounters, earlier: Option<&[u64; MAX_COUNTERS]>, exited| {
            // The saturating difference (`SlotCounts - SlotCounts`), computed in place: this loop
            // runs once per thread on the machine.
            let mut counts = SlotCounts(task.counters);
            if let Some(earlier) = earlier {
                for (count, before) in counts.0.iter_mut().zip(earlier) {
                    *count = count.saturating_sub(*before);
                }
            }
            if !(only_active && counts.is_zero()) {
                tasks.push(TaskCounts {
                    tid,
                    tgid: task.tgid,
                    comm: comm_string(&task.comm),
                    exited,
                    counts,
                });
            }
        };
    let Some(previous) = previous else {
        for (tid, task) in new_exits {
            visit(*tid, task, None, true);
        }
        for (tid, task) in current.live.iter() {
            visit(tid, task, None, false);
        }
        return tasks;
    };
    // A tid whose new exit record consumed its previous value is remembered instead of removed.
    let mut consumed: HashSet<u32, FastHash> =
        HashSet::with_capacity_and_hasher(new_exits.len(), FastHash::default());
    for (tid, task) in new_exits {
        let earlier = if consumed.insert(*tid) {
            previous.live.get(*tid).map(|task| &task.counters)
        } else {
            None
        };
        visit(*tid, task, earlier, true);
    }
    let mut cursor = 0;
    for (tid, task) in current.live.iter() {
        let earlier = if !consumed.is_empty() && consumed.contains(&tid) {
            None
        } else {
            previous
                .live
                .get_near(tid, &mut cursor)
                .map(|task| &task.counters)
        };
        visit(tid, task, earlier, false);
    }
    tasks
}

/// Threads summed into processes, each named by its main thread.
pub(crate) fn processes_of(tasks: &[TaskCounts]) -> Vec<ProcessCounts> {
    // pid -> index in `processes`; the main thread's name wins, else the first thread's.
    let mut index: FastMap<u32, usize> =
        FastMap::with_capacity_and_hasher(tasks.len() / 4, FastHash::default());
    let mut processes: Vec<ProcessCounts> = Vec::with_capacity(tasks.len() / 4);
    let mut named_by_main: Vec<bool> = Vec::with_capacity(tasks.len() / 4);
    // Tasks come ordered by tid, so a process's threads mostly follow one another.
    let mut last: Option<(u32, usize)> = None;
    for task in tasks {
        let slot = match last {
            Some((tgid, slot)) if tgid == task.tgid => slot,
            _ => *index.entry(task.tgid).or_insert_with(|| {
                processes.push(ProcessCounts {
                    pid: task.tgid,
                    comm: task.comm.clone(),
                    threads: 0,
                    counts: SlotCounts::ZERO,
                });
                named_by_main.push(false);
                processes.len() - 1
            }),
        };
        last = Some((task.tgid, slot));
        let process = &mut processes[slot];
        process.counts += task.counts;
        process.threads += 1;
        if task.tid == task.tgid && !named_by_main[slot] {
            process.comm.clone_from(&task.comm);
            named_by_main[slot] = true;
        }
    }
    // Ordered by pid through their indices: moving the entries themselves in the sort costs
    // more than the rest of this.
    let mut order: Vec<(u32, usize)> = index.into_iter().collect();
    order.sort_unstable();
    let mut slots: Vec<Option<ProcessCounts>> = processes.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(_, slot)| slots[slot].take())
        .collect()
}

/// A kernel `comm` (NUL-padded, at most 16 bytes) as text.
pub fn comm_string(comm: &[u8; 16]) -> CompactString {
    let len = comm
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(comm.len());
    let name = &comm[..len];
    // Checked first: the lossy conversion's own path is several times slower for the valid
    // names that nearly every thread has.
    match std::str::from_utf8(name) {
        Ok(text) => CompactString::new(text),
        Err(_) => CompactString::from_utf8_lossy(name),
    }
}

fn diagnostics_of(snapshot: &Snapshot) -> Diagnostics {
    let probes = Diagnostics {
        overflows: snapshot.probes.overflows,
        missed_returns: snapshot.probes.missed_returns,
        unmatched_returns: snapshot.probes.unmatched_returns,
        probe_read_failures: snapshot.probes.read_failures,
        probe_map_full: snapshot.probes.map_full,
        tail_calls_cut: snapshot.probes.tail_calls_cut,
        histogram_full: snapshot.probes.histogram_full,
        goroutine_switches_lost: snapshot.probes.goroutine_switches_lost,
        ..Diagnostics::default()
    };
    snapshot.cpus.iter().fold(probes, |mut sum, (_, state)| {
        sum.readings += state.readings;
        sum.not_running_readings += state.not_running;
        sum.read_errors += state.read_errors;
        sum.task_map_full += state.task_map_full;
        sum.exit_records_lost += state.exit_records_lost;
        sum.cgroup_map_full += state.cgroup_map_full;
        sum.unsplit_migrations += state.unsplit_migrations;
        sum.unseen_switches += state.unseen_switches;
        sum.unseen_arrivals += state.unseen_arrivals;
        sum
    })
}

/// Per-function totals (summed over callers) and the caller -> callee edges.
fn function_entries(
    ctx: &ReportContext<'_>,
    aggregate: &Aggregate,
    weight_slot: usize,
    entity: &dyn Fn(&SlotCounts) -> Entity,
) -> (Vec<FunctionEntry>, Vec<CallEdge>) {
    let name = |id: u32| -> (String, String) {
        ctx.functions
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| (String::new(), format!("function #{id}")))
    };
    let pid = |key: &CallKey| (key.tgid != 0).then_some(key.tgid);
    let shown_edges = if ctx.call_tree {
        aggregate.calls.as_slice()
    } else {
        &[]
    };
    let edges = shown_edges.iter().map(|call| {
        let key = &call.key;
        CallEdge {
            caller: (key.parent != ROOT_FUNCTION).then(|| name(key.parent).1),
            callee: name(key.function).1,
            pid: pid(key),
            calls: call.calls,
            inclusive: entity(&call.inclusive),
        }
    });
    let mut edges: Vec<CallEdge> = edges.collect();
    let mut totals: Vec<((u32, u32), FunctionCounts)> =
        aggregate.function_totals().into_iter().collect();
    // Compared by reference: a copy of two names per comparison cost more than the sort.
    let symbol = |id: u32| -> std::borrow::Cow<'_, str> {
        match ctx.functions.get(id as usize) {
            Some((_, symbol)) => symbol.as_str().into(),
            None => format!("function #{id}").into(),
        }
    };
    totals.sort_by(|(a_key, a), (b_key, b)| {
        b.inclusive
            .get(weight_slot)
            .cmp(&a.inclusive.get(weight_slot))
            .then_with(|| symbol(a_key.0).cmp(&symbol(b_key.0)))
    });
    // Every probed function is listed, a function never called with `calls: 0`: a report must
    // tell "probed, not called" apart from "not probed". Split by process, it is listed once,
    // without a process.
    let called: std::collections::BTreeSet<u32> =
        totals.iter().map(|((function, _), _)| *function).collect();
    totals.extend(
        (0..ctx.functions.len() as u32)
            .filter(|id| !called.contains(id))
            .map(|id| ((id, 0), FunctionCounts::default())),
    );
    let mut histograms = aggregate.function_histograms();
    let weight = ctx.model.weight_counter();
    let functions = totals
        .into_iter()
        .map(|((function, tgid), total)| {
            let distribution = histograms.remove(&(function, tgid)).map(|buckets| {
                let mut distribution = Distribution::of(weight, buckets, entity);
                distribution.probe_cost = (ctx.distribution_probe_costs)(function);
                distribution
            });
            let (target, symbol) = name(function);
            let returns = ctx
                .target_returns
                .iter()
                .find(|returns| returns.target == target);
            FunctionEntry {
                return_probe: returns.map(|returns| returns.return_probe),
                return_probe_reason: returns.map(|returns| returns.reason.clone()),
                target,
                symbol,
                pid: (tgid != 0).then_some(tgid),
                calls: total.calls,
                unwound: total.unwound,
                entry_single_step: false,
                inclusive: entity(&total.inclusive),
                exclusive: entity(&total.exclusive),
                distribution,
            }
        })
        .collect();
    edges.sort_by(|a, b| {
        a.caller
            .cmp(&b.caller)
            .then(a.callee.cmp(&b.callee))
            .then(a.pid.cmp(&b.pid))
    });
    (functions, edges)
}

/// `entries` heaviest first in slot `weight_slot`, ties by id (`key`: an entry's counts and
/// id).
fn heaviest_first<T>(
    entries: &[T],
    weight_slot: usize,
    key: impl Fn(&T) -> (&SlotCounts, u32),
) -> Vec<&T> {
    let mut sorted: Vec<&T> = entries.iter().collect();
    sorted.sort_by(|a, b| {
        let ((a_counts, a_id), (b_counts, b_id)) = (key(a), key(b));
        b_counts
            .get(weight_slot)
            .cmp(&a_counts.get(weight_slot))
            .then(a_id.cmp(&b_id))
    });
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::software::Software;

    fn task(tgid: u32, comm: &str, cpu_clock: u64) -> TaskCounters {
        let mut task = TaskCounters::ZERO;
        task.tgid = tgid;
        task.counters[0] = cpu_clock;
        task.comm[..comm.len()].copy_from_slice(comm.as_bytes());
        task
    }

    fn cpu(total: u64, idle: u64) -> CpuState {
        let mut state = CpuState::ZERO;
        state.total[0] = total;
        state.idle[0] = idle;
        state.readings = 10;
        state
    }

    fn context(model: &dyn Model) -> ReportContext<'_> {
        let slot_names = model.counters().into_iter().map(|spec| spec.name).collect();
        ReportContext::system_wide_for_tests(model, slot_names, 0)
    }

    #[test]
    fn threads_sum_into_processes_named_by_their_main_thread() {
        let snapshot = Snapshot {
            cpus: vec![(0, cpu(1000, 100)), (1, cpu(500, 50))],
            live: [(10, task(10, "server", 300)), (11, task(10, "worker", 400))]
                .into_iter()
                .collect(),
            exited: vec![(12, task(10, "worker", 250)), (20, task(20, "sh", 400))],
            ..Snapshot::default()
        };
        let report = build_report(&context(&Software), &snapshot, None);
        assert_eq!(report.totals.counters["cpu-clock"], 1500);
        assert_eq!(report.idle.counters["cpu-clock"], 150);
        assert_eq!(
            report.tasks.iter().map(|t| t.tid).collect::<Vec<_>>(),
            vec![11, 20, 10, 12]
        );
        assert!(
            report
                .tasks
                .iter()
                .find(|t| t.tid == 12)
                .is_some_and(|t| t.exited)
        );
        let server = report.processes.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!((server.comm.as_str(), server.threads), ("server", 3));
        assert_eq!(server.entity.counters["cpu-clock"], 950);
        assert_eq!(report.processes[0].pid, 10, "sorted by cpu-clock");
        assert_eq!(report.diagnostics.readings, 20);
    }

    /// `-- CMD`: the report of the command's run subtracts what was counted before its start
    /// from every figure, keeps the command's tasks that counted nothing (unlike an interval),
    /// and reports the command and what came before it apart.
    #[test]
    fn a_command_run_leaves_out_what_came_before_it() {
        let mut before = cpu(900, 200);
        before.untracked[0] = 690;
        // The held command (tid 30) counted 10 before its exec.
        let start = Snapshot {
            cpus: vec![(0, before)],
            live: [(30, task(30, "held", 10))].into_iter().collect(),
            ..Snapshot::default()
        };
        let mut after = cpu(2200, 500);
        after.untracked[0] = 990;
        let current = Snapshot {
            cpus: vec![(0, after)],
            live: [(30, task(30, "cmd", 310)), (31, task(30, "cmd", 0))]
                .into_iter()
                .collect(),
            exited: vec![(32, task(32, "child", 400))],
            ..Snapshot::default()
        };
        let aggregate = Aggregate::since_start(&current, &start);
        assert_eq!(aggregate.totals.get(0), 1300);
        assert_eq!(aggregate.idle.get(0), 300);
        assert_eq!(aggregate.untracked.get(0), 300);
        let tasks: BTreeMap<u32, u64> = aggregate
            .tasks
            .iter()
            .map(|task| (task.tid, task.counts.get(0)))
            .collect();
        assert_eq!(tasks, BTreeMap::from([(30, 300), (31, 0), (32, 400)]));
        assert_eq!(
            Aggregate::since(&current, Some(&start)).tasks.len(),
            2,
            "an interval leaves out tid 31"
        );
        let mut ctx = context(&Software);
        ctx.command_scope = true;
        ctx.before_command = Some(Aggregate::since(&start, None).totals);
        let report = report_of(&ctx, &aggregate);
        let command = report.command.as_ref().expect("the command's entity");
        assert_eq!(
            command.counters["cpu-clock"], 700,
            "its 3 tasks' 300 + 0 + 400"
        );
        assert_eq!(report.totals.counters["cpu-clock"], 1300);
        let before = report.before_command.as_ref().expect("before the command");
        assert_eq!(before.counters["cpu-clock"], 900);
        assert!(
            build_report(&context(&Software), &current, None)
                .command
                .is_none()
        );
    }

    #[test]
    fn intervals_subtract_and_a_reused_tid_is_not_double_counted() {
        let previous = Snapshot {
            cpus: vec![(0, cpu(1000, 100))],
            live: [(7, task(7, "old", 300)), (8, task(8, "steady", 100))]
                .into_iter()
                .collect(),
            exited: vec![],
            ..Snapshot::default()
        };
        // tid 7 died (final total 350) and a new task reused tid 7 (40 so far).
        let current = Snapshot {
            cpus: vec![(0, cpu(1600, 160))],
            live: [(7, task(7, "new", 40)), (8, task(8, "steady", 100))]
                .into_iter()
                .collect(),
            exited: vec![(7, task(7, "old", 350))],
            ..Snapshot::default()
        };
        let mut ctx = context(&Software);
        ctx.interval = Some(IntervalInfo {
            index: 2,
            end_s: 2.0,
        });
        let report = build_report(&ctx, &current, Some(&previous));
        assert_eq!(report.totals.counters["cpu-clock"], 600);
        assert_eq!(report.idle.counters["cpu-clock"], 60);
        let by_comm: BTreeMap<_, _> = report
            .tasks
            .iter()
            .map(|t| (t.comm.as_str(), t.entity.counters["cpu-clock"]))
            .collect();
        // "steady" gained nothing and is left out of the interval.
        assert_eq!(by_comm, BTreeMap::from([("new", 40), ("old", 50)]));
        assert_eq!(report.cpus[0].counters["cpu-clock"], 600);
    }

    #[test]
    fn comm_stops_at_nul() {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"bash");
        assert_eq!(comm_string(&comm), "bash");
        assert_eq!(comm_string(&[b'x'; 16]), "x".repeat(16));
    }

    fn slots(values: &[u64]) -> SlotCounts {
        let mut counts = SlotCounts::ZERO;
        counts.0[..values.len()].copy_from_slice(values);
        counts
    }

    #[test]
    fn slot_counts_add_sum_and_subtract_saturating() {
        let a = slots(&[5, 7, 0]);
        let b = slots(&[1, 10, 3]);
        assert_eq!(a + b, slots(&[6, 17, 3]));
        assert_eq!(
            [a, b, b].into_iter().sum::<SlotCounts>(),
            slots(&[7, 27, 6])
        );
        // An earlier reading that is larger (a reused tid) gives zero, never a wrapped count.
        assert_eq!(a - b, slots(&[4, 0, 0]));
        assert!((b - b).is_zero());
        assert_eq!(a.get(1), 7);
        assert_eq!(a.get(MAX_COUNTERS + 3), 0);
    }

    #[test]
    fn interval_aggregate_keeps_only_cgroups_and_calls_that_moved() {
        use topdown_common::CgroupCounters;
        let call = |function: u32, calls: u64, inclusive: u64| {
            let mut stats = CallStats {
                calls,
                unwound: 0,
                inclusive: [0; MAX_COUNTERS],
                exclusive: [0; MAX_COUNTERS],
                callee_calls: 0,
            };
            stats.inclusive[0] = inclusive;
            stats.exclusive[0] = inclusive / 2;
            (
                CallKey {
                    function,
                    parent: ROOT_FUNCTION,
                    tgid: 0,
                    _pad: 0,
                },
                stats,
            )
        };
        let cgroup = |count: u64| {
            let mut counters = [0; MAX_COUNTERS];
            counters[0] = count;
            CgroupCounters { counters }
        };
        let previous = Snapshot {
            cpus: vec![(0, cpu(100, 10))],
            cgroups: vec![(7, cgroup(40)), (8, cgroup(50))],
            calls: vec![call(0, 3, 30), call(1, 2, 20)],
            ..Snapshot::default()
        };
        let current = Snapshot {
            cpus: vec![(0, cpu(250, 30))],
            cgroups: vec![(7, cgroup(40)), (8, cgroup(95))],
            calls: vec![call(0, 3, 30), call(1, 5, 80)],
            ..Snapshot::default()
        };
        let aggregate = Aggregate::since(&current, Some(&previous));
        assert_eq!(aggregate.totals, slots(&[150]));
        assert_eq!(aggregate.idle, slots(&[20]));
        assert_eq!(aggregate.cgroups, vec![(8, slots(&[45]))]);
        assert_eq!(aggregate.calls.len(), 1);
        assert_eq!(aggregate.calls[0].key.function, 1);
        assert_eq!(aggregate.calls[0].calls, 3);
        assert_eq!(aggregate.calls[0].inclusive, slots(&[60]));
        assert_eq!(aggregate.calls[0].exclusive, slots(&[30]));
        assert_eq!(aggregate.cpus, vec![(0, slots(&[150]))]);
        assert_eq!(aggregate.diagnostics.readings, 0);
        // Cumulative: everything, unchanged entries included.
        // Histogram buckets: only those with calls in the interval, by what they gained.
        let bucket = |index: u32, calls: u64, slots: u64| {
            let mut bucket = HistogramBucket::ZERO;
            bucket.calls = calls;
            bucket.counters[0] = slots;
            (
                HistogramKey {
                    kind: histogram::FUNCTION,
                    owner: 1,
                    tgid: 0,
                    bucket: index,
                },
                bucket,
            )
        };
        let before = Snapshot {
            histograms: vec![bucket(9, 5, 50), bucket(35, 1, 1000)],
            ..previous.clone()
        };
        let after = Snapshot {
            histograms: vec![bucket(9, 5, 50), bucket(35, 3, 3000), bucket(40, 1, 2000)],
            ..current.clone()
        };
        let moved = Aggregate::since(&after, Some(&before));
        let gained: Vec<(u32, u64, u64)> = moved
            .histograms
            .iter()
            .map(|b| (b.key.bucket, b.calls, b.counts.0[0]))
            .collect();
        assert_eq!(gained, [(35, 2, 2000), (40, 1, 2000)]);
        let whole = Aggregate::since(&current, None);
        assert_eq!(whole.cgroups.len(), 2);
        assert_eq!(whole.calls.len(), 2);
        assert_eq!(whole.diagnostics.readings, 10);
    }

    /// The delta as it was first written (a map of every previous task, consumed by the new
    /// exits), against the one that reads the previous snapshot in place, on random snapshots
    /// with exits and reused tids.
    #[test]
    fn task_deltas_match_the_map_based_reference() {
        fn task_counts(
            tid: u32,
            task: &TaskCounters,
            before: Option<SlotCounts>,
            exited: bool,
        ) -> TaskCounts {
            TaskCounts {
                tid,
                tgid: task.tgid,
                comm: comm_string(&task.comm),
                exited,
                counts: SlotCounts(task.counters) - before.unwrap_or_default(),
            }
        }

        fn reference(current: &Snapshot, previous: &Snapshot) -> Vec<TaskCounts> {
            let mut before: HashMap<u32, SlotCounts> = previous
                .live
                .iter()
                .map(|(tid, task)| (tid, SlotCounts(task.counters)))
                .collect();
            let new_exits = current.exited.get(previous.exited.len()..).unwrap_or(&[]);
            let mut deltas: Vec<TaskCounts> = new_exits
                .iter()
                .map(|(tid, task)| task_counts(*tid, task, before.remove(tid), true))
                .collect();
            deltas.extend(
                current
                    .live
                    .iter()
                    .map(|(tid, task)| task_counts(tid, task, before.get(&tid).copied(), false)),
            );
            deltas.retain(|task| !task.counts.is_zero());
            deltas
        }
        let mut state = 7u64;
        let mut below = |bound: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % bound
        };
        for _ in 0..50 {
            let mut previous = Snapshot::default();
            let mut current = Snapshot::default();
            let (mut previous_live, mut current_live) = (Vec::new(), Vec::new());
            for _ in 0..below(4) {
                let tid = 1 + below(30) as u32;
                let exit = (tid, task(tid, "gone", below(100)));
                previous.exited.push(exit);
                current.exited.push(exit);
            }
            for _ in 0..60 {
                let tid = 1 + below(30) as u32;
                previous_live.push((tid, task(tid, "before", below(500))));
            }
            for _ in 0..60 {
                let tid = 1 + below(30) as u32;
                current_live.push((tid, task(tid, "now", below(500))));
            }
            for _ in 0..below(6) {
                let tid = 1 + below(30) as u32;
                current.exited.push((tid, task(tid, "ended", below(700))));
            }
            previous.live = previous_live.into_iter().collect();
            current.live = current_live.into_iter().collect();
            assert_eq!(
                task_deltas(&current, Some(&previous), true),
                reference(&current, &previous)
            );
            assert_eq!(
                processes_of(&task_deltas(&current, Some(&previous), true)),
                processes_of(&reference(&current, &previous))
            );
            // Cumulative: every task instance, unchanged.
            let whole = task_deltas(&current, None, false);
            assert_eq!(whole.len(), current.exited.len() + current.live.len());
            assert!(
                whole
                    .iter()
                    .zip(&current.exited)
                    .all(|(task, (tid, exited))| {
                        task.exited
                            && task.tid == *tid
                            && task.counts == SlotCounts(exited.counters)
                    })
            );
        }
    }

    /// Repeated slot names keep the last slot's count, as `named` does.
    #[test]
    fn the_slot_namer_names_like_named() {
        let names: Vec<String> = ["slots", "b", "a", "b", "cpu-clock"]
            .map(str::to_owned)
            .to_vec();
        let counts = slots(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(SlotNamer::new(&names).named(&counts), counts.named(&names));
        assert_eq!(SlotNamer::new(&[]).named(&counts), counts.named(&[]));
    }
}
