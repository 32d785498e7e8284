//! `topdown-floor`: the benchmark's floor instrument (`cargo xtask bench`). Loads an empty
//! `tp_btf/sched_switch` program, attached as topdown attaches its own, and keeps it attached
//! until killed (the kernel detaches it when the process ends, as with topdown).

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use aya::{Btf, Ebpf, programs::BtfTracePoint};

/// Built by build.rs with the eBPF crate (its `floor` binary).
static FLOOR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor"));

fn attach() -> Result<Ebpf> {
    let mut ebpf = Ebpf::load(FLOOR_OBJECT).context("loading the floor program")?;
    let btf = Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let program: &mut BtfTracePoint = ebpf
        .program_mut("empty_switch")
        .context("the floor object has no empty_switch program")?
        .try_into()?;
    program
        .load("sched_switch", &btf)
        .context("loading empty_switch")?;
    program.attach().context("attaching empty_switch")?;
    Ok(ebpf)
}

/// Until SIGINT or SIGTERM. Handled, not left to their default action: a process started in
/// the background by a shell inherits SIGINT ignored.
async fn until_stopped() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

fn run() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    let _ebpf = attach()?;
    // "counting" is what the benchmark waits for, as with topdown.
    eprintln!("topdown-floor: counting with an empty tp_btf/sched_switch program");
    runtime.block_on(until_stopped())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("topdown-floor: {err:#}");
            ExitCode::FAILURE
        }
    }
}
