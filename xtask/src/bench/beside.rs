//! What an untraced process pays while topdown probes a library it also uses (issue 21): the
//! per-call CPU time of `strlen`/`memchr` in `tests/workloads/safety/beside.c` (a process of
//! its own, never traced) alone, beside `stat -u ... -- CMD` tracing another process of the
//! same binary (probes only in the traced processes), and beside `stat -a -u ...` (probes in
//! every process that maps the library: what `-- CMD` did before).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use super::{MachineLoad, command_text, machine_text, write_section};
use crate::cmd;

/// Seconds each configuration runs.
const SECONDS: u64 = 6;
/// Rounds of the three configurations, in turn.
const ROUNDS: usize = 3;

struct Beside {
    child: Child,
    stop: PathBuf,
    log: PathBuf,
}

impl Beside {
    fn start(binary: &Path, lib: &Path, dir: &Path, name: &str) -> Result<Self> {
        let stop = dir.join(format!("{name}.stop"));
        let log = dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&stop);
        let _ = std::fs::remove_file(&log);
        let child = Command::new(binary)
            .arg(&stop)
            .arg(&log)
            .env("LD_LIBRARY_PATH", lib)
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self { child, stop, log })
    }

    /// Stops it; the mean CPU time per call over its rounds (ns).
    fn finish(mut self) -> Result<f64> {
        std::fs::write(&self.stop, b"")?;
        let _ = self.child.wait();
        let rounds: Vec<f64> = std::fs::read_to_string(&self.log)?
            .lines()
            .filter_map(|line| line.parse().ok())
            .collect();
        if rounds.is_empty() {
            bail!("{}: no rounds", self.log.display());
        }
        Ok(rounds.iter().sum::<f64>() / rounds.len() as f64)
    }
}

pub(super) fn bench_beside(topdown: &Path) -> Result<()> {
    let dir = topdown.with_file_name("besidebench");
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6")
        .context("finding the system libc to copy")?;
    let copy = lib.join("libc.so.6");
    std::fs::copy(&libc, &copy).context("copying libc")?;
    let binary = dir.join("beside");
    let source = cmd::workspace_root().join("tests/workloads/safety/beside.c");
    cmd::cc(&["-O2"], &source, &binary)?;
    // strlen and memchr are IFUNCs: probe every implementation the resolver may pick.
    let specs: Vec<String> = ["__strlen_*", "__memchr_*"]
        .iter()
        .flat_map(|glob| ["-u".to_owned(), format!("{}:{glob}", copy.display())])
        .collect();
    let base = [
        "stat",
        "--pmu",
        "synthetic:intel-icl",
        "--no-compensation",
        "--format",
        "json",
        "-o",
        "/dev/null",
    ];
    let seconds = SECONDS.to_string();
    let mut load = MachineLoad::start();
    let (mut alone, mut scoped, mut wide) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let beside = Beside::start(&binary, &lib, &dir, "alone")?;
        std::thread::sleep(Duration::from_secs(SECONDS));
        alone.push(beside.finish()?);

        // The traced process: the same binary, its stop file written after SECONDS.
        let traced_stop = dir.join("traced.stop");
        let _ = std::fs::remove_file(&traced_stop);
        let beside = Beside::start(&binary, &lib, &dir, "scoped")?;
        let mut tracer = Command::new(topdown)
            .args(base)
            .args(&specs)
            .arg("--")
            .arg("env")
            .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
            .arg(&binary)
            .arg(&traced_stop)
            .arg(dir.join("traced.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_secs(SECONDS));
        std::fs::write(&traced_stop, b"")?;
        let _ = tracer.wait();
        scoped.push(beside.finish()?);

        let beside = Beside::start(&binary, &lib, &dir, "wide")?;
        let status = Command::new(topdown)
            .args(base)
            .args(&specs)
            .args(["-a", "-d", &seconds])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        wide.push(beside.finish()?);
        if !status.success() {
            bail!("topdown -a -u ... exited with {status}");
        }
        load.sample();
        println!(
            "beside, round {}: alone {:.1} ns, beside -- CMD {:.1} ns, beside -a {:.1} ns",
            round + 1,
            alone[round],
            scoped[round],
            wide[round]
        );
    }
    let load = load.finish();
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len() as f64;
    let (alone, scoped, wide) = (mean(&alone), mean(&scoped), mean(&wide));
    let mut section =
        String::from("## Untraced process beside a traced one (`cargo xtask bench`)\n\n");
    section += &machine_text();
    section += &format!(
        " Shared machine: 1-minute load average {:.2} to {:.2} over the run. Command: `{}`.\n\n\
         An untraced process (`tests/workloads/safety/beside.c`, never traced) calls `strlen` \
         and `memchr` of a private libc copy in rounds and reports its own CPU time per call; \
         topdown probes every implementation of both (`-u COPY:__strlen_*`, `__memchr_*`) for \
         {SECONDS} s, {ROUNDS} rounds of the three configurations in turn, mean over the \
         rounds' per-call figures:\n\n\
         | configuration | untraced process, ns per call | ratio to alone |\n\
         |---|---|---|\n\
         | alone (no topdown) | {alone:.1} | 1.00 |\n\
         | beside `stat -u ... -- CMD` tracing another process of the same binary | {scoped:.1} | {:.2} |\n\
         | beside `stat -a -u ...` (machine-wide, what `-- CMD` attached before issue 21) | {wide:.1} | {:.0} |\n\n\
         With `-- CMD` the probes are links of the traced processes only (`crate::session::follow`): the \
         process beside has no breakpoint. With `-a` every process that maps the copy traps at \
         each call; the mean includes the rounds before topdown attached.\n",
        load.load_min,
        load.load_max,
        command_text(),
        scoped / alone,
        wide / alone,
    );
    write_section("## Untraced process beside a traced one", &section)
}
