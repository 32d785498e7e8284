//! `cargo xtask setup`: installs what a fresh machine lacks, idempotently, one line per step.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{describe, is_root, output, run},
    toolchain::{
        BPF_LINKER_VERSION, EBPF_TOOLCHAIN, GO_PACKAGES, HOST_TOOLCHAIN, LLVM_PACKAGES,
        LLVM_PREFIX, REAL_PROGRAM_PACKAGES, SAFETY_PACKAGES, TEST_PACKAGES, USAGE_PACKAGES,
        USDT_PACKAGES,
    },
};

pub fn setup() -> Result<()> {
    toolchains()?;
    debian_packages(&LLVM_PACKAGES, "LLVM 22 for bpf-linker")?;
    debian_packages(
        &TEST_PACKAGES,
        "a Prometheus server and promtool for the exporter's tests, tmux for topdown top's",
    )?;
    debian_packages(
        &REAL_PROGRAM_PACKAGES,
        "bpftrace's entry counts against `-u 'libsqlite3:*'` on the sqlite3 CLI (function-probe tests)",
    )?;
    debian_packages(
        &GO_PACKAGES,
        "the Go toolchain: it builds the Go function-probe tests' programs, and `go tool pprof` reads --format pprof output in the export tests",
    )?;
    debian_packages(
        &SAFETY_PACKAGES,
        "libc's debug symbols, libpython, g++ and zlib for the probe-safety harness",
    )?;
    debian_packages(
        &USDT_PACKAGES,
        "the USDT and --postgres tests (sys/sdt.h, python3.11, a PostgreSQL 15 server with pg_stat_statements, psql, pgbench)",
    )?;
    debian_packages(
        &USAGE_PACKAGES,
        "man and bash-completion to read topdown's man pages and completions, zsh and fish to test theirs",
    )?;
    bpf_linker()?;
    tracefs()?;
    Ok(())
}

fn toolchains() -> Result<()> {
    let listed = output(Command::new("rustup").args(["toolchain", "list"]))?;
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    for (toolchain, components) in [
        (HOST_TOOLCHAIN, &["clippy", "rustfmt"][..]),
        // clippy: `cargo xtask test` lints the eBPF crate with the nightly that builds it.
        (EBPF_TOOLCHAIN, &["rust-src", "clippy"][..]),
    ] {
        if has_toolchain(&listed, toolchain) && has_components(toolchain, components)? {
            println!(
                "ok: rust toolchain {toolchain} with {}",
                components.join(", ")
            );
            continue;
        }
        println!(
            "installing: rust toolchain {toolchain} with {}",
            components.join(", ")
        );
        let mut install = Command::new("rustup");
        install.args(["toolchain", "install", toolchain, "--profile", "minimal"]);
        for component in components {
            install.args(["--component", component]);
        }
        run(&mut install).context(
            "installing a pinned Rust toolchain (the machine must reach the Rust release servers)",
        )?;
    }
    Ok(())
}

/// `rustup toolchain list` prints `1.98.0-x86_64-unknown-linux-gnu (active)` etc.
pub fn has_toolchain(listed: &str, toolchain: &str) -> bool {
    listed.lines().any(|line| {
        let name = line.split_whitespace().next().unwrap_or("");
        name == toolchain
            || name
                .strip_prefix(toolchain)
                .is_some_and(|rest| rest.starts_with('-'))
    })
}

fn has_components(toolchain: &str, components: &[&str]) -> Result<bool> {
    let listed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        toolchain,
    ]))?;
    if !listed.status.success() {
        return Ok(false);
    }
    let listed = String::from_utf8_lossy(&listed.stdout);
    Ok(components.iter().all(|component| {
        listed
            .lines()
            .any(|line| line == *component || line.starts_with(&format!("{component}-")))
    }))
}

fn debian_packages(packages: &[&str], why: &str) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|package| !dpkg_installed(package))
        .collect();
    if missing.is_empty() {
        println!("ok: Debian packages {} ({why})", packages.join(" "));
        return Ok(());
    }
    if !is_root() {
        bail!(
            "Debian packages {} are missing and installing them needs root: run as root or `apt-get install -y {}`",
            missing.join(" "),
            missing.join(" ")
        );
    }
    println!(
        "installing: Debian packages {} for {why} (apt-get update first)",
        missing.join(" ")
    );
    run(Command::new("apt-get").args(["update", "-q"])).context("apt-get update")?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .with_context(|| format!("installing {why}"))?;
    Ok(())
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn bpf_linker() -> Result<()> {
    let version = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success());
    if version.as_ref().is_some_and(|out| {
        is_linker_version(&String::from_utf8_lossy(&out.stdout), BPF_LINKER_VERSION)
    }) {
        println!("ok: bpf-linker {BPF_LINKER_VERSION}");
        return Ok(());
    }
    println!("installing: bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    let mut install = crate::cmd::cargo();
    install
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            "llvm-22",
            "--force",
        ])
        // Without LLVM_PREFIX the link fails with "unable to find library -lLLVM".
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX);
    run(&mut install)
        .with_context(|| format!("{} (needs crates.io and LLVM 22)", describe(&install)))
}

/// `bpf-linker --version` prints `bpf-linker 0.13.0`.
pub fn is_linker_version(printed: &str, wanted: &str) -> bool {
    printed.split_whitespace().nth(1) == Some(wanted)
}

fn tracefs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if has_tracefs(&mounts) {
        println!("ok: tracefs mounted");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "tracefs is not mounted and mounting it needs root: `mount -t tracefs nodev /sys/kernel/tracing`"
        );
    }
    println!("mounting: tracefs at /sys/kernel/tracing");
    run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
        .context("mounting tracefs")
}

pub fn has_tracefs(mounts: &str) -> bool {
    mounts
        .lines()
        .any(|line| line.split_whitespace().nth(2) == Some("tracefs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_installed_toolchains() {
        let listed = "stable-x86_64-unknown-linux-gnu (default)\n1.98.0-x86_64-unknown-linux-gnu (active)\nnightly-2026-06-20-x86_64-unknown-linux-gnu\n";
        assert!(has_toolchain(listed, "1.98.0"));
        assert!(has_toolchain(listed, "nightly-2026-06-20"));
        assert!(!has_toolchain(listed, "1.98.1"));
        assert!(!has_toolchain(
            "nightly-x86_64-unknown-linux-gnu\n",
            "nightly-2026-06-20"
        ));
    }

    #[test]
    fn recognises_linker_version_and_tracefs() {
        assert!(is_linker_version("bpf-linker 0.13.0\n", "0.13.0"));
        assert!(!is_linker_version("bpf-linker 0.12.1\n", "0.13.0"));
        assert!(has_tracefs(
            "nodev /sys/kernel/tracing tracefs rw,relatime 0 0\n"
        ));
        assert!(!has_tracefs("sysfs /sys sysfs rw 0 0\n"));
    }
}
