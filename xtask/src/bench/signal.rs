//! `TOPDOWN_BENCH_ONLY=signal`: how long `topdown stat ... -- CMD` takes to end after SIGINT or
//! SIGTERM arrives while it counts, with a whole library probed. On the signal topdown stops
//! counting, hands the signal to the command, calibrates the probes' cost, writes its report,
//! detaches and exits with 128 + signal; the issue asks for all of that within 1 s.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    MachineLoad, Spread, command_text, probed_functions, section_start, strings, write_section,
};

/// Rounds (each runs every row with each signal once, in turn), and the bound.
const ROUNDS: usize = 5;
const BOUND_MS: f64 = 1000.0;
/// How long topdown counts before the signal.
const COUNT_FOR: Duration = Duration::from_millis(500);
/// A run that has not started counting in this long, or not ended this long after the signal,
/// is stopped and reported as failed.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long stderr's last lines are waited for once topdown has exited.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// The libraries probed whole, each as a private copy (never the system's file, which every
/// process on the machine using it would trap on).
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";
const SIGNALS: [(i32, &str); 2] = [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")];

struct Row {
    name: String,
    argv: Vec<String>,
    /// Probes something, so the calibration's "probe cost" line is expected.
    probes: bool,
}

/// What one run came to.
enum Outcome {
    /// Ended with 128 + signal: ms from the signal to the exit, and topdown's stderr.
    Ended { ms: f64, stderr: String },
    /// Stopped by the bench: why, and topdown's stderr so far.
    Failed { why: String, stderr: String },
}

/// Per row and signal: the times of the runs that ended, and what the others came to.
#[derive(Default)]
struct Measured {
    ms: Vec<f64>,
    calibrated: usize,
    failed: Vec<String>,
    functions: Option<u64>,
}

pub(super) fn bench(topdown: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("topdown-signal-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = bench_in(topdown, &dir);
    let removed =
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()));
    result.and(removed)
}

/// Copies `library` (its real file) into `dir` under its own name.
fn copy_library(library: &str, dir: &Path) -> Result<PathBuf> {
    let real = std::fs::canonicalize(library).with_context(|| format!("resolving {library}"))?;
    let name = Path::new(library)
        .file_name()
        .with_context(|| format!("{library} has no file name"))?;
    let copy = dir.join(name);
    std::fs::copy(&real, &copy)
        .with_context(|| format!("copying {} to {}", real.display(), copy.display()))?;
    Ok(copy)
}

fn bench_in(topdown: &Path, dir: &Path) -> Result<()> {
    let libc_copy = copy_library(LIBC, dir)?;
    let libstdcxx_copy = copy_library(LIBSTDCXX, dir)?;
    let td = topdown.display().to_string();
    let dir_text = dir.display().to_string();
    let libc_probe = format!("{}:*", libc_copy.display());
    let libstdcxx_probe = format!("{}:*", libstdcxx_copy.display());
    let command = [
        "env".to_owned(),
        format!("LD_LIBRARY_PATH={dir_text}"),
        "sleep".to_owned(),
        "30".to_owned(),
    ];
    let stat = |extra: &[&str]| {
        let mut argv = strings(&[&td, "stat"]);
        argv.extend(strings(extra));
        argv.push("--".to_owned());
        argv.extend(command.iter().cloned());
        argv
    };
    let rows = [
        Row {
            name: "floor: topdown stat -- env LD_LIBRARY_PATH=DIR sleep 30 (no probes)".to_owned(),
            argv: stat(&[]),
            probes: false,
        },
        Row {
            name: "topdown stat -u 'DIR/libc.so.6:*' -- env LD_LIBRARY_PATH=DIR sleep 30 \
                   (default model and compensation)"
                .to_owned(),
            argv: stat(&["-u", &libc_probe]),
            probes: true,
        },
        Row {
            name: "topdown stat --pmu synthetic:intel-icl -u 'DIR/libc.so.6:*' -- env \
                   LD_LIBRARY_PATH=DIR sleep 30"
                .to_owned(),
            argv: stat(&["--pmu", "synthetic:intel-icl", "-u", &libc_probe]),
            probes: true,
        },
        Row {
            name: "topdown stat -u 'DIR/libc.so.6:*' -u 'DIR/libstdc++.so.6:*' -- env \
                   LD_LIBRARY_PATH=DIR sleep 30"
                .to_owned(),
            argv: stat(&["-u", &libc_probe, "-u", &libstdcxx_probe]),
            probes: true,
        },
    ];

    let mut machine = MachineLoad::start();
    let mut measured: Vec<Vec<Measured>> = rows
        .iter()
        .map(|_| SIGNALS.iter().map(|_| Measured::default()).collect())
        .collect();
    for round in 0..ROUNDS {
        for (index, row) in rows.iter().enumerate() {
            for (which, &(signal, signal_name)) in SIGNALS.iter().enumerate() {
                let figures = &mut measured[index][which];
                let what = format!(
                    "signal, round {}: {signal_name:<7} {:<110}",
                    round + 1,
                    row.name
                );
                match run(row, signal, signal_name)? {
                    Outcome::Ended { ms, stderr } => {
                        println!("{what} {ms:>8.1} ms to exit");
                        figures.ms.push(ms);
                        if calibrated(&stderr) {
                            figures.calibrated += 1;
                        }
                        figures.functions = figures.functions.or(probed_functions(&stderr));
                    }
                    Outcome::Failed { why, stderr } => {
                        println!("{what} FAILED: {why}\n{stderr}");
                        figures.failed.push(why);
                    }
                }
            }
        }
        machine.sample();
    }
    let load = machine.finish();

    let mut section = section_start("Ending on a signal", &load);
    section += &format!(
        "Command: `{}`. How long `topdown stat ... -- CMD` takes to end after SIGINT or \
         SIGTERM arrives while it counts (the issue's bound: within 1 s in every phase, with \
         nothing left attached). Each run starts topdown (stdout to /dev/null), waits for its \
         `topdown: counting` line on stderr, lets it count for {} ms, sends the signal to \
         topdown alone, and polls for its exit every 1 ms: the figure is ms from the signal to \
         the exit, which covers stopping the count, handing the signal to the command, \
         calibrating the probes' cost (the default compensation), writing the report and \
         detaching. Every run must exit with 128 + signal (130, 143); a run that does not start \
         counting within {} s, or does not end within {} s of the signal, is stopped and \
         counted as failed. DIR is a private directory holding copies of the system's \
         `libc.so.6` and `libstdc++.so.6` (never the system's files, which every process \
         using them would trap on); the command runs with `LD_LIBRARY_PATH=DIR`. \
         {ROUNDS} rounds, each running every row with each signal in turn; median and range, \
         in ms. \"calibrated\" counts the runs whose stderr has the calibration's `topdown: \
         probe cost (...)` line, i.e. the calibration ran after the signal.\n\n",
        command_text(),
        COUNT_FOR.as_millis(),
        RUN_TIMEOUT.as_secs(),
        RUN_TIMEOUT.as_secs(),
    );
    section += "| configuration | signal | functions probed | signal to exit (ms) | range | \
                every run within 1 s | calibrated | failed runs |\n\
                |---|---|---:|---:|---:|---|---:|---:|\n";
    let mut verdicts = Vec::new();
    let mut failures = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        for (which, (_, signal_name)) in SIGNALS.iter().enumerate() {
            let figures = &measured[index][which];
            let spread = Spread::of(&figures.ms);
            let verdict = if figures.ms.is_empty() {
                "not measured"
            } else if spread.max <= BOUND_MS {
                "met"
            } else {
                "not met"
            };
            verdicts.push(format!(
                "{} ({signal_name}): {:.1} ms median, {:.1} ms slowest, {verdict}",
                row.name, spread.median, spread.max
            ));
            let calibrated = if row.probes {
                format!("{}/{}", figures.calibrated, figures.ms.len())
            } else {
                "-".to_owned()
            };
            section += &format!(
                "| {} | {signal_name} | {} | {:.1} | {:.1}..{:.1} | {verdict} | {calibrated} | {} |\n",
                row.name,
                figures
                    .functions
                    .map_or("-".to_owned(), |count| count.to_string()),
                spread.median,
                spread.min,
                spread.max,
                figures.failed.len(),
            );
            failures.extend(
                figures
                    .failed
                    .iter()
                    .map(|why| format!("{} ({signal_name}): {why}", row.name)),
            );
        }
    }
    for failure in &failures {
        section += &format!("\nFailed: {failure}.\n");
    }
    println!("{}", verdicts.join("\n"));
    write_section("## Ending on a signal", &section)?;
    if !failures.is_empty() {
        bail!(
            "signal: {} run(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// One run of `row`: start it, wait for it to count, count for `COUNT_FOR`, send `signal` and
/// time the exit. A wrong exit status is an error; a run that hangs is stopped and reported.
fn run(row: &Row, signal: i32, signal_name: &str) -> Result<Outcome> {
    let begun = Instant::now();
    let mut child = Command::new(&row.argv[0])
        .args(&row.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", row.argv[0]))?;
    let stderr = child.stderr.take().context("topdown's stderr")?;
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let mut text = Vec::new();
    loop {
        match lines.recv_timeout(RUN_TIMEOUT.saturating_sub(begun.elapsed())) {
            Ok(line) => {
                let counting = line.starts_with("topdown: counting");
                text.push(line);
                if counting {
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                stop(&mut child);
                drain(&lines, &mut text);
                return Ok(Outcome::Failed {
                    why: format!("did not start counting within {} s", RUN_TIMEOUT.as_secs()),
                    stderr: text.join("\n"),
                });
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.wait().context("waiting for topdown")?;
                bail!(
                    "{}: topdown ended ({status}) before it counted:\n{}",
                    row.name,
                    text.join("\n")
                );
            }
        }
    }
    std::thread::sleep(COUNT_FOR);
    if let Some(status) = child.try_wait().context("polling topdown")? {
        drain(&lines, &mut text);
        bail!(
            "{}: topdown ended ({status}) before the {signal_name} was sent:\n{}",
            row.name,
            text.join("\n")
        );
    }
    let pid = i32::try_from(child.id()).context("topdown's pid")?;
    let signalled = Instant::now();
    // SAFETY: kill(2) with a pid and a signal number; it touches no memory of ours.
    if unsafe { libc::kill(pid, signal) } != 0 {
        let err = std::io::Error::last_os_error();
        stop(&mut child);
        return Err(err).with_context(|| format!("sending {signal_name} to topdown ({pid})"));
    }
    let ended = loop {
        if let Some(status) = child.try_wait().context("polling topdown")? {
            break Some((status, signalled.elapsed()));
        }
        if signalled.elapsed() > RUN_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let Some((status, took)) = ended else {
        stop(&mut child);
        drain(&lines, &mut text);
        return Ok(Outcome::Failed {
            why: format!(
                "did not end within {} s of the {signal_name}",
                RUN_TIMEOUT.as_secs()
            ),
            stderr: text.join("\n"),
        });
    };
    drain(&lines, &mut text);
    let stderr = text.join("\n");
    let expected = 128 + signal;
    if status.code() != Some(expected) {
        bail!(
            "{}: after {signal_name}, topdown {}, not exit status {expected} (128 + {signal}):\n\
             {stderr}",
            row.name,
            describe(status)
        );
    }
    Ok(Outcome::Ended {
        ms: took.as_secs_f64() * 1e3,
        stderr,
    })
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended with {status}"),
    }
}

/// The stderr lines still to come, until the pipe closes or `DRAIN_TIMEOUT` (the command, which
/// shares the pipe, may outlive a stopped topdown).
fn drain(lines: &Receiver<String>, text: &mut Vec<String>) {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        text.push(line);
    }
}

/// Kills a hung topdown and everything it started (its children first, read before they are
/// handed to init), and reaps it.
fn stop(child: &mut Child) {
    for pid in descendants(child.id()) {
        // SAFETY: kill(2) with a pid and a signal number; it touches no memory of ours.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `pid`'s descendants, from /proc's children lists (its threads' too).
fn descendants(pid: u32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|pid| pid.parse::<u32>().ok())
            {
                if let Ok(signed) = i32::try_from(child) {
                    found.push(signed);
                }
                queue.push(child);
            }
        }
    }
    found
}

/// Whether the calibration's "probe cost (...)" line is on stderr.
fn calibrated(stderr: &str) -> bool {
    stderr
        .lines()
        .any(|line| line.starts_with("topdown: probe cost ("))
}
