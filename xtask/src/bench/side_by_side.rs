//! Program time side by side: a configuration's tracer and its floor attached together during
//! one ping-pong, with the kernel's BPF statistics on, so both programs run at the same
//! switches under the same conditions (the machine's load, steal, caches) and their ratio is
//! paired at the finest grain there is. Measured apart, seconds away from each other, the two
//! run times drift by more than the few nanoseconds a bound at 1.2x turns on.
//!
//! Which one attaches first alternates between measurements: programs on one hook run in the
//! order they were attached, and the first pays for warming what the second finds warm (seen
//! here: 1.33x with topdown first, 0.80x with the floor first, for one pair). The ratio is the
//! geometric mean of the two orders' (`balanced_ratio`), and the text gives each.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use super::{
    BOOTSTRAP_RESAMPLES, Config, balanced_ratio, bound_text, enable_bpf_stats, start_tracer,
    stop_tracer,
};
use crate::cmd;

/// Measurements per pair (half with each order).
pub(super) const ROUNDS: usize = 12;

/// What runs while both tracers are attached.
pub(super) struct Workload<'a> {
    /// The command, run to its end once per measurement.
    pub argv: Vec<String>,
    /// The units of work (switches, spans) one run did, from its standard output.
    pub units: &'a dyn Fn(&str) -> Result<f64>,
    /// One unit, for the text: "ping-pong switch", "span".
    pub unit: &'a str,
    /// Where a program that runs less than once per unit did not run, for the text: "the
    /// ping-pong's switches".
    pub at: &'a str,
    /// The program types timed (`prog_type`), all where None.
    pub program_types: Option<&'a [u64]>,
}

/// A configuration and the floor it is timed beside, as indexes of the section's configurations.
#[derive(Clone, Copy)]
pub(super) struct Pair {
    pub config: usize,
    pub floor: usize,
}

/// Each configuration beside each floor `floors_of` names for it (configuration names; a name
/// not among `configs` is skipped).
pub(super) fn pairs<'a>(
    configs: &'a [Config],
    floors_of: impl Fn(&'a Config) -> Vec<&'a str>,
) -> Vec<Pair> {
    configs
        .iter()
        .enumerate()
        .flat_map(|(index, config)| {
            floors_of(config).into_iter().filter_map(move |name| {
                Some(Pair {
                    config: index,
                    floor: super::index_of(configs, name)?,
                })
            })
        })
        .collect()
}

/// What the kernel timed for one pair, per measurement.
#[derive(Default)]
pub(super) struct Timed {
    /// Program time per ping-pong switch, ns: every program the tracer holds, their run-time
    /// growth over the ping-pong divided by its switches.
    pub config_ns: Vec<f64>,
    pub floor_ns: Vec<f64>,
    /// Program runs per ping-pong switch.
    pub config_runs: Vec<f64>,
    pub floor_runs: Vec<f64>,
    /// Whether the configuration's tracer was attached first.
    pub config_first: Vec<bool>,
}

/// Total run time (ns) and runs of the BPF programs `pid` holds of the types `workload` counts.
fn program_totals(pid: u32, workload: &Workload<'_>) -> Option<(u64, u64)> {
    let programs: Vec<(u64, u64)> = super::rounds::program_runs(pid)?
        .into_iter()
        .filter(|(program_type, _, _)| {
            workload
                .program_types
                .is_none_or(|types| types.contains(program_type))
        })
        .map(|(_, ns, runs)| (ns, runs))
        .collect();
    Some(
        programs
            .iter()
            .fold((0, 0), |(ns, runs), (program_ns, program_runs)| {
                (ns + program_ns, runs + program_runs)
            }),
    )
}

/// Measures each pair side by side over `workload` (`run`) and gives their lines against
/// `bound` (`text`).
pub(super) fn measured_lines(
    configs: &[Config],
    pairs: &[Pair],
    tracer_of: &dyn Fn(usize) -> Option<Vec<String>>,
    workload: &Workload<'_>,
    label: &str,
    bound: f64,
) -> Result<String> {
    let timed = run(configs, pairs, tracer_of, workload, label)?;
    Ok(text(configs, pairs, &timed, bound, workload))
}

/// Runs `ROUNDS` side-by-side measurements of each pair over `workload` (`tracer_of` gives a
/// configuration's tracer), the pairs interleaved so that a pair's measurements spread over
/// the whole run.
fn run(
    configs: &[Config],
    pairs: &[Pair],
    tracer_of: &dyn Fn(usize) -> Option<Vec<String>>,
    workload: &Workload<'_>,
    label: &str,
) -> Result<Vec<Timed>> {
    let _stats = enable_bpf_stats().context("timing programs side by side")?;
    let mut timed: Vec<Timed> = pairs.iter().map(|_| Timed::default()).collect();
    for round in 0..ROUNDS {
        for (pair, times) in pairs.iter().zip(&mut timed) {
            let config_first = round % 2 == 0;
            let (config, floor) = (&configs[pair.config], &configs[pair.floor]);
            let tracers = (|| Some((tracer_of(pair.config)?, tracer_of(pair.floor)?)))()
                .with_context(|| format!("{} or {} has no tracer", config.name, floor.name))?;
            let measured = measure(&tracers, config_first, workload)
                .with_context(|| format!("{label}{} beside {}", config.name, floor.name))?;
            let (config_ns, config_runs, floor_ns, floor_runs) = measured;
            println!(
                "{label}side by side {}/{ROUNDS}: {:<60} {config_ns:>8.1} ns/unit ({config_runs:.3} runs), floor {floor_ns:>8.1} ns/unit ({floor_runs:.3} runs), {}",
                round + 1,
                config.name,
                if config_first {
                    "attached first"
                } else {
                    "floor first"
                }
            );
            times.config_ns.push(config_ns);
            times.floor_ns.push(floor_ns);
            times.config_runs.push(config_runs);
            times.floor_runs.push(floor_runs);
            times.config_first.push(config_first);
        }
    }
    Ok(timed)
}

/// One run of the workload with both tracers (the configuration's, the floor's) attached:
/// (config ns per unit, its runs per unit, floor ns per unit, its runs per unit).
fn measure(
    (config, floor): &(Vec<String>, Vec<String>),
    config_first: bool,
    workload: &Workload<'_>,
) -> Result<(f64, f64, f64, f64)> {
    let (first, second) = if config_first {
        (config, floor)
    } else {
        (floor, config)
    };
    let mut first = start_tracer(first)?;
    let mut second = match start_tracer(second) {
        Ok(child) => child,
        Err(err) => {
            stop_tracer(&mut first);
            return Err(err);
        }
    };
    let (config_pid, floor_pid) = if config_first {
        (first.id(), second.id())
    } else {
        (second.id(), first.id())
    };
    let before = (
        program_totals(config_pid, workload),
        program_totals(floor_pid, workload),
    );
    let output = workload_output(&workload.argv);
    let after = (
        program_totals(config_pid, workload),
        program_totals(floor_pid, workload),
    );
    stop_tracer(&mut second);
    stop_tracer(&mut first);
    let units = (workload.units)(&output?)?;
    let per_unit = |before: Option<(u64, u64)>, after: Option<(u64, u64)>, name: &str| {
        let ((ns0, runs0), (ns1, runs1)) = before
            .zip(after)
            .with_context(|| format!("no program statistics for {name}"))?;
        Ok::<_, anyhow::Error>((
            ns1.saturating_sub(ns0) as f64 / units,
            runs1.saturating_sub(runs0) as f64 / units,
        ))
    };
    let (config_ns, config_runs) = per_unit(before.0, after.0, "the configuration's tracer")?;
    let (floor_ns, floor_runs) = per_unit(before.1, after.1, "the floor")?;
    Ok((config_ns, config_runs, floor_ns, floor_runs))
}

/// The workload's standard output, if it succeeded.
fn workload_output(argv: &[String]) -> Result<String> {
    let out = cmd::output(Command::new(&argv[0]).args(&argv[1..]))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            argv[0],
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Below this many program runs per ping-pong switch, neither program runs at the ping-pong's
/// switches: what they ran was the rest of the machine's (a trigger that fires only at cgroup
/// switches, with both sides in one cgroup).
const NOT_AT_THESE_SWITCHES: f64 = 0.05;

/// One line per pair: the program time per switch of each, their ratio against `bound` with its
/// bootstrap interval, and the ratio with each attach order.
fn text(
    configs: &[Config],
    pairs: &[Pair],
    timed: &[Timed],
    bound: f64,
    workload: &Workload<'_>,
) -> String {
    let unit = workload.unit;
    let mut text = String::new();
    for (pair, times) in pairs.iter().zip(timed) {
        let median = |values: &[f64]| super::Spread::of(values).median;
        let ratio = balanced_ratio(
            &times.config_ns,
            &times.floor_ns,
            &times.config_first,
            BOOTSTRAP_RESAMPLES,
        );
        let by_order = |first: bool| {
            let pick = |values: &[f64]| -> Vec<f64> {
                values
                    .iter()
                    .zip(&times.config_first)
                    .filter(|(_, config_first)| **config_first == first)
                    .map(|(value, _)| *value)
                    .collect()
            };
            median(&pick(&times.config_ns)) / median(&pick(&times.floor_ns))
        };
        let (config_runs, floor_runs) = (median(&times.config_runs), median(&times.floor_runs));
        let verdict = if config_runs < NOT_AT_THESE_SWITCHES && floor_runs < NOT_AT_THESE_SWITCHES {
            format!(
                "**met: neither runs a program at {}** (what they ran, {}, was at the rest of \
                 the machine's)",
                workload.at,
                super::ratio_text(&ratio)
            )
        } else {
            bound_text(&ratio, bound)
        };
        text += &format!(
            "- {} beside {}: {:.1} against {:.1} ns of program time per {unit} \
             ({config_runs:.3} and {floor_runs:.3} runs per {unit}), {verdict}; {:.2}x with \
             it attached first, {:.2}x with the floor first.\n",
            configs[pair.config].name,
            configs[pair.floor].name,
            median(&times.config_ns),
            median(&times.floor_ns),
            by_order(true),
            by_order(false),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(config_ns: f64, floor_ns: f64, runs: f64) -> Timed {
        let first = [true, false, true, false];
        Timed {
            config_ns: first.iter().map(|_| config_ns).collect(),
            floor_ns: first.iter().map(|_| floor_ns).collect(),
            config_runs: first.iter().map(|_| runs).collect(),
            floor_runs: first.iter().map(|_| runs).collect(),
            config_first: first.to_vec(),
        }
    }

    #[test]
    fn pairs_are_each_configuration_beside_each_named_floor_there_is() {
        let configs = [
            Config::new("floor", None, None),
            Config::new("work floor", None, None),
            Config::new("topdown", None, Some("floor".to_owned())).with_work_floor("work floor"),
            Config::new("other", None, Some("missing".to_owned())),
        ];
        let pairs = pairs(&configs, |config| {
            [config.floor.as_deref(), config.work_floor.as_deref()]
                .into_iter()
                .flatten()
                .collect()
        });
        let indexes: Vec<(usize, usize)> = pairs.iter().map(|p| (p.config, p.floor)).collect();
        assert_eq!(indexes, [(2, 0), (2, 1)]);
    }

    #[test]
    fn each_pair_gets_a_verdict_and_switches_without_programs_say_so() {
        let configs = [
            Config::new("topdown", Some(vec!["topdown".to_owned()]), None),
            Config::new("floor", Some(vec!["floor".to_owned()]), None),
        ];
        let pairs = [Pair {
            config: 0,
            floor: 1,
        }];
        let workload = Workload {
            argv: Vec::new(),
            units: &|_| Ok(1.0),
            unit: "ping-pong switch",
            at: "the ping-pong's switches",
            program_types: None,
        };
        let text = |timed: Timed| text(&configs, &pairs, &[timed], 1.2, &workload);
        let over = text(timed(150.0, 100.0, 1.0));
        assert_eq!(
            over,
            "- topdown beside floor: 150.0 against 100.0 ns of program time per ping-pong \
             switch (1.000 and 1.000 runs per ping-pong switch), 1.50x (95% interval 1.50x..1.50x): \
             **not met**; 1.50x with it attached first, 1.50x with the floor first.\n"
        );
        let under = text(timed(110.0, 100.0, 1.0));
        assert!(
            under.contains("1.10x (95% interval 1.10x..1.10x): **met**"),
            "{under}"
        );
        // A trigger that does not fire at the ping-pong's switches: its runs are elsewhere.
        let elsewhere = text(timed(3.0, 2.0, 0.001));
        assert!(
            elsewhere.contains("**met: neither runs a program at the ping-pong's switches**"),
            "{elsewhere}"
        );
    }
}
