//! `cargo xtask bench`: what tracing adds per context switch, measured side by side in one run.
//!
//! A ping-pong of two threads pinned to one CPU runs untraced, under `topdown stat -a` with the
//! software and the synthetic model, and under an empty bpftrace sched_switch program (the floor
//! any BPF tool pays). Rounds alternate between configurations so machine noise spreads over all
//! of them; each figure is the median. Results replace BENCHMARKS.md's section.

use std::{
    io::{BufRead as _, BufReader, Read},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

const ROUNDS: usize = 5;
const ROUND_TRIPS: &str = "200000";

struct Config {
    name: String,
    tracer: Option<Vec<String>>,
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
    ]))?;
    let pingpong = topdown.with_file_name("pingpong");
    let floor = topdown.with_file_name("topdown-floor");
    // `-p` of a process that never runs: every switch the ping-pong makes is one nobody traces.
    let mut idle = Command::new("sleep")
        .arg("infinity")
        .spawn()
        .context("starting an idle process for `stat -p`")?;
    let idle_pid = idle.id().to_string();
    let result = bench_switches(&topdown, &pingpong, &floor, &idle_pid);
    let _ = idle.kill();
    let _ = idle.wait();
    result?;
    bench_cgroups(&topdown, &pingpong)?;
    bench_functions(&topdown)
}

/// `topdown stat` with `--format json -o /dev/null` and `args`.
fn stat_argv(topdown: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![topdown.to_owned(), "stat".to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    argv.extend(["--format", "json", "-o", "/dev/null"].map(str::to_owned));
    argv
}

/// What tracing adds per context switch: `-a` and `-p` of an idle process, beside the empty
/// aya sched_switch program and an empty bpftrace one.
fn bench_switches(topdown: &Path, pingpong: &Path, floor: &Path, idle_pid: &str) -> Result<()> {
    let td = topdown.display().to_string();
    let mut configs = vec![
        Config {
            name: "no tracing".to_owned(),
            tracer: None,
        },
        Config {
            name: FLOOR_NAME.to_owned(),
            tracer: Some(vec![floor.display().to_string()]),
        },
        Config {
            name: "topdown stat -p IDLE_PID --pmu software".to_owned(),
            tracer: Some(stat_argv(&td, &["-p", idle_pid, "--pmu", "software"])),
        },
        Config {
            name: "topdown stat -p IDLE_PID --pmu synthetic:intel-icl".to_owned(),
            tracer: Some(stat_argv(
                &td,
                &["-p", idle_pid, "--pmu", "synthetic:intel-icl"],
            )),
        },
        Config {
            name: "topdown stat -a --pmu software".to_owned(),
            tracer: Some(stat_argv(&td, &["-a", "--pmu", "software"])),
        },
        Config {
            name: "topdown stat -a --pmu synthetic:intel-icl".to_owned(),
            tracer: Some(stat_argv(&td, &["-a", "--pmu", "synthetic:intel-icl"])),
        },
        Config {
            name: BPFTRACE_NAME.to_owned(),
            tracer: Some(vec![
                "bpftrace".into(),
                "-e".into(),
                "tracepoint:sched:sched_switch {}".into(),
            ]),
        },
    ];
    if let Some(old) = baseline_build() {
        configs.push(Config {
            name: "baseline: topdown stat -p IDLE_PID --pmu synthetic:intel-icl".to_owned(),
            tracer: Some(stat_argv(
                &old,
                &["-p", idle_pid, "--pmu", "synthetic:intel-icl"],
            )),
        });
        for pmu in ["software", "synthetic:intel-icl"] {
            configs.push(Config {
                name: format!("baseline: topdown stat -a --pmu {pmu}"),
                tracer: Some(stat_argv(&old, &["-a", "--pmu", pmu])),
            });
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
    write_results(&configs, &medians, &run_times)
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

const FLOOR_NAME: &str = "aya empty tp_btf/sched_switch program (floor)";
const BPFTRACE_NAME: &str = "bpftrace 'tracepoint:sched:sched_switch {}'";

/// Per-function probes: ns per call of a tiny function, unprobed, under an empty bpftrace
/// uprobe+uretprobe pair (the floor), and under `topdown stat -u` (the default `--returns auto`,
/// which gives this plain C program uretprobes, and each mechanism forced); then the time to
/// attach 1, 100 and 1000 functions.
fn bench_functions(topdown: &Path) -> Result<()> {
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
    const CALLS: &str = "100000";
    let topdown_run = |pmu: &str, returns: Option<&str>| {
        let mut argv: Vec<String> = [
            td.as_str(),
            "stat",
            "--pmu",
            pmu,
            "--format",
            "json",
            "-o",
            "/dev/null",
            "-u",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        argv.push(format!("{bench}:tiny"));
        if let Some(returns) = returns {
            argv.extend(["--returns".to_owned(), returns.to_owned()]);
        }
        argv.extend(["--".to_owned(), bench.clone(), CALLS.to_owned()]);
        argv
    };
    let configs: [(&str, Vec<String>); 6] = [
        ("no probes", vec![bench.clone(), CALLS.to_owned()]),
        (
            "bpftrace empty uprobe + uretprobe (floor)",
            vec![
                "bpftrace".to_owned(),
                "-e".to_owned(),
                format!("uprobe:{bench}:tiny {{}} uretprobe:{bench}:tiny {{}}"),
                "-c".to_owned(),
                format!("{bench} {CALLS}"),
            ],
        ),
        (
            "topdown -u (default: --returns auto), software",
            topdown_run("software", None),
        ),
        (
            "topdown -u (default: --returns auto), synthetic:intel-icl",
            topdown_run("synthetic:intel-icl", None),
        ),
        (
            "topdown -u --returns exit, synthetic:intel-icl",
            topdown_run("synthetic:intel-icl", Some("exit")),
        ),
        (
            "topdown -u --returns uretprobe, synthetic:intel-icl",
            topdown_run("synthetic:intel-icl", Some("uretprobe")),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..3 {
        for (index, (name, argv)) in configs.iter().enumerate() {
            let out = cmd::output(Command::new(&argv[0]).args(&argv[1..]))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let value: f64 = text
                .lines()
                .find_map(|line| line.trim().strip_prefix("ns_per_call="))
                .and_then(|value| value.parse().ok())
                .with_context(|| {
                    format!(
                        "{name}: no ns_per_call in output: {text}{}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                })?;
            println!(
                "functions, round {}: {name:<58} {value:>10.1} ns/call",
                round + 1
            );
            samples[index].push(value);
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|values| median(values)).collect();

    let mut attach = Vec::new();
    for (count, glob) in [(1, "f0000"), (100, "f00??"), (1000, "f0???")] {
        let mut times = Vec::new();
        for _ in 0..3 {
            let out = cmd::output(
                Command::new(topdown)
                    .args([
                        "stat",
                        "--pmu",
                        "software",
                        "--format",
                        "json",
                        "-o",
                        "/dev/null",
                        "-u",
                    ])
                    .arg(format!("{bench}:{glob}"))
                    .args(["--", &bench, "1"]),
            )?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let ms: f64 = stderr
                .lines()
                .find_map(|line| line.split("attached in ").nth(1))
                .and_then(|rest| rest.trim_end_matches(" ms").trim().parse().ok())
                .with_context(|| format!("no attach time in: {stderr}"))?;
            times.push(ms);
        }
        attach.push((count, median(&mut times)));
    }

    let mut section = String::from("## Per-function probe cost (`cargo xtask bench`)\n\n");
    section += &format!(
        "Same machine and command. A tiny function (`lea; ret`) called {CALLS} times; 3 alternating \
         rounds, median. Uprobes trap into the kernel, and traps are slow in this VM (an empty \
         bpftrace uprobe alone costs ~11 us per hit here against ~0.3 us published for bare \
         metal), so compare the rows, not the absolute figures.\n\n"
    );
    section += "| configuration | ns per call | added over the bpftrace floor |\n|---|---:|---:|\n";
    for ((name, _), value) in configs.iter().zip(&medians) {
        section += &format!("| {name} | {value:.1} | {:+.1} |\n", value - medians[1]);
    }
    section += "\nExit-instruction probes put a plain uprobe on each `ret` and tail-call `jmp` \
                instead of rewriting the return address, so exceptions, panics and thread \
                cancellation still unwind through probed functions; the price is a single-stepped \
                `ret` per call where a uretprobe returns through the kernel's trampoline. The \
                default, `--returns auto`, gives a target uretprobes when nothing in the traced \
                program can unwind (this benchmark's plain C program), exit probes otherwise.\n\n";
    section += "| functions attached | attach time (ms) |\n|---:|---:|\n";
    for (count, ms) in &attach {
        section += &format!("| {count} | {ms:.1} |\n");
    }
    let path = cmd::workspace_root().join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".to_owned());
    std::fs::write(
        &path,
        replace_section(&existing, "## Per-function probe cost", &section),
    )
    .with_context(|| format!("writing {}", path.display()))?;
    println!("\n{section}");
    Ok(())
}

/// Per-cgroup attribution: the ping-pong's two sides in two cgroups (so every context switch is
/// also a cgroup switch: the worst case for the cgroup-switch trigger), with 2 active cgroups
/// and with 198 more, each holding a process that wakes every 10 ms.
fn bench_cgroups(topdown: &Path, pingpong: &Path) -> Result<()> {
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
    let mut configs = vec![
        Config {
            name: "no tracing".to_owned(),
            tracer: None,
        },
        Config {
            name: "--by cgroup --trigger sched-switch".to_owned(),
            tracer: tracer(&td, "sched-switch"),
        },
        Config {
            name: "--by cgroup --trigger cgroup-switch".to_owned(),
            tracer: tracer(&td, "cgroup-switch"),
        },
    ];
    if let Some(old) = baseline_build() {
        for trigger in ["sched-switch", "cgroup-switch"] {
            configs.push(Config {
                name: format!("baseline: --by cgroup --trigger {trigger}"),
                tracer: tracer(&old, trigger),
            });
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
        for round in 0..3 {
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
    section += "Same machine and command, synthetic model (7 counters), 3 alternating rounds, median. \
                With the two ping-pong sides in one cgroup no switch crosses cgroups (the common case); \
                with one side per cgroup every context switch is also a cgroup switch (the worst case \
                for the cgroup-switch trigger); the last scenario adds 198 cgroups, each with a process \
                waking every 10 ms. The cgroup-switch trigger also reads the counters when a CPU \
                enters and leaves idle (`power:cpu_idle`), which the many wake-ups of the last \
                scenario exercise.\n\n";
    section += "| active cgroups | configuration | ns per context switch | added over no tracing |\n|---:|---|---:|---:|\n";
    for (active, medians) in &rows {
        for (config, value) in configs.iter().zip(medians) {
            section += &format!(
                "| {active} | {} | {value:.1} | {:+.1} |\n",
                config.name,
                value - medians[0]
            );
        }
    }
    let path = cmd::workspace_root().join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".to_owned());
    std::fs::write(
        &path,
        replace_section(&existing, "## Per-cgroup attribution cost", &section),
    )
    .with_context(|| format!("writing {}", path.display()))?;
    println!("\n{section}");
    Ok(())
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
                if line.contains("counting") || line.contains("Attaching") {
                    let _ = sender.send(());
                }
            }
        });
    }
    match receiver.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => {
            // Attached means probes are live; let it settle.
            std::thread::sleep(Duration::from_millis(300));
            Ok(child)
        }
        Err(_) => {
            let _ = child.kill();
            bail!("{} did not attach within 60 s", argv.join(" "))
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn write_results(configs: &[Config], medians: &[f64], run_times: &[Option<f64>]) -> Result<()> {
    let baseline = medians[0];
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
    let command = match baseline_build() {
        Some(_) => "TOPDOWN_BENCH_BASELINE=<an earlier build's topdown> cargo xtask bench",
        None => "cargo xtask bench",
    };
    section += &format!(
        "Command: `{command}`. A ping-pong of two threads pinned to CPU 0 ({ROUND_TRIPS} round \
         trips, two context switches each), {ROUNDS} alternating rounds per configuration, median.\n\n"
    );
    // What each configuration adds per switch, and that as a multiple of what the empty aya
    // program adds.
    let added = |name: &str| {
        configs
            .iter()
            .position(|config| config.name == name)
            .map(|index| medians[index] - baseline)
    };
    let floor = added(FLOOR_NAME).unwrap_or(f64::NAN);
    section += "| configuration | ns per context switch | added over no tracing | added / floor's | sched_switch program, ns per run |\n|---|---:|---:|---:|---:|\n";
    for ((config, value), run_time) in configs.iter().zip(medians).zip(run_times) {
        section += &format!(
            "| {} | {value:.1} | {:+.1} | {:.2}x | {} |\n",
            config.name,
            value - baseline,
            (value - baseline) / floor,
            run_time.map_or("-".to_owned(), |ns| format!("{ns:.1}"))
        );
    }
    section += "\nThe last column is the kernel's own timing of the tracer's sched_switch program \
                (`BPF_ENABLE_STATS`, mean run time over the ping-pong's switches, median of the \
                rounds): the program's work alone, without the hook's fixed cost, and steady when \
                other load on the machine makes the wall-clock columns wander (the two `-p` rows \
                run the same program: their wall-clock difference is that noise).\n";
    section += "\nThe floor is an aya `tp_btf/sched_switch` program that does nothing \
                (`topdown-floor`), loaded and attached as topdown's is. `IDLE_PID` is a process \
                that sleeps throughout, so with `-p` no switch of the ping-pong is traced: since \
                issue 11 those switches take no counter reading.\n";
    let run_time = |name: &str| {
        configs
            .iter()
            .position(|config| config.name == name)
            .and_then(|index| run_times[index])
    };
    let idle_p = "topdown stat -p IDLE_PID --pmu synthetic:intel-icl";
    if let (Some(empty), Some(filtered)) = (run_time(FLOOR_NAME), run_time(idle_p)) {
        // Both pay the same hook; they differ by what their programs do, which the kernel's
        // run times measure without the wall-clock noise.
        let extra = filtered - empty;
        section += &format!(
            "\n`-p` of an idle process, synthetic (7 counters): its sched_switch program runs \
             {filtered:.1} ns per switch against {empty:.1} ns for the empty program, {extra:+.1} \
             ns. "
        );
        section += &if floor > 0.0 {
            format!(
                "With the empty program's wall-clock cost above ({floor:+.1} ns per switch), \
                 `-p` adds an estimated {:.2}x what the empty program adds (issue 11's target: \
                 at most 1.2x).\n",
                (floor + extra) / floor
            )
        } else {
            "The empty program's wall-clock cost was lost in this run's noise, so no ratio is \
             estimated.\n"
                .to_owned()
        };
    }
    if let (Some(old), Some(new)) = (
        added("baseline: topdown stat -p IDLE_PID --pmu synthetic:intel-icl"),
        added("topdown stat -p IDLE_PID --pmu synthetic:intel-icl"),
    ) {
        section += &format!(
            "\n`-p` of an idle process, synthetic (7 counters), this build against the baseline \
             build (`TOPDOWN_BENCH_BASELINE`), same rounds: {new:+.1} ns against {old:+.1} ns \
             per switch.\n"
        );
    }
    let path = cmd::workspace_root().join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".to_owned());
    let updated = replace_section(&existing, "## Context-switch cost", &section);
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))?;
    println!("\n{section}\nwritten to {}", path.display());
    Ok(())
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
}
