//! `cargo xtask bench`: what tracing adds, measured side by side in one run, each figure beside
//! its floor and beside an empty bpftrace program.
//!
//! The floor is `topdown-floor` (topdown-ebpf's `floor.rs`): aya programs at the same hooks as
//! topdown's that read the same counters (topdown's counter plan, opened the same way) and do
//! nothing else, so "x floor" says how far topdown's logic is from the least any tool reading
//! those counters there must pay. The bpftrace column says how it compares with the cheapest
//! thing a user would otherwise run. Rounds alternate between configurations so machine noise
//! spreads over all of them; each figure is the median. Results replace BENCHMARKS.md's sections.

use std::{
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// Rounds of the context-switch and cgroup sections, and ping-pong length per round.
const ROUNDS: usize = 5;
const CGROUP_ROUNDS: usize = 3;
const ROUND_TRIPS: &str = "200000";
/// Rounds and calls per round of the per-call section.
const CALL_ROUNDS: usize = 3;
const CALLS: &str = "100000";
/// Function counts whose attach time is measured, and rounds per count.
const ATTACH_COUNTS: [usize; 4] = [1, 100, 1000, 10000];
const ATTACH_ROUNDS: usize = 3;
/// A tool that has not attached (and run the program once) in this long is reported as such.
const ATTACH_TIMEOUT_S: &str = "150";
/// bpftrace takes over 100 ms per uprobe here: once one of its runs took this long, its other
/// rounds for that count are skipped (the figure is then the median of the rounds it ran).
const SLOW_RUN_MS: f64 = 30_000.0;
/// bpftrace 0.17 attaches one perf link per uprobe and closes each with an RCU grace period:
/// 1000 functions took ~2 minutes here, and 10000 went on detaching for minutes after its
/// timeout, so it is not run above this many.
const BPFTRACE_ATTACH_MAX: usize = 1000;
/// (tasks, call edges) for `refresh_cost`, and its rounds: issue 11's size (100000 tasks and
/// 10000 edges), then tasks and edges each on their own.
const REFRESH_SIZES: [(u32, u32); 3] = [(100_000, 10_000), (100_000, 0), (10, 10_000)];
const REFRESH_ROUNDS: &str = "5";
/// Issue 11's target for one refresh: `top`'s and `serve`'s per-refresh paths.
const REFRESH_TARGET_MS: f64 = 50.0;

/// The models measured: the software one (2 counters) and a synthetic TopDown one (7 counters).
const SOFTWARE: &str = "software";
const SYNTHETIC: &str = "synthetic:intel-icl";

struct Config {
    name: String,
    tracer: Option<Vec<String>>,
    /// The name of the configuration that is this one's floor (None: no floor, e.g. the floors).
    floor: Option<String>,
}

impl Config {
    fn new(name: impl Into<String>, tracer: Option<Vec<String>>, floor: Option<String>) -> Self {
        Self {
            name: name.into(),
            tracer,
            floor,
        }
    }
}

/// `TOPDOWN_BENCH_BASELINE=PATH`: an earlier build of topdown, measured in the same rounds as
/// this one (`baseline:` rows), so a change is judged side by side on one noisy machine.
fn baseline_build() -> Option<String> {
    std::env::var("TOPDOWN_BENCH_BASELINE")
        .ok()
        .filter(|path| !path.is_empty())
}

pub fn bench() -> Result<()> {
    ensure_bpftrace()?;
    let topdown = crate::build_topdown(true)?;
    cmd::run(cmd::cargo().args([
        "build",
        "--release",
        "--package",
        "topdown-tests",
        "--bin",
        "pingpong",
    ]))?;
    cmd::run(cmd::cargo().args([
        "build",
        "--release",
        "--package",
        "topdown-user",
        "--bin",
        "topdown-floor",
        "--example",
        "refresh_cost",
    ]))?;
    let pingpong = topdown.with_file_name("pingpong");
    let floor = topdown.with_file_name("topdown-floor");
    let sections = sections()?;
    if sections.contains(&"switches") {
        // `-p` of a process that never runs: every switch the ping-pong makes is one nobody
        // traces.
        let mut idle = Command::new("sleep")
            .arg("infinity")
            .spawn()
            .context("starting an idle process for `stat -p`")?;
        let idle_pid = idle.id().to_string();
        let result = bench_switches(&topdown, &pingpong, &floor, &idle_pid);
        let _ = idle.kill();
        let _ = idle.wait();
        result?;
    }
    if sections.contains(&"cgroups") {
        bench_cgroups(&topdown, &pingpong, &floor)?;
    }
    if sections.contains(&"functions") {
        bench_functions(&topdown, &floor)?;
    }
    if sections.contains(&"attach") {
        bench_attach(&topdown, &floor)?;
    }
    if sections.contains(&"refresh") {
        bench_refresh(&topdown)?;
    }
    Ok(())
}

const SECTIONS: [&str; 5] = ["switches", "cgroups", "functions", "attach", "refresh"];

/// `TOPDOWN_BENCH_ONLY=attach,refresh`: the sections to run (all by default), so one section
/// can be re-measured without the others' minutes.
fn sections() -> Result<Vec<&'static str>> {
    let Some(list) = std::env::var("TOPDOWN_BENCH_ONLY")
        .ok()
        .filter(|list| !list.is_empty())
    else {
        return Ok(SECTIONS.to_vec());
    };
    list.split(',')
        .map(|name| {
            SECTIONS
                .iter()
                .find(|known| **known == name.trim())
                .copied()
                .with_context(|| {
                    format!(
                        "TOPDOWN_BENCH_ONLY: no section {name:?}; the sections are {}",
                        SECTIONS.join(", ")
                    )
                })
        })
        .collect()
}

/// The command as run, with the environment variables that change what it measures.
fn command_text() -> String {
    let mut text = String::new();
    if baseline_build().is_some() {
        text += "TOPDOWN_BENCH_BASELINE=<an earlier build's topdown> ";
    }
    if let Ok(only) = std::env::var("TOPDOWN_BENCH_ONLY")
        && !only.is_empty()
    {
        text += &format!("TOPDOWN_BENCH_ONLY={only} ");
    }
    text + "cargo xtask bench"
}

/// `topdown stat` with `--format json -o /dev/null` and `args`.
fn stat_argv(topdown: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![topdown.to_owned(), "stat".to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    argv.extend(["--format", "json", "-o", "/dev/null"].map(str::to_owned));
    argv
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

const FLOOR_NAME: &str = "aya empty tp_btf/sched_switch program";
const BPFTRACE_NAME: &str = "bpftrace 'tracepoint:sched:sched_switch {}'";

fn switch_floor_name(pmu: &str) -> String {
    format!("floor: aya sched_switch reading --pmu {pmu}")
}

/// What tracing adds per context switch: `-a` and `-p` of an idle process, beside the floor
/// reading the same counters, the empty aya program and an empty bpftrace one.
fn bench_switches(topdown: &Path, pingpong: &Path, floor: &Path, idle_pid: &str) -> Result<()> {
    let td = topdown.display().to_string();
    let fl = floor.display().to_string();
    let mut configs = vec![
        Config::new("no tracing", None, None),
        Config::new(FLOOR_NAME, Some(vec![fl.clone()]), None),
    ];
    for pmu in [SOFTWARE, SYNTHETIC] {
        configs.push(Config::new(
            switch_floor_name(pmu),
            Some(strings(&[&fl, "--pmu", pmu, "--read"])),
            None,
        ));
    }
    for pmu in [SOFTWARE, SYNTHETIC] {
        configs.push(Config::new(
            format!("topdown stat -p IDLE_PID --pmu {pmu}"),
            Some(stat_argv(&td, &["-p", idle_pid, "--pmu", pmu])),
            Some(switch_floor_name(pmu)),
        ));
    }
    // Reading at every switch, as -a does: its floor is the reading one.
    configs.push(Config::new(
        format!("topdown stat -p IDLE_PID --read-every-switch --pmu {SYNTHETIC}"),
        Some(stat_argv(
            &td,
            &["-p", idle_pid, "--read-every-switch", "--pmu", SYNTHETIC],
        )),
        Some(switch_floor_name(SYNTHETIC)),
    ));
    for pmu in [SOFTWARE, SYNTHETIC] {
        configs.push(Config::new(
            format!("topdown stat -a --pmu {pmu}"),
            Some(stat_argv(&td, &["-a", "--pmu", pmu])),
            Some(switch_floor_name(pmu)),
        ));
    }
    configs.push(Config::new(
        BPFTRACE_NAME,
        Some(strings(&[
            "bpftrace",
            "-e",
            "tracepoint:sched:sched_switch {}",
        ])),
        None,
    ));
    if let Some(old) = baseline_build() {
        configs.push(Config::new(
            format!("baseline: topdown stat -p IDLE_PID --pmu {SYNTHETIC}"),
            Some(stat_argv(&old, &["-p", idle_pid, "--pmu", SYNTHETIC])),
            Some(switch_floor_name(SYNTHETIC)),
        ));
        for pmu in [SOFTWARE, SYNTHETIC] {
            configs.push(Config::new(
                format!("baseline: topdown stat -a --pmu {pmu}"),
                Some(stat_argv(&old, &["-a", "--pmu", pmu])),
                Some(switch_floor_name(pmu)),
            ));
        }
    }
    // The kernel's per-program run times: unlike the ping-pong's wall-clock figure, they do not
    // move with whatever else the machine runs.
    let stats = enable_bpf_stats();
    if let Err(err) = &stats {
        println!("no BPF run-time statistics: {err:#}");
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut run_times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        for (index, config) in configs.iter().enumerate() {
            let (value, run_time) = measure_switches(config, pingpong)
                .with_context(|| format!("round {round}: {}", config.name))?;
            println!(
                "round {}: {:<55} {value:>9.1} ns/switch, program {} ns/run",
                round + 1,
                config.name,
                run_time.map_or("-".to_owned(), |ns| format!("{ns:.1}"))
            );
            samples[index].push(value);
            run_times[index].extend(run_time);
        }
    }
    drop(stats);
    let medians: Vec<f64> = samples.iter_mut().map(|values| median(values)).collect();
    let run_times: Vec<Option<f64>> = run_times
        .iter_mut()
        .map(|values| (!values.is_empty()).then(|| median(values)))
        .collect();
    write_switches(&configs, &medians, &run_times)
}

/// What each configuration adds over `medians[0]` (the untraced run), and that as a multiple of
/// what its floor adds and of what the bpftrace configuration adds: the row's figures.
struct Added {
    added: Vec<f64>,
    per_floor: Vec<Option<f64>>,
    per_bpftrace: Vec<Option<f64>>,
}

fn added_over(configs: &[Config], medians: &[f64], bpftrace: &str) -> Added {
    let added: Vec<f64> = medians.iter().map(|value| value - medians[0]).collect();
    let added_by = |name: &str| {
        configs
            .iter()
            .position(|config| config.name == name)
            .map(|index| added[index])
    };
    let bpftrace_added = added_by(bpftrace);
    let per_floor = configs
        .iter()
        .zip(&added)
        .map(|(config, value)| {
            let floor = added_by(config.floor.as_deref()?)?;
            Some(value / floor)
        })
        .collect();
    let per_bpftrace = added
        .iter()
        .enumerate()
        .map(|(index, value)| Some(value / bpftrace_added.filter(|_| index > 0)?))
        .collect();
    Added {
        added,
        per_floor,
        per_bpftrace,
    }
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |ratio| format!("{ratio:.2}x"))
}

/// `BPF_ENABLE_STATS` (include/uapi/linux/bpf.h: command 32, `BPF_STATS_RUN_TIME` = 0): the
/// kernel times every BPF program run for as long as the returned fd is open.
fn enable_bpf_stats() -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    let mut attr = [0u32; 4];
    // SAFETY: a valid `union bpf_attr` prefix of the size passed.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 32, attr.as_mut_ptr(), 16) };
    if fd < 0 {
        bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}
/// The busiest BPF program `pid` holds (the sched_switch one: the others run rarely or never
/// during a ping-pong): its total run time and runs, from `/proc/PID/fdinfo`.
fn switch_program_runs(pid: u32) -> Option<(u64, u64)> {
    let mut busiest: Option<(u64, u64)> = None;
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
        let runs = (field("run_time_ns:")?, field("run_cnt:")?);
        if busiest.is_none_or(|(_, count)| runs.1 > count) {
            busiest = Some(runs);
        }
    }
    busiest
}

/// `measure`, plus the mean run time of the tracer's sched_switch program during the
/// ping-pong (None without a tracer or statistics).
fn measure_switches(config: &Config, pingpong: &Path) -> Result<(f64, Option<f64>)> {
    let args = ["--round-trips", ROUND_TRIPS, "--cpu", "0"].map(str::to_owned);
    let mut tracer = match &config.tracer {
        Some(argv) => Some(start_tracer(argv)?),
        None => None,
    };
    let before = tracer
        .as_ref()
        .and_then(|child| switch_program_runs(child.id()));
    let result = run_pingpong(pingpong, &args);
    let after = tracer
        .as_ref()
        .and_then(|child| switch_program_runs(child.id()));
    if let Some(child) = &mut tracer {
        // SAFETY: signalling our own child.
        unsafe { libc_kill(child.id() as i32, 2) };
        let _ = child.wait();
    }
    let run_time = match (before, after) {
        (Some((ns0, runs0)), Some((ns1, runs1))) if runs1 > runs0 && ns1 > ns0 => {
            Some((ns1 - ns0) as f64 / (runs1 - runs0) as f64)
        }
        _ => None,
    };
    Ok((result?, run_time))
}

/// How a per-call configuration runs: a command that runs callbench itself (topdown's
/// `-- CMD`, bpftrace's `-c`), or a tracer started beside a separate callbench run (the floor).
enum CallRun {
    Alone(Vec<String>),
    Beside(Vec<String>),
}

fn call_floor_name(pmu: &str, returns: &str) -> String {
    match returns {
        "exit" => format!("floor: aya uprobes at entry and at each exit reading --pmu {pmu}"),
        _ => format!("floor: aya uprobe + uretprobe reading --pmu {pmu}"),
    }
}

const BPFTRACE_CALL_NAME: &str = "bpftrace empty uprobe + uretprobe";

/// Per-function probes: ns per call of a tiny function, unprobed, under an empty bpftrace
/// uprobe+uretprobe pair, and under `topdown stat -u` with each return mechanism beside its
/// floor (the aya programs reading the same counters at the same points).
fn bench_functions(topdown: &Path, floor: &Path) -> Result<()> {
    let source = cmd::workspace_root().join("tests/workloads/callbench.c");
    let binary = topdown.with_file_name("callbench");
    cmd::run(
        Command::new("cc")
            .args(["-O1", "-fno-ipa-icf", "-o"])
            .arg(&binary)
            .arg(&source),
    )?;
    let bench = binary.display().to_string();
    let td = topdown.display().to_string();
    let fl = floor.display().to_string();
    let topdown_run = |pmu: &str, returns: Option<&str>| {
        let mut argv = strings(&[&td, "stat", "--pmu", pmu, "--format", "json", "-o"]);
        argv.extend(strings(&["/dev/null", "-u", &format!("{bench}:tiny")]));
        if let Some(returns) = returns {
            argv.extend(strings(&["--returns", returns]));
        }
        argv.extend(strings(&["--", &bench, CALLS]));
        argv
    };
    let mut configs = vec![
        Config::new("no probes", None, None),
        Config::new(BPFTRACE_CALL_NAME, None, None),
    ];
    let mut runs = vec![
        CallRun::Alone(vec![bench.clone(), CALLS.to_owned()]),
        CallRun::Alone(strings(&[
            "bpftrace",
            "-e",
            &format!("uprobe:{bench}:tiny {{}} uretprobe:{bench}:tiny {{}}"),
            "-c",
            &format!("{bench} {CALLS}"),
        ])),
    ];
    for pmu in [SOFTWARE, SYNTHETIC] {
        for returns in ["uretprobe", "exit"] {
            configs.push(Config::new(call_floor_name(pmu, returns), None, None));
            runs.push(CallRun::Beside(strings(&[
                &fl,
                "--pmu",
                pmu,
                "-u",
                &format!("{bench}:tiny"),
                "--returns",
                returns,
            ])));
            configs.push(Config::new(
                format!("topdown -u --returns {returns} --pmu {pmu}"),
                None,
                Some(call_floor_name(pmu, returns)),
            ));
            runs.push(CallRun::Alone(topdown_run(pmu, Some(returns))));
        }
    }
    // `auto` gives this plain C program uretprobes: its floor is theirs.
    configs.push(Config::new(
        format!("topdown -u (default: --returns auto) --pmu {SYNTHETIC}"),
        None,
        Some(call_floor_name(SYNTHETIC, "uretprobe")),
    ));
    runs.push(CallRun::Alone(topdown_run(SYNTHETIC, None)));

    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..CALL_ROUNDS {
        for (index, (config, run)) in configs.iter().zip(&runs).enumerate() {
            let value = measure_calls(run, &bench)
                .with_context(|| format!("round {round}: {}", config.name))?;
            println!(
                "functions, round {}: {:<70} {value:>10.1} ns/call",
                round + 1,
                config.name
            );
            samples[index].push(value);
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|values| median(values)).collect();
    let added = added_over(&configs, &medians, BPFTRACE_CALL_NAME);

    let mut section = String::from("## Per-function probe cost (`cargo xtask bench`)\n\n");
    section += &format!(
        "Same machine; command: `{}`. A tiny function (`lea; ret`, `tests/workloads/callbench.c`) \
         called {CALLS} times; {CALL_ROUNDS} alternating rounds, median. Each topdown row is \
         beside its floor: `topdown-floor -u` attaches aya programs at the same points (the \
         entry, and a uretprobe or a uprobe on each exit instruction) that read the same \
         counters (topdown's counter plan for that `--pmu`) and do nothing else. Uprobes trap \
         into the kernel, and traps are slow in this VM, so compare the ratios, not the absolute \
         figures.\n\n",
        command_text()
    );
    section += "| configuration | ns per call | added over no probes | added / its floor's | added / bpftrace's |\n|---|---:|---:|---:|---:|\n";
    for (index, (config, value)) in configs.iter().zip(&medians).enumerate() {
        section += &format!(
            "| {} | {value:.1} | {:+.1} | {} | {} |\n",
            config.name,
            added.added[index],
            ratio(added.per_floor[index]),
            ratio(added.per_bpftrace[index])
        );
    }
    section += "\nExit-instruction probes (`--returns exit`) put a plain uprobe on each `ret` and \
                tail-call `jmp` instead of rewriting the return address, so exceptions, panics and \
                thread cancellation still unwind through probed functions; the price is a \
                single-stepped `ret` per call where a uretprobe returns through the kernel's \
                trampoline. The default, `--returns auto`, gives a target uretprobes when nothing \
                in the traced program can unwind (this plain C program), exit probes otherwise.\n";
    write_section("## Per-function probe cost", &section)
}

fn measure_calls(run: &CallRun, bench: &str) -> Result<f64> {
    let (out, mut tracer) = match run {
        CallRun::Alone(argv) => (cmd::output(Command::new(&argv[0]).args(&argv[1..]))?, None),
        CallRun::Beside(argv) => {
            let child = start_tracer(argv)?;
            let out = cmd::output(Command::new(bench).arg(CALLS));
            (out?, Some(child))
        }
    };
    if let Some(child) = &mut tracer {
        // SAFETY: signalling our own child.
        unsafe { libc_kill(child.id() as i32, 2) };
        let _ = child.wait();
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix("ns_per_call="))
        .and_then(|value| value.parse().ok())
        .with_context(|| {
            format!(
                "no ns_per_call in output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// A C file of `count` tiny functions `f00000`, `f00001`, …, compiled: the globs `f00000`,
/// `f000*`, `f00*` and `f0*` match 1, 100, 1000 and 10000 of them.
fn attach_workload(dir: &Path, count: usize) -> Result<PathBuf> {
    let mut source = String::from("// Generated by `cargo xtask bench`: functions to attach to.\n");
    for index in 0..count {
        source +=
            &format!("__attribute__((noinline)) int f{index:05}(int x) {{ return x + 1; }}\n");
    }
    source += "int main(void) { return 0; }\n";
    let path = dir.join("attachbench.c");
    std::fs::write(&path, source).with_context(|| format!("writing {}", path.display()))?;
    let binary = dir.join("attachbench");
    cmd::run(
        Command::new("cc")
            .args(["-O1", "-fno-ipa-icf", "-o"])
            .arg(&binary)
            .arg(&path),
    )?;
    Ok(binary)
}

fn attach_glob(count: usize) -> Result<&'static str> {
    Ok(match count {
        1 => "f00000",
        100 => "f000*",
        1000 => "f00*",
        10000 => "f0*",
        _ => bail!("no glob for {count} functions"),
    })
}

/// Milliseconds in the first line of `text` that holds "attached in": topdown's and
/// topdown-floor's own report of their attach time, and of the part of it spent loading the
/// probe programs ("(N ms of it loading"), which does not grow with the number of functions.
fn attached_ms(text: &str) -> Option<(f64, f64)> {
    text.lines().find_map(|line| {
        let rest = line.split("attached in ").nth(1)?;
        let total = rest.split_whitespace().next()?.parse().ok()?;
        let loading = rest
            .split('(')
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some((total, loading))
    })
}

/// One line of the attach table: medians in milliseconds.
struct AttachRow {
    count: usize,
    own: f64,
    own_loading: f64,
    floor: f64,
    floor_loading: f64,
    wall: f64,
    /// Wall time, or why bpftrace was not measured.
    bpftrace: std::result::Result<f64, String>,
}

/// Attach time for 1 to 10000 functions: topdown's own figure beside the floor's (the same
/// entry + uretprobe points, attached one by one), and the wall-clock time of running the
/// program once under topdown and under bpftrace with an empty uprobe on each.
fn bench_attach(topdown: &Path, floor: &Path) -> Result<()> {
    let dir = topdown.with_file_name("attachbench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let max = ATTACH_COUNTS.iter().copied().max().unwrap_or(1);
    let binary = attach_workload(&dir, max)?;
    let bin = binary.display().to_string();
    let fl = floor.display().to_string();
    let mut rows = Vec::new();
    for count in ATTACH_COUNTS {
        let glob = attach_glob(count)?;
        let spec = format!("{bin}:{glob}");
        let mut own = Vec::new();
        let mut own_loading = Vec::new();
        let mut floor_ms = Vec::new();
        let mut floor_loading = Vec::new();
        let mut topdown_wall = Vec::new();
        let mut bpftrace_wall: Vec<f64> = Vec::new();
        let mut bpftrace_failure = None;
        let mut bpftrace_slow = false;
        for round in 0..ATTACH_ROUNDS {
            let start = Instant::now();
            let out = cmd::output(
                Command::new("timeout")
                    .arg(ATTACH_TIMEOUT_S)
                    .arg(topdown)
                    .args(["stat", "--pmu", SYNTHETIC, "--format", "json", "-o"])
                    .args(["/dev/null", "-u", &spec, "--", &bin]),
            )?;
            topdown_wall.push(start.elapsed().as_secs_f64() * 1e3);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let (total, loading) = attached_ms(&stderr)
                .with_context(|| format!("topdown -u {spec}: no attach time in: {stderr}"))?;
            own.push(total);
            own_loading.push(loading);

            let argv = strings(&[&fl, "--pmu", SYNTHETIC, "-u", &spec]);
            let (mut child, lines) = start_tracer_lines(&argv)?;
            // SAFETY: signalling our own child.
            unsafe { libc_kill(child.id() as i32, 2) };
            let _ = child.wait();
            let (total, loading) = attached_ms(&lines.join("\n"))
                .with_context(|| format!("topdown-floor -u {spec}: no attach time"))?;
            floor_ms.push(total);
            floor_loading.push(loading);

            println!(
                "attach {count}, round {}: topdown {:.1} ms (wall {:.1}), floor {:.1} ms",
                round + 1,
                own[round],
                topdown_wall[round],
                floor_ms[round]
            );
            if count > BPFTRACE_ATTACH_MAX {
                bpftrace_failure = Some(format!(
                    "over {BPFTRACE_ATTACH_MAX} functions (`BPFTRACE_ATTACH_MAX`)"
                ));
            }
            if bpftrace_failure.is_some() || bpftrace_slow {
                continue;
            }
            let start = Instant::now();
            let out = cmd::output(
                Command::new("timeout")
                    .arg(ATTACH_TIMEOUT_S)
                    .args(["bpftrace", "-e", &format!("uprobe:{spec} {{}}"), "-c", &bin])
                    // bpftrace refuses more than 512 probes unless told (man bpftrace).
                    .env("BPFTRACE_MAX_PROBES", (2 * max).to_string()),
            )?;
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            if out.status.success() {
                bpftrace_wall.push(elapsed);
                bpftrace_slow = elapsed > SLOW_RUN_MS;
            } else {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let reason = match out.status.code() {
                    Some(124) => format!("did not finish in {ATTACH_TIMEOUT_S} s"),
                    _ => stderr.lines().last().unwrap_or("failed").trim().to_owned(),
                };
                bpftrace_failure = Some(reason);
            }
            println!(
                "attach {count}, round {}: bpftrace wall {elapsed:.1} ms",
                round + 1
            );
        }
        let bpftrace = match bpftrace_failure {
            Some(reason) => Err(reason),
            None => Ok(median(&mut bpftrace_wall)),
        };
        rows.push(AttachRow {
            count,
            own: median(&mut own),
            own_loading: median(&mut own_loading),
            floor: median(&mut floor_ms),
            floor_loading: median(&mut floor_loading),
            wall: median(&mut topdown_wall),
            bpftrace,
        });
    }
    let mut section = String::from("## Attach time (`cargo xtask bench`)\n\n");
    section += &format!(
        "Same machine; command: `{}`. A generated C program of {max} tiny functions; `-u` with a \
         glob matching 1 to {max} of them, `--pmu {SYNTHETIC}`; {ATTACH_ROUNDS} rounds, median. \
         \"topdown attach\" is topdown's own figure (stderr: the time to attach its \
         probes, after the functions are resolved), \"loading\" the part of it the kernel spent \
         loading and verifying the probe programs (once per run, whatever the number of \
         functions: topdown's programs keep shadow stacks and up to 32 counters, the floor's \
         only read them), and the last ratio compares what is left; the floor's is \
         `topdown-floor -u` attaching an entry uprobe and a uretprobe per function the same way \
         (one uprobe.multi link per program, as topdown where the kernel has them), timed the \
         same way. The wall-clock columns run the program once under the tool, start to \
         exit (loading, attaching, running, detaching); bpftrace has an empty uprobe on each \
         function (`BPFTRACE_MAX_PROBES` raised); a bpftrace run over {:.0} s is not repeated, \
         and one over {ATTACH_TIMEOUT_S} s is stopped and reported as not measured; bpftrace is \
         not run above {BPFTRACE_ATTACH_MAX} functions (one perf link per uprobe, each closed \
         after an RCU grace period: at 10000 it was still detaching minutes after being \
         stopped).\n\n",
        command_text(),
        SLOW_RUN_MS / 1e3
    );
    section += "| functions | topdown attach (ms) | of it loading | floor attach (ms) | of it loading | topdown / floor | without loading | topdown wall (ms) | bpftrace wall (ms) | topdown / bpftrace |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for row in &rows {
        let (bpftrace_text, per_bpftrace) = match row.bpftrace {
            Ok(ms) => (format!("{ms:.1}"), format!("{:.2}x", row.wall / ms)),
            Err(ref reason) => (format!("not measured: {reason}"), "-".to_owned()),
        };
        section += &format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.1} | {bpftrace_text} | {per_bpftrace} |\n",
            row.count,
            row.own,
            row.own_loading,
            row.floor,
            row.floor_loading,
            row.own / row.floor,
            (row.own - row.own_loading) / (row.floor - row.floor_loading),
            row.wall,
        );
    }
    write_section("## Attach time", &section)
}

/// The user-space cost of one refresh (`topdown-user/examples/refresh_cost.rs`) at each of
/// `REFRESH_SIZES`: `top`'s and `serve`'s per-refresh paths against the target, and the full
/// outputs of everything on their own.
fn bench_refresh(topdown: &Path) -> Result<()> {
    let example = topdown.with_file_name("examples").join("refresh_cost");
    let mut section = String::from("## Refresh cost (`cargo xtask bench`)\n\n");
    section += &format!(
        "Same machine; command: `{}`, which runs `refresh_cost TASKS EDGES {REFRESH_ROUNDS}` (release build of \
         `topdown-user/examples/refresh_cost.rs`) on two synthetic cumulative snapshots in which \
         every task and edge counted (model intel-spr, level 2); median of {REFRESH_ROUNDS} rounds, in ms. \
         Issue 11's target is under {REFRESH_TARGET_MS:.0} ms with 100000 tasks and 10000 function edges \
         for the user-space cost of one refresh, once the BPF maps are read:\n\n\
         - **top** = order (index the task map's entries by tid) + aggregate (the deltas, typed) \
         + top screen (pick the rows a 50-line screen shows in the default view, name and \
         evaluate only those, draw it) + drop (the previous refresh's counts freed);\n\
         - **serve** = order + aggregate + exporter update (a fresh exporter, so every series is \
         new) + drop.\n\n\
         Reading the task map is the kernel's work (system calls), shown on its own: **map read** \
         is what `Session::snapshot` does (`BPF_MAP_LOOKUP_BATCH`), **entry by entry** what it did \
         before and still does on kernels before 5.6 (aya's iterator: two system calls per task), \
         both on a kernel hash map of TASKS entries laid out as topdown's task map (needs root; \
         `-` where not measured). Wall time, and in parentheses the refreshing thread's CPU time, \
         which other work on a busy machine inflates less; the step columns are wall time. The \
         other columns are not per refresh: a scrape encodes every series; report, table and JSON \
         are `stat`'s full output of every thread, process, function and edge. Edges are not split \
         by process (`top` and `serve` never split them).\n\n",
        command_text()
    );
    section += "| tasks | call edges | top: wall (CPU) | serve: wall (CPU) | under 50 ms: top, serve (wall; CPU) | map read | entry by entry | order | aggregate | top screen | exporter update | drop | scrape | full report | + table | + JSON |\n|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (tasks, edges) in REFRESH_SIZES {
        let out = cmd::output(Command::new(&example).args([
            tasks.to_string(),
            edges.to_string(),
            REFRESH_ROUNDS.to_owned(),
        ]))?;
        let text = String::from_utf8_lossy(&out.stdout);
        println!("refresh_cost {tasks} {edges}:\n{text}");
        if !out.status.success() {
            bail!(
                "refresh_cost {tasks} {edges} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let value = |key: &str| -> Result<f64> {
            text.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix("_ms="))
                .and_then(|value| value.trim().parse().ok())
                .with_context(|| format!("refresh_cost printed no {key}_ms: {text}"))
        };
        let (top, serve) = (value("top")?, value("serve")?);
        let (top_cpu, serve_cpu) = (value("top_cpu")?, value("serve_cpu")?);
        let verdict = |ms: f64| if ms < REFRESH_TARGET_MS { "yes" } else { "no" };
        let optional =
            |key: &str| value(key).map_or_else(|_| "-".to_owned(), |ms| format!("{ms:.1}"));
        section += &format!(
            "| {tasks} | {edges} | {top:.1} ({top_cpu:.1}) | {serve:.1} ({serve_cpu:.1}) | {}, {}; {}, {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            verdict(top),
            verdict(serve),
            verdict(top_cpu),
            verdict(serve_cpu),
            optional("step_map_read"),
            optional("step_map_read_by_entry"),
            value("step_order")?,
            value("step_aggregate")?,
            value("step_top_screen")?,
            value("step_exporter_update")?,
            value("step_aggregate_drop")?,
            value("step_scrape")?,
            value("step_report")?,
            value("step_table")?,
            value("step_json")?,
        );
    }
    write_section("## Refresh cost", &section)
}

/// Replaces (or appends) the section starting with `heading` in BENCHMARKS.md, and prints it.
fn write_section(heading: &str, section: &str) -> Result<()> {
    let path = cmd::workspace_root().join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".to_owned());
    std::fs::write(&path, replace_section(&existing, heading, section))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("\n{section}");
    Ok(())
}

/// Per-cgroup attribution: the ping-pong's two sides in two cgroups (so every context switch is
/// also a cgroup switch: the worst case for the cgroup-switch trigger), with 2 active cgroups
/// and with 198 more, each holding a process that wakes every 10 ms.
fn bench_cgroups(topdown: &Path, pingpong: &Path, floor: &Path) -> Result<()> {
    let mount = cgroup_v2_mount()?;
    let root = mount.join(format!("topdown-bench-{}", std::process::id()));
    let side_a = root.join("a");
    let side_b = root.join("b");
    for dir in [&side_a, &side_b] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let td = topdown.display().to_string();
    let tracer = |topdown: &str, trigger: &str| {
        Some(
            [
                topdown,
                "stat",
                "-a",
                "--by",
                "cgroup",
                "--trigger",
                trigger,
                "--pmu",
                "synthetic:intel-icl",
                "--format",
                "json",
                "-o",
                "/dev/null",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        )
    };
    let floor_name = switch_floor_name(SYNTHETIC);
    let mut configs = vec![
        Config::new("no tracing", None, None),
        Config::new(
            floor_name.clone(),
            Some(strings(&[
                &floor.display().to_string(),
                "--pmu",
                SYNTHETIC,
                "--read",
            ])),
            None,
        ),
        Config::new(
            "--by cgroup --trigger sched-switch",
            tracer(&td, "sched-switch"),
            Some(floor_name.clone()),
        ),
        Config::new(
            "--by cgroup --trigger cgroup-switch",
            tracer(&td, "cgroup-switch"),
            Some(floor_name.clone()),
        ),
        Config::new(
            BPFTRACE_NAME,
            Some(strings(&[
                "bpftrace",
                "-e",
                "tracepoint:sched:sched_switch {}",
            ])),
            None,
        ),
    ];
    if let Some(old) = baseline_build() {
        for trigger in ["sched-switch", "cgroup-switch"] {
            configs.push(Config::new(
                format!("baseline: --by cgroup --trigger {trigger}"),
                tracer(&old, trigger),
                Some(floor_name.clone()),
            ));
        }
    }
    let pingpong_args = [
        "--round-trips".to_owned(),
        ROUND_TRIPS.to_owned(),
        "--cpu".to_owned(),
        "0".to_owned(),
        "--processes".to_owned(),
        "--cgroup-a".to_owned(),
        side_a.display().to_string(),
        "--cgroup-b".to_owned(),
        side_b.display().to_string(),
    ];
    let same_cgroup_args = ["--round-trips", ROUND_TRIPS, "--cpu", "0"]
        .map(str::to_owned)
        .to_vec();
    let scenarios: [(&str, usize, &[String]); 3] = [
        ("both sides in one cgroup", 0, &same_cgroup_args),
        ("2 (one per side)", 0, &pingpong_args),
        ("200 (2 + 198 waking every 10 ms)", 198, &pingpong_args),
    ];
    let mut rows = Vec::new();
    for (label, extra, args) in scenarios {
        let mut wakers = Vec::new();
        for index in 0..extra {
            let dir = root.join(format!("busy-{index}"));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let waker = Command::new(pingpong)
                .args(["--waker", "10"])
                .spawn()
                .context("starting a waker")?;
            std::fs::write(dir.join("cgroup.procs"), waker.id().to_string())
                .context("moving a waker")?;
            wakers.push(waker);
        }
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        for round in 0..CGROUP_ROUNDS {
            for (index, config) in configs.iter().enumerate() {
                let value = measure_with(config, pingpong, args)
                    .with_context(|| format!("{label}, round {round}: {}", config.name))?;
                println!(
                    "{label}, round {}: {:<40} {value:>9.1} ns/switch",
                    round + 1,
                    config.name
                );
                samples[index].push(value);
            }
        }
        for mut waker in wakers {
            let _ = waker.kill();
            let _ = waker.wait();
        }
        let medians: Vec<f64> = samples.iter_mut().map(|values| median(values)).collect();
        rows.push((label, medians));
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = remove_tree(&root);

    let mut section = String::from("## Per-cgroup attribution cost (`cargo xtask bench`)\n\n");
    section += &format!(
        "Same machine; command: `{}`. Synthetic model (7 counters), {CGROUP_ROUNDS} alternating \
         rounds, median. With the two ping-pong sides in one cgroup no switch crosses cgroups \
         (the common case); with one side per cgroup every context switch is also a cgroup \
         switch (the worst case for the cgroup-switch trigger); the last scenario adds 198 \
         cgroups, each with a process waking every 10 ms. The cgroup-switch trigger also reads \
         the counters when a CPU enters and leaves idle (`power:cpu_idle`), which the many \
         wake-ups of the last scenario exercise. The floor reads the same 7 counters at every \
         context switch.\n\n",
        command_text()
    );
    section += "| active cgroups | configuration | ns per context switch | added over no tracing | added / floor's | added / bpftrace's |\n|---:|---|---:|---:|---:|---:|\n";
    for (active, medians) in &rows {
        let added = added_over(&configs, medians, BPFTRACE_NAME);
        for (index, (config, value)) in configs.iter().zip(medians).enumerate() {
            section += &format!(
                "| {active} | {} | {value:.1} | {:+.1} | {} | {} |\n",
                config.name,
                added.added[index],
                ratio(added.per_floor[index]),
                ratio(added.per_bpftrace[index])
            );
        }
    }
    write_section("## Per-cgroup attribution cost", &section)
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

fn cgroup_v2_mount() -> Result<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split_whitespace().nth(4)?;
            (after.split_whitespace().next()? == "cgroup2")
                .then(|| std::path::PathBuf::from(mount_point))
        })
        .context("no cgroup v2 mount: the cgroup benchmark needs one")
}

fn measure_with(config: &Config, pingpong: &Path, args: &[String]) -> Result<f64> {
    let mut tracer = match &config.tracer {
        Some(argv) => Some(start_tracer(argv)?),
        None => None,
    };
    let result = run_pingpong(pingpong, args);
    if let Some(child) = &mut tracer {
        // SAFETY: signalling our own child.
        unsafe { libc_kill(child.id() as i32, 2) };
        let _ = child.wait();
    }
    result
}

fn run_pingpong(pingpong: &Path, args: &[String]) -> Result<f64> {
    let out = cmd::output(Command::new(pingpong).args(args))?;
    if !out.status.success() {
        bail!("pingpong failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("ns_per_switch=")
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("unexpected pingpong output: {text}"))
}

/// Starts a tracer and waits until it says it is attached (topdown: "counting" on stderr;
/// bpftrace: "Attaching" on stdout).
fn start_tracer(argv: &[String]) -> Result<Child> {
    Ok(start_tracer_lines(argv)?.0)
}

/// `start_tracer`, also returning the lines the tracer printed up to that point.
fn start_tracer_lines(argv: &[String]) -> Result<(Child, Vec<String>)> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    let (sender, receiver) = mpsc::channel();
    let streams: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().context("tracer stdout")?),
        Box::new(child.stderr.take().context("tracer stderr")?),
    ];
    for stream in streams {
        let sender = sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
    }
    drop(sender);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => {
                let attached = line.contains("counting") || line.contains("Attaching");
                lines.push(line);
                if attached {
                    // Attached means probes are live; let it settle.
                    std::thread::sleep(Duration::from_millis(300));
                    return Ok((child, lines));
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{} did not attach within 300 s: {}",
                    argv.join(" "),
                    lines.join(" / ")
                )
            }
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The kernel-timed run time of configuration `index`'s sched_switch program as a multiple of
/// its floor's.
fn program_per_floor(configs: &[Config], run_times: &[Option<f64>], index: usize) -> Option<f64> {
    let floor = configs[index].floor.as_deref()?;
    let floor = configs.iter().position(|config| config.name == floor)?;
    Some(run_times[index]? / run_times[floor]?)
}

fn write_switches(configs: &[Config], medians: &[f64], run_times: &[Option<f64>]) -> Result<()> {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                line.strip_prefix("model name")
                    .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut section = String::new();
    section += "## Context-switch cost (`cargo xtask bench`)\n\n";
    section += &format!(
        "Machine: {cpus} vCPUs, {cpu_model}, Linux {}, a VM without a hardware PMU (so the synthetic \
         model stands in for TopDown counters; hardware counter reads are not measured here).\n\n",
        kernel.trim()
    );
    let command = command_text();
    section += &format!(
        "Command: `{command}`. A ping-pong of two threads pinned to CPU 0 ({ROUND_TRIPS} round \
         trips, two context switches each), {ROUNDS} alternating rounds per configuration, median. \
         Each topdown row's floor is `topdown-floor --pmu MODEL --read`: an aya \
         `tp_btf/sched_switch` program that reads the same counters (topdown's counter plan for \
         that model, opened the same way) into a scratch map and does nothing else.\n\n"
    );
    let added = added_over(configs, medians, BPFTRACE_NAME);
    section += "| configuration | ns per context switch | added over no tracing | added / its floor's | added / bpftrace's | sched_switch program, ns per run | program / its floor's program |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for (index, ((config, value), run_time)) in
        configs.iter().zip(medians).zip(run_times).enumerate()
    {
        section += &format!(
            "| {} | {value:.1} | {:+.1} | {} | {} | {} | {} |\n",
            config.name,
            added.added[index],
            ratio(added.per_floor[index]),
            ratio(added.per_bpftrace[index]),
            run_time.map_or("-".to_owned(), |ns| format!("{ns:.1}")),
            ratio(program_per_floor(configs, run_times, index))
        );
    }
    section += "\nThe last two columns are the kernel's own timing of the tracer's sched_switch \
                program (`BPF_ENABLE_STATS`, mean run time over the ping-pong's switches, median \
                of the rounds) and that as a multiple of its floor's: the program's work alone, \
                without the hook's fixed cost, and steady when other load on the machine makes \
                the wall-clock columns wander.\n";
    section += "\n`IDLE_PID` is a process that sleeps throughout, so with `-p` no switch of the \
                ping-pong is traced: those switches take no counter reading (the default with a \
                filter), and its floor (a program that reads at every switch) is above what it \
                needs; the empty aya program is the floor that matters there. With \
                `--read-every-switch` every switch is read.\n";
    let index_of = |name: &str| configs.iter().position(|config| config.name == name);
    let empty = index_of(FLOOR_NAME);
    let idle_p = index_of(&format!("topdown stat -p IDLE_PID --pmu {SYNTHETIC}"));
    if let (Some(empty), Some(idle_p)) = (empty, idle_p) {
        let floor = added.added[empty];
        section += &format!(
            "\n`-p` of an idle process, synthetic (7 counters): {:+.1} ns per switch against \
             {floor:+.1} ns for the empty aya program",
            added.added[idle_p]
        );
        // Other load can leave the empty program's small cost below the noise: no ratio then.
        if floor > 0.0 {
            section += &format!(", {:.2}x by wall clock", added.added[idle_p] / floor);
        } else {
            section += " (below this run's noise: no wall-clock ratio)";
        }
        if let (Some(empty_run), Some(filtered_run)) = (run_times[empty], run_times[idle_p]) {
            // Both pay the same hook; they differ by what their programs do, which the kernel's
            // run times measure without the wall-clock noise.
            let extra = filtered_run - empty_run;
            section += &format!(
                "; its program runs {filtered_run:.1} ns per switch against {empty_run:.1} ns, \
                 {extra:+.1} ns"
            );
            if floor > 0.0 {
                section += &format!(
                    ", so with the empty program's wall-clock cost it adds an estimated {:.2}x",
                    (floor + extra) / floor
                );
            }
        }
        section += " (issue 11's target: at most 1.2x).\n";
    }
    if let (Some(old), Some(new)) = (
        index_of(&format!(
            "baseline: topdown stat -p IDLE_PID --pmu {SYNTHETIC}"
        )),
        idle_p,
    ) {
        section += &format!(
            "\n`-p` of an idle process, synthetic (7 counters), this build against the baseline \
             build (`TOPDOWN_BENCH_BASELINE`), same rounds: {:+.1} ns against {:+.1} ns \
             per switch.\n",
            added.added[new], added.added[old]
        );
    }
    write_section("## Context-switch cost", &section)
}

/// Replaces the `## …` section starting with `heading` (up to the next `## `), or appends it.
pub fn replace_section(text: &str, heading: &str, section: &str) -> String {
    match text.find(heading) {
        Some(start) => {
            let rest = &text[start + heading.len()..];
            let end = rest
                .find("\n## ")
                .map_or(text.len(), |offset| start + heading.len() + offset + 1);
            // A blank line between sections, however the section text ends.
            let rest = &text[end..];
            let separator = if rest.is_empty() || section.ends_with("\n\n") {
                ""
            } else {
                "\n"
            };
            format!("{}{}{separator}{}", &text[..start], section, rest)
        }
        None => format!("{}\n\n{section}", text.trim_end()),
    }
}

fn ensure_bpftrace() -> Result<()> {
    if Command::new("bpftrace")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
    {
        println!("ok: bpftrace");
        return Ok(());
    }
    println!("installing: bpftrace (Debian) for the BPF floor measurement");
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "bpftrace"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

unsafe extern "C" {
    #[link_name = "kill"]
    pub(crate) fn libc_kill(pid: i32, signal: i32) -> i32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_in_place() {
        let text = "# Benchmarks\n\n## Context-switch cost\nold\n\n## Other\nkeep\n";
        let updated = replace_section(
            text,
            "## Context-switch cost",
            "## Context-switch cost\nnew\n",
        );
        assert_eq!(
            updated,
            "# Benchmarks\n\n## Context-switch cost\nnew\n\n## Other\nkeep\n"
        );
        assert_eq!(
            replace_section("# B\n", "## X", "## X\ny\n"),
            "# B\n\n## X\ny\n"
        );
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn figures_are_ratios_to_their_floor_and_to_bpftrace() {
        let configs = [
            Config::new("none", None, None),
            Config::new("floor", None, None),
            Config::new("tool", None, Some("floor".to_owned())),
            Config::new("bpftrace", None, None),
        ];
        let added = added_over(&configs, &[100.0, 110.0, 130.0, 120.0], "bpftrace");
        assert_eq!(added.added, [0.0, 10.0, 30.0, 20.0]);
        assert_eq!(added.per_floor, [None, None, Some(3.0), None]);
        assert_eq!(added.per_bpftrace, [None, Some(0.5), Some(1.5), Some(1.0)]);
        let run_times = [None, Some(50.0), Some(75.0), Some(40.0)];
        assert_eq!(program_per_floor(&configs, &run_times, 2), Some(1.5));
        assert_eq!(program_per_floor(&configs, &run_times, 1), None);
    }

    #[test]
    fn attach_times_are_read_from_both_tools() {
        assert_eq!(
            attached_ms(
                "topdown-floor: 20000 probe points attached in 135.7 ms (1.2 ms of it loading \
                 the probe programs)"
            ),
            Some((135.7, 1.2))
        );
        assert_eq!(
            attached_ms(
                "x\ntopdown: probing 100 functions in 1 binary (uretprobes) attached in 12.5 ms \
                 (10.0 ms of it loading the probe programs)"
            ),
            Some((12.5, 10.0))
        );
        assert_eq!(attached_ms("topdown: counting"), None);
        assert_eq!(attach_glob(100).ok(), Some("f000*"));
        assert!(attach_glob(7).is_err());
    }
}
