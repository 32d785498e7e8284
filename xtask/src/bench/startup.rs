//! `TOPDOWN_BENCH_ONLY=startup`: how long a traced command waits before it runs, from
//! `topdown stat -u ... -- CMD` being started to CMD's `main`, with the default compensation.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    MachineLoad, Spread, command_text, probed_functions, section_start, strings, write_section,
};
use crate::cmd;

/// Rounds (each runs every row once, in turn), and the start-up issue 28 asks for.
const ROUNDS: usize = 5;
const BOUND_MS: f64 = 300.0;
/// Where Debian's libsqlite3-0 puts the library (`cargo xtask setup` installs it).
const SQLITE_LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";
const SQLITE: &str = "/usr/bin/sqlite3";
/// A run that has not ended in this long is stopped and reported.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

struct Row {
    name: String,
    argv: Vec<String>,
    /// Extra environment (the copied library's directory).
    env: Vec<(String, String)>,
    /// Judged against `BOUND_MS` (topdown with the default compensation).
    judged: bool,
}

/// CLOCK_MONOTONIC now, in ns: the clock `started` prints.
fn monotonic_ns() -> i128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)
}

/// One run: ms from starting `row`'s command to `started`'s `main`, the whole run's ms, and
/// what the tool printed on stderr.
fn run(row: &Row) -> Result<(f64, f64, String)> {
    let begun = Instant::now();
    let spawned_at = monotonic_ns();
    let mut child = Command::new(&row.argv[0])
        .args(&row.argv[1..])
        .envs(row.env.iter().map(|(key, value)| (key, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", row.argv[0]))?;
    let stderr = child.stderr.take().context("stderr")?;
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let stdout = child.stdout.take().context("stdout")?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(ns) = line.trim().strip_prefix("started_ns=") {
                let _ = sender.send(ns.parse::<i128>().ok());
            }
        }
    });
    let started = receiver.recv_timeout(RUN_TIMEOUT).ok().flatten();
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let whole = begun.elapsed().as_secs_f64() * 1e3;
    let errors = errors.join().unwrap_or_default();
    let Some(started) = started else {
        bail!("{}: the command never started: {errors}", row.name);
    };
    if !status.is_some_and(|status| status.success()) {
        bail!("{}: failed ({status:?}): {errors}", row.name);
    }
    Ok(((started - spawned_at) as f64 / 1e6, whole, errors))
}

pub(super) fn bench(topdown: &Path) -> Result<()> {
    let dir = topdown.with_file_name("startup-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = dir.join("started");
    let source = cmd::workspace_root().join("tests/workloads/started.c");
    cmd::cc(&["-O1"], &source, &started)?;
    let st = started.display().to_string();
    let td = topdown.display().to_string();
    let stat = |extra: &[&str], probe: &str, command: &[&str]| {
        let mut argv = strings(&[&td, "stat", "--format", "json", "-o", "/dev/null"]);
        argv.extend(strings(extra));
        argv.extend(strings(&["-u", probe, "--"]));
        argv.extend(strings(command));
        argv
    };
    let work = format!("{st}:work");
    let row = |name: &str, argv: Vec<String>, judged: bool| Row {
        name: name.to_owned(),
        argv,
        env: Vec::new(),
        judged,
    };
    let mut rows = vec![
        row("the command alone, untraced", vec![st.clone()], false),
        row(
            "topdown stat -u started:work -- started (default model and compensation)",
            stat(&[], &work, &[&st]),
            true,
        ),
        row(
            "topdown stat --pmu synthetic:intel-icl -u started:work -- started",
            stat(&["--pmu", "synthetic:intel-icl"], &work, &[&st]),
            true,
        ),
        row(
            "topdown stat --no-compensation -u started:work -- started",
            stat(&["--no-compensation"], &work, &[&st]),
            false,
        ),
        row(
            "topdown stat -I 60000 -u started:work -- started (calibrates before the command)",
            stat(&["-I", "60000"], &work, &[&st]),
            false,
        ),
    ];
    let mut not_measured = Vec::new();
    if Path::new(SQLITE_LIBRARY).exists() && Path::new(SQLITE).exists() {
        // A copy of its own: probing a system library whole would trap every process using it.
        let libs = dir.join("lib");
        std::fs::create_dir_all(&libs).with_context(|| format!("creating {}", libs.display()))?;
        let copy: PathBuf = libs.join("libsqlite3.so.0");
        std::fs::copy(SQLITE_LIBRARY, &copy)
            .with_context(|| format!("copying {SQLITE_LIBRARY}"))?;
        rows.push(Row {
            name: "topdown stat -u 'libsqlite3:*' -- started sqlite3 :memory: .quit".to_owned(),
            argv: stat(
                &[],
                &format!("{}:*", copy.display()),
                &[&st, SQLITE, ":memory:", ".quit"],
            ),
            env: vec![("LD_LIBRARY_PATH".to_owned(), libs.display().to_string())],
            judged: true,
        });
    } else {
        not_measured.push(format!(
            "`-u 'libsqlite3:*'`: not measured, {SQLITE} or {SQLITE_LIBRARY} missing \
             (`cargo xtask setup` installs them)"
        ));
    }
    rows.push(row(
        "bpftrace -e 'uprobe:started:work {}' -c started",
        strings(&["bpftrace", "-e", &format!("uprobe:{work} {{}}"), "-c", &st]),
        false,
    ));

    let mut machine = MachineLoad::start();
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut wholes: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut functions: Vec<Option<u64>> = vec![None; rows.len()];
    for round in 0..ROUNDS {
        for (index, row) in rows.iter().enumerate() {
            let (latency, whole, stderr) = run(row)?;
            println!(
                "startup, round {}: {:<80} {latency:>8.1} ms to the command, {whole:>8.1} ms in all",
                round + 1,
                row.name
            );
            latencies[index].push(latency);
            wholes[index].push(whole);
            functions[index] = functions[index].or(probed_functions(&stderr));
        }
        machine.sample();
    }
    let load = machine.finish();
    let mut section = section_start("Start-up", &load);
    section += &format!(
        "Command: `{}`. How long a traced command waits: from starting the tool to the \
         command's `main` (`tests/workloads/started.c` prints CLOCK_MONOTONIC there; with \
         arguments it then execs them, so `sqlite3` is timed from the same moment), and the \
         whole run, start to exit. {ROUNDS} rounds, each running every row in turn; median and \
         range, in ms. The default compensation calibrates the probes' cost after counting, \
         before the report (`probe_compensation.calibrated` in the JSON says when and how \
         long), so the command does not wait for it; `-I` reports during the run and \
         calibrates before the command, as every run did before. The library row probes a \
         copy of libsqlite3 (run with `LD_LIBRARY_PATH` set to its directory), never the \
         system's file, which every process using it would trap on.\n\n",
        command_text()
    );
    section += "| configuration | functions probed | to the command (ms) | range | whole run (ms) | under 300 ms |\n|---|---:|---:|---:|---:|---|\n";
    let mut verdicts = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        let latency = Spread::of(&latencies[index]);
        let whole = Spread::of(&wholes[index]);
        let judged = if row.judged {
            let verdict = if latency.max <= BOUND_MS {
                "met (every round)"
            } else if latency.median <= BOUND_MS {
                "met by the median, not in every round"
            } else {
                "not met"
            };
            verdicts.push(format!("{}: {verdict}", row.name));
            verdict.to_owned()
        } else {
            "-".to_owned()
        };
        section += &format!(
            "| {} | {} | {:.1} | {:.1}..{:.1} | {:.1} | {judged} |\n",
            row.name,
            functions[index].map_or("-".to_owned(), |count| count.to_string()),
            latency.median,
            latency.min,
            latency.max,
            whole.median,
        );
    }
    for line in not_measured {
        section += &format!("\n{line}\n");
    }
    println!("{}", verdicts.join("\n"));
    write_section("## Start-up", &section)
}
