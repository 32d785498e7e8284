//! The span sections of `cargo xtask bench`: what one span costs (a pair of USDT sites,
//! `tests/workloads/spanbench.c`) beside its floor (aya uprobes at the same two sites reading
//! the same counters, `topdown-floor -U`), and pgbench's throughput against a PostgreSQL
//! server with and without `--postgres`.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use super::{
    BOOTSTRAP_RESAMPLES, BPF_PROG_TYPE_KPROBE, Config, LoadReport, MachineLoad, PROGRAM_ROUNDS,
    ProbeCost, ProbeWorkload, SOFTWARE, SYNTHETIC, TracedRun, command_text, machine_text, median,
    side_by_side, start_tracer, stat_argv, stop_tracer, strings, write_section,
};
use crate::cmd;

const SPAN_ROUNDS: usize = 5;
/// Issue 23's bound: a span at most this many times its floor.
const ISSUE_23_BOUND: f64 = 1.2;
const SPANS: &str = "100000";
/// pgbench rounds, seconds per run and clients.
const PGBENCH_ROUNDS: usize = 3;
const PGBENCH_SECONDS: &str = "10";
const PGBENCH_CLIENTS: &str = "2";

fn span_floor_name(pmu: &str) -> String {
    format!("floor: aya uprobes at both sites reading --pmu {pmu}")
}

fn span_work_floor_name(pmu: &str) -> String {
    format!(
        "floor: aya uprobes at both sites reading --pmu {pmu}, keeping the start's reading per \
         thread and adding the span to a total"
    )
}

const BPFTRACE_SPAN_NAME: &str = "bpftrace empty usdt probes at both sites";

/// ns per span of spanbench, unprobed, under empty bpftrace usdt probes, and under `topdown
/// stat --span` (without a key and keyed by an argument) beside its floor.
pub(super) fn bench_spans(topdown: &Path, floor: &Path) -> Result<()> {
    let source = cmd::workspace_root().join("tests/workloads/spanbench.c");
    let binary = topdown.with_file_name("spanbench");
    cmd::cc(&["-O2"], &source, &binary)?;
    let bench = binary.display().to_string();
    let td = topdown.display().to_string();
    // spanbench's one span kind, keyed by `key` (a `--span` suffix: `,key=arg0`).
    let span = |key: &str| format!("s={bench}:bench:start..bench:end{key}");
    let topdown_run = |pmu: &str, key: &str| {
        let mut argv = stat_argv(&td, &["--pmu", pmu, "--span", &span(key)]);
        argv.extend(strings(&["--", &bench, SPANS]));
        argv
    };
    // The same probes machine-wide beside spanbench, as the floors run, so the kernel's run
    // time of its uprobe programs can be read before and after spanbench's run.
    let topdown_beside =
        |pmu: &str, key: &str| stat_argv(&td, &["-a", "--pmu", pmu, "--span", &span(key)]);
    let mut configs = vec![
        Config::new("no probes", None, None),
        Config::new(BPFTRACE_SPAN_NAME, None, None),
    ];
    // Per configuration, the tracer whose programs the statistics rounds time (none for the
    // unprobed run and bpftrace).
    let mut timed: Vec<Option<Vec<String>>> = vec![None, None];
    let mut runs = vec![
        TracedRun::Alone(vec![bench.clone(), SPANS.to_owned()]),
        TracedRun::Alone(strings(&[
            "bpftrace",
            "-e",
            &format!("usdt:{bench}:bench:start {{}} usdt:{bench}:bench:end {{}}"),
            "-c",
            &format!("{bench} {SPANS}"),
        ])),
    ];
    for pmu in [SOFTWARE, SYNTHETIC] {
        // Each floor beside spanbench: its name and how it is told the start and end sites.
        for (name, start, end) in [
            (span_floor_name(pmu), "-U", "-U"),
            (span_work_floor_name(pmu), "--span-start", "--span-end"),
        ] {
            configs.push(Config::new(name, None, None));
            let argv = strings(&[
                &floor.display().to_string(),
                "--pmu",
                pmu,
                start,
                &format!("{bench}:bench:start"),
                end,
                &format!("{bench}:bench:end"),
            ]);
            timed.push(Some(argv.clone()));
            runs.push(TracedRun::Beside(argv));
        }
        for (what, key) in [("no key", ""), ("key=arg0", ",key=arg0")] {
            configs.push(
                Config::new(
                    format!("topdown --span ({what}) --pmu {pmu}"),
                    None,
                    Some(span_floor_name(pmu)),
                )
                .with_work_floor(span_work_floor_name(pmu)),
            );
            runs.push(TracedRun::Alone(topdown_run(pmu, key)));
            timed.push(Some(topdown_beside(pmu, key)));
        }
    }
    let mut load = MachineLoad::start();
    let workload = ProbeWorkload {
        argv: &[bench.clone(), SPANS.to_owned()],
        per_run: SPANS.parse()?,
        field: "ns_per_span",
        what: "spans",
        unit: "ns/span",
        rounds: SPAN_ROUNDS,
    };
    let cost = ProbeCost::measure(
        &configs,
        &runs,
        &timed,
        &workload,
        BPFTRACE_SPAN_NAME,
        &mut || load.sample(),
    )?;
    // Each topdown row beside each of its floors, both attached during one spanbench run.
    let pairs = side_by_side::pairs(&configs, |config| {
        [config.floor.as_deref(), config.work_floor.as_deref()]
            .into_iter()
            .flatten()
            .collect()
    });
    fn spans(_: &str) -> Result<f64> {
        Ok(SPANS.parse()?)
    }
    let workload = side_by_side::Workload {
        argv: vec![bench.clone(), SPANS.to_owned()],
        units: &spans,
        unit: "span",
        at: "these spans",
        // Uprobes (`BPF_PROG_TYPE_KPROBE`) only: topdown's `-a` also reads at every context
        // switch of the machine, which the floors do not.
        program_types: Some(&[BPF_PROG_TYPE_KPROBE]),
    };
    let side = side_by_side::measured_lines(
        &configs,
        &pairs,
        &|index| timed[index].clone(),
        &workload,
        "spans: ",
        ISSUE_23_BOUND,
    )?;
    let load = load.finish();
    let mut section = String::from("## Per-span cost (`cargo xtask bench`)\n\n");
    section += &machine_text();
    section += &format!(
        " Command: `{}`. One span is a pair of USDT probes (`bench:start` with an integer \
         argument, `bench:end`) around nothing, `tests/workloads/spanbench.c`, {SPANS} per run; \
         {SPAN_ROUNDS} alternating rounds, median; {} during the rounds. Each topdown row is beside its floor: `topdown-floor -U` attaches an aya \
         uprobe at each of the two sites that reads the same counters (topdown's counter plan \
         for that `--pmu`) and does nothing else; the same-work floor (`topdown-floor \
         --span-start --span-end`) also does what no span can go without: the start keeps its \
         reading in the thread's own storage (BPF task storage, as topdown's span stacks), \
         the end finds it and adds the difference and \
         one span to a total, atomically (no key, nesting or virtual counters). Issue 23's \
         bound: a span at most 1.2x its floor. Uprobes trap into the kernel, and traps are slow in this VM: compare the \
         ratios, not the absolute figures. `per round` is each round's own ratio (a row and \
         its floor a few seconds apart): median and range. Then {PROGRAM_ROUNDS} rounds with \
         the kernel's BPF statistics on time the tracers' uprobe programs over spanbench's \
         run (topdown machine-wide, `stat -a --span`, beside spanbench as the floor runs): \
         `BPF program ns per span` (median) is the probes' own cost without the traps, which \
         other load does not move.\n\n",
        command_text(),
        load_text(&load)
    );
    section += &cost.table(&configs, "span");
    section += &format!(
        "\nSide by side: each topdown row's tracer (`stat -a --span`) and each of its floors \
         attached together during one spanbench run ({} runs per pair, with the kernel's BPF \
         statistics on, which of the two attaches first alternating: uprobes at one site run \
         in that order), so both programs run at the same sites' hits under the same \
         conditions and their ratio is paired within each run. The figure is every program \
         the tracer holds at the sites (its uprobe programs: topdown's `-a` also reads at \
         every context switch, which the floors do not), their run time over the run divided \
         by its spans; the ratio is the \
         geometric mean of the two orders' ratios of medians, against issue 23's bound of \
         {ISSUE_23_BOUND}x (95% percentile bootstrap intervals, {BOOTSTRAP_RESAMPLES} \
         resamples of each order's runs). Program time leaves out the traps, which both pay \
         alike:\n\n{side}",
        side_by_side::ROUNDS
    );
    write_section("## Per-span cost", &section)
}

/// The machine's load over the rounds, for the section's text.
fn load_text(load: &LoadReport) -> String {
    format!(
        "1-minute load {:.1} to {:.1}{}",
        load.load_min,
        load.load_max,
        load.cpu0_steal
            .map(|steal| format!(", CPU 0 steal {:.1}%", 100.0 * steal))
            .unwrap_or_default()
    )
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL server of the benchmark's own in a temporary directory, stopped when dropped.
struct Server {
    dir: PathBuf,
    port: String,
    user: (u32, u32),
}

impl Server {
    fn start() -> Result<Self> {
        let name = std::ffi::CString::new("postgres")?;
        // SAFETY: a valid C string; the entry is read at once, on this thread.
        let entry = unsafe { libc::getpwnam(name.as_ptr()) };
        if entry.is_null() {
            bail!("no postgres user: install postgresql-15 (cargo xtask setup does)");
        }
        // SAFETY: non-null, as checked.
        let user = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
        let dir = std::env::temp_dir().join(format!("topdown-bench-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::chown(&dir, Some(user.0), Some(user.1))?;
        let server = Self {
            dir,
            port: "54329".to_owned(),
            user,
        };
        let data = server.dir.join("data");
        server.as_postgres(
            Command::new(format!("{PG_BIN}/initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-A", "trust", "-U", "postgres", "--locale=C"]),
        )?;
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)?;
        text += &format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nport = {}\n\
             shared_preload_libraries = 'pg_stat_statements'\ncompute_query_id = on\n",
            server.dir.display(),
            server.port
        );
        std::fs::write(&conf, text)?;
        server.as_postgres(
            Command::new(format!("{PG_BIN}/pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.join("server.log"))
                .args(["-w", "start"]),
        )?;
        Ok(server)
    }

    fn as_postgres(&self, command: &mut Command) -> Result<()> {
        let output = command
            .uid(self.user.0)
            .gid(self.user.1)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("{command:?}"))?;
        if !output.status.success() {
            bail!(
                "{command:?}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    fn pgbench(&self, args: &[&str]) -> Result<String> {
        let output = cmd::output(
            Command::new(format!("{PG_BIN}/pgbench"))
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port, "-U", "postgres"])
                .args(args)
                .arg("postgres"),
        )?;
        if !output.status.success() {
            bail!("pgbench: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(format!("{PG_BIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .uid(self.user.0)
            .gid(self.user.1)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// pgbench's select-only transactions per second (`-S`, the simple protocol and `-M
/// prepared`) with no tracing, with `topdown stat -a`, and with `topdown stat -a --postgres`.
pub(super) fn bench_postgres(topdown: &Path) -> Result<()> {
    let server = Server::start()?;
    server.pgbench(&["-i", "-s", "1", "-q"])?;
    let td = topdown.display().to_string();
    let postgres = format!("{PG_BIN}/postgres");
    let tracers: Vec<(String, Option<Vec<String>>)> = vec![
        ("no tracing".to_owned(), None),
        (
            format!("topdown stat -a --pmu {SYNTHETIC}"),
            Some(strings(&[&td, "stat", "-a", "--pmu", SYNTHETIC])),
        ),
        (
            format!("topdown stat -a --postgres --pmu {SYNTHETIC}"),
            Some(strings(&[
                &td,
                "stat",
                "-a",
                "--pmu",
                SYNTHETIC,
                "--postgres",
                &postgres,
            ])),
        ),
    ];
    let modes = ["simple", "prepared"];
    let mut samples = vec![vec![Vec::new(); tracers.len()]; modes.len()];
    let mut load = MachineLoad::start();
    for round in 0..PGBENCH_ROUNDS {
        for (mode_index, mode) in modes.iter().enumerate() {
            for (index, (name, tracer)) in tracers.iter().enumerate() {
                let child = tracer.as_ref().map(|argv| start_tracer(argv)).transpose()?;
                let output = server.pgbench(&[
                    "-S",
                    "-n",
                    "-M",
                    mode,
                    "-c",
                    PGBENCH_CLIENTS,
                    "-j",
                    PGBENCH_CLIENTS,
                    "-T",
                    PGBENCH_SECONDS,
                ]);
                if let Some(mut child) = child {
                    stop_tracer(&mut child);
                }
                let tps = tps(&output?)?;
                println!(
                    "postgres, round {}: -M {mode:<8} {name:<50} {tps:>10.1} tps",
                    round + 1
                );
                samples[mode_index][index].push(tps);
            }
        }
        load.sample();
    }
    drop(server);
    let load = load.finish();
    let mut section = String::from("## pgbench with `--postgres` (`cargo xtask bench`)\n\n");
    section += &machine_text();
    section += &format!(
        " Command: `{}`. A PostgreSQL 15 server of the benchmark's own (Debian's package, \
         pg_stat_statements loaded, compute_query_id on, a unix socket), pgbench scale 1, \
         select-only (`pgbench -S -n -c {PGBENCH_CLIENTS} -j {PGBENCH_CLIENTS} -T \
         {PGBENCH_SECONDS}`), each protocol {PGBENCH_ROUNDS} alternating rounds, median; \
         {}. pgbench and the server share the VM's CPUs with \
         topdown. `-a` alone reads the counters at every context switch; `--postgres` adds \
         the query spans' probes (two per query, and the per-query notes of the query id: \
         `pgstat_report_activity` and `pgstat_report_query_id`, a few traps per query).\n\n",
        command_text(),
        load_text(&load)
    );
    section += "| protocol | configuration | TPS | of untraced |\n|---|---|---:|---:|\n";
    for (mode_index, mode) in modes.iter().enumerate() {
        let medians: Vec<f64> = samples[mode_index]
            .iter_mut()
            .map(|values| median(values))
            .collect();
        for ((name, _), value) in tracers.iter().zip(&medians) {
            section += &format!(
                "| {mode} | {name} | {value:.0} | {:.2} |\n",
                value / medians[0]
            );
        }
    }
    write_section("## pgbench with `--postgres`", &section)
}

/// `tps = 1234.5 (without initial connection time)` in pgbench's output.
fn tps(output: &str) -> Result<f64> {
    output
        .lines()
        .find_map(|line| {
            line.strip_prefix("tps = ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no tps in pgbench's output: {output}"))
}
