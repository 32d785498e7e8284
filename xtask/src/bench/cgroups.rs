//! `TOPDOWN_BENCH_ONLY=cgroups`: what per-cgroup attribution (`--by cgroup`) adds per context
//! switch with each trigger, beside floors that do the same unavoidable work, in three
//! scenarios: no switch crossing cgroups, every switch crossing, and 200 active cgroups.

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{
    BOOTSTRAP_RESAMPLES, Config, Figures, ISSUE_28_BOUND, MachineLoad, NO_TRACING, SOFTWARE,
    STATS_ROUNDS, SYNTHETIC, bpftrace_switch_config, cgroup_v2_mount, command_text, remove_tree,
    rounds, section_start, side_by_side, stat_argv, stats_elsewhere_text, strings,
    switch_floor_name, write_section,
};

/// Rounds with the statistics off, and ping-pong length (round trips: two switches each).
const ROUNDS: usize = 8;
const ROUND_TRIPS: &str = "50000";
/// Background processes of the last scenario, each in a cgroup of its own, and how often each
/// wakes up.
const WAKERS: usize = 198;
const WAKE_MS: &str = "10";

fn task_cgroup_floor_name(pmu: &str) -> String {
    format!(
        "floor: aya sched_switch reading --pmu {pmu}, adding to the task's and the cgroup's entries"
    )
}

fn cgroup_switch_floor_name(pmu: &str) -> String {
    format!("floor: aya cgroup-switches + cpu_idle reading --pmu {pmu}")
}

fn cgroup_switch_work_floor_name(pmu: &str) -> String {
    format!(
        "floor: aya cgroup-switches + cpu_idle reading --pmu {pmu}, adding to the cgroup's entry"
    )
}

fn trigger_name(trigger: &str, pmu: &str) -> String {
    format!("topdown stat -a --by cgroup --trigger {trigger} --pmu {pmu}")
}

/// The scenarios: a label, how many waking processes run beside the ping-pong, whether the two
/// sides share a cgroup, and whether the ping-pong runs SCHED_FIFO.
struct Scenario {
    label: &'static str,
    wakers: usize,
    one_cgroup: bool,
    /// Real-time, so no ordinary task runs on the CPU between hops (less noise); not with the
    /// wakers, which must take turns with the ping-pong on its CPU to matter.
    fifo: bool,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        label: "both sides in one cgroup",
        wakers: 0,
        one_cgroup: true,
        fifo: true,
    },
    Scenario {
        label: "2 (one per side)",
        wakers: 0,
        one_cgroup: false,
        fifo: true,
    },
    Scenario {
        label: "200 (2 + 198 waking every 10 ms)",
        wakers: WAKERS,
        one_cgroup: false,
        fifo: false,
    },
];

fn configs(topdown: &Path, floor: &Path) -> Vec<Config> {
    let td = topdown.display().to_string();
    let fl = floor.display().to_string();
    let mut configs = vec![Config::new(NO_TRACING, None, None)];
    for pmu in [SOFTWARE, SYNTHETIC] {
        let floor_args = |extra: &[&str]| {
            let mut argv = strings(&[&fl, "--pmu", pmu]);
            argv.extend(strings(extra));
            Some(argv)
        };
        configs.push(Config::new(
            switch_floor_name(pmu),
            floor_args(&["--read"]),
            None,
        ));
        configs.push(Config::new(
            task_cgroup_floor_name(pmu),
            floor_args(&["--read", "--add-to", "task,cgroup"]),
            None,
        ));
        configs.push(Config::new(
            cgroup_switch_floor_name(pmu),
            floor_args(&["--trigger", "cgroup-switch"]),
            None,
        ));
        configs.push(Config::new(
            cgroup_switch_work_floor_name(pmu),
            floor_args(&["--trigger", "cgroup-switch", "--add-to", "cgroup"]),
            None,
        ));
        for (trigger, work_floor) in [
            ("sched-switch", task_cgroup_floor_name(pmu)),
            ("cgroup-switch", cgroup_switch_work_floor_name(pmu)),
        ] {
            let argv = stat_argv(
                &td,
                &["-a", "--by", "cgroup", "--trigger", trigger, "--pmu", pmu],
            );
            configs.push(
                Config::new(
                    trigger_name(trigger, pmu),
                    Some(argv),
                    Some(switch_floor_name(pmu)),
                )
                .with_work_floor(work_floor),
            );
        }
    }
    configs.push(bpftrace_switch_config());
    configs
}

/// Per-cgroup attribution: the ping-pong's two sides as processes, in one cgroup, in two (so
/// every context switch is also a cgroup switch: the worst case for the cgroup-switch
/// trigger), and in two beside 198 more cgroups, each holding a process that wakes every
/// 10 ms.
pub(super) fn bench(topdown: &Path, pingpong: &Path, floor: &Path) -> Result<()> {
    let mount = cgroup_v2_mount()?;
    let root = mount.join(format!("topdown-bench-{}", std::process::id()));
    let result = bench_in(&root, topdown, pingpong, floor);
    // The wakers are gone; their cgroups empty once the kernel has reaped them.
    std::thread::sleep(Duration::from_millis(200));
    let _ = remove_tree(&root);
    result
}

fn bench_in(root: &Path, topdown: &Path, pingpong: &Path, floor: &Path) -> Result<()> {
    let side_a = root.join("a");
    let side_b = root.join("b");
    for dir in [&side_a, &side_b] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let configs = configs(topdown, floor);
    // Each topdown configuration beside its same-work floor, where that is not its reading
    // floor.
    let pairs = side_by_side::pairs(&configs, |config| {
        config
            .work_floor
            .as_deref()
            .filter(|_| config.work_floor != config.floor)
            .into_iter()
            .collect()
    });
    let mut machine = MachineLoad::start();
    let mut measured = Vec::new();
    for scenario in &SCENARIOS {
        let mut args = strings(&["--processes", "--round-trips", ROUND_TRIPS, "--cpu", "0"]);
        if scenario.fifo {
            args.push("--fifo".to_owned());
        }
        let b = if scenario.one_cgroup {
            &side_a
        } else {
            &side_b
        };
        args.extend([
            "--cgroup-a".to_owned(),
            side_a.display().to_string(),
            "--cgroup-b".to_owned(),
            b.display().to_string(),
        ]);
        let wakers = Wakers::start(root, pingpong, scenario.wakers)?;
        let label = format!("{}: ", scenario.label);
        let result = rounds::run(
            &configs,
            pingpong,
            &rounds::Plan {
                rounds: ROUNDS,
                stats_rounds: STATS_ROUNDS,
                repeats: &|_| 1,
                pingpong_args: &args,
                label: &label,
            },
            &mut machine,
        );
        let timed = result.and_then(|result| {
            let workload = super::pingpong_workload(pingpong, &args);
            let side = side_by_side::measured_lines(
                &configs,
                &pairs,
                &|index| configs[index].tracer.clone(),
                &workload,
                &label,
                ISSUE_28_BOUND,
            )?;
            Ok((result, side))
        });
        drop(wakers);
        measured.push(timed?);
    }
    write(&configs, &measured, &machine.finish())
}

/// Processes each in a cgroup of its own under `root`, waking every `WAKE_MS`; killed when
/// dropped.
struct Wakers(Vec<Child>);

impl Wakers {
    fn start(root: &Path, pingpong: &Path, count: usize) -> Result<Self> {
        let mut wakers = Self(Vec::new());
        for index in 0..count {
            let dir = root.join(format!("busy-{index}"));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let waker = Command::new(pingpong)
                .args(["--waker", WAKE_MS])
                .spawn()
                .context("starting a waker")?;
            let pid = waker.id();
            wakers.0.push(waker);
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).context("moving a waker")?;
        }
        Ok(wakers)
    }
}

impl Drop for Wakers {
    fn drop(&mut self) {
        for waker in &mut self.0 {
            let _ = waker.kill();
            let _ = waker.wait();
        }
    }
}

fn write(
    configs: &[Config],
    measured: &[(rounds::Measured, String)],
    load: &super::LoadReport,
) -> Result<()> {
    let mut section = section_start("Per-cgroup attribution cost", load);
    section += &format!(
        "Command: `{}`. The ping-pong's two sides are processes pinned to CPU 0 that hand a \
         byte back and forth through pipes ({ROUND_TRIPS} round trips per ping-pong): both in \
         one cgroup, so no switch crosses cgroups (the common case); one per cgroup, so every \
         context switch is also a cgroup switch (the worst case for the cgroup-switch \
         trigger); and one per cgroup beside {WAKERS} more cgroups, each with a process \
         waking every {WAKE_MS} ms. The first two run SCHED_FIFO (no ordinary task runs on the \
         CPU between hops), the last does not, so the wakers take turns with the ping-pong on \
         its CPU. The figure is the CPU time both sides were charged per switch into one of \
         them, as in the context-switch section; {ROUNDS} rounds per scenario, each running \
         every configuration in a rotating order with an untraced ping-pong before the first \
         and after each (a measurement's added cost is its figure less the mean of the two \
         around it), medians, then {STATS_ROUNDS} rounds with the kernel's BPF statistics on \
         for the program columns (the mean run time of the tracer's busiest program: \
         sched_switch, or the `cgroup-switches` event's program{}).\n\n\
         Floors (`topdown-floor`): the reading floor reads the same counters at every \
         context switch and does nothing else. The same-work floors also do what each \
         trigger cannot go without. The sched-switch trigger reads at every switch and, as \
         topdown keeps per-task entries with it (they are in the JSON report), adds each \
         reading's delta to the leaving task's entry and, atomically (several CPUs add to \
         one cgroup), to its cgroup's entry: the floor `--add-to task,cgroup`. The \
         cgroup-switch trigger reads at each switch between cgroups (the `cgroup-switches` \
         software event, period 1: the perf event's overflow path runs the program) and \
         when a CPU enters and leaves idle (`power:cpu_idle`: the kernel runs no \
         `cgroup-switches` program for a switch away from idle), and adds to the cgroup's \
         entry only: the floor `--trigger cgroup-switch --add-to cgroup`, on those same \
         hooks.\n\n",
        command_text(),
        stats_elsewhere_text(measured.iter().map(|(m, _)| m.stats_on_elsewhere).sum())
    );
    section += "| active cgroups | configuration | CPU ns per switch | added over no tracing | IQR of added | added / reading floor's | added / same-work floor's | added / bpftrace's | wall ns per switch | busiest program, ns per run | program / reading floor's | program / same-work floor's | added − program |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let mut verdicts = format!(
        "\nIssue 28's bound, each trigger at most {ISSUE_28_BOUND}x its same-work floor per \
         context switch (95% percentile bootstrap intervals, {BOOTSTRAP_RESAMPLES} resamples \
         of the measurements, the k-th of each configuration drawn together):\n\n"
    );
    let mut side_lines = String::new();
    for (scenario, (measured, side)) in SCENARIOS.iter().zip(measured) {
        for line in side.lines() {
            side_lines += &format!(
                "- {}, {}\n",
                scenario.label,
                line.strip_prefix("- ").unwrap_or(line)
            );
        }
        let figures = Figures::of(measured);
        for index in 0..configs.len() {
            section += &figures.row(
                configs,
                index,
                &format!("{} | {}", scenario.label, configs[index].name),
            );
        }
        for (index, config) in configs.iter().enumerate() {
            let Some(floor_name) = config.work_floor.as_deref() else {
                continue;
            };
            if config.work_floor == config.floor {
                continue;
            }
            let Some(floor) = configs.iter().position(|c| c.name == floor_name) else {
                continue;
            };
            verdicts += &format!(
                "- {}, {}: {}",
                scenario.label,
                config.name,
                figures.against_work_floor(measured, index, floor)
            );
        }
    }
    section += &verdicts;
    section += &super::side_by_side_text(&side_lines);
    section += "\nWith both sides in one cgroup the cgroup-switch trigger reads nothing during \
                the ping-pong: its program column then shows whatever cgroup switches the rest \
                of the machine made (its busiest program's mean run time), not the ping-pong's. \
                The side-by-side runs per switch say so (a few in a thousand, for the tracer \
                and its floor alike): no program of either runs at the ping-pong's switches.\n";
    write_section("## Per-cgroup attribution cost", &section)
}
