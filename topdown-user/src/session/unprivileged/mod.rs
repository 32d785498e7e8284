//! `topdown stat -- CMD` without BPF: what a user without root (or CAP_BPF + CAP_PERFMON) gets,
//! and what `--no-bpf` forces.
//!
//! # How it counts
//!
//! The model's counter plan (the same [`crate::schedule::Plan`] the BPF session uses) is opened
//! on the held command itself, once per CPU, as *inherited per-task* counters
//! ([`task_counters`]): every thread and child process the command creates gets a copy, and
//! the counters start at the command's `execve` (`enable_on_exec`), so nothing of topdown's own
//! start-up is counted. Reading an event returns the whole tree's count, live tasks included.
//!
//! Per task, the kernel offers one exact reading: with `inherit_stat`, an inherited counter
//! writes its task's final value as a `PERF_RECORD_READ` into the ring buffer when the task
//! exits (kernel/events/core.c, `sync_child_event`; perf's `record -s` reads the same records).
//! So every thread and process of the command that exits during the run gets its own exact
//! entry, once the record of every counting event arrived for it (see [`task_counters`] for
//! why each event has its own buffer). The command's main thread is the one task without such
//! records (its events are the parents, not copies); its counts are the tree's total minus
//! every task split off.
//!
//! Limits, by construction:
//! - a task still running when the report is made has no record yet, and one whose records
//!   did not all arrive (a full buffer) cannot be checked: their counts are inside the main
//!   thread's remainder, stderr names them and `diagnostics.unsplit_tasks` counts them
//!   (normally the command waits for its children and nothing is left running);
//! - no `-I`: a running task's value is not readable on its own, so intervals could not be split
//!   per task;
//! - per-function (`-u`), per-cgroup (`--by cgroup`, `-G`) and other processes (`-p`, `-a`) need
//!   BPF and are refused with one line (exit 2);
//! - without CAP_PERFMON and with `kernel.perf_event_paranoid` above 1, the kernel counts only
//!   user space (`perf_allow_kernel`): every event excludes kernel and hypervisor, and the
//!   synthetic models (kernel tracepoints, which would count nothing then) are refused.
//!
//! Formulas, names and outputs are the BPF session's: the counts become an [`Aggregate`] and go
//! through the same [`report_of`] and renderers, so `-o` recordings read back with `report -i`.

mod records;
mod task_counters;

use std::{collections::HashMap, ffi::OsString, time::Duration, time::Instant};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{SignalKind, signal};

use self::{
    records::CounterValue,
    task_counters::{Exclusions, TaskCounters},
};
use crate::{
    cli::StatArgs,
    error::{Failure, fail},
    model::{CounterSource, Model},
    report::{By, Format, render},
    schedule::Plan,
    session::{
        aggregate::{Aggregate, ReportContext, SlotCounts, TaskCounts, processes_of, report_of},
        counters::{Privilege, online_cpus, pmu_cpus, resolve},
        event_loop::sleep_until,
        target::{PendingCommand, ProcessWatch},
    },
    ui::output::Output,
};

/// Why the run counts without BPF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// `--no-bpf`.
    Asked,
    /// Neither root nor CAP_BPF + CAP_PERFMON.
    Unprivileged,
}

/// `Some` when `stat` must count without BPF.
pub fn applies(args: &StatArgs) -> Result<Option<Why>> {
    if args.no_bpf {
        return Ok(Some(Why::Asked));
    }
    let capabilities = crate::session::capabilities::effective_capabilities()?;
    Ok(
        (!crate::session::capabilities::capabilities_suffice(capabilities))
            .then_some(Why::Unprivileged),
    )
}

/// The line every run without BPF prints: what it cannot do.
const NOT_AVAILABLE: &str = "topdown: counting the command without BPF (per process and thread, \
     with inherited per-task counters): per-function (-u), per-cgroup (--by cgroup, -G), other \
     processes (-p, -a) and -I need root or CAP_BPF+CAP_PERFMON";

/// The first option this path cannot honour, as the one-line usage error.
fn refusal(args: &StatArgs, why: Why) -> Option<String> {
    let needs = match why {
        Why::Asked => "is not available with --no-bpf",
        Why::Unprivileged => "needs root or CAP_BPF+CAP_PERFMON (BPF)",
    };
    let only = "without it topdown counts only a command it starts, per process and thread: \
                topdown stat -- CMD";
    if !args.uprobes.is_empty() || args.report.by.contains(&By::Function) {
        return Some(format!(
            "per-function counting (-u, --by function) {needs}; leave it out, or use the \
             topdown-region library in the program itself"
        ));
    }
    if !args.usdt.is_empty()
        || !args.spans.is_empty()
        || args.postgres.is_some()
        || args.report.by.contains(&By::Span)
    {
        return Some(format!(
            "counting USDT probes and spans (-U, --span, --postgres, --by span) {needs}; leave it out"
        ));
    }
    if args.report.by.contains(&By::Cgroup)
        || !args.cgroups.is_empty()
        || args.cgroup_depth.is_some()
    {
        return Some(format!(
            "per-cgroup counting (--by cgroup, -G, --cgroup-depth) {needs}; {only}"
        ));
    }
    if !args.scope.pids.is_empty() {
        return Some(format!("-p (processes already running) {needs}; {only}"));
    }
    if args.scope.command.is_empty() {
        return Some(format!(
            "-a (every task, the default without -- CMD) {needs}; {only}"
        ));
    }
    if args.interval_ms.is_some() {
        return Some(format!(
            "-I {needs}: inherited counters give a task's own value only when it exits; leave \
             out -I"
        ));
    }
    if args.trigger.is_some() {
        return Some(format!("--trigger {needs}; leave it out"));
    }
    if args.report.format == Format::Svg {
        return Some(format!(
            "--format svg draws probed functions, which {needs}"
        ));
    }
    None
}

/// Runs `topdown stat -- CMD` with inherited per-task counters; returns the command's status.
pub async fn run(args: StatArgs, why: Why) -> Result<u8> {
    if let Some(line) = refusal(&args, why) {
        return Err(fail(Failure::Usage, line));
    }
    eprintln!("{NOT_AVAILABLE}");
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut output = Output::open(args.report.output.as_deref())?;

    let setup = Setup::new(&args)?;
    let pending = PendingCommand::spawn(&args.scope.command)?;
    // If opening fails, dropping `pending` ends the held command before it ever runs.
    let mut counters = TaskCounters::open(
        pending.pid(),
        &setup.plan,
        &setup.counters,
        &setup.cpus,
        &|pmu: &str| pmu_cpus(pmu),
        setup.exclusions,
    )?;
    let pid = pending.release()?;
    let watch = ProcessWatch::new(pid)?;
    let scope = crate::session::target::Scope::Command(args.scope.command.clone()).describe();
    eprintln!(
        "topdown: counting {scope} with model {} ({} counters x {} CPUs, per task){}",
        setup.model.name(),
        setup.plan.counters.len(),
        counters.cpu_count(),
        if setup.exclusions.user_only {
            "; user space only (kernel.perf_event_paranoid > 1 without CAP_PERFMON)"
        } else {
            ""
        }
    );

    let started = Instant::now();
    let deadline = args
        .scope
        .duration
        .map(|secs| tokio::time::Instant::now() + Duration::from_secs_f64(secs));
    // Records are drained often enough that the buffers never fill in ordinary runs; a full
    // buffer is counted (PERF_RECORD_LOST) and reported.
    let mut drain = tokio::time::interval(Duration::from_millis(20));
    let mut signalled = None;
    let mut command_exited = false;
    loop {
        tokio::select! {
            _ = interrupt.recv() => { signalled = Some(libc::SIGINT); break; }
            _ = terminate.recv() => { signalled = Some(libc::SIGTERM); break; }
            _ = sleep_until(deadline) => break,
            result = exited(watch.as_ref()) => {
                result?;
                command_exited = true;
                break;
            }
            _ = drain.tick() => counters.drain(),
        }
    }
    if let (Some(signo), Some(watch)) = (signalled, &watch) {
        // The command may not have seen the signal (kill to topdown alone): pass it on and let
        // it finish, so its last counts are in the report.
        crate::session::target::signal(pid, signo);
        command_exited = tokio::time::timeout(Duration::from_secs(5), watch.exited())
            .await
            .is_ok();
    }
    let elapsed = started.elapsed();

    // Totals first, records second: a task exiting in between has its record taken, and the
    // remainder (main thread and running tasks) only shrinks.
    let per_cpu = counters.read_cpus()?;
    counters.drain();
    let command_name = program_name(&args.scope.command);
    let tally = &counters.tally;
    let built = build_aggregate(
        &setup.plan,
        pid,
        command_exited || watch.is_none(),
        &per_cpu,
        tally,
        &command_name,
    );
    if !built.running.is_empty() {
        eprintln!(
            "topdown: {} task(s) of the command were still running at the end (tid {}); the \
             kernel gives an inherited counter's per-task value only at exit, so their counts \
             are in pid {pid}'s main thread",
            built.running.len(),
            listed(&built.running)
        );
    }
    if !built.incomplete.is_empty() || tally.lost > 0 || tally.undecodable > 0 {
        eprintln!(
            "topdown: {} task(s) exited without all their exit readings arriving (tid {}; {} \
             record(s) lost, {} unreadable): their counts are in pid {pid}'s main thread",
            built.incomplete.len(),
            listed(&built.incomplete),
            tally.lost,
            tally.undecodable
        );
    }
    let ctx = ReportContext {
        model: setup.model.as_ref(),
        slot_names: setup.plan.slot_names(),
        level: setup.level,
        scope,
        duration_s: elapsed.as_secs_f64(),
        interval: None,
        cgroup_paths: &HashMap::new(),
        cgroup_depth: None,
        functions: &[],
        target_returns: &[],
        call_tree: true,
        distribution_probe_costs: &|_| None,
        // The counters start at the command's execve: nothing is counted before it.
        command_scope: true,
        before_command: None,
    };
    let report = report_of(&ctx, &built.aggregate);
    render(
        &report,
        args.report.format,
        &args.report.by,
        args.report.weight,
        output.as_mut(),
    )?;
    output.commit()?;
    drop(counters);
    Ok(crate::session::target::wait_command(pid).await)
}

/// The model, its plan and how to open it, checked before the command is started.
struct Setup {
    model: Box<dyn Model>,
    level: u8,
    plan: Plan,
    counters: Vec<crate::session::counters::ResolvedCounter>,
    cpus: Vec<u32>,
    exclusions: Exclusions,
}

impl Setup {
    fn new(args: &StatArgs) -> Result<Self> {
        let counting = &args.counting;
        let (model, announcement) = crate::session::counting::select_model_by(
            &counting.pmu,
            counting.synthetic.as_deref(),
        )?;
        if let Some(line) = announcement {
            eprintln!("topdown: {line}");
        }
        let model = crate::session::counting::with_extra_events(model, &counting.events)?;
        if counting.level > model.max_level() && model.max_level() > 0 {
            eprintln!(
                "topdown: model {} computes TopDown level {} only; level-{} metrics are null",
                model.name(),
                model.max_level(),
                counting.level
            );
        }
        if counting.hybrid_cpus.is_some() || (model.is_synthetic() && is_hybrid(model.as_ref())) {
            return Err(fail(
                Failure::Usage,
                "a synthetic hybrid model splits the CPUs between core types, which only the \
                 BPF session does: use a plain synthetic model with --no-bpf",
            ));
        }
        let level = if model.max_level() == 0 {
            0
        } else {
            counting.level
        };
        let plan =
            crate::session::counting::plan_counters(model.as_ref(), level, counting.max_counters)?;
        for note in &plan.notes {
            eprintln!("{note}");
        }
        let paranoid = read_paranoid()?;
        let perfmon = crate::session::capabilities::perfmon_capable(
            crate::session::capabilities::effective_capabilities()?,
        );
        let user_only = kernel_counting_refused(paranoid, perfmon);
        if user_only && counting.all_kernel {
            return Err(fail(
                Failure::Permission,
                format!(
                    "--all-kernel: kernel.perf_event_paranoid is {paranoid}, so without \
                     CAP_PERFMON only user space can be counted (needs 1 or less)"
                ),
            ));
        }
        let tracepoints = uses_tracepoints(&plan);
        if tracepoints && user_only {
            return Err(fail(
                Failure::Permission,
                format!(
                    "model {} counts kernel tracepoints, which count nothing in user space only \
                     (kernel.perf_event_paranoid is {paranoid}; needs 1 or less, or root): use \
                     --pmu software",
                    model.name()
                ),
            ));
        }
        let tracefs = if tracepoints {
            Some(crate::session::tracefs::Tracefs::locate_or_mount()?)
        } else {
            None
        };
        let counters = resolve(&plan.counters, tracefs.as_ref())?;
        let privilege = match (counting.all_user, counting.all_kernel) {
            (true, _) => Privilege::UserOnly,
            (_, true) => Privilege::KernelOnly,
            _ => Privilege::All,
        };
        Ok(Self {
            model,
            level,
            plan,
            counters,
            cpus: online_cpus()?,
            exclusions: Exclusions {
                privilege,
                user_only,
            },
        })
    }
}

/// The kernel refuses to count kernel code for a user without CAP_PERFMON when
/// `perf_event_paranoid` > 1 (kernel/events/core.c `perf_allow_kernel`; the levels are in
/// Documentation/admin-guide/sysctl/kernel.rst, "perf_event_paranoid").
fn kernel_counting_refused(paranoid: i32, perfmon: bool) -> bool {
    !perfmon && paranoid > 1
}

fn read_paranoid() -> Result<i32> {
    let path = "/proc/sys/kernel/perf_event_paranoid";
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("parsing {path}: expected a number, got '{}'", text.trim()))
}

fn is_hybrid(model: &dyn Model) -> bool {
    model
        .counters()
        .iter()
        .any(|spec| crate::schedule::counter_pmu(&spec.name).is_some())
}

fn uses_tracepoints(plan: &Plan) -> bool {
    plan.counters.iter().any(|spec| match &spec.source {
        CounterSource::Tracepoint { .. } => true,
        CounterSource::Event(event) => {
            matches!(event.kind, crate::events::EventKind::Tracepoint { .. })
        }
        CounterSource::Perf { .. } => false,
    })
}

fn program_name(argv: &[OsString]) -> String {
    let Some(first) = argv.first() else {
        return String::new();
    };
    let path = std::path::Path::new(first);
    let name = path.file_name().unwrap_or(first.as_os_str());
    // The kernel keeps 15 bytes of a task's name (TASK_COMM_LEN - 1).
    name.to_string_lossy().chars().take(15).collect()
}

/// The counts per task, and the tasks whose own counts stayed in the main thread.
struct Built {
    aggregate: Aggregate,
    /// Created and never seen exiting: no exit readings yet.
    running: Vec<u32>,
    /// Exited, but not every counting event's exit reading arrived (lost or unreadable).
    incomplete: Vec<u32>,
}

/// Puts the per-CPU totals and the exit records into the aggregate the BPF path makes. A task
/// gets its own entry only when all its exit readings arrived; the main thread's entry is the
/// totals minus those entries, so nothing is counted twice or dropped.
fn build_aggregate(
    plan: &Plan,
    pid: u32,
    command_exited: bool,
    per_cpu: &[(u32, Vec<CounterValue>)],
    tally: &task_counters::Tally,
    command_name: &str,
) -> Built {
    let counter_count = plan.counters.len();
    let mut total = vec![CounterValue::default(); counter_count];
    for (_, values) in per_cpu {
        add_values(&mut total, values);
    }
    let mut recorded = vec![CounterValue::default(); counter_count];
    let mut tasks = Vec::with_capacity(tally.exited.len() + 1);
    let mut exited: Vec<(&u32, &task_counters::Exited)> = tally
        .exited
        .iter()
        .filter(|(tid, _)| **tid != pid && tally.complete(**tid))
        .collect();
    exited.sort_by_key(|(tid, _)| **tid);
    for (&tid, task) in exited {
        add_values(&mut recorded, &task.values);
        tasks.push(TaskCounts {
            tid,
            tgid: task.tgid,
            comm: tally.comm_of(tid, command_name).into(),
            exited: true,
            counts: slot_counts(plan, &task.values),
        });
    }
    let remainder: Vec<CounterValue> = total
        .iter()
        .zip(&recorded)
        .map(|(all, parts)| CounterValue {
            value: all.value.saturating_sub(parts.value),
            enabled_ns: all.enabled_ns.saturating_sub(parts.enabled_ns),
            running_ns: all.running_ns.saturating_sub(parts.running_ns),
        })
        .collect();
    tasks.push(TaskCounts {
        tid: pid,
        tgid: pid,
        comm: tally.comm_of(pid, command_name).into(),
        exited: command_exited,
        counts: slot_counts(plan, &remainder),
    });
    let mut incomplete: Vec<u32> = tally
        .exited
        .keys()
        .chain(tally.exits.keys())
        .copied()
        .filter(|&tid| tid != pid && !tally.complete(tid))
        .collect();
    incomplete.sort_unstable();
    incomplete.dedup();
    let mut running: Vec<u32> = tally
        .forks
        .keys()
        .copied()
        .filter(|tid| {
            *tid != pid && !tally.exits.contains_key(tid) && !tally.exited.contains_key(tid)
        })
        .collect();
    running.sort_unstable();
    let processes = processes_of(&tasks);
    let aggregate = Aggregate {
        totals: slot_counts(plan, &total),
        tasks,
        processes,
        cpus: per_cpu
            .iter()
            .map(|(cpu, values)| (*cpu, slot_counts(plan, values)))
            .collect(),
        diagnostics: crate::report::Diagnostics {
            unsplit_tasks: (running.len() + incomplete.len()) as u64,
            ..Default::default()
        },
        ..Default::default()
    };
    Built {
        aggregate,
        running,
        incomplete,
    }
}

/// `tids` for a message: the first few, and how many more.
fn listed(tids: &[u32]) -> String {
    const SHOWN: usize = 10;
    let mut text = tids
        .iter()
        .take(SHOWN)
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if tids.len() > SHOWN {
        text += &format!(" and {} more", tids.len() - SHOWN);
    }
    text
}

fn add_values(sum: &mut [CounterValue], values: &[CounterValue]) {
    for (slot, value) in sum.iter_mut().zip(values) {
        *slot += *value;
    }
}

/// Per-counter values into the plan's slots: each slot takes its counter's value, or (for a
/// rotating group) its leader's enabled or running time, as the BPF side fills them
/// (`topdown_common::slot_source`), so the model's evaluator scales the same way.
fn slot_counts(plan: &Plan, values: &[CounterValue]) -> SlotCounts {
    use topdown_common::slot_source;
    let mut slots = SlotCounts::ZERO;
    for (slot, planned) in plan.slots.iter().enumerate() {
        let Some(value) = values.get(slot_source::fd_slot(planned.source) as usize) else {
            continue;
        };
        let field = match slot_source::field(planned.source) {
            slot_source::FIELD_ENABLED => value.enabled_ns,
            slot_source::FIELD_RUNNING => value.running_ns,
            _ => value.value,
        };
        if let Some(target) = slots.0.get_mut(slot) {
            *target = field;
        }
    }
    slots
}

async fn exited(watch: Option<&ProcessWatch>) -> Result<()> {
    match watch {
        Some(watch) => watch.exited().await,
        // Gone before it could be watched: nothing to wait for.
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_counting_follows_paranoid_and_perfmon() {
        assert!(kernel_counting_refused(2, false));
        assert!(kernel_counting_refused(3, false));
        assert!(!kernel_counting_refused(1, false));
        assert!(!kernel_counting_refused(-1, false));
        assert!(!kernel_counting_refused(2, true));
    }

    /// One exited task's tally entry with `readings` of the plan's exit readings.
    fn exited(tgid: u32, values: Vec<CounterValue>, readings: usize) -> task_counters::Exited {
        task_counters::Exited {
            tgid,
            values,
            readings,
        }
    }

    #[test]
    fn the_main_thread_gets_what_no_exit_record_has() {
        let model = crate::model::model_by_name("synthetic:intel-icl", &[]).unwrap();
        let plan = crate::schedule::plan(model.as_ref(), 1, &|_| None).unwrap();
        let n = plan.counters.len();
        let value = |v: u64| CounterValue {
            value: v,
            enabled_ns: 10,
            running_ns: 10,
        };
        let mut cpu0 = vec![value(0); n];
        cpu0[0] = value(700);
        let mut cpu1 = vec![value(0); n];
        cpu1[0] = value(300);
        // Two CPUs: each exiting task writes one reading per counter per CPU.
        let mut tally = task_counters::Tally {
            events: 2 * n,
            ..Default::default()
        };
        let mut thread = vec![value(0); n];
        thread[0] = value(200);
        tally.exited.insert(11, exited(10, thread, 2 * n));
        let mut child = vec![value(0); n];
        child[0] = value(500);
        tally.exited.insert(12, exited(12, child, 2 * n));
        // Exited, but one of its readings never arrived: not split, and said.
        let mut partial = vec![value(0); n];
        partial[0] = value(40);
        tally.exited.insert(14, exited(10, partial, 2 * n - 1));
        // Exited with no reading at all.
        for tid in [10, 11, 12, 14, 15] {
            tally.exits.insert(tid, 1);
        }
        tally.forks.insert(11, (10, 10));
        tally.forks.insert(12, (12, 10));
        tally.forks.insert(13, (13, 12));
        tally.forks.insert(14, (10, 10));
        tally.forks.insert(15, (10, 10));
        tally.comms.insert(10, (5, "work".to_owned()));
        let built = build_aggregate(&plan, 10, true, &[(0, cpu0), (1, cpu1)], &tally, "fallback");
        let slots = |tid: u32| {
            built
                .aggregate
                .tasks
                .iter()
                .find(|task| task.tid == tid)
                .map(|task| (task.counts.get(0), task.comm.to_string()))
        };
        assert_eq!(slots(10), Some((300, "work".to_owned())));
        assert_eq!(slots(11), Some((200, "work".to_owned())));
        assert_eq!(slots(12), Some((500, "work".to_owned())));
        assert_eq!(slots(14), None, "its 40 stay in the main thread's 300");
        assert_eq!(slots(15), None);
        assert_eq!(built.aggregate.totals.get(0), 1000);
        assert_eq!(built.running, [13], "forked and never exited");
        assert_eq!(built.incomplete, [14, 15]);
        assert_eq!(built.aggregate.diagnostics.unsplit_tasks, 3);
        let process = |pid: u32| {
            built
                .aggregate
                .processes
                .iter()
                .find(|process| process.pid == pid)
                .map(|process| (process.threads, process.counts.get(0)))
        };
        assert_eq!(process(10), Some((2, 500)));
        assert_eq!(process(12), Some((1, 500)));
    }

    #[test]
    fn a_reused_tid_is_split_only_with_every_instance_complete() {
        let mut tally = task_counters::Tally {
            events: 4,
            ..Default::default()
        };
        tally.exits.insert(20, 2);
        tally.exited.insert(20, exited(20, Vec::new(), 8));
        tally.exits.insert(21, 2);
        tally.exited.insert(21, exited(21, Vec::new(), 4));
        tally.exited.insert(22, exited(22, Vec::new(), 4));
        assert!(tally.complete(20));
        assert!(!tally.complete(21), "one instance's readings missing");
        assert!(
            !tally.complete(22),
            "its exit record missing: cannot be checked"
        );
        assert_eq!(listed(&[1, 2]), "1, 2");
        assert_eq!(
            listed(&(1..=12).collect::<Vec<_>>()),
            "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more"
        );
    }
}
