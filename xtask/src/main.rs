//! Project tasks: `cargo xtask setup | run | test | repeat | bench | fuzz | soak`.
//!
//! xtask builds with whatever stable Rust the machine has; everything else runs through the
//! pinned toolchains it installs (see `toolchain.rs`).

mod bench;
mod cmd;
mod fuzz;
mod repeat;
mod setup;
mod soak;
mod toolchain;
mod usage;

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "topdown's project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned toolchains, LLVM 22, bpf-linker, the test packages, mount tracefs,
    /// then build topdown and install its man pages and shell completions (idempotent).
    Setup,
    /// Setup, build topdown (release) and run it: by default the demo (three functions of a
    /// bundled workload, each dominated by a different bottleneck, traced with `-u`).
    Run {
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Setup, then fmt check, clippy, and every test (integration tests as root).
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Setup, then run every integration test binary many times (optionally under load), to
    /// find tests that fail only sometimes; failures' output goes to target/repeat/.
    Repeat {
        /// Runs per test binary.
        #[arg(long, default_value_t = 20)]
        times: u32,
        /// Load beside the tests: a topdown build in a fresh target directory over and over,
        /// or every CPU spinning.
        #[arg(long, value_enum, default_value_t = repeat::Noise::None)]
        noise: repeat::Noise,
        /// Only this test binary (`stat`, `unprivileged`, `c_api`...); repeatable.
        #[arg(long = "test")]
        only: Vec<String>,
        /// Arguments for each test binary (a test name filter, `--exact`...).
        #[arg(last = true)]
        test_args: Vec<OsString>,
    },
    /// Setup, then the benchmarks; writes BENCHMARKS.md.
    Bench,
    /// Setup, then `topdown serve` under 10,000 short-lived processes and hundreds of
    /// cgroups; writes its memory and map occupancy to BENCHMARKS.md.
    Soak,
    /// Setup, then run every cargo-fuzz target (the event-spec and option parsers).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.task {
        Task::Setup => {
            setup::setup()?;
            // The usage reference is written by the binary itself (`topdown generate`).
            usage::install(&build_topdown(false)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Run { args } => {
            setup::setup()?;
            let binary = build_topdown(true)?;
            install_usage(&binary);
            let args = if args.is_empty() {
                demo_args(&binary)?
            } else {
                args
            };
            let status = cmd::status(std::process::Command::new(&binary).args(&args))?;
            Ok(ExitCode::from(
                status
                    .code()
                    .and_then(|code| u8::try_from(code).ok())
                    .unwrap_or(1),
            ))
        }
        Task::Test { args } => {
            if std::env::var_os("CI").is_some() && !cmd::is_root() {
                bail!("CI must run the tests as root: the integration tests load BPF programs");
            }
            setup::setup()?;
            cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))
                .context("formatting (run `cargo +1.98.0 fmt --all`)")?;
            // Default members: the eBPF crate only builds for the BPF target (via build.rs).
            cmd::run(cmd::cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
            clippy_ebpf()?;
            let binary = build_topdown(false)?;
            install_usage(&binary);
            cmd::run(
                cmd::cargo()
                    .args(["test"])
                    .args(&args)
                    .env("TOPDOWN_BIN", &binary),
            )?;
            // The parsers never panic: a short fuzzing run of each (`cargo xtask fuzz` for longer).
            fuzz::fuzz(15)?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Repeat {
            times,
            noise,
            only,
            test_args,
        } => {
            setup::setup()?;
            let clean = repeat::repeat(&repeat::Plan {
                times,
                noise,
                only,
                test_args,
            })?;
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Task::Bench => {
            setup::setup()?;
            bench::bench()?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Soak => {
            setup::setup()?;
            soak::soak()?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Fuzz { seconds } => {
            setup::setup()?;
            fuzz::fuzz(seconds)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Setup's last step where a task builds topdown anyway: its man pages and completions. Nothing
/// in the run or the tests needs them, so a failure (not root) is said and the task goes on.
fn install_usage(binary: &std::path::Path) {
    if let Err(err) = usage::install(binary) {
        println!("not installed: man pages and completions: {err:#}");
    }
}

/// Builds the demo workload and returns `stat -u ...` arguments that trace its three functions.
fn demo_args(topdown: &std::path::Path) -> Result<Vec<OsString>> {
    let demo = topdown.with_file_name("bottlenecks");
    let source = cmd::workspace_root().join("xtask/demo/bottlenecks.c");
    cmd::cc(&["-O2", "-g"], &source, &demo)
        .context("building the demo workload (needs a C compiler)")?;
    let demo = demo.display().to_string();
    let mut args: Vec<OsString> = vec!["stat".into(), "--by".into(), "function,process".into()];
    for function in [
        "pointer_chase",
        "unpredictable_branches",
        "dependent_arithmetic",
    ] {
        args.push("-u".into());
        args.push(format!("{demo}:{function}").into());
    }
    args.push("--".into());
    args.push(demo.into());
    Ok(args)
}

/// Builds the topdown binary with the pinned toolchain and returns its path.
pub fn build_topdown(release: bool) -> Result<PathBuf> {
    let mut build = cmd::cargo();
    build.args(["build", "--package", "topdown-user", "--bin", "topdown"]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cmd::workspace_root().join("target"));
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join("topdown"))
}

/// clippy on the eBPF crate, which the host's clippy leaves out (it only builds for the BPF
/// target): the same nightly, target and `bpf_target_arch` cfg as aya-build uses for the object.
fn clippy_ebpf() -> Result<()> {
    let arch = std::env::consts::ARCH;
    cmd::run(
        cmd::cargo_of(toolchain::EBPF_TOOLCHAIN)
            .args([
                "clippy",
                "-p",
                "topdown-ebpf",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ])
            .env("RUSTFLAGS", format!("--cfg bpf_target_arch=\"{arch}\""))
            // Its own directory: different flags would otherwise rebuild the host's artifacts.
            .env(
                "CARGO_TARGET_DIR",
                cmd::workspace_root().join("target/ebpf-clippy"),
            ),
    )
    .context("clippy on the eBPF crate (topdown-ebpf)")
}
