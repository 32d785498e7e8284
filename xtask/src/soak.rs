//! `cargo xtask soak`: `topdown serve` under churn, to show that its memory and map occupancy
//! stay flat: 10,000 short-lived processes (two threads each) spread over hundreds of cgroups
//! that are created and removed as it goes. Samples the exporter's RSS, series and BPF map
//! entries, and writes the figures to BENCHMARKS.md. Not part of CI's run (it takes minutes).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

const PROCESSES: u32 = 10_000;
/// Processes per workload run (one parent forking the rest); each run gets a cgroup of its own.
const PER_RUN: u32 = 50;
/// Cgroups are created, used and removed in this many waves.
const WAVES: u32 = 4;
/// Cgroups alive at once (one per run of a wave); PROCESSES / PER_RUN cgroups in all.
const CGROUPS: u32 = PROCESSES / PER_RUN / WAVES;
const PORT: u16 = 19_943;
/// Pause after each workload run.
const PACE: Duration = Duration::from_millis(400);

/// The cgroup v2 mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
fn cgroup2_mount() -> Result<PathBuf> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    mounts
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, path, kind) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(path))
        })
        .context("no cgroup v2 mount: soak needs one for its cgroups")
}

/// Removes an emptied cgroup; exited tasks leave it asynchronously, so retry for a while.
fn remove_cgroup(cgroup: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::remove_dir(cgroup) {
            Ok(()) => return Ok(()),
            Err(err)
                if Instant::now() < deadline && err.raw_os_error() == Some(16 /* EBUSY */)
                    || err.kind() == std::io::ErrorKind::DirectoryNotEmpty =>
            {
                std::thread::sleep(Duration::from_millis(50));
                if Instant::now() >= deadline {
                    return Err(err).with_context(|| format!("removing {}", cgroup.display()));
                }
            }
            Err(err) => return Err(err).with_context(|| format!("removing {}", cgroup.display())),
        }
    }
}

struct Sample {
    at_s: f64,
    processes: u32,
    rss_kib: u64,
    series: f64,
    tasks: f64,
    cgroups: f64,
}

fn metrics() -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", PORT)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

fn value(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("VmRSS:")?
                    .trim()
                    .trim_end_matches(" kB")
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

fn sample(serve: &Child, started: Instant, processes: u32) -> Option<Sample> {
    let text = metrics()?;
    Some(Sample {
        at_s: started.elapsed().as_secs_f64(),
        processes,
        rss_kib: rss_kib(serve.id()),
        series: value(&text, "topdown_series "),
        tasks: value(&text, r#"topdown_bpf_map_entries{map="tasks"}"#),
        cgroups: value(&text, r#"topdown_bpf_map_entries{map="cgroups"}"#),
    })
}

fn workload() -> Result<PathBuf> {
    cmd::run(cmd::cargo().args([
        "build",
        "--package",
        "topdown-tests",
        "--bin",
        "td-workload",
    ]))?;
    Ok(cmd::workspace_root().join("target/debug/td-workload"))
}

pub fn soak() -> Result<()> {
    if !cmd::is_root() {
        bail!("cargo xtask soak loads BPF and creates cgroups: run it as root");
    }
    let topdown = crate::build_topdown(true)?;
    let workload = workload()?;
    let root = cgroup2_mount()?.join("topdown-soak");
    let root = root.as_path();
    let _ = std::fs::create_dir(root);
    let mut serve = Command::new(&topdown)
        .args([
            "serve",
            "--pmu",
            "synthetic:intel-icl",
            "--by",
            "cgroup,process",
        ])
        .args(["--refresh-ms", "1000", "--series-ttl", "5"])
        .args(["--listen", &format!("127.0.0.1:{PORT}")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting topdown serve")?;
    let started = Instant::now();
    while metrics().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = serve.kill();
            bail!("topdown serve did not start serving");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut samples = vec![];
    let result = churn(&workload, root, &serve, started, &mut samples);
    // Let the TTL expire the churned series, then take the final sample.
    std::thread::sleep(Duration::from_secs(8));
    if let Some(last) = sample(&serve, started, PROCESSES) {
        samples.push(last);
    }
    // SAFETY: signalling our own child.
    unsafe { crate::bench::libc_kill(serve.id() as i32, 15) };
    let _ = serve.wait();
    let _ = std::fs::remove_dir(root);
    result?;
    write_results(&samples)
}

fn churn(
    workload: &Path,
    root: &Path,
    serve: &Child,
    started: Instant,
    samples: &mut Vec<Sample>,
) -> Result<()> {
    let runs = PROCESSES / PER_RUN;
    let runs_per_wave = runs / WAVES;
    let mut processes = 0;
    for wave in 0..WAVES {
        let cgroups: Vec<PathBuf> = (0..CGROUPS)
            .map(|index| root.join(format!("w{wave}-cg{index}")))
            .collect();
        for cgroup in &cgroups {
            std::fs::create_dir_all(cgroup)
                .with_context(|| format!("creating {}", cgroup.display()))?;
        }
        for run in 0..runs_per_wave {
            let cgroup = &cgroups[(run % CGROUPS) as usize];
            // The shell moves itself into the cgroup, then becomes the workload: 1 parent and
            // PER_RUN - 1 forked children, two threads each, a few syscalls per thread.
            let script = format!(
                "echo $$ > {}/cgroup.procs && exec {} --children {} getppid=3 getpgid=2 >/dev/null",
                cgroup.display(),
                workload.display(),
                PER_RUN - 1
            );
            cmd::run(Command::new("sh").args(["-c", &script]))?;
            processes += PER_RUN;
            // Paced so the exporter refreshes (every second) many times during the churn.
            std::thread::sleep(PACE);
            if let Some(point) = sample(serve, started, processes) {
                println!(
                    "{:6.1} s  {:5} processes  RSS {:6} KiB  series {:5}  task map {:5}  cgroup map {:4}",
                    point.at_s,
                    point.processes,
                    point.rss_kib,
                    point.series,
                    point.tasks,
                    point.cgroups
                );
                samples.push(point);
            }
        }
        for cgroup in &cgroups {
            remove_cgroup(cgroup)?;
        }
    }
    Ok(())
}

fn write_results(samples: &[Sample]) -> Result<()> {
    let Some(first) = samples.first() else {
        bail!("no samples taken");
    };
    let last = samples.last().unwrap_or(first);
    // A figure's row: its first sample, its largest and its last.
    let row = |label: &str, pick: fn(&Sample) -> f64| {
        let largest = samples.iter().map(pick).fold(f64::MIN, f64::max);
        format!(
            "| {label} | {} | {largest} | {} |\n",
            pick(first),
            pick(last)
        )
    };
    let mut section = String::from("## Soak: `topdown serve` under churn (`cargo xtask soak`)\n\n");
    section += &crate::bench::machine_text();
    section += "\n\n";
    section += &format!(
        "Command: `cargo xtask soak`: {PROCESSES} short-lived processes of two threads each in \
         {} cgroups, created, used and removed in {WAVES} waves of {CGROUPS}, under `topdown \
         serve --by cgroup,process --refresh-ms 1000 --series-ttl 5`; {} samples over {:.0} s.\n\n",
        PROCESSES / PER_RUN,
        samples.len(),
        last.at_s
    );
    section += "| | first sample | maximum | after the churn |\n|---|---:|---:|---:|\n";
    section += &row("RSS (KiB)", |s| s.rss_kib as f64);
    section += &row("series", |s| s.series);
    section += &row("task map entries", |s| s.tasks);
    section += &row("cgroup map entries", |s| s.cgroups);
    let path = cmd::workspace_root().join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".to_owned());
    let updated = crate::bench::replace_section(&existing, "## Soak", &section);
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))?;
    println!("\n{section}\nwritten to {}", path.display());
    Ok(())
}
