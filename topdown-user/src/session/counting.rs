//! The counting session `stat` and `serve` share: the model and its counter plan, the per-CPU
//! counter groups, the BPF session and its trigger, cgroup naming and filtering, function
//! probes, and CPU hotplug. The commands own only their event loops and their outputs.
//!
//! It starts in two steps so a command can resolve what it traces between them: [`prepare`]
//! validates every option and opens the counters (nothing is attached yet, so a usage error
//! costs nothing), then [`Prepared::start`] loads the BPF programs for the given [`Targets`] and
//! attaches the function probes before a held command is released.

use std::collections::HashMap;

use anyhow::Result;

use crate::{
    cgroup::CgroupTree,
    cli::CountingArgs,
    error::{Failure, fail},
    functions::{
        calibration::{
            CALIBRATION_CALLS, CalibratedAt, Calibration, CalibrationRun, CompensationReport,
            ReturnMechanism, SHORTENED_CALIBRATION_CALLS, SHORTENED_CALIBRATION_SHARE,
            SYNTHETIC_CALIBRATION_CALLS, Setup, calibrate,
        },
        distribution::ProbeCost,
        probes::{ProbeRequest, Probes},
        symbols::ProbeSpec,
    },
    model::{Model, model_by_name, synthetic::parse_synthetic_overrides},
    report::{By, IntervalInfo, Report},
    schedule::Plan,
    session::{
        aggregate::{Aggregate, Naming, ReportContext, SlotCounts, report_of},
        bpf::{ProcessLinks, Session, SessionConfig, Snapshot, Trigger},
        counters::{CounterGroups, Privilege, online_cpus, pmu_cpus, resolve},
        follow::{Follower, follow_command},
        target::{PendingCommand, Scope, resolve_pids},
        tracefs::Tracefs,
    },
};

/// What the BPF side attributes to: the command's scope, resolved.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// What the reports call it: `system-wide`, `pid 123`, `command: make`.
    pub scope: String,
    /// Only these processes get their own entries (`-p`, `-- CMD`); `None`: every task.
    pub tracked_tgids: Option<Vec<u32>>,
    /// Children forked by tracked processes are tracked too (`-- CMD`).
    pub follow_forks: bool,
    /// `-p`: function probes are limited to these processes, and library names resolve through
    /// their mappings. Empty: every process that maps the target.
    pub probe_processes: Vec<u32>,
    /// Function totals are kept per process (`stat --by function,task`); the exporter keeps
    /// them per function.
    pub functions_per_process: bool,
    /// `-- CMD`: the program, whose libraries can unwind through probed functions.
    pub command: Option<std::path::PathBuf>,
    /// `-- CMD` followed by `crate::session::follow`: function probes go to its processes only.
    pub followed: Option<crate::session::bpf::ProcessLinks>,
}

impl Targets {
    /// What runs the probed functions, for `--returns auto`.
    pub fn image(&self) -> crate::functions::unwinding::Image {
        use crate::functions::unwinding::Image;
        match &self.command {
            Some(program) => Image::Command(program.clone()),
            None if !self.probe_processes.is_empty() => {
                Image::Processes(self.probe_processes.clone())
            }
            None => Image::Everything,
        }
    }
}

/// A scope made ready to trace: what the BPF side attributes to, the processes whose end ends
/// the run, the command held before its `execve` (`-- CMD`) and the tracer following it.
pub struct Traced {
    pub targets: Targets,
    /// `-p` and `-- CMD`: the run ends when all of these have exited.
    pub watched_pids: Vec<u32>,
    /// Dropped before its release (the session failed to start), the command exits without
    /// ever running untraced.
    pub pending: Option<PendingCommand>,
    /// Function probes and USDT sites of a command go to its processes only, followed with
    /// ptrace.
    pub follower: Option<(Follower, ProcessLinks)>,
}

/// Resolves `scope` for a session: `-p`'s pids checked, `-- CMD` spawned and held, its follower
/// started when `probes_processes` (function probes or USDT sites).
pub fn trace_scope(
    scope: &Scope,
    probes_processes: bool,
    functions_per_process: bool,
) -> Result<Traced> {
    let (tracked_tgids, watched_pids, pending) = match scope {
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
    let follower = match &pending {
        Some(pending) if probes_processes => follow_command(pending.pid()),
        _ => None,
    };
    let targets = Targets {
        scope: scope.describe(),
        // Library names resolve through the traced processes' own mappings (-p).
        probe_processes: match scope {
            Scope::Pids(_) => tracked_tgids.clone().unwrap_or_default(),
            _ => Vec::new(),
        },
        follow_forks: matches!(scope, Scope::Command(_)),
        tracked_tgids,
        functions_per_process,
        command: pending.as_ref().map(|pending| pending.program().to_owned()),
        followed: follower.as_ref().map(|(_, links)| links.clone()),
    };
    Ok(Traced {
        targets,
        watched_pids,
        pending,
        follower,
    })
}

/// When the function probes' cost is calibrated (`crate::functions::calibration`), with `-u` and
/// the default compensation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalibrateAt {
    /// Before [`Prepared::start`] returns: every report from the first on is compensated
    /// (`serve`, `top`, `stat -I`).
    Start,
    /// At the first report, which for `stat` is its one report at the end: the traced command
    /// starts without waiting for the calibration (~1-2 s on the test VM), and the
    /// calibration still measures the traps seconds from the calls it is subtracted from.
    FirstReport,
}

/// Options checked and counters opened; nothing loaded into the kernel yet.
pub struct Prepared {
    counters: OpenCounters,
    by: Vec<By>,
    cgroups: Option<CgroupTree>,
    cgroup_filter: Option<Vec<u64>>,
    probe_specs: Vec<ProbeSpec>,
    trigger: Trigger,
    spans: SpanRequest,
}

/// `-U`, `--span` and `--postgres`, parsed (resolved to sites once the targets are known).
#[derive(Clone, Debug, Default)]
struct SpanRequest {
    hits: Vec<crate::spans::usdt::ProbeName>,
    specs: Vec<crate::spans::SpanSpec>,
    /// `--postgres`: `Some(empty)` for the default binary.
    postgres: Option<String>,
}

impl SpanRequest {
    fn parse(args: &CountingArgs) -> Result<Self> {
        Ok(Self {
            hits: args
                .usdt
                .iter()
                .map(|text| crate::spans::usdt::ProbeName::parse(text, "-U"))
                .collect::<Result<_>>()?,
            specs: args
                .spans
                .iter()
                .map(|text| crate::spans::SpanSpec::parse(text))
                .collect::<Result<_>>()?,
            postgres: args.postgres.clone(),
        })
    }

    fn is_empty(&self) -> bool {
        self.hits.is_empty() && self.specs.is_empty() && self.postgres.is_none()
    }

    /// The sites and kinds, for `targets`.
    fn plan(&self, targets: &Targets) -> Result<crate::spans::SpanPlan> {
        let pids = if targets.probe_processes.is_empty() {
            targets.tracked_tgids.clone().unwrap_or_default()
        } else {
            targets.probe_processes.clone()
        };
        let postgres = match &self.postgres {
            Some(binary) if binary.is_empty() => Some(crate::spans::postgres::default_binary(
                &pids,
                targets.command.as_deref(),
            )?),
            Some(binary) => Some(crate::spans::usdt::find_file(binary, &pids)?),
            None => None,
        };
        crate::spans::SpanPlan::build(&self.hits, &self.specs, postgres.as_deref(), &pids)
    }
}

/// The USDT program's links and what its kinds and probes are.
pub struct ActiveSpans {
    pub naming: crate::spans::report::SpanNaming,
    _links: crate::session::bpf::UsdtLinks,
}

/// Checks the counting options, selects the model (announcing fallbacks) and opens its counters
/// on every CPU. `requested_by` are the breakdowns asked for: `-u` adds functions and
/// `--cgroup-depth` adds cgroups.
pub fn prepare(args: &CountingArgs, requested_by: &[By]) -> Result<Prepared> {
    let mut by = requested_by.to_vec();
    if !args.uprobes.is_empty() && !by.contains(&By::Function) {
        by.push(By::Function);
    }
    if args.cgroup_depth.is_some() && !by.contains(&By::Cgroup) {
        by.push(By::Cgroup);
    }
    let probe_specs = parse_probe_specs(&args.uprobes)?;
    let spans = SpanRequest::parse(args)?;
    if (!spans.specs.is_empty() || spans.postgres.is_some()) && !by.contains(&By::Span) {
        by.push(By::Span);
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
    let counters = open_counters(args)?;
    let wants_cgroups = by.contains(&By::Cgroup);
    let mut tree = if wants_cgroups || !args.cgroups.is_empty() {
        Some(CgroupTree::open()?)
    } else {
        None
    };
    let cgroup_filter = match (&mut tree, args.cgroups.is_empty()) {
        (Some(tree), false) => Some(tree.resolve(&args.cgroups)?),
        _ => None,
    };
    Ok(Prepared {
        counters,
        cgroups: if wants_cgroups { tree } else { None },
        by,
        cgroup_filter,
        probe_specs,
        trigger,
        spans,
    })
}

impl Prepared {
    /// The breakdowns reports will show (with what `-u` and `--cgroup-depth` imply).
    pub fn by(&self) -> &[By] {
        &self.by
    }

    /// Loads and attaches the BPF programs for `targets`, then the function probes. If this
    /// fails, nothing stays attached.
    pub fn start(
        self,
        args: &CountingArgs,
        targets: Targets,
        verbose: bool,
        calibrate_at: CalibrateAt,
    ) -> Result<CountingSession> {
        let counters = self.counters;
        let weight_slot = counters
            .plan
            .slot_names()
            .iter()
            .position(|name| name == counters.model.weight_counter())
            .unwrap_or(0) as u32;
        let span_plan = if self.spans.is_empty() {
            None
        } else {
            Some(self.spans.plan(&targets)?)
        };
        let usdt = span_plan
            .as_ref()
            .map(|plan| crate::session::bpf::UsdtSizes {
                sites: plan.sites.sites.len() as u32,
                hit_probes: plan.sites.hit_probes.len() as u32,
                max_spans: args.max_spans,
            })
            .unwrap_or_default();
        let config = SessionConfig {
            tracked_tgids: targets.tracked_tgids.clone(),
            follow_forks: targets.follow_forks,
            max_tasks: args.max_tasks,
            max_tracked: args.max_tracked,
            verbose,
            split_functions_by_process: targets.functions_per_process,
            max_stacks: args.max_stacks,
            max_calls: args.max_calls,
            max_buckets: args.max_buckets,
            weight_slot,
            by_cgroup: self.cgroups.is_some(),
            cgroup_filter: self.cgroup_filter,
            max_cgroups: args.max_cgroups,
            num_slots: counters.plan.slots.len() as u32,
            slot_sources: counters.plan.slot_sources(),
            trigger: self.trigger,
            skip_untraced_switches: !args.read_every_switch,
            usdt,
        };
        // Duplicated before the run's session takes the counters: the calibration reads them too.
        let calibration_counters = if self.probe_specs.is_empty() || args.no_compensation {
            None
        } else {
            Some((counters.groups.try_clone()?, counters.groups.hybrid_cpus()))
        };
        // Reading the probed files' symbols needs nothing of the BPF session: it runs on a
        // thread of its own while this one loads the programs and the kernel verifies them,
        // which is most of the time before the command may run (issue 28's 300 ms).
        let (bpf, resolution) = std::thread::scope(|scope| {
            let resolving = (!self.probe_specs.is_empty()).then(|| {
                scope.spawn(|| {
                    let started = std::time::Instant::now();
                    let resolution = crate::functions::symbols::resolve(
                        &self.probe_specs,
                        &targets.probe_processes,
                    );
                    log::info!(
                        "reading the probed functions' symbols took {:.1} ms",
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    resolution
                })
            });
            let started = std::time::Instant::now();
            let bpf = Session::start(&config, counters.groups, &counters.tracefs);
            log::info!(
                "loading the BPF programs and maps took {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            let resolution = resolving.map(|thread| {
                thread.join().unwrap_or_else(|_| {
                    Err(anyhow::anyhow!(
                        "reading the probed functions' symbols panicked"
                    ))
                })
            });
            (bpf, resolution)
        });
        let mut bpf = bpf?;
        if let Some(links) = &targets.followed {
            bpf.follow_processes(links.clone());
        }
        let spans = match span_plan {
            Some(plan) => Some(attach_spans(
                &mut bpf,
                plan,
                &targets.probe_processes,
                args.usdt_links,
            )?),
            None => None,
        };
        let probes = match resolution {
            None => None,
            Some(resolution) => Some(Probes::attach_resolution(
                &mut bpf,
                ProbeRequest {
                    specs: self.probe_specs,
                    processes: targets.probe_processes.clone(),
                    returns: args.return_mode(),
                    image: targets.image(),
                    verbose,
                },
                resolution?,
            )?),
        };
        let calibration = match (calibration_counters, &probes) {
            (Some((groups, hybrid_cpus)), Some(probes)) => CalibrationState::Pending(Pending {
                groups,
                hybrid_cpus,
                mechanisms: probes.mechanisms_in_use(),
                calls: if counters.model.is_synthetic() {
                    SYNTHETIC_CALIBRATION_CALLS
                } else {
                    CALIBRATION_CALLS
                },
                weight_slot,
            }),
            _ => CalibrationState::Off,
        };
        let mut session = CountingSession {
            model: counters.model,
            level: counters.level,
            slot_names: counters.plan.slot_names(),
            plan: counters.plan,
            tracefs: counters.tracefs,
            cpus: counters.cpus,
            bpf,
            probes,
            spans,
            calibration,
            by: self.by,
            cgroups: self.cgroups,
            cgroup_depth: args.cgroup_depth.map(|depth| depth as usize),
            scope: targets.scope,
            command_start: None,
        };
        if calibrate_at == CalibrateAt::Start {
            session.calibrate(CalibratedAt::Start);
        }
        Ok(session)
    }
}

/// The probe-cost calibration of a session.
enum CalibrationState {
    /// No `-u`, or `--no-compensation`.
    Off,
    /// To run before the first report (`CalibrateAt::FirstReport`).
    Pending(Pending),
    /// Measured, subtracted from function figures.
    Done(Calibration, CalibrationRun),
    /// Failed and said so: the figures stay raw.
    Failed,
}

/// What a calibration still to run needs from the run.
struct Pending {
    /// The run's counters, duplicated before its session took them.
    groups: CounterGroups,
    hybrid_cpus: Vec<(String, Vec<u32>)>,
    mechanisms: Vec<ReturnMechanism>,
    calls: u64,
    /// The run's `SessionConfig::weight_slot`.
    weight_slot: u32,
}

/// A running count: everything attached, attributing until dropped (dropping detaches all).
pub struct CountingSession {
    model: Box<dyn Model>,
    level: u8,
    plan: Plan,
    tracefs: Tracefs,
    slot_names: Vec<String>,
    cpus: Vec<u32>,
    /// The loaded BPF programs and their maps.
    pub bpf: Session,
    /// The `-u` function probes, if any.
    pub probes: Option<Probes>,
    /// The USDT sites (`-U`, `--span`, `--postgres`), if any.
    pub spans: Option<ActiveSpans>,
    /// Their measured cost, subtracted from function figures.
    calibration: CalibrationState,
    by: Vec<By>,
    /// Present when cgroups are counted: names cgroup ids (remembering removed cgroups).
    cgroups: Option<CgroupTree>,
    cgroup_depth: Option<usize>,
    scope: String,
    /// `-- CMD`: the state when the command started and everything counted before it.
    command_start: Option<(Snapshot, SlotCounts)>,
}

impl CountingSession {
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// The breakdowns reports show (with what `-u` and `--cgroup-depth` imply).
    pub fn by(&self) -> &[By] {
        &self.by
    }

    /// Shows functions too (a configuration reload that adds `-u`).
    pub fn show_functions(&mut self) {
        if !self.by.contains(&By::Function) {
            self.by.push(By::Function);
        }
    }

    /// The hotplug poll: re-opens the counters of a CPU that came back online.
    pub fn check_cpus(&mut self) {
        if let Err(err) = self.bpf.check_cpus() {
            log::warn!("{err:#}");
        }
    }

    /// Everything attributed so far; `last` freezes the counters first (the final report).
    pub fn snapshot(&mut self, last: bool) -> Result<Snapshot> {
        self.bpf.flush(last)?;
        let mut snapshot = self.bpf.snapshot()?;
        if let Some(spans) = &self.spans {
            snapshot.spans = self.bpf.span_snapshot(spans.naming.hit_probes.len())?;
        }
        Ok(snapshot)
    }

    /// `-- CMD`, just before the command is released: reports from here on describe its run.
    /// What was counted until now (topdown's start-up, attaching, the probe calibration) is
    /// left out of every figure and reported apart (`before_command`).
    pub fn mark_command_start(&mut self) -> Result<()> {
        let start = self.snapshot(false)?;
        let before = Aggregate::since(&start, None).totals;
        self.command_start = Some((start, before));
        Ok(())
    }

    /// The report of `snapshot` (since the command's start with `-- CMD`), or (interval mode,
    /// the exporter) of what happened since `previous`.
    pub fn report(
        &mut self,
        snapshot: &Snapshot,
        previous: Option<&Snapshot>,
        duration_s: f64,
        interval: Option<IntervalInfo>,
    ) -> Report {
        let aggregate = match (previous, &self.command_start) {
            (None, Some((start, _))) => Aggregate::since_start(snapshot, start),
            _ => Aggregate::since(snapshot, previous),
        };
        self.report_of(&aggregate, duration_s, interval)
    }

    /// Names and evaluates `aggregate` (made from this session's snapshots) into a report.
    pub fn report_of(
        &mut self,
        aggregate: &Aggregate,
        duration_s: f64,
        interval: Option<IntervalInfo>,
    ) -> Report {
        self.report_with(aggregate, duration_s, interval, true)
    }

    /// [`Self::report_of`] without the caller -> callee edges, which `top`'s screen never
    /// shows.
    pub fn screen_report_of(&mut self, aggregate: &Aggregate, duration_s: f64) -> Report {
        self.report_with(aggregate, duration_s, None, false)
    }

    fn report_with(
        &mut self,
        aggregate: &Aggregate,
        duration_s: f64,
        interval: Option<IntervalInfo>,
        call_tree: bool,
    ) -> Report {
        self.calibrate(CalibratedAt::End);
        let cgroup_paths = self.cgroup_paths(aggregate);
        let (compensated, compensation) = self.compensate(aggregate);
        let aggregate = compensated.as_ref().unwrap_or(aggregate);
        let weight_slot = self
            .slot_names
            .iter()
            .position(|name| name == self.model.weight_counter());
        let distribution_probe_costs = |function: u32| -> Option<ProbeCost> {
            compensation.as_ref()?;
            let CalibrationState::Done(calibration, _) = &self.calibration else {
                return None;
            };
            let mechanism = self.probes.as_ref()?.mechanism(function)?;
            calibration.weight_costs(mechanism, weight_slot?)
        };
        let ctx = ReportContext {
            model: self.model.as_ref(),
            slot_names: self.slot_names.clone(),
            level: self.level,
            scope: self.scope.clone(),
            duration_s,
            interval,
            cgroup_paths: &cgroup_paths,
            cgroup_depth: self.cgroup_depth,
            functions: self.functions(),
            target_returns: self
                .probes
                .as_ref()
                .map(|probes| probes.target_returns())
                .unwrap_or_default(),
            call_tree,
            distribution_probe_costs: &distribution_probe_costs,
            command_scope: self.command_start.is_some(),
            before_command: self.command_start.as_ref().map(|(_, before)| *before),
        };
        let mut report = report_of(&ctx, aggregate);
        if let Some(probes) = &self.probes {
            let ids: HashMap<(&str, &str), u32> = probes
                .functions()
                .iter()
                .enumerate()
                .map(|(id, (target, symbol))| ((target.as_str(), symbol.as_str()), id as u32))
                .collect();
            for function in &mut report.functions {
                function.entry_single_step = ids
                    .get(&(function.target.as_str(), function.symbol.as_str()))
                    .is_some_and(|id| probes.entry_single_step(*id));
            }
        }
        report.probe_compensation = compensation;
        if let Some(spans) = &self.spans {
            let (entries, usdt) = crate::spans::report::entries(
                &spans.naming,
                &aggregate.spans,
                self.model.as_ref(),
                &self.slot_names,
                self.level,
            );
            report.spans = entries;
            report.usdt = usdt;
            report.span_diagnostics = Some(aggregate.spans.stats);
        }
        report
    }

    /// Shortens the calibration still to run (`calibration::SHORTENED_CALIBRATION_SHARE`):
    /// the run was ended by a signal, whose sender waits for topdown to end.
    pub fn shorten_calibration(&mut self) {
        if let CalibrationState::Pending(pending) = &mut self.calibration {
            let planned = pending.calls;
            pending.calls = (planned / SHORTENED_CALIBRATION_SHARE)
                .max(SHORTENED_CALIBRATION_CALLS.min(planned));
            eprintln!(
                "topdown: ended by a signal: the probes' cost is calibrated with {} calls per \
                 run instead of {planned}, so that topdown ends within a second",
                pending.calls,
            );
        }
    }

    /// Runs the probe-cost calibration if it is still to run (`CalibrateAt::FirstReport`);
    /// `at` is what the report will say of when it ran. A failure leaves the figures raw and
    /// says so in one line.
    pub fn calibrate(&mut self, at: CalibratedAt) {
        if !matches!(self.calibration, CalibrationState::Pending(_)) {
            return;
        }
        let CalibrationState::Pending(pending) =
            std::mem::replace(&mut self.calibration, CalibrationState::Failed)
        else {
            return;
        };
        let started = std::time::Instant::now();
        // A signal while calibrating ends topdown at once (`crate::session::interrupt`).
        let phase = crate::session::interrupt::set(crate::session::interrupt::Phase::Calibrating);
        let calibrated = calibrate_probes(Setup {
            groups: pending.groups,
            plan: &self.plan,
            tracefs: &self.tracefs,
            mechanisms: pending.mechanisms,
            hybrid_cpus: pending.hybrid_cpus,
            calls: pending.calls,
            weight_slot: pending.weight_slot,
            after_counting: at == CalibratedAt::End,
        });
        crate::session::interrupt::set(phase);
        if let Some(calibration) = calibrated {
            let run = CalibrationRun {
                at,
                duration_ms: started.elapsed().as_secs_f64() * 1e3,
            };
            self.calibration = CalibrationState::Done(calibration, run);
        }
    }

    /// `aggregate` with the function probes' own cost taken out of its per-function figures,
    /// and what was subtracted; `(None, None)` when nothing is (no `-u`, `--no-compensation`,
    /// a calibration that failed or has not run yet).
    /// Task, process, cgroup and CPU totals stay raw: the probes really ran there.
    pub fn compensate(
        &self,
        aggregate: &Aggregate,
    ) -> (Option<Aggregate>, Option<CompensationReport>) {
        match (&self.calibration, &self.probes) {
            (CalibrationState::Done(calibration, run), Some(probes)) => {
                let (compensated, mut report) = calibration.compensate(
                    aggregate,
                    &|id| probes.mechanism(id),
                    probes.functions(),
                    &self.slot_names,
                );
                report.calibrated = Some(run.clone());
                (Some(compensated), Some(report))
            }
            _ => (None, None),
        }
    }

    /// The paths of `aggregate`'s cgroups (and, for `--cgroup-depth` roll-ups, of every cgroup
    /// seen), rescanning the hierarchy for ids not seen yet.
    pub fn cgroup_paths(&mut self, aggregate: &Aggregate) -> HashMap<u64, String> {
        let mut paths = HashMap::new();
        if let Some(tree) = &mut self.cgroups {
            for (id, _) in &aggregate.cgroups {
                if let Some(path) = tree.path_of(*id) {
                    paths.insert(*id, path);
                }
            }
            if self.cgroup_depth.is_some() {
                paths.extend(tree.known_paths());
            }
        }
        paths
    }

    /// What this session's aggregates mean (the exporter's reading of them).
    pub fn naming<'a>(&'a self, cgroup_paths: &'a HashMap<u64, String>) -> Naming<'a> {
        Naming::new(
            self.model.as_ref(),
            &self.slot_names,
            self.level,
            cgroup_paths,
            self.cgroup_depth,
            self.functions(),
        )
    }

    /// Probed functions by id: `(target, symbol)`.
    fn functions(&self) -> &[(String, String)] {
        self.probes
            .as_ref()
            .map(|probes| probes.functions())
            .unwrap_or_default()
    }

    /// Frees the map entries of cgroups removed since they were named, and drops them from
    /// `snapshot` (their last counts are in the report just built from it). A daemon's maps
    /// stay bounded by the cgroups that exist.
    pub fn forget_removed_cgroups(&mut self, snapshot: &mut Snapshot) -> Result<()> {
        let Some(tree) = &self.cgroups else {
            return Ok(());
        };
        let mount = tree.mount().to_path_buf();
        let known: HashMap<u64, String> = tree.known_paths().collect();
        let removed: Vec<u64> = snapshot
            .cgroups
            .iter()
            .filter(|(id, _)| {
                known
                    .get(id)
                    .is_some_and(|path| !mount.join(path.trim_start_matches('/')).exists())
            })
            .map(|(id, _)| *id)
            .collect();
        if !removed.is_empty() {
            self.bpf.forget_cgroups(&removed)?;
            snapshot.cgroups.retain(|(id, _)| !removed.contains(id));
        }
        Ok(())
    }
}

/// Attaches the USDT program to `plan`'s sites (in `processes`, or every process mapping
/// each file) and says so in one line.
fn attach_spans(
    bpf: &mut Session,
    plan: crate::spans::SpanPlan,
    processes: &[u32],
    linking: crate::session::bpf::UsdtLinking,
) -> Result<ActiveSpans> {
    let started = std::time::Instant::now();
    let links = bpf.attach_usdt(&plan.sites, processes, linking)?;
    let sites = &plan.sites.sites;
    let mut files: Vec<&std::path::Path> = sites.iter().map(|site| site.target.as_path()).collect();
    files.sort();
    files.dedup();
    let semaphores = sites.iter().filter(|site| site.ref_ctr_offset != 0).count();
    eprintln!(
        "topdown: USDT: {} site{} in {} file{} ({}, {} with semaphores) attached in {:.1} ms",
        sites.len(),
        if sites.len() == 1 { "" } else { "s" },
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        match links.mode {
            crate::session::bpf::AttachMode::Multi => "uprobe.multi",
            crate::session::bpf::AttachMode::PerPoint => "one perf uprobe per site",
        },
        semaphores,
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(ActiveSpans {
        naming: crate::spans::report::SpanNaming {
            kinds: plan.kinds,
            hit_probes: plan.sites.hit_probes,
        },
        _links: links,
    })
}

/// Runs the probe-cost calibration; a failure leaves the figures raw and says so in one line.
fn calibrate_probes(setup: Setup<'_>) -> Option<Calibration> {
    if setup.mechanisms.is_empty() {
        return None;
    }
    let leader = setup
        .plan
        .slot_names()
        .into_iter()
        .next()
        .unwrap_or_default();
    match calibrate(setup) {
        Ok(calibration) => {
            let costs: Vec<String> = calibration
                .costs()
                .iter()
                .map(|cost| {
                    let core = cost
                        .core_type
                        .as_deref()
                        .map(|core| format!(" on {core}"))
                        .unwrap_or_default();
                    format!(
                        "{:?}{core}: {:.0} per call, {:.0} per probed callee",
                        cost.mechanism,
                        cost.per_call.get(&leader).copied().unwrap_or(0.0),
                        cost.per_callee.get(&leader).copied().unwrap_or(0.0),
                    )
                    .to_lowercase()
                })
                .collect();
            eprintln!(
                "topdown: probe cost ({leader}) {}; subtracted from function figures \
                 (--no-compensation keeps it)",
                costs.join("; ")
            );
            Some(calibration)
        }
        Err(err) => {
            eprintln!("topdown: probe cost not calibrated, function figures include it: {err:#}");
            None
        }
    }
}

/// `-u` texts to specs (the first error names the bad one).
pub fn parse_probe_specs(texts: &[String]) -> Result<Vec<ProbeSpec>> {
    texts.iter().map(|text| ProbeSpec::parse(text)).collect()
}

/// The model, its counter plan and the opened per-CPU groups.
struct OpenCounters {
    model: Box<dyn Model>,
    level: u8,
    plan: Plan,
    groups: CounterGroups,
    tracefs: Tracefs,
    cpus: Vec<u32>,
}

/// Selects the model (announcing fallbacks), plans its counters and opens them on every CPU.
fn open_counters(args: &CountingArgs) -> Result<OpenCounters> {
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
    Ok(OpenCounters {
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
pub fn plan_counters(model: &dyn Model, level: u8, max_counters: Option<u32>) -> Result<Plan> {
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
                    let cpus = crate::session::counters::parse_cpu_list(&done.1)
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
        let cpus = crate::session::counters::parse_cpu_list(&done.1)
            .map_err(|err| usage(format!("{err:#}")))?;
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
    crate::session::pmu::free_general_counters(std::path::Path::new("/"), pmu)
}

fn effective_level(model: &dyn Model, requested: u8) -> u8 {
    if model.max_level() == 0 { 0 } else { requested }
}

/// The model for `--pmu`, and the line that announces a fallback.
/// Adds the `-e` events to the model's counters (parsed against this machine's PMUs).
pub(crate) fn with_extra_events(model: Box<dyn Model>, specs: &[String]) -> Result<Box<dyn Model>> {
    if specs.is_empty() {
        return Ok(model);
    }
    // libpfm-style names without a `pmu::` prefix are encoded for the model in use, not for
    // whatever PMU libpfm detects (they differ with --pmu naming another CPU's model).
    let catalog =
        crate::events::PmuCatalog::load(std::path::Path::new("/")).with_model(model.base_name());
    let mut events = Vec::with_capacity(specs.len());
    for spec in specs {
        let event = crate::events::parse_event(spec, &catalog).map_err(|err| {
            fail(
                Failure::Usage,
                format!("-e {spec} (with model {}): {err:#}", model.name()),
            )
        })?;
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
                format!(
                    "-e {spec}: model {} already counts this event; leave it out",
                    model.name()
                ),
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
        let choice = crate::session::pmu::auto_model(std::path::Path::new("/"))?;
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
    match crate::session::pmu::detect(std::path::Path::new("/")) {
        Ok(detection) if detection.hypervisor && !detection.core_pmu => fail(
            Failure::PmuUnavailable,
            crate::model::with_events::missing_pmu_message(model),
        ),
        _ => err,
    }
}

/// Loading BPF and opening system-wide counters needs root, or CAP_BPF + CAP_PERFMON.
fn check_privileges() -> Result<()> {
    if crate::session::capabilities::capabilities_suffice(
        crate::session::capabilities::effective_capabilities()?,
    ) {
        Ok(())
    } else {
        Err(fail(
            Failure::Permission,
            "topdown needs root, or the CAP_BPF and CAP_PERFMON capabilities: run it with sudo",
        ))
    }
}
