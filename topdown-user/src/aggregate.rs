//! Turns what the BPF side attributed (per-slot arrays per task and per CPU) into a [`Report`]:
//! names counters, sums threads into processes, computes metrics with the model, and, in
//! interval mode, subtracts the previous snapshot.

use std::collections::{BTreeMap, HashMap};

use topdown_common::{CallKey, CallStats, CpuState, MAX_COUNTERS, ROOT_FUNCTION, TaskCounters};

use crate::{
    bpf::Snapshot,
    model::{Counts, Model, evaluate},
    report::{
        CallEdge, CgroupEntry, CpuEntry, Diagnostics, Entity, FunctionEntry, IntervalInfo,
        ProcessEntry, Report, TaskEntry,
    },
};

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
}

type Slots = [u64; MAX_COUNTERS];

/// Builds a report of everything in `current`, or (interval mode) of what happened since
/// `previous`.
pub fn build_report(
    ctx: &ReportContext<'_>,
    current: &Snapshot,
    previous: Option<&Snapshot>,
) -> Report {
    let names = &ctx.slot_names;
    let entity = |slots: &Slots| -> Entity {
        let counters = name_slots(names, slots);
        let evaluation = evaluate(ctx.model, &counters, ctx.level);
        Entity {
            counters,
            metrics: evaluation.metrics,
            estimated: evaluation.estimated,
        }
    };

    let per_cpu = |pick: fn(&CpuState) -> &Slots| -> Slots {
        let now = sum_cpus(current, pick);
        match previous {
            Some(previous) => sub(&now, &sum_cpus(previous, pick)),
            None => now,
        }
    };
    let totals = per_cpu(|state| &state.total);
    let idle = per_cpu(|state| &state.idle);
    let untracked = per_cpu(|state| &state.untracked);
    let dropped = per_cpu(|state| &state.dropped);

    let tasks = task_deltas(current, previous);
    let weight = names
        .iter()
        .position(|name| name == ctx.model.weight_counter())
        .unwrap_or(0);

    let mut task_entries: Vec<TaskEntry> = tasks
        .iter()
        .map(|task| TaskEntry {
            tid: task.tid,
            tgid: task.tgid,
            comm: task.comm.clone(),
            exited: task.exited,
            entity: entity(&task.counters),
        })
        .collect();
    task_entries.sort_by(|a, b| {
        let weight_of = |entry: &TaskEntry| {
            entry
                .entity
                .counters
                .get(&names[weight])
                .copied()
                .unwrap_or(0)
        };
        weight_of(b).cmp(&weight_of(a)).then(a.tid.cmp(&b.tid))
    });

    let mut processes: BTreeMap<u32, (Slots, String, bool, u32)> = BTreeMap::new();
    for task in &tasks {
        let process = processes
            .entry(task.tgid)
            .or_insert_with(|| ([0; MAX_COUNTERS], task.comm.clone(), false, 0));
        process.0 = add(&process.0, &task.counters);
        process.3 += 1;
        // The main thread's name is the process's name.
        if task.tid == task.tgid && !process.2 {
            process.1 = task.comm.clone();
            process.2 = true;
        }
    }
    let mut process_entries: Vec<ProcessEntry> = processes
        .into_iter()
        .map(|(pid, (slots, comm, _, threads))| ProcessEntry {
            pid,
            comm,
            threads,
            entity: entity(&slots),
        })
        .collect();
    process_entries.sort_by(|a, b| {
        let weight_of = |entry: &ProcessEntry| {
            entry
                .entity
                .counters
                .get(&names[weight])
                .copied()
                .unwrap_or(0)
        };
        weight_of(b).cmp(&weight_of(a)).then(a.pid.cmp(&b.pid))
    });

    let cgroups = cgroup_entries(ctx, current, previous, &entity);
    let (functions, call_tree) = function_entries(ctx, current, previous, &entity);

    let cpus = current
        .cpus
        .iter()
        .map(|(cpu, state)| {
            let before = previous
                .and_then(|previous| previous.cpus.iter().find(|(other, _)| other == cpu))
                .map_or([0; MAX_COUNTERS], |(_, state)| state.total);
            CpuEntry {
                cpu: *cpu,
                counters: name_slots(names, &sub(&state.total, &before)),
            }
        })
        .collect();

    let diagnostics = {
        let now = diagnostics_of(current);
        match previous {
            Some(previous) => {
                let before = diagnostics_of(previous);
                Diagnostics {
                    readings: now.readings.saturating_sub(before.readings),
                    not_running_readings: now
                        .not_running_readings
                        .saturating_sub(before.not_running_readings),
                    read_errors: now.read_errors.saturating_sub(before.read_errors),
                    task_map_full: now.task_map_full.saturating_sub(before.task_map_full),
                    exit_records_lost: now
                        .exit_records_lost
                        .saturating_sub(before.exit_records_lost),
                    cgroup_map_full: now.cgroup_map_full.saturating_sub(before.cgroup_map_full),
                    overflows: now.overflows.saturating_sub(before.overflows),
                    missed_returns: now.missed_returns.saturating_sub(before.missed_returns),
                    unmatched_returns: now
                        .unmatched_returns
                        .saturating_sub(before.unmatched_returns),
                    probe_read_failures: now
                        .probe_read_failures
                        .saturating_sub(before.probe_read_failures),
                    probe_map_full: now.probe_map_full.saturating_sub(before.probe_map_full),
                }
            }
            None => now,
        }
    };

    Report {
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
        totals: entity(&totals),
        idle: entity(&idle),
        untracked: entity(&untracked),
        dropped: entity(&dropped),
        tasks: task_entries,
        processes: process_entries,
        cgroups,
        cgroup_depth: ctx.cgroup_depth,
        overflows: (!ctx.functions.is_empty()).then_some(diagnostics.overflows),
        missed_returns: (!ctx.functions.is_empty()).then_some(diagnostics.missed_returns),
        functions,
        call_tree,
        cpus,
        diagnostics,
    }
}

/// One task's counts for the report.
struct TaskDelta {
    tid: u32,
    tgid: u32,
    comm: String,
    exited: bool,
    counters: Slots,
}

/// Every task instance's counts, or in interval mode what each gained since `previous`.
///
/// A tid can die and be reused within a run. Exit records that arrived since `previous` belong
/// to the instance that was live under that tid then, so they consume its previous value first;
/// live tasks then subtract whatever previous value is left for their tid.
fn task_deltas(current: &Snapshot, previous: Option<&Snapshot>) -> Vec<TaskDelta> {
    let Some(previous) = previous else {
        return current
            .exited
            .iter()
            .map(|(tid, task)| delta(*tid, task, None, true))
            .chain(
                current
                    .live
                    .iter()
                    .map(|(tid, task)| delta(*tid, task, None, false)),
            )
            .collect();
    };
    let mut before: HashMap<u32, Slots> = previous
        .live
        .iter()
        .map(|(tid, task)| (*tid, task.counters))
        .collect();
    let new_exits = current.exited.get(previous.exited.len()..).unwrap_or(&[]);
    let mut deltas: Vec<TaskDelta> = new_exits
        .iter()
        .map(|(tid, task)| delta(*tid, task, before.remove(tid).as_ref(), true))
        .collect();
    deltas.extend(
        current
            .live
            .iter()
            .map(|(tid, task)| delta(*tid, task, before.get(tid), false)),
    );
    deltas.retain(|task| task.counters.iter().any(|&count| count != 0));
    deltas
}

fn delta(tid: u32, task: &TaskCounters, before: Option<&Slots>, exited: bool) -> TaskDelta {
    TaskDelta {
        tid,
        tgid: task.tgid,
        comm: comm_string(&task.comm),
        exited,
        counters: before.map_or(task.counters, |before| sub(&task.counters, before)),
    }
}

/// A kernel `comm` (NUL-padded, at most 16 bytes) as text.
pub fn comm_string(comm: &[u8; 16]) -> String {
    let len = comm
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

fn name_slots(names: &[String], slots: &Slots) -> Counts {
    names
        .iter()
        .zip(slots.iter())
        .map(|(name, value)| (name.clone(), *value))
        .collect()
}

fn sum_cpus(snapshot: &Snapshot, pick: fn(&CpuState) -> &Slots) -> Slots {
    snapshot
        .cpus
        .iter()
        .fold([0; MAX_COUNTERS], |sum, (_, state)| add(&sum, pick(state)))
}

fn add(a: &Slots, b: &Slots) -> Slots {
    std::array::from_fn(|slot| a[slot].wrapping_add(b[slot]))
}

fn sub(a: &Slots, b: &Slots) -> Slots {
    std::array::from_fn(|slot| a[slot].saturating_sub(b[slot]))
}

fn diagnostics_of(snapshot: &Snapshot) -> Diagnostics {
    let probes = Diagnostics {
        overflows: snapshot.probes.overflows,
        missed_returns: snapshot.probes.missed_returns,
        unmatched_returns: snapshot.probes.unmatched_returns,
        probe_read_failures: snapshot.probes.read_failures,
        probe_map_full: snapshot.probes.map_full,
        ..Diagnostics::default()
    };
    snapshot.cpus.iter().fold(probes, |mut sum, (_, state)| {
        sum.readings += state.readings;
        sum.not_running_readings += state.not_running;
        sum.read_errors += state.read_errors;
        sum.task_map_full += state.task_map_full;
        sum.exit_records_lost += state.exit_records_lost;
        sum.cgroup_map_full += state.cgroup_map_full;
        sum
    })
}

/// Per-function totals (summed over callers) and the caller -> callee edges.
fn function_entries(
    ctx: &ReportContext<'_>,
    current: &Snapshot,
    previous: Option<&Snapshot>,
    entity: &dyn Fn(&Slots) -> Entity,
) -> (Vec<FunctionEntry>, Vec<CallEdge>) {
    let before: HashMap<CallKey, CallStats> = previous
        .map(|previous| previous.calls.iter().copied().collect())
        .unwrap_or_default();
    let name = |id: u32| -> (String, String) {
        ctx.functions
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| (String::new(), format!("function #{id}")))
    };
    let pid = |key: &CallKey| (key.tgid != 0).then_some(key.tgid);
    // (function, tgid) -> (calls, inclusive, exclusive)
    let mut totals: BTreeMap<(u32, u32), (u64, Slots, Slots)> = BTreeMap::new();
    let mut edges = Vec::new();
    for (key, stats) in &current.calls {
        let (calls, inclusive, exclusive) = match before.get(key) {
            Some(old) => (
                stats.calls.saturating_sub(old.calls),
                sub(&stats.inclusive, &old.inclusive),
                sub(&stats.exclusive, &old.exclusive),
            ),
            None => (stats.calls, stats.inclusive, stats.exclusive),
        };
        if calls == 0 && previous.is_some() {
            continue;
        }
        let total = totals.entry((key.function, key.tgid)).or_insert((
            0,
            [0; MAX_COUNTERS],
            [0; MAX_COUNTERS],
        ));
        total.0 += calls;
        total.1 = add(&total.1, &inclusive);
        total.2 = add(&total.2, &exclusive);
        edges.push(CallEdge {
            caller: (key.parent != ROOT_FUNCTION).then(|| name(key.parent).1),
            callee: name(key.function).1,
            pid: pid(key),
            calls,
            inclusive: entity(&inclusive),
        });
    }
    let weight = ctx.model.weight_counter();
    let functions_list: Vec<FunctionEntry> = totals
        .into_iter()
        .map(|((function, tgid), (calls, inclusive, exclusive))| {
            let (target, symbol) = name(function);
            FunctionEntry {
                target,
                symbol,
                pid: (tgid != 0).then_some(tgid),
                calls,
                inclusive: entity(&inclusive),
                exclusive: entity(&exclusive),
            }
        })
        .collect();
    let mut functions_list = functions_list;
    let weight_of = |entity: &Entity| entity.counters.get(weight).copied().unwrap_or(0);
    functions_list.sort_by(|a, b| {
        weight_of(&b.inclusive)
            .cmp(&weight_of(&a.inclusive))
            .then(a.symbol.cmp(&b.symbol))
    });
    edges.sort_by(|a, b| {
        a.caller
            .cmp(&b.caller)
            .then(a.callee.cmp(&b.callee))
            .then(a.pid.cmp(&b.pid))
    });
    (functions_list, edges)
}

/// Per-cgroup entries: flat (each cgroup's own counts, which add up to the non-idle total),
/// or with `--cgroup-depth N` one entry per cgroup down to depth N holding its whole subtree.
fn cgroup_entries(
    ctx: &ReportContext<'_>,
    current: &Snapshot,
    previous: Option<&Snapshot>,
    entity: &dyn Fn(&Slots) -> Entity,
) -> Vec<CgroupEntry> {
    use crate::cgroup::{ancestor_at, container::describe, depth};
    let before: HashMap<u64, Slots> = previous
        .map(|previous| {
            previous
                .cgroups
                .iter()
                .map(|(id, c)| (*id, c.counters))
                .collect()
        })
        .unwrap_or_default();
    let mut own: Vec<(u64, Option<String>, Slots)> = current
        .cgroups
        .iter()
        .map(|(id, c)| {
            let counters = before
                .get(id)
                .map_or(c.counters, |before| sub(&c.counters, before));
            (*id, ctx.cgroup_paths.get(id).cloned(), counters)
        })
        .filter(|(_, _, counters)| previous.is_none() || counters.iter().any(|&v| v != 0))
        .collect();
    let dropped = sum_cpus(current, |state| &state.cgroup_dropped);
    let dropped = match previous {
        Some(previous) => sub(&dropped, &sum_cpus(previous, |state| &state.cgroup_dropped)),
        None => dropped,
    };
    if dropped.iter().any(|&v| v != 0) {
        own.push((0, None, dropped));
    }

    let entries: Vec<(u64, Option<String>, Slots)> = match ctx.cgroup_depth {
        None => own,
        Some(max_depth) => {
            // Every cgroup down to max_depth gets the sum of its subtree.
            let id_of: HashMap<&str, u64> = ctx
                .cgroup_paths
                .iter()
                .map(|(id, path)| (path.as_str(), *id))
                .collect();
            let mut rolled: BTreeMap<String, (u64, Slots)> = BTreeMap::new();
            for (_, path, counters) in &own {
                let Some(path) = path else { continue };
                for level in 0..=depth(path).min(max_depth) {
                    let ancestor = ancestor_at(path, level);
                    let id = id_of.get(ancestor.as_str()).copied().unwrap_or(0);
                    let slot = rolled.entry(ancestor).or_insert((id, [0; MAX_COUNTERS]));
                    slot.1 = add(&slot.1, counters);
                }
            }
            rolled
                .into_iter()
                .map(|(path, (id, counters))| (id, Some(path), counters))
                .collect()
        }
    };
    let weight = ctx.model.weight_counter();
    let weight_of = |entry: &CgroupEntry| entry.entity.counters.get(weight).copied().unwrap_or(0);
    let mut result: Vec<CgroupEntry> = entries
        .into_iter()
        .map(|(id, path, counters)| {
            let container = path
                .as_deref()
                .map(describe)
                .filter(|info| !info.is_empty());
            CgroupEntry {
                id,
                path,
                container,
                entity: entity(&counters),
            }
        })
        .collect();
    result.sort_by(|a, b| weight_of(b).cmp(&weight_of(a)).then(a.path.cmp(&b.path)));
    result
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

    static NO_PATHS: std::sync::LazyLock<HashMap<u64, String>> =
        std::sync::LazyLock::new(HashMap::new);

    fn context(model: &dyn Model) -> ReportContext<'_> {
        ReportContext {
            model,
            slot_names: model.counters().into_iter().map(|spec| spec.name).collect(),
            level: 0,
            scope: "system-wide".to_owned(),
            duration_s: 1.0,
            interval: None,
            cgroup_paths: &NO_PATHS,
            cgroup_depth: None,
            functions: &[],
        }
    }

    #[test]
    fn threads_sum_into_processes_named_by_their_main_thread() {
        let snapshot = Snapshot {
            cpus: vec![(0, cpu(1000, 100)), (1, cpu(500, 50))],
            live: HashMap::from([(10, task(10, "server", 300)), (11, task(10, "worker", 400))]),
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

    #[test]
    fn intervals_subtract_and_a_reused_tid_is_not_double_counted() {
        let previous = Snapshot {
            cpus: vec![(0, cpu(1000, 100))],
            live: HashMap::from([(7, task(7, "old", 300)), (8, task(8, "steady", 100))]),
            exited: vec![],
            ..Snapshot::default()
        };
        // tid 7 died (final total 350) and a new task reused tid 7 (40 so far).
        let current = Snapshot {
            cpus: vec![(0, cpu(1600, 160))],
            live: HashMap::from([(7, task(7, "new", 40)), (8, task(8, "steady", 100))]),
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
}
