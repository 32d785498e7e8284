//! `cargo xtask fuzz`: runs every cargo-fuzz target of `fuzz/` for a while; any panic or
//! sanitizer report fails the task. `cargo xtask test` runs it briefly.

use anyhow::{Context as _, Result};

use crate::{
    cmd::{cargo, cargo_of, output, run, workspace_root},
    toolchain::{CARGO_FUZZ_VERSION, EBPF_TOOLCHAIN},
};

/// The targets of `fuzz/Cargo.toml`, one per parser.
pub const TARGETS: [&str; 4] = ["perf_spec", "libpfm_spec", "format_spec", "synthetic_spec"];

/// Installs cargo-fuzz if missing (idempotent, says what it does).
pub fn ensure_cargo_fuzz() -> Result<()> {
    let installed = output(cargo().args(["fuzz", "--version"]))
        .map(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains(CARGO_FUZZ_VERSION)
        })
        .unwrap_or(false);
    if installed {
        println!("ok: cargo-fuzz {CARGO_FUZZ_VERSION}");
        return Ok(());
    }
    println!("installing: cargo-fuzz {CARGO_FUZZ_VERSION}");
    run(cargo().args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))
}

/// Fuzzes each target for `seconds` with the pinned nightly (libFuzzer needs
/// `-Zsanitizer`).
pub fn fuzz(seconds: u32) -> Result<()> {
    ensure_cargo_fuzz()?;
    let dir = workspace_root().join("fuzz");
    for target in TARGETS {
        println!("fuzzing: {target} for {seconds} s");
        run(cargo_of(EBPF_TOOLCHAIN)
            .current_dir(&dir)
            .args(["fuzz", "run", target, "--"])
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1"))
        .with_context(|| format!("fuzz target {target} failed (see fuzz/artifacts/{target})"))?;
    }
    Ok(())
}
