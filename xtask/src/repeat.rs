//! `cargo xtask repeat`: every integration test binary run many times, optionally under load,
//! to find tests that fail only sometimes. Each failure's output is kept for its root cause;
//! nothing is retried.
//!
//! The binaries are those `cargo test --no-run` builds for the integration tests of
//! `topdown-tests` (tests/tests/*.rs) and `topdown-region` (topdown-region/tests/*.rs), run
//! from copies in target/repeat/<start time>/bin (a build meanwhile changes nothing). Each run is the binary
//! alone, from its package's directory with `TOPDOWN_BIN` set, as `cargo test` runs it. Noise: `build` rebuilds topdown-user into a fresh target directory in a loop
//! (what other engineers' builds do to this machine), `cpu` keeps every CPU busy with spinning
//! threads.

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::ValueEnum;

use crate::cmd;

/// Packages whose integration tests are repeated.
const PACKAGES: [&str; 2] = ["topdown-tests", "topdown-region"];

/// Load running beside the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Noise {
    None,
    /// `cargo build -p topdown-user` into a fresh target directory, over and over.
    Build,
    /// One spinning thread per CPU.
    Cpu,
}

/// What to repeat and how.
pub struct Plan {
    pub times: u32,
    pub noise: Noise,
    /// Binary names to run (`stat`, `c_api`); empty: all.
    pub only: Vec<String>,
    /// Arguments for each test binary (a test name filter, `--exact`...).
    pub test_args: Vec<std::ffi::OsString>,
}

/// One integration test binary.
struct TestBinary {
    /// `package/target`, e.g. `topdown-tests/stat`.
    name: String,
    executable: PathBuf,
    /// The package directory: `cargo test` runs a test binary from there.
    directory: PathBuf,
}

/// The runs of one binary.
#[derive(Default)]
struct Outcome {
    runs: u32,
    failures: u32,
    /// Test name -> how many runs it failed in.
    failed_tests: BTreeMap<String, u32>,
    seconds: f64,
}

pub fn repeat(plan: &Plan) -> Result<bool> {
    // Each invocation has its own directory, so two can run side by side (one with noise).
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let directory = cmd::workspace_root().join(format!("target/repeat/{started}"));
    // Copies: a build during the runs (fixing what they found) must not change what they run.
    let copies = directory.join("bin");
    std::fs::create_dir_all(&copies).with_context(|| format!("creating {}", copies.display()))?;
    let topdown = copy_into(&crate::build_topdown(false)?, &copies, "topdown")?;
    let (mut binaries, libraries) = test_binaries()?;
    for binary in &mut binaries {
        binary.executable = copy_into(&binary.executable, &copies, &binary.name.replace('/', "-"))?;
    }
    // The C API tests link the static library cargo built beside the test binaries.
    for library in &libraries {
        if let Some(name) = library.file_name() {
            copy_into(library, &copies, &name.to_string_lossy())?;
        }
    }
    let selected: Vec<&TestBinary> = binaries
        .iter()
        .filter(|binary| {
            plan.only.is_empty()
                || plan
                    .only
                    .iter()
                    .any(|name| binary.name == *name || binary.name.ends_with(&format!("/{name}")))
        })
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = binaries.iter().map(|binary| binary.name.as_str()).collect();
        bail!(
            "no test binary named {}: choose from {}",
            plan.only.join(", "),
            names.join(", ")
        );
    }
    let logs = directory;
    println!("repeat: binaries and failure logs in {}", logs.display());
    let _noise = NoiseGuard::start(plan.noise, started)?;
    let mut outcomes = Vec::new();
    for binary in selected {
        let mut outcome = Outcome::default();
        for run in 1..=plan.times {
            let started = Instant::now();
            let output = Command::new(&binary.executable)
                .args(&plan.test_args)
                .current_dir(&binary.directory)
                .env("TOPDOWN_BIN", &topdown)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("running {}", binary.executable.display()))?;
            outcome.seconds += started.elapsed().as_secs_f64();
            outcome.runs += 1;
            let stdout = String::from_utf8_lossy(&output.stdout);
            if output.status.success() {
                println!("repeat: {} run {run}/{}: ok", binary.name, plan.times);
                continue;
            }
            outcome.failures += 1;
            let failed = failed_tests(&stdout);
            for test in &failed {
                *outcome.failed_tests.entry(test.clone()).or_default() += 1;
            }
            let log = logs.join(format!("{}.{run}.log", binary.name.replace('/', "-")));
            let mut file = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            file.write_all(&output.stdout)
                .and_then(|()| file.write_all(b"\n----- stderr -----\n"))
                .and_then(|()| file.write_all(&output.stderr))
                .with_context(|| format!("writing {}", log.display()))?;
            println!(
                "repeat: {} run {run}/{}: FAILED ({}): {} [{}]",
                binary.name,
                plan.times,
                output.status,
                if failed.is_empty() {
                    "no test named".to_owned()
                } else {
                    failed.join(", ")
                },
                log.display()
            );
        }
        outcomes.push((binary.name.clone(), outcome));
    }
    println!(
        "\nrepeat: {} run(s) per binary, noise {:?}",
        plan.times, plan.noise
    );
    println!(
        "{:<34} {:>5} {:>8} {:>9}  failed tests",
        "BINARY", "RUNS", "FAILURES", "SECONDS"
    );
    let mut clean = true;
    for (name, outcome) in &outcomes {
        clean &= outcome.failures == 0;
        let tests: Vec<String> = outcome
            .failed_tests
            .iter()
            .map(|(test, count)| format!("{test} x{count}"))
            .collect();
        println!(
            "{name:<34} {:>5} {:>8} {:>9.1}  {}",
            outcome.runs,
            outcome.failures,
            outcome.seconds,
            tests.join(", ")
        );
    }
    Ok(clean)
}

fn copy_into(file: &Path, directory: &Path, name: &str) -> Result<PathBuf> {
    let copy = directory.join(name);
    std::fs::copy(file, &copy)
        .with_context(|| format!("copying {} to {}", file.display(), copy.display()))?;
    Ok(copy)
}

/// The names libtest prints as `test NAME ... FAILED`.
fn failed_tests(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| {
            line.strip_prefix("test ")?
                .strip_suffix(" ... FAILED")
                .map(str::to_owned)
        })
        .collect()
}

/// Builds the integration tests and lists their binaries from cargo's JSON messages, and the
/// C libraries (static and shared) built with them, which tests find beside themselves.
fn test_binaries() -> Result<(Vec<TestBinary>, Vec<PathBuf>)> {
    let mut build = cmd::cargo();
    build.args(["test", "--no-run", "--message-format=json"]);
    for package in PACKAGES {
        build.args(["--package", package]);
    }
    build.args(["--tests"]).stderr(Stdio::inherit());
    let output = cmd::output(&mut build)?;
    if !output.status.success() {
        bail!("{} failed ({})", cmd::describe(&build), output.status);
    }
    let mut binaries = Vec::new();
    let mut libraries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let target = &message["target"];
        let c_library = target["kind"].as_array().is_some_and(|kinds| {
            kinds
                .iter()
                .any(|kind| kind == "staticlib" || kind == "cdylib")
        });
        if c_library {
            libraries.extend(
                message["filenames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|file| file.as_str())
                    .filter(|file| file.ends_with(".a") || file.ends_with(".so"))
                    .map(PathBuf::from),
            );
        }
        let is_integration = target["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|kind| kind == "test"));
        let (Some(executable), Some(manifest), Some(name)) = (
            message["executable"].as_str(),
            message["manifest_path"].as_str(),
            target["name"].as_str(),
        ) else {
            continue;
        };
        if !is_integration {
            continue;
        }
        let directory = Path::new(manifest)
            .parent()
            .map(Path::to_path_buf)
            .context("a manifest path without a directory")?;
        let package = directory
            .file_name()
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        binaries.push(TestBinary {
            name: format!("{package}/{name}"),
            executable: PathBuf::from(executable),
            directory,
        });
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    binaries.dedup_by(|a, b| a.name == b.name);
    if binaries.is_empty() {
        bail!("cargo test --no-run listed no integration test binaries");
    }
    libraries.sort();
    libraries.dedup();
    Ok((binaries, libraries))
}

/// The load beside the tests, stopped when dropped.
struct NoiseGuard {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    build: Option<Child>,
    /// The build loop's target directory, removed when it stops.
    target: Option<PathBuf>,
}

impl NoiseGuard {
    fn start(noise: Noise, started: u64) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut guard = Self {
            stop: stop.clone(),
            threads: Vec::new(),
            build: None,
            target: None,
        };
        match noise {
            Noise::None => {}
            Noise::Cpu => {
                let cpus = std::thread::available_parallelism().map_or(1, usize::from);
                for _ in 0..cpus {
                    let stop = stop.clone();
                    guard.threads.push(std::thread::spawn(move || {
                        let mut x = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..100_000 {
                                x = std::hint::black_box(x.wrapping_mul(6364136223846793005) + 1);
                            }
                        }
                    }));
                }
            }
            Noise::Build => {
                let target = cmd::workspace_root().join(format!("target/repeat-noise-{started}"));
                let cargo_command = cmd::cargo();
                let cargo = cmd::describe(&cargo_command);
                let script = format!(
                    "while :; do rm -rf '{target}'; {cargo} build --quiet --package topdown-user \
                     --target-dir '{target}' >/dev/null 2>&1; done",
                    target = target.display()
                );
                // A shell loop in its own process group, so the whole build stops with it; the
                // environment cmd::cargo() clears is cleared for it too.
                let mut shell = Command::new("sh");
                for (key, value) in cargo_command.get_envs() {
                    match value {
                        Some(value) => shell.env(key, value),
                        None => shell.env_remove(key),
                    };
                }
                let child = shell
                    .args(["-c", &script])
                    .current_dir(cmd::workspace_root())
                    .process_group(0)
                    .stdin(Stdio::null())
                    .spawn()
                    .context("starting the build noise")?;
                println!("repeat: build noise: {script}");
                guard.build = Some(child);
                guard.target = Some(target);
            }
        }
        Ok(guard)
    }
}

impl Drop for NoiseGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Some(mut child) = self.build.take() {
            if let Ok(group) = i32::try_from(child.id()) {
                // SAFETY: signals our own process group (the noise loop and its builds).
                unsafe { libc::kill(-group, libc::SIGTERM) };
            }
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Some(target) = self.target.take() {
            let _ = std::fs::remove_dir_all(target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_test_names_come_from_libtest_lines() {
        let stdout = "running 3 tests\ntest a ... ok\ntest b::c ... FAILED\ntest d ... FAILED\n\
                      test e ... ignored\n";
        assert_eq!(failed_tests(stdout), ["b::c", "d"]);
    }
}
