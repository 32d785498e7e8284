//! `topdown serve`: the always-on exporter. Counts system-wide like `stat -a`, turns each
//! refresh's deltas into Prometheus series (`exporter`), and serves them over HTTP (`http`).

pub mod exporter;
pub mod http;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

use crate::{
    bpf::{Session, SessionConfig, Snapshot, Trigger},
    cgroup::CgroupTree,
    cli::ServeArgs,
    error::{Failure, fail},
    report::By,
    stat::{Counting, Reporting, attach_probes, open_counting},
    symbols::ProbeSpec,
};

/// Runs the exporter until SIGINT or SIGTERM; returns the exit status.
pub async fn run(args: ServeArgs, verbose: bool) -> Result<u8> {
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    // Bind first: a port in use is a usage error, found before any BPF is loaded.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|err| {
            fail(
                Failure::Usage,
                format!("cannot listen on {}: {err}", args.listen),
            )
        })?;

    let Counting {
        model,
        level,
        plan,
        groups,
        tracefs,
        cpus,
    } = open_counting(&args.counting)?;
    let counting = &args.counting;
    let mut by = args.by.clone();
    if !counting.uprobes.is_empty() && !by.contains(&By::Function) {
        by.push(By::Function);
    }
    let wants_cgroups = by.contains(&By::Cgroup) || counting.cgroup_depth.is_some();
    let mut cgroup_tree = if wants_cgroups || !counting.cgroups.is_empty() {
        Some(CgroupTree::open()?)
    } else {
        None
    };
    let cgroup_filter = match (&mut cgroup_tree, counting.cgroups.is_empty()) {
        (Some(tree), false) => Some(tree.resolve(&counting.cgroups)?),
        _ => None,
    };
    let probe_specs = counting
        .uprobes
        .iter()
        .map(|text| ProbeSpec::parse(text))
        .collect::<Result<Vec<_>>>()?;
    let trigger = match counting.trigger {
        Some(Trigger::CgroupSwitch) if by != [By::Cgroup] => {
            return Err(fail(
                Failure::Usage,
                "--trigger cgroup-switch only counts per cgroup: use it with --by cgroup alone",
            ));
        }
        Some(trigger) => trigger,
        None if by == [By::Cgroup] => Trigger::CgroupSwitch,
        None => Trigger::SchedSwitch,
    };
    let config = SessionConfig {
        tracked_tgids: None,
        follow_forks: false,
        max_tasks: counting.max_tasks,
        max_tracked: counting.max_tracked,
        verbose,
        split_functions_by_process: false,
        max_stacks: counting.max_stacks,
        max_calls: counting.max_calls,
        by_cgroup: wants_cgroups,
        cgroup_filter,
        max_cgroups: counting.max_cgroups,
        num_slots: plan.slots.len() as u32,
        slot_sources: plan.slot_sources(),
        trigger,
    };
    let mut session = Session::start(&config, groups, &tracefs)?;
    let functions = if probe_specs.is_empty() {
        Vec::new()
    } else {
        attach_probes(&mut session, &probe_specs, &[], counting.uretprobes)?
    };
    let mut reporting = Reporting {
        model: model.as_ref(),
        level,
        slot_names: plan.slot_names(),
        scope: "system-wide".to_owned(),
        by,
        cgroups: if wants_cgroups { cgroup_tree } else { None },
        cgroup_depth: counting.cgroup_depth.map(|depth| depth as usize),
        functions,
    };
    let mut exporter = exporter::Exporter::new(
        model.recorded_name(),
        model.is_synthetic(),
        exporter::Limits {
            max_series: usize::try_from(args.max_series).unwrap_or(usize::MAX),
            ttl: Duration::from_secs(args.series_ttl_s),
        },
    );
    let (publish, snapshots) = watch::channel(http::Snapshot::default());
    let mut server = tokio::spawn(http::serve(listener, snapshots));
    eprintln!(
        "topdown: serving http://{}/metrics with model {} ({} counters x {} CPUs), refreshing every {} ms",
        args.listen,
        model.name(),
        plan.counters.len(),
        cpus.len(),
        args.refresh_ms
    );

    let mut previous: Option<(Snapshot, Instant)> = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(args.refresh_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let started = Instant::now();
                match refresh(&mut session, &mut reporting, &mut exporter, &mut previous) {
                    Ok(()) => {
                        let took = started.elapsed();
                        exporter.set_refresh_duration(took);
                        match exporter.encode() {
                            Ok(text) => {
                                let _ = publish.send(http::Snapshot { metrics: Arc::new(text), healthy: true });
                            }
                            Err(err) => log::warn!("encoding metrics: {err}"),
                        }
                    }
                    Err(err) => {
                        log::warn!("refresh failed: {err:#}");
                        publish.send_modify(|snapshot| snapshot.healthy = false);
                    }
                }
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => {
                eprintln!("topdown: SIGHUP: the configuration is the command line; restart topdown serve to change it");
            }
            stopped = &mut server => {
                let why = match stopped {
                    Ok(Ok(())) => "it returned".to_owned(),
                    Ok(Err(err)) => format!("{err:#}"),
                    Err(err) => err.to_string(),
                };
                return Err(anyhow::anyhow!("the HTTP server stopped: {why}"));
            }
        }
    }
    server.abort();
    drop(session);
    eprintln!("topdown: stopped; every probe and BPF program is detached");
    Ok(0)
}

/// Reads the maps, turns the deltas since the last refresh into series, and forgets exited
/// tasks so a daemon's memory stays bounded.
fn refresh(
    session: &mut Session,
    reporting: &mut Reporting<'_>,
    exporter: &mut exporter::Exporter,
    previous: &mut Option<(Snapshot, Instant)>,
) -> Result<()> {
    session.flush(false)?;
    let mut snapshot = session.snapshot()?;
    let now = Instant::now();
    let elapsed = previous
        .as_ref()
        .map_or(0.0, |(_, at)| now.duration_since(*at).as_secs_f64());
    let report = reporting.build(
        &snapshot,
        previous.as_ref().map(|(snapshot, _)| snapshot),
        elapsed,
        None,
    );
    exporter.update(&report, now);
    session.forget_exited();
    snapshot.exited.clear();
    *previous = Some((snapshot, now));
    Ok(())
}
