//! `topdown-floor`: the benchmark's floor instrument (`cargo xtask bench`). Loads the floor
//! programs (topdown-ebpf's `floor.rs`), attached as topdown attaches its own, and keeps them
//! attached until SIGINT or SIGTERM (the kernel detaches them when the process ends, as with
//! topdown).
//!
//! Without options: the empty `tp_btf/sched_switch` program (`--filter-pids`: one that does what
//! a process filter must at a switch, and no more). `--pmu MODEL` opens the counter
//! groups topdown would open for MODEL (its counter plan and `CounterGroups::open`) and hands
//! them to the programs; `--read` attaches the sched_switch program that reads them; `-u
//! BINARY:FUNC` attaches programs that read them at entry and at return of FUNC; `-U
//! BINARY:PROVIDER:NAME` attaches the entry program at every site of a USDT probe (a span's
//! floor: the same two sites, the same counters, nothing else); `--span-start` and `--span-end`
//! attach a span's same-work floor (the start's reading kept per thread, the difference
//! added to a total at the end); `--go-switches BINARY`
//! attaches uprobes where topdown hooks that Go binary's goroutine switches
//! (`topdown::functions::symbols::go::HOOKS`): programs reading the counters with `--pmu`, empty
//! ones without.

use std::{path::PathBuf, process::ExitCode, time::Instant};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{MapData, PerfEventArray},
    programs::{
        BtfTracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use clap::{Parser, ValueEnum};
use topdown::{
    error::{Failure, fail, failure_of},
    functions::symbols::{self, ProbeSpec},
    session::{
        bpf::{attach_to_cgroup_switches, switch_offsets},
        counters::{CounterGroups, Privilege, online_cpus, pmu_cpus, resolve},
        tracefs::Tracefs,
    },
};
use topdown_common::{MAX_COUNTERS, kernel_offset};

/// Built by build.rs with the eBPF crate (its `floor` binary).
static FLOOR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor"));

#[derive(Parser)]
#[command(name = "topdown-floor", about = "The benchmark's floor instrument")]
struct Args {
    /// Open the counters topdown opens for this model (same names as topdown's `--pmu`).
    #[arg(long)]
    pmu: Option<String>,
    /// Read every counter at each context switch (needs --pmu); without it the sched_switch
    /// program is empty.
    #[arg(long)]
    read: bool,
    /// Instead of the empty program, the least a process filter (`-p`) does at each context
    /// switch between untracked tasks: the arriving task's tgid from its `task_struct` (offset
    /// from the kernel's BTF), its bit in a global of tracked pids (none are), and the CPU's
    /// word saying whether the task leaving is tracked. Reads no counter.
    #[arg(long, conflicts_with = "read")]
    filter_pids: bool,
    /// BINARY:FUNC (a symbol or glob, as topdown's -u) or BINARY:OFFSET (0x-prefixed file
    /// offset): read every counter at entry and return (needs --pmu).
    #[arg(short = 'u')]
    functions: Vec<String>,
    /// How returns are caught: a uretprobe, or a uprobe on each exit instruction (as topdown's
    /// `--returns`).
    #[arg(long, value_enum, default_value_t = Returns::Uretprobe)]
    returns: Returns,
    /// When the counters are read: at every context switch (`--read`), or as topdown's
    /// `--trigger cgroup-switch` reads them: at each switch between cgroups (the
    /// `cgroup-switches` software event, period 1) and when a CPU enters and leaves idle
    /// (`power:cpu_idle`).
    #[arg(long, value_enum, default_value_t = FloorTrigger::SchedSwitch)]
    trigger: FloorTrigger,
    /// Also add each reading's delta to a hash-map entry: the leaving task's (by tid), its
    /// cgroup's (atomically), or both (`task,cgroup`): the least any per-task or per-cgroup
    /// attribution does beyond reading.
    #[arg(long, value_enum, value_delimiter = ',')]
    add_to: Vec<AddTo>,
    /// BINARY:PROVIDER:NAME: read every counter at each site of this USDT probe (needs
    /// --pmu; probes without semaphores only).
    #[arg(short = 'U')]
    usdt: Vec<String>,
    /// BINARY:PROVIDER:NAME: a span's start sites (needs --span-end and --pmu). With its end
    /// sites, the least a span does beyond its two readings: the start's reading kept in the
    /// thread's hash-map entry, the difference added atomically to one total at the end.
    #[arg(long, requires = "span_end")]
    span_start: Option<String>,
    /// BINARY:PROVIDER:NAME: the span's end sites (with --span-start).
    #[arg(long, requires = "span_start")]
    span_end: Option<String>,
    /// A Go binary: a uprobe on each runtime function topdown hooks to follow its goroutines
    /// (their switches, stack growth and exits), reading every counter with --pmu, empty
    /// without.
    #[arg(long = "go-switches")]
    go_switches: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FloorTrigger {
    SchedSwitch,
    CgroupSwitch,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AddTo {
    Task,
    Cgroup,
}

/// `--max-tasks`, `--max-cgroups` and `--max-spans`'s defaults in topdown: the attributing
/// floors' map sizes (a thread's open span is in its own storage, as topdown's span stacks).
const MAX_TASKS: u32 = 32768;
const MAX_CGROUPS: u32 = 4096;
const MAX_SPANS: u32 = 16384;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Returns {
    Uretprobe,
    Exit,
}

/// Where to attach: entry points, return (uretprobe) points and exit-instruction points.
#[derive(Default)]
struct Points {
    entries: Vec<(PathBuf, u64)>,
    returns: Vec<(PathBuf, u64)>,
    exits: Vec<(PathBuf, u64)>,
}

/// Resolves each `-u` into probe points.
fn resolve_points(specs: &[String], returns: Returns) -> Result<Points> {
    let mut points = Points::default();
    for text in specs {
        let spec = ProbeSpec::parse(text)?;
        if let Some(hex) = spec.function.strip_prefix("0x") {
            let offset = u64::from_str_radix(hex, 16).map_err(|_| {
                fail(
                    Failure::Usage,
                    format!("-u {text}: {} is not a hexadecimal offset", spec.function),
                )
            })?;
            if returns == Returns::Exit {
                return Err(fail(
                    Failure::Usage,
                    format!("-u {text}: --returns exit needs a symbol, not an offset"),
                ));
            }
            points.entries.push((PathBuf::from(&spec.target), offset));
            points.returns.push((PathBuf::from(&spec.target), offset));
            continue;
        }
        let resolution = symbols::resolve(&[spec], &[])?;
        for function in resolution.functions {
            points
                .entries
                .push((function.target.clone(), function.symbol.offset));
            match returns {
                Returns::Uretprobe => points
                    .returns
                    .push((function.target, function.symbol.offset)),
                Returns::Exit => {
                    let exits = function.symbol.exits.as_ref().ok_or_else(|| {
                        fail(
                            Failure::Usage,
                            format!(
                                "-u {text}: no exit instructions known for {} (not x86-64): use --returns uretprobe",
                                function.display
                            ),
                        )
                    })?;
                    for exit in exits {
                        points.exits.push((function.target.clone(), exit.offset));
                    }
                }
            }
        }
    }
    Ok(points)
}

/// The sites of each USDT probe given to `flag` (`-U`, `--span-start`).
fn usdt_points(probes: &[String], flag: &str) -> Result<Vec<(PathBuf, u64)>> {
    let mut points = Vec::new();
    for text in probes {
        let probe = topdown::spans::usdt::ProbeName::parse(text, flag)?;
        let path = PathBuf::from(&probe.target);
        let file = topdown::spans::usdt::notes::read(&path)?;
        let option = format!("{flag} {text}");
        for (_, notes) in topdown::spans::usdt::required_sites(
            &file,
            &path,
            &probe.provider,
            &probe.name,
            &option,
        )? {
            for note in notes {
                if note.semaphore.is_some() {
                    return Err(fail(
                        Failure::Usage,
                        format!("{option}: the floor does not enable semaphores"),
                    ));
                }
                points.push((path.clone(), note.offset));
            }
        }
    }
    Ok(points)
}

/// Opens `model`'s counters as topdown does (`counting::open_counters`, without hybrid
/// overrides or extra events): returns the slots the programs read and the groups.
fn open_counters(model: &str) -> Result<(u32, [u32; MAX_COUNTERS], CounterGroups)> {
    let (model, announcement) = topdown::session::counting::select_model_by(model, None)?;
    if let Some(line) = announcement {
        eprintln!("topdown-floor: {line}");
    }
    let level = if model.max_level() == 0 { 0 } else { 1 };
    let plan = topdown::session::counting::plan_counters(model.as_ref(), level, None)?;
    let tracefs = Tracefs::locate_or_mount()?;
    let counters = resolve(&plan.counters, Some(&tracefs))?;
    let cpus = online_cpus()?;
    let groups = CounterGroups::open(&plan, &counters, &cpus, &pmu_cpus, Privilege::All)?;
    Ok((plan.slots.len() as u32, plan.slot_sources(), groups))
}

/// Loads the floor object with `counters` stored in its map, and attaches what `args` asks for.
fn attach(
    args: &Args,
    counters: Option<&(u32, [u32; MAX_COUNTERS], CounterGroups)>,
) -> Result<Ebpf> {
    let possible_cpus = aya::util::nr_cpus()
        .map_err(|(path, err)| anyhow!("reading {path}: {err}"))?
        .get();
    let (num_slots, slot_sources) = counters.map_or((0, [0; MAX_COUNTERS]), |(n, s, _)| (*n, *s));
    let task_pid_offset = if args.filter_pids {
        switch_offsets().context("--filter-pids reads the pid from task_struct")?
            [kernel_offset::TASK_PID]
    } else {
        0
    };
    let mut ebpf = EbpfLoader::new()
        // `SPAN_OPEN` is task storage, which aya 0.16 loads but has no type for.
        .allow_unsupported_maps()
        .override_global("NUM_COUNTERS", &num_slots, true)
        .override_global("TASK_PID_OFFSET", &task_pid_offset, true)
        .override_global("SLOT_SOURCES", &slot_sources, true)
        .map_max_entries("COUNTERS", possible_cpus * MAX_COUNTERS as u32)
        .map_max_entries("TASK_TOTALS", MAX_TASKS)
        .map_max_entries("CGROUP_TOTALS", MAX_CGROUPS)
        .map_max_entries("SPAN_TOTAL", MAX_SPANS)
        .load(FLOOR_OBJECT)
        .context("loading the floor programs")?;
    if let Some((_, _, groups)) = counters {
        let mut map: PerfEventArray<&mut MapData> = ebpf
            .map_mut("COUNTERS")
            .context("the floor object has no COUNTERS map")?
            .try_into()?;
        for (cpu, slot, fd) in groups.fds() {
            map.set(cpu * MAX_COUNTERS as u32 + slot as u32, &fd)
                .with_context(|| format!("storing counter {slot} of CPU {cpu}"))?;
        }
    }
    match args.trigger {
        FloorTrigger::SchedSwitch => {
            let task = args.add_to.contains(&AddTo::Task);
            let cgroup = args.add_to.contains(&AddTo::Cgroup);
            let switch = match (args.read, task, cgroup) {
                (false, _, _) if args.filter_pids => "filter_switch",
                (false, _, _) => "empty_switch",
                (true, false, false) => "floor_switch",
                (true, true, false) => "floor_switch_task",
                (true, false, true) => "floor_switch_cgroup",
                (true, true, true) => "floor_switch_task_cgroup",
            };
            let btf = Btf::from_sys_fs().context("reading the kernel's BTF")?;
            let program: &mut BtfTracePoint = ebpf
                .program_mut(switch)
                .with_context(|| format!("the floor object has no {switch} program"))?
                .try_into()?;
            program
                .load("sched_switch", &btf)
                .with_context(|| format!("loading {switch}"))?;
            program
                .attach()
                .with_context(|| format!("attaching {switch}"))?;
        }
        FloorTrigger::CgroupSwitch => {
            let Some((_, _, groups)) = counters else {
                return Err(fail(
                    Failure::Usage,
                    "--trigger cgroup-switch reads counters: name the model with --pmu MODEL",
                ));
            };
            let cgroup = args.add_to.contains(&AddTo::Cgroup);
            attach_cgroup_switch_floor(&mut ebpf, groups, cgroup)?;
        }
    }

    let mut points = resolve_points(&args.functions, args.returns)?;
    points.entries.extend(usdt_points(&args.usdt, "-U")?);
    // Timed as topdown times its own: the probes' attaching, after the functions are resolved.
    let started = Instant::now();
    // As topdown: one uprobe.multi link per binary and program where the kernel has them (a
    // perf link per point otherwise, each of which waits for an RCU grace period when closed).
    let multi = topdown::session::bpf::uprobe_multi_supported();
    let (entry, ret) = if multi {
        ("floor_entry_multi", "floor_return_multi")
    } else {
        ("floor_entry", "floor_return")
    };
    let mut attached = 0;
    let mut loading = std::time::Duration::ZERO;
    // Exit instructions get plain uprobes: the entry program, attached there too.
    let mut entry_points = points.entries;
    entry_points.extend(points.exits);
    let span_starts = usdt_points(args.span_start.as_slice(), "--span-start")?;
    let span_ends = usdt_points(args.span_end.as_slice(), "--span-end")?;
    let (span_start, span_end) = if multi {
        ("floor_span_start_multi", "floor_span_end_multi")
    } else {
        ("floor_span_start", "floor_span_end")
    };
    for (name, list) in [
        (entry, &entry_points),
        (ret, &points.returns),
        (span_start, &span_starts),
        (span_end, &span_ends),
    ] {
        let (points, load_time) = attach_uprobes(&mut ebpf, name, list, multi)?;
        attached += points;
        loading += load_time;
    }
    if let Some(binary) = &args.go_switches {
        let go = symbols::elf::functions(binary)?.go.ok_or_else(|| {
            fail(
                Failure::Usage,
                format!("--go-switches {}: not a Go binary", binary.display()),
            )
        })?;
        let hooks: Vec<(PathBuf, u64)> = go
            .hooks
            .iter()
            .map(|(offset, _)| (binary.clone(), *offset))
            .collect();
        // One link per point, as topdown attaches its runtime hooks.
        let program = if counters.is_some() {
            "floor_entry"
        } else {
            "empty_uprobe"
        };
        let (points, load_time) = attach_uprobes(&mut ebpf, program, &hooks, false)?;
        attached += points;
        loading += load_time;
    }
    if attached > 0 {
        // Parsed by `cargo xtask bench` like topdown's own line.
        eprintln!(
            "topdown-floor: {attached} probe points attached in {:.1} ms \
             ({:.1} ms of it loading the probe programs)",
            started.elapsed().as_secs_f64() * 1e3,
            loading.as_secs_f64() * 1e3
        );
    }
    Ok(ebpf)
}

/// The cgroup-switch trigger's hooks, as topdown attaches them (`bpf::Session::start`): a
/// `cgroup-switches` event per CPU, period 1, and `power:cpu_idle`.
fn attach_cgroup_switch_floor(ebpf: &mut Ebpf, groups: &CounterGroups, cgroup: bool) -> Result<()> {
    use aya::programs::{PerfEvent, TracePoint};
    let (switch, idle) = if cgroup {
        ("floor_cgroup_switch_cgroup", "floor_cpu_idle_cgroup")
    } else {
        ("floor_cgroup_switch", "floor_cpu_idle")
    };
    let program: &mut TracePoint = ebpf
        .program_mut(idle)
        .with_context(|| format!("the floor object has no {idle} program"))?
        .try_into()?;
    program.load().with_context(|| format!("loading {idle}"))?;
    program
        .attach("power", "cpu_idle")
        .context("attaching to power:cpu_idle")?;
    let program: &mut PerfEvent = ebpf
        .program_mut(switch)
        .with_context(|| format!("the floor object has no {switch} program"))?
        .try_into()?;
    program
        .load()
        .with_context(|| format!("loading {switch}"))?;
    attach_to_cgroup_switches(program, groups)
}

fn attach_uprobes(
    ebpf: &mut Ebpf,
    name: &str,
    points: &[(PathBuf, u64)],
    multi: bool,
) -> Result<(usize, std::time::Duration)> {
    if points.is_empty() {
        return Ok((0, std::time::Duration::ZERO));
    }
    let program: &mut UProbe = ebpf
        .program_mut(name)
        .with_context(|| format!("the floor object has no {name} program"))?
        .try_into()?;
    let started = Instant::now();
    if program.fd().is_err() {
        program.load().with_context(|| format!("loading {name}"))?;
    }
    let loading = started.elapsed();
    let mut by_target: std::collections::BTreeMap<&PathBuf, Vec<UProbeAttachPoint<'static>>> =
        std::collections::BTreeMap::new();
    for (target, offset) in points {
        by_target
            .entry(target)
            .or_default()
            .push(UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(*offset),
                cookie: None,
            });
    }
    for (target, list) in by_target {
        // Each link is kept by the program until the object is dropped.
        if multi {
            program
                .attach(list.iter().copied(), target, UProbeScope::AllProcesses)
                .with_context(|| format!("attaching {name} to {}", target.display()))?;
        } else {
            for point in list {
                program
                    .attach([point], target, UProbeScope::AllProcesses)
                    .with_context(|| format!("attaching {name} to {}", target.display()))?;
            }
        }
    }
    Ok((points.len(), loading))
}

/// Until SIGINT or SIGTERM. Handled, not left to their default action: a process started in
/// the background by a shell inherits SIGINT ignored.
async fn until_stopped() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

/// Rejects option combinations the floor would otherwise ignore or cannot serve.
fn check_combinations(args: &Args) -> Result<()> {
    if !args.add_to.is_empty() && !args.read && args.trigger == FloorTrigger::SchedSwitch {
        return Err(fail(
            Failure::Usage,
            "--add-to attributes readings: add --read (or --trigger cgroup-switch)",
        ));
    }
    if args.filter_pids && args.trigger == FloorTrigger::CgroupSwitch {
        return Err(fail(
            Failure::Usage,
            "--filter-pids is a sched_switch floor: drop --trigger cgroup-switch",
        ));
    }
    if args.add_to.contains(&AddTo::Task) && args.trigger == FloorTrigger::CgroupSwitch {
        return Err(fail(
            Failure::Usage,
            "--trigger cgroup-switch attributes to cgroups only: use --add-to cgroup",
        ));
    }
    if (args.read
        || !args.functions.is_empty()
        || !args.usdt.is_empty()
        || args.span_start.is_some()
        || args.trigger == FloorTrigger::CgroupSwitch)
        && args.pmu.is_none()
    {
        return Err(fail(
            Failure::Usage,
            "--read, -u, -U, --span-start and --trigger cgroup-switch read counters: name the \
             model whose counters to open with --pmu MODEL",
        ));
    }
    Ok(())
}

fn run(args: Args) -> Result<()> {
    check_combinations(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    let counters = args.pmu.as_deref().map(open_counters).transpose()?;
    let _ebpf = attach(&args, counters.as_ref())?;
    // "counting" is what the benchmark waits for, as with topdown.
    let what = match (args.trigger, args.read) {
        (FloorTrigger::CgroupSwitch, _) => "cgroup-switch and cpu_idle programs",
        (FloorTrigger::SchedSwitch, true) => "reading sched_switch program",
        (FloorTrigger::SchedSwitch, false) if args.filter_pids => "filtering sched_switch program",
        (FloorTrigger::SchedSwitch, false) => "empty sched_switch program",
    };
    eprintln!("topdown-floor: counting with the {what}");
    runtime.block_on(until_stopped())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(err) if !err.use_stderr() => err.exit(),
        Err(err) => {
            let text = err.render().to_string();
            let line = text.lines().next().unwrap_or("bad arguments").trim();
            eprintln!("topdown-floor: {line}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("topdown-floor: {err:#}");
            ExitCode::from(failure_of(&err).map_or(1, |failure| failure.exit_code()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(argv: &[&str]) -> Result<(), String> {
        let args =
            Args::try_parse_from(std::iter::once("topdown-floor").chain(argv.iter().copied()))
                .map_err(|err| err.to_string())?;
        check_combinations(&args).map_err(|err| format!("{err:#}"))
    }

    #[test]
    fn combinations_the_floor_would_ignore_are_refused() {
        assert_eq!(
            check(&[
                "--filter-pids",
                "--trigger",
                "cgroup-switch",
                "--pmu",
                "software"
            ]),
            Err("--filter-pids is a sched_switch floor: drop --trigger cgroup-switch".to_owned())
        );
        assert_eq!(
            check(&[
                "--trigger",
                "cgroup-switch",
                "--add-to",
                "task",
                "--pmu",
                "software"
            ]),
            Err(
                "--trigger cgroup-switch attributes to cgroups only: use --add-to cgroup"
                    .to_owned()
            )
        );
        assert_eq!(check(&["--filter-pids"]), Ok(()));
        assert_eq!(
            check(&[
                "--trigger",
                "cgroup-switch",
                "--add-to",
                "cgroup",
                "--pmu",
                "software"
            ]),
            Ok(())
        );
    }
}
