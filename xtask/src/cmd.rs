//! Running commands with the pinned toolchain and clear failures.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Output},
};

use anyhow::{Context as _, Result, bail};

use crate::toolchain::HOST_TOOLCHAIN;

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `cargo` of the pinned host toolchain, run from the workspace root, without the outer
/// cargo's toolchain pins (RUSTUP_TOOLCHAIN, RUSTC...), which would override `rustup run`.
pub fn cargo() -> Command {
    cargo_of(HOST_TOOLCHAIN)
}

/// `cargo` of `toolchain`, as [`cargo`] does for the host one.
pub fn cargo_of(toolchain: &str) -> Command {
    let mut command = Command::new("rustup");
    command.args(["run", toolchain, "cargo"]);
    for key in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO",
        "RUSTDOC",
    ] {
        command.env_remove(key);
    }
    command.current_dir(workspace_root());
    command
}

/// `cc FLAGS -o BINARY SOURCE`: how the benchmarks and the demo build their C workloads.
pub fn cc(flags: &[&str], source: &Path, binary: &Path) -> Result<()> {
    run(Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(binary)
        .arg(source))
}

/// Runs a command with inherited stdio; a failure names the command.
pub fn run(command: &mut Command) -> Result<()> {
    let status = status(command)?;
    if !status.success() {
        bail!("{} failed ({status})", describe(command));
    }
    Ok(())
}

pub fn status(command: &mut Command) -> Result<ExitStatus> {
    command
        .status()
        .with_context(|| format!("cannot run {}", describe(command)))
}

/// Runs a command capturing its output (for probes like `--version`).
pub fn output(command: &mut Command) -> Result<Output> {
    command
        .output()
        .with_context(|| format!("cannot run {}", describe(command)))
}

pub fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
