//! The rounds the context-switch and per-cgroup sections measure in: every configuration's
//! tracer started in turn beside a ping-pong, each measurement bracketed by untraced ones, and
//! the kernel's own timing of the tracers' programs in further rounds.

use std::path::Path;

use anyhow::{Context as _, Result};

use super::{
    Config, MachineLoad, NO_TRACING, enable_bpf_stats, pingpong_field, pingpong_output,
    start_tracer, stop_tracer,
};

/// How a section's rounds run.
pub(super) struct Plan<'a> {
    /// Rounds with the kernel's BPF run-time statistics off: the CPU-time figures.
    pub rounds: usize,
    /// Further rounds with them on: the program run-time figures (the statistics add two clock
    /// reads to every program run, so the CPU-time rounds run without them).
    pub stats_rounds: usize,
    /// How often a configuration is measured per round (more for a ratio's small denominator).
    pub repeats: &'a dyn Fn(&Config) -> usize,
    /// The ping-pong's arguments.
    pub pingpong_args: &'a [String],
    /// Prefix of the progress lines.
    pub label: &'a str,
}

/// Per configuration (indexes of the section's configurations; the first is the untraced
/// ping-pong), what the rounds measured.
pub(super) struct Measured {
    /// CPU ns per switch.
    pub cpu: Vec<Vec<f64>>,
    /// CPU ns per switch less the mean of the untraced ping-pongs just before and after.
    pub added: Vec<Vec<f64>>,
    /// Wall-clock ns per hop.
    pub wall: Vec<Vec<f64>>,
    /// The tracer's busiest program's mean run time, ns per run (statistics rounds).
    pub program: Vec<Vec<f64>>,
    /// Switches per ping-pong.
    pub switches: Vec<f64>,
    /// Measurements meant to run without statistics in which a program's run count moved
    /// anyway: something else on the machine had them on.
    pub stats_on_elsewhere: usize,
}

/// One ping-pong under one configuration.
pub(super) struct Sample {
    /// Wall clock per hop.
    pub wall_ns: f64,
    /// Both sides' run time per switch into one of them.
    pub cpu_ns: f64,
    pub switches: u64,
    /// Mean run time of the tracer's busiest program, when the kernel timed it.
    pub program_ns: Option<f64>,
}

/// Runs `plan`'s rounds over `configs` (`configs[0]` is the untraced ping-pong). Each round
/// runs every traced configuration in a rotating order, with an untraced ping-pong before the
/// first and after each, so a measurement's added cost is its figure less the mean of the two
/// untraced ones around it (drift over those seconds cancels to first order).
pub(super) fn run(
    configs: &[Config],
    pingpong: &Path,
    plan: &Plan<'_>,
    machine: &mut MachineLoad,
) -> Result<Measured> {
    let mut measured = Measured {
        cpu: vec![Vec::new(); configs.len()],
        added: vec![Vec::new(); configs.len()],
        wall: vec![Vec::new(); configs.len()],
        program: vec![Vec::new(); configs.len()],
        switches: Vec::new(),
        stats_on_elsewhere: 0,
    };
    let untraced = Config::new(NO_TRACING, None, None);
    let traced: Vec<usize> = (0..configs.len())
        .filter(|&index| configs[index].tracer.is_some())
        .collect();
    for round in 0..plan.rounds + plan.stats_rounds {
        let stats = if round < plan.rounds {
            None
        } else {
            match enable_bpf_stats() {
                Ok(fd) => Some(fd),
                Err(err) => {
                    println!("no BPF run-time statistics: {err:#}");
                    break;
                }
            }
        };
        let label = format!(
            "{}round {}{}",
            plan.label,
            round + 1,
            if stats.is_some() { " (BPF stats)" } else { "" }
        );
        let mut before = measure(&untraced, pingpong, plan.pingpong_args)
            .with_context(|| format!("{label}: {NO_TRACING}"))?;
        let mut first = true;
        for offset in 0..traced.len() {
            let index = traced[(offset + round) % traced.len()];
            let config = &configs[index];
            for _ in 0..(plan.repeats)(config) {
                let sample = measure(config, pingpong, plan.pingpong_args)
                    .with_context(|| format!("{label}: {}", config.name))?;
                let after = measure(&untraced, pingpong, plan.pingpong_args)
                    .with_context(|| format!("{label}: {NO_TRACING}"))?;
                let baseline = (before.cpu_ns + after.cpu_ns) / 2.0;
                println!(
                    "{label}: {:<70} cpu {:>7.1} ns/switch ({:+6.1} over untraced), wall {:>7.1}, {} switches, program {} ns/run",
                    config.name,
                    sample.cpu_ns,
                    sample.cpu_ns - baseline,
                    sample.wall_ns,
                    sample.switches,
                    sample
                        .program_ns
                        .map_or("-".to_owned(), |ns| format!("{ns:.1}"))
                );
                if stats.is_some() {
                    measured.program[index].extend(sample.program_ns);
                } else {
                    measured.stats_on_elsewhere += usize::from(sample.program_ns.is_some());
                    measured.cpu[index].push(sample.cpu_ns);
                    measured.added[index].push(sample.cpu_ns - baseline);
                    measured.wall[index].push(sample.wall_ns);
                    measured.switches.push(sample.switches as f64);
                    if first {
                        measured.cpu[0].push(before.cpu_ns);
                        measured.wall[0].push(before.wall_ns);
                        first = false;
                    }
                    measured.cpu[0].push(after.cpu_ns);
                    measured.wall[0].push(after.wall_ns);
                    measured.added[0].push(0.0);
                }
                before = after;
            }
        }
        machine.sample();
    }
    Ok(measured)
}

/// Each BPF program `pid` holds: its type (`prog_type`, include/uapi/linux/bpf.h), total run
/// time (ns) and runs, from `/proc/PID/fdinfo` (`run_time_ns` and `run_cnt`, which the kernel
/// keeps while its statistics are on).
pub(super) fn program_runs(pid: u32) -> Option<Vec<(u64, u64, u64)>> {
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let is_program = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-prog");
        if !is_program {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ))
        .ok()?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        programs.push((
            field("prog_type:")?,
            field("run_time_ns:")?,
            field("run_cnt:")?,
        ));
    }
    Some(programs)
}

/// The busiest BPF program `pid` holds (at a switch hook, the one that runs at every switch
/// or cgroup switch: the others run rarely or never during a ping-pong): its total run time
/// and runs.
fn busiest_program_runs(pid: u32) -> Option<(u64, u64)> {
    program_runs(pid)?
        .into_iter()
        .map(|(_, ns, runs)| (ns, runs))
        .max_by_key(|&(_, runs)| runs)
}

/// One ping-pong (`pingpong ARGS`) under `config`'s tracer, with the mean run time of the
/// tracer's busiest program during it (None without a tracer or with the kernel's statistics
/// off).
pub(super) fn measure(config: &Config, pingpong: &Path, args: &[String]) -> Result<Sample> {
    let mut tracer = match &config.tracer {
        Some(argv) => Some(start_tracer(argv)?),
        None => None,
    };
    let before = tracer
        .as_ref()
        .and_then(|child| busiest_program_runs(child.id()));
    let output = pingpong_output(pingpong, args);
    let after = tracer
        .as_ref()
        .and_then(|child| busiest_program_runs(child.id()));
    if let Some(child) = &mut tracer {
        stop_tracer(child);
    }
    let program_ns = match (before, after) {
        (Some((ns0, runs0)), Some((ns1, runs1))) if runs1 > runs0 && ns1 > ns0 => {
            Some((ns1 - ns0) as f64 / (runs1 - runs0) as f64)
        }
        _ => None,
    };
    let text = output?;
    Ok(Sample {
        wall_ns: pingpong_field(&text, "ns_per_switch")?,
        cpu_ns: pingpong_field(&text, "cpu_ns_per_switch")?,
        switches: pingpong_field(&text, "switches")? as u64,
        program_ns,
    })
}
