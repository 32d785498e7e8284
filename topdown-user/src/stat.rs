//! `topdown stat`: opens the model's counters, starts the BPF session, runs the event loop
//! (signals, interval reports, exit records, the traced command) and writes the final report.

use std::{
    collections::HashMap,
    fs::File,
    io::Write,
    os::fd::RawFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};

use crate::{
    aggregate::{ReportContext, build_report},
    bpf::{AttachMode, ProbePoint, Session, SessionConfig, Snapshot, Trigger},
    cgroup::CgroupTree,
    cli::{CountingArgs, StatArgs},
    counters::{CounterGroups, Privilege, online_cpus, pmu_cpus, resolve},
    error::{Failure, fail},
    model::{Model, model_by_name, synthetic::parse_synthetic_overrides},
    report::{By, IntervalInfo, Report, render},
    schedule::Plan,
    symbols::{ProbeSpec, resolve as resolve_functions},
    target::{PendingCommand, ProcessWatch, Scope, reap, resolve_pids},
    tracefs::Tracefs,
};

/// Why the counting stopped.
enum Stop {
    Duration,
    Signal(libc::c_int),
    TargetsGone,
}

/// Runs `topdown stat`; returns the process exit status (the command's, with `-- CMD`).
pub async fn run(args: StatArgs, verbose: bool) -> Result<u8> {
    // Before anything is loaded: a Ctrl-C from here on ends the run cleanly with a report,
    // never kills topdown half-way.
    let mut signals = Signals {
        interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
    };
    let scope = scope_of(&args);
    // Fail on bad output paths before touching the kernel.
    let mut output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(File::create(path).map_err(|err| {
            fail(
                Failure::Usage,
                format!("cannot write {}: {err}", path.display()),
            )
        })?),
        None => Box::new(std::io::stdout()),
    };
    let counting = open_counting(&args)?;
    let Counting {
        model,
        level,
        plan,
        groups,
        tracefs,
        cpus,
    } = counting;
    let counters = plan.counters.clone();

    let wants_cgroups = args.by.contains(&By::Cgroup) || args.cgroup_depth.is_some();
    let mut cgroup_tree = if wants_cgroups || !args.cgroups.is_empty() {
        Some(CgroupTree::open()?)
    } else {
        None
    };
    let cgroup_filter = match (&mut cgroup_tree, args.cgroups.is_empty()) {
        (Some(tree), false) => Some(tree.resolve(&args.cgroups)?),
        _ => None,
    };
    let mut by = args.by.clone();
    if !args.uprobes.is_empty() && !by.contains(&By::Function) {
        by.push(By::Function);
    }
    let probe_specs = args
        .uprobes
        .iter()
        .map(|text| ProbeSpec::parse(text))
        .collect::<Result<Vec<_>>>()?;
    if args.cgroup_depth.is_some() && !by.contains(&By::Cgroup) {
        by.push(By::Cgroup);
    }
    let cgroup_only = by == [By::Cgroup];
    let trigger = match args.trigger {
        Some(Trigger::CgroupSwitch) if !cgroup_only => {
            return Err(fail(
                Failure::Usage,
                "--trigger cgroup-switch only counts per cgroup: use it with --by cgroup alone",
            ));
        }
        Some(trigger) => trigger,
        None if cgroup_only => Trigger::CgroupSwitch,
        None => Trigger::SchedSwitch,
    };
    let mut reporting = Reporting {
        model: model.as_ref(),
        level,
        slot_names: plan.slot_names(),
        scope: scope.describe(),
        by,
        cgroups: if wants_cgroups { cgroup_tree } else { None },
        cgroup_depth: args.cgroup_depth.map(|depth| depth as usize),
        functions: Vec::new(),
    };

    let (tracked, watched_pids, pending) = match &scope {
        Scope::SystemWide => (None, Vec::new(), None),
        Scope::Pids(pids) => {
            let tgids = resolve_pids(pids)?;
            (Some(tgids.clone()), tgids, None)
        }
        Scope::Command(argv) => {
            let pending = PendingCommand::spawn(argv)?;
            (
                Some(vec![pending.pid()]),
                vec![pending.pid()],
                Some(pending),
            )
        }
    };
    let config = SessionConfig {
        tracked_tgids: tracked,
        follow_forks: matches!(scope, Scope::Command(_)),
        max_tasks: args.max_tasks,
        max_tracked: args.max_tracked,
        verbose,
        split_functions_by_process: reporting.by.contains(&By::Function)
            && reporting.by.contains(&By::Task),
        max_stacks: args.max_stacks,
        max_calls: args.max_calls,
        by_cgroup: reporting.cgroups.is_some(),
        cgroup_filter,
        max_cgroups: args.max_cgroups,
        num_slots: plan.slots.len() as u32,
        slot_sources: plan.slot_sources(),
        trigger,
    };
    // If the session cannot start, dropping `pending` closes its pipe and the held command
    // exits without ever running untraced.
    let mut session = Session::start(&config, groups, &tracefs)?;
    if !probe_specs.is_empty() {
        // Library names resolve through the traced processes' own mappings (-p).
        let pids: Vec<u32> = match &scope {
            Scope::Pids(_) => config.tracked_tgids.clone().unwrap_or_default(),
            _ => Vec::new(),
        };
        reporting.functions = attach_probes(&mut session, &probe_specs, &pids, args.uretprobes)?;
    }
    let command_pid = match pending {
        Some(pending) => Some(pending.release()?),
        None => None,
    };
    let mut watches = Vec::new();
    for pid in watched_pids {
        if let Some(watch) = ProcessWatch::new(pid)? {
            watches.push(watch);
        }
    }
    eprintln!(
        "topdown: counting {} with model {} ({} counters x {} CPUs){}",
        scope.describe(),
        model.name(),
        counters.len(),
        cpus.len(),
        if args.duration.is_none() && command_pid.is_none() {
            "; Ctrl-C to stop"
        } else {
            ""
        }
    );

    let started = Instant::now();
    let mut interval_state = args.interval_ms.map(|ms| IntervalState {
        period: Duration::from_millis(ms),
        index: 0,
        previous: None,
        previous_end: Duration::ZERO,
    });
    let stop = event_loop(
        &mut signals,
        &mut session,
        &args,
        &mut watches,
        &mut interval_state,
        started,
        &mut reporting,
        output.as_mut(),
    )
    .await?;

    if let (Some(pid), Stop::Signal(signo)) = (command_pid, &stop) {
        // The command may not have seen the signal (kill to topdown alone): pass it on and let
        // it finish, so its last counts are in the report.
        crate::target::signal(pid, *signo);
        for watch in &watches {
            if watch.pid() == pid {
                let _ = tokio::time::timeout(Duration::from_secs(5), watch.exited()).await;
            }
        }
    }

    session.flush(true)?;
    let snapshot = session.snapshot()?;
    let elapsed = started.elapsed();
    match &mut interval_state {
        Some(state) => {
            // The last, partial interval, so nothing counted is left out.
            write_interval(
                state,
                &snapshot,
                elapsed,
                &mut reporting,
                args.format,
                output.as_mut(),
            )?;
        }
        None => {
            let report = reporting.build(&snapshot, None, elapsed.as_secs_f64(), None);
            render(&report, args.format, &reporting.by, output.as_mut())?;
        }
    }
    output.flush().context("writing the report")?;
    drop(session);

    let status = match command_pid {
        Some(pid) => wait_command(pid).await,
        None => 0,
    };
    if matches!(stop, Stop::TargetsGone) && command_pid.is_none() {
        eprintln!("topdown: every traced process has exited");
    }
    Ok(status)
}

struct IntervalState {
    period: Duration,
    index: u64,
    previous: Option<Snapshot>,
    previous_end: Duration,
}

struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[allow(clippy::too_many_arguments)]
async fn event_loop(
    signals: &mut Signals,
    session: &mut Session,
    args: &StatArgs,
    watches: &mut Vec<ProcessWatch>,
    interval_state: &mut Option<IntervalState>,
    started: Instant,
    reporting: &mut Reporting<'_>,
    output: &mut dyn Write,
) -> Result<Stop> {
    let deadline = args
        .duration
        .map(|seconds| tokio::time::Instant::from_std(started) + Duration::from_secs_f64(seconds));
    let exits = register(session.exits_fd()).context("polling the exit ring buffer")?;
    let logs = match session.log_fd() {
        Some(fd) => Some(register(fd).context("polling BPF logs")?),
        None => None,
    };
    let mut ticker = interval_state.as_ref().map(|state| {
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::from_std(started) + state.period,
            state.period,
        );
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    let tracking_targets = !watches.is_empty();
    let mut hotplug = tokio::time::interval(Duration::from_secs(1));
    hotplug.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            _ = hotplug.tick() => {
                if let Err(err) = session.check_cpus() {
                    log::warn!("{err:#}");
                }
            }
            _ = signals.interrupt.recv() => return Ok(Stop::Signal(libc::SIGINT)),
            _ = signals.terminate.recv() => return Ok(Stop::Signal(libc::SIGTERM)),
            _ = sleep_until(deadline) => return Ok(Stop::Duration),
            gone = first_exit(watches), if tracking_targets => {
                let index = gone?;
                watches.swap_remove(index);
                if watches.is_empty() {
                    return Ok(Stop::TargetsGone);
                }
            }
            guard = exits.readable() => {
                let mut guard = guard.context("waiting for exit records")?;
                session.drain_exits();
                guard.clear_ready();
            }
            guard = readable(logs.as_ref()) => {
                let mut guard = guard.context("waiting for BPF logs")?;
                session.flush_logs();
                guard.clear_ready();
            }
            _ = tick(ticker.as_mut()) => {
                if let Some(state) = interval_state.as_mut() {
                    session.flush(false)?;
                    let snapshot = session.snapshot()?;
                    write_interval(state, &snapshot, started.elapsed(), reporting, args.format, output)?;
                    output.flush().context("writing the report")?;
                }
            }
        }
    }
}

/// What every report of a run shares, and the cgroup names learned so far.
pub(crate) struct Reporting<'m> {
    pub(crate) model: &'m dyn Model,
    pub(crate) level: u8,
    pub(crate) slot_names: Vec<String>,
    pub(crate) scope: String,
    pub(crate) by: Vec<By>,
    /// Present with `--by cgroup`: names cgroup ids (remembering removed cgroups).
    pub(crate) cgroups: Option<CgroupTree>,
    pub(crate) cgroup_depth: Option<usize>,
    /// Probed functions by id: `(target, demangled symbol)`.
    pub(crate) functions: Vec<(String, String)>,
}

impl Reporting<'_> {
    pub(crate) fn build(
        &mut self,
        snapshot: &Snapshot,
        previous: Option<&Snapshot>,
        duration_s: f64,
        interval: Option<IntervalInfo>,
    ) -> Report {
        let mut cgroup_paths = HashMap::new();
        if let Some(tree) = &mut self.cgroups {
            for (id, _) in &snapshot.cgroups {
                if let Some(path) = tree.path_of(*id) {
                    cgroup_paths.insert(*id, path);
                }
            }
            // Ancestors are named too, for --cgroup-depth roll-ups.
            if self.cgroup_depth.is_some() {
                cgroup_paths.extend(tree.known_paths());
            }
        }
        let ctx = ReportContext {
            model: self.model,
            slot_names: self.slot_names.clone(),
            level: self.level,
            scope: self.scope.clone(),
            duration_s,
            interval,
            cgroup_paths: &cgroup_paths,
            cgroup_depth: self.cgroup_depth,
            functions: &self.functions,
        };
        build_report(&ctx, snapshot, previous)
    }
}

fn write_interval(
    state: &mut IntervalState,
    snapshot: &Snapshot,
    now: Duration,
    reporting: &mut Reporting<'_>,
    format: crate::report::Format,
    output: &mut dyn Write,
) -> Result<()> {
    state.index += 1;
    let interval = IntervalInfo {
        index: state.index,
        end_s: now.as_secs_f64(),
    };
    let duration_s = now.saturating_sub(state.previous_end).as_secs_f64();
    let report = reporting.build(
        snapshot,
        state.previous.as_ref(),
        duration_s,
        Some(interval),
    );
    render(&report, format, &reporting.by, output)?;
    state.previous = Some(snapshot.clone());
    state.previous_end = now;
    Ok(())
}

/// The level reports are computed at: the software model has none.
/// Resolves the `-u` specs and attaches their probes; returns `(target, symbol)` per function
/// id (the attach cookie).
pub fn attach_probes(
    session: &mut Session,
    probe_specs: &[ProbeSpec],
    pids: &[u32],
    uretprobes: bool,
) -> Result<Vec<(String, String)>> {
    let functions = resolve_functions(probe_specs, pids)?;
    let points: Vec<ProbePoint> = functions
        .iter()
        .enumerate()
        .map(|(id, function)| ProbePoint {
            target: function.target.clone(),
            offset: function.offset,
            exits: if uretprobes {
                None
            } else {
                function.exits.clone()
            },
            function_id: id as u32,
        })
        .collect();
    // Attached before a held command execs, so none of its calls are missed.
    let attach_started = Instant::now();
    let mode = session.attach_functions(&points, pids)?;
    eprintln!(
        "topdown: probing {} function{} ({}) attached in {:.1} ms",
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        match mode {
            AttachMode::Multi => "uprobe.multi",
            AttachMode::PerPoint => "one uprobe per function",
        },
        attach_started.elapsed().as_secs_f64() * 1e3
    );
    Ok(functions
        .into_iter()
        .map(|function| (function.target.display().to_string(), function.display))
        .collect())
}

/// The model, its counter plan and the opened per-CPU groups: what `stat` and `serve` share.
pub struct Counting {
    pub model: Box<dyn Model>,
    pub level: u8,
    pub plan: Plan,
    pub groups: CounterGroups,
    pub tracefs: Tracefs,
    pub cpus: Vec<u32>,
}

/// Selects the model (announcing fallbacks), plans its counters and opens them on every CPU.
pub fn open_counting(args: &CountingArgs) -> Result<Counting> {
    let (model, announcement) = select_model(args)?;
    if let Some(line) = announcement {
        eprintln!("topdown: {line}");
    }
    let model = with_extra_events(model, &args.events)?;
    let level = args.level;
    if model.max_level() < level && model.max_level() > 0 {
        eprintln!(
            "topdown: model {} computes TopDown level {} only; level-{level} metrics are null",
            model.name(),
            model.max_level()
        );
    }
    let privilege = match (args.all_user, args.all_kernel) {
        (true, _) => Privilege::UserOnly,
        (_, true) => Privilege::KernelOnly,
        _ => Privilege::All,
    };
    check_privileges()?;
    let tracefs = Tracefs::locate_or_mount()?;
    let level = effective_level(model.as_ref(), level);
    let plan = plan_counters(model.as_ref(), level, args.max_counters)?;
    for note in &plan.notes {
        eprintln!("{note}");
    }
    let counters = resolve(&plan.counters, Some(&tracefs))?;
    let cpus = online_cpus()?;
    let hybrid_cpus = synthetic_hybrid_cpus(model.as_ref(), args.hybrid_cpus.as_deref(), &cpus)?;
    let cpus_of = |pmu: &str| -> Result<Vec<u32>> {
        match &hybrid_cpus {
            Some(split) => split
                .iter()
                .find(|(name, _)| name == pmu)
                .map(|(_, list)| list.clone())
                .ok_or_else(|| {
                    fail(
                        Failure::Usage,
                        format!("--hybrid-cpus gives no CPUs for {pmu}"),
                    )
                }),
            None => pmu_cpus(pmu),
        }
    };
    let groups = CounterGroups::open(&plan, &counters, &cpus, &cpus_of, privilege)
        .map_err(|err| explain_missing_pmu(err, model.as_ref()))?;
    Ok(Counting {
        model,
        level,
        plan,
        groups,
        tracefs,
        cpus,
    })
}

/// The counter plan: the PMU's general-purpose counters bound how many events count at once
/// (`--max-counters` overrides the detected number; synthetic models are unbounded unless told).
fn plan_counters(model: &dyn Model, level: u8, max_counters: Option<u32>) -> Result<Plan> {
    let detect = !model.is_synthetic() && max_counters.is_none();
    let budget = move |pmu: Option<&str>| {
        if detect {
            detected_free_counters(pmu)
        } else {
            max_counters
        }
    };
    crate::schedule::plan(model, level, &budget)
        .map_err(|err| fail(Failure::Usage, format!("{err:#}")))
}

/// Each hybrid PMU's CPUs: `(pmu, cpus)`.
type HybridCpus = Vec<(String, Vec<u32>)>;

/// For a synthetic hybrid model, the CPUs standing in for each core type (`--hybrid-cpus`, or
/// the online CPUs split in two halves). `None` for every other model: real hybrid PMUs say
/// which CPUs they cover in sysfs.
fn synthetic_hybrid_cpus(
    model: &dyn Model,
    requested: Option<&str>,
    online: &[u32],
) -> Result<Option<HybridCpus>> {
    use crate::model::hybrid::{ATOM_PMU, CORE_PMU};
    let is_hybrid = model
        .counters()
        .iter()
        .any(|spec| crate::schedule::counter_pmu(&spec.name).is_some());
    if !is_hybrid || !model.is_synthetic() {
        if requested.is_some() {
            return Err(fail(
                Failure::Usage,
                "--hybrid-cpus only applies to a synthetic hybrid model, e.g. --pmu \
                 synthetic:hybrid:intel-spr+intel-grt",
            ));
        }
        return Ok(None);
    }
    let split = match requested {
        Some(text) => parse_hybrid_cpus(text)?,
        None => {
            if online.len() < 2 {
                return Err(fail(
                    Failure::Usage,
                    "a synthetic hybrid model needs two online CPUs to stand in for the two \
                     core types, or --hybrid-cpus cpu_core=0,cpu_atom=0",
                ));
            }
            let half = online.len() / 2;
            vec![
                (CORE_PMU.to_owned(), online[..half].to_vec()),
                (ATOM_PMU.to_owned(), online[half..].to_vec()),
            ]
        }
    };
    let describe: Vec<String> = split
        .iter()
        .map(|(pmu, cpus)| {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            format!("{pmu} = CPU {}", list.join(","))
        })
        .collect();
    eprintln!(
        "topdown: synthetic hybrid: {} (choose with --hybrid-cpus)",
        describe.join(", ")
    );
    Ok(Some(split))
}

fn parse_hybrid_cpus(text: &str) -> Result<HybridCpus> {
    use crate::model::hybrid::{ATOM_PMU, CORE_PMU};
    let usage = |what: String| {
        fail(
            Failure::Usage,
            format!("--hybrid-cpus '{text}': {what}; expected e.g. cpu_core=0-1,cpu_atom=2-3"),
        )
    };
    let mut split: Vec<(String, Vec<u32>)> = Vec::new();
    let mut current: Option<(String, String)> = None;
    // Commas separate both the PMUs and a cpulist's parts: a part with '=' starts a new PMU.
    for part in text.split(',') {
        match part.split_once('=') {
            Some((pmu, list)) => {
                if let Some(done) = current.take() {
                    let cpus = crate::counters::parse_cpu_list(&done.1)
                        .map_err(|err| usage(format!("{err:#}")))?;
                    split.push((done.0, cpus));
                }
                if pmu != CORE_PMU && pmu != ATOM_PMU {
                    return Err(usage(format!("unknown PMU '{pmu}'")));
                }
                current = Some((pmu.to_owned(), list.to_owned()));
            }
            None => match &mut current {
                Some((_, list)) => {
                    list.push(',');
                    list.push_str(part);
                }
                None => return Err(usage(format!("'{part}' names no PMU"))),
            },
        }
    }
    if let Some(done) = current {
        let cpus =
            crate::counters::parse_cpu_list(&done.1).map_err(|err| usage(format!("{err:#}")))?;
        split.push((done.0, cpus));
    }
    for pmu in [CORE_PMU, ATOM_PMU] {
        if !split
            .iter()
            .any(|(name, cpus)| name == pmu && !cpus.is_empty())
        {
            return Err(usage(format!("no CPUs for {pmu}")));
        }
    }
    Ok(split)
}

/// Free general-purpose counters of this machine's core PMU (or hybrid `pmu`), from detection.
fn detected_free_counters(pmu: Option<&str>) -> Option<u32> {
    crate::pmu::free_general_counters(std::path::Path::new("/"), pmu)
}

fn effective_level(model: &dyn Model, requested: u8) -> u8 {
    if model.max_level() == 0 { 0 } else { requested }
}

async fn wait_command(pid: u32) -> u8 {
    loop {
        if let Some(status) = reap(pid) {
            return u8::try_from(status).unwrap_or(u8::MAX);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn tick(ticker: Option<&mut tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn readable(
    fd: Option<&AsyncFd<FdRef>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, FdRef>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// Index of the first watched process to exit.
async fn first_exit(watches: &[ProcessWatch]) -> Result<usize> {
    let waits = watches.iter().enumerate().map(|(index, watch)| {
        Box::pin(async move {
            watch.exited().await?;
            Ok::<usize, anyhow::Error>(index)
        })
    });
    let (result, _, _) = futures_select_all(waits).await;
    result
}

/// A minimal `select_all` (avoids a dependency for one call).
async fn futures_select_all<F>(
    futures: impl IntoIterator<Item = std::pin::Pin<Box<F>>>,
) -> (F::Output, usize, ())
where
    F: std::future::Future,
{
    let mut futures: Vec<_> = futures.into_iter().collect();
    std::future::poll_fn(move |cx| {
        for (index, future) in futures.iter_mut().enumerate() {
            if let std::task::Poll::Ready(output) = future.as_mut().poll(cx) {
                return std::task::Poll::Ready((output, index, ()));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Registers a session-owned fd with the event loop.
fn register(fd: RawFd) -> Result<AsyncFd<FdRef>> {
    // SAFETY: the session owns the fd and outlives the event loop that polls it.
    unsafe { AsyncFd::register(FdRef(fd)) }.map_err(|err| anyhow::anyhow!("{err}"))
}

/// A borrowed fd for `AsyncFd` (the session owns the real one and outlives the loop).
struct FdRef(RawFd);

impl std::os::fd::AsRawFd for FdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn scope_of(args: &StatArgs) -> Scope {
    if !args.command.is_empty() {
        Scope::Command(args.command.clone())
    } else if !args.pids.is_empty() {
        Scope::Pids(args.pids.clone())
    } else {
        Scope::SystemWide
    }
}

/// The model for `--pmu`, and the line that announces a fallback.
/// Adds the `-e` events to the model's counters (parsed against this machine's PMUs).
fn with_extra_events(model: Box<dyn Model>, specs: &[String]) -> Result<Box<dyn Model>> {
    if specs.is_empty() {
        return Ok(model);
    }
    let catalog = crate::events::PmuCatalog::load(std::path::Path::new("/"));
    let mut events = Vec::with_capacity(specs.len());
    for spec in specs {
        let event = crate::events::parse_event(spec, &catalog)
            .map_err(|err| fail(Failure::Usage, format!("-e: {err:#}")))?;
        if model
            .counters()
            .iter()
            .any(|counter| counter.name == event.name)
            || events
                .iter()
                .any(|known: &crate::events::EventAttr| known.name == event.name)
        {
            return Err(fail(
                Failure::Usage,
                format!("-e {spec}: this event is already counted"),
            ));
        }
        events.push(event);
    }
    Ok(Box::new(crate::model::with_events::WithEvents::new(
        model, events,
    )))
}

fn select_model(args: &CountingArgs) -> Result<(Box<dyn Model>, Option<String>)> {
    select_model_by(&args.pmu, args.synthetic.as_deref())
}

/// The model for `--pmu` (`auto` detects) and `--synthetic` overrides, with the line announcing
/// a fallback when `auto` found no TopDown PMU.
pub fn select_model_by(
    pmu: &str,
    synthetic: Option<&str>,
) -> Result<(Box<dyn Model>, Option<String>)> {
    let overrides = match synthetic {
        Some(text) => parse_synthetic_overrides(text)
            .map_err(|err| fail(Failure::Usage, format!("{err:#}")))?,
        None => Vec::new(),
    };
    if pmu == "auto" {
        if !overrides.is_empty() {
            return Err(fail(
                Failure::Usage,
                "--synthetic needs an explicit synthetic model: --pmu synthetic:<model>",
            ));
        }
        let choice = crate::pmu::auto_model(std::path::Path::new("/"))?;
        let model = model_by_name(&choice.model, &[])?;
        return Ok((model, choice.announcement));
    }
    let model = model_by_name(pmu, &overrides)
        .map_err(|err| fail(Failure::Usage, format!("--pmu: {err:#}")))?;
    Ok((model, None))
}

/// A hardware model's counters failed to open: say so plainly when this is a VM without a
/// virtual PMU, the usual reason on cloud machines.
fn explain_missing_pmu(err: anyhow::Error, model: &dyn Model) -> anyhow::Error {
    if crate::error::failure_of(&err) != Some(Failure::PmuUnavailable) || model.is_synthetic() {
        return err;
    }
    match crate::pmu::detect(std::path::Path::new("/")) {
        Ok(detection) if detection.hypervisor && !detection.core_pmu => fail(
            Failure::PmuUnavailable,
            format!(
                "model {} needs a hardware PMU, but this is a VM without a virtual PMU (hypervisor \
                 flag set, no core PMU in /sys/bus/event_source/devices): use --pmu software, or \
                 --pmu synthetic:{} to exercise the pipeline",
                model.name(),
                model.recorded_name()
            ),
        ),
        _ => err,
    }
}

/// Loading BPF and opening system-wide counters needs root, or CAP_BPF + CAP_PERFMON.
fn check_privileges() -> Result<()> {
    if crate::check::capabilities_suffice(crate::check::effective_capabilities()?) {
        Ok(())
    } else {
        Err(fail(
            Failure::Permission,
            "topdown needs root, or the CAP_BPF and CAP_PERFMON capabilities: run it with sudo",
        ))
    }
}
