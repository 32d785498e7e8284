//! `topdown serve`: the always-on exporter. Counts system-wide like `stat -a`, turns each
//! refresh's deltas into Prometheus series (`exporter`), and serves them over HTTP (`http`).

pub mod config;
mod distributions;
pub mod duty_cycle;
pub mod exporter;
mod families;
pub mod http;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

use self::duty_cycle::{Sampler, Switch};
use crate::{
    cli::ServeArgs,
    error::{Failure, fail},
    functions::probes::{ProbeRequest, Probes},
    session::{
        aggregate::Aggregate,
        bpf::Snapshot,
        counting::{self, CalibrateAt, CountingSession, Targets, parse_probe_specs},
    },
};

/// Runs the exporter until SIGINT or SIGTERM; returns the exit status.
pub async fn run(command_line: ServeArgs, verbose: bool) -> Result<u8> {
    let mut args = config::effective(command_line)?;
    if let Some(cycle) = args.duty_cycle
        && args.counting.uprobes.is_empty()
    {
        return Err(fail(
            Failure::Usage,
            format!("--duty-cycle {cycle} cycles the function probes: give -u TARGET:FUNC too"),
        ));
    }
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

    let prepared = counting::prepare(&args.counting, &args.by)?;
    let targets = Targets {
        scope: "system-wide".to_owned(),
        ..Targets::default()
    };
    let mut session = prepared.start(&args.counting, targets, verbose, CalibrateAt::Start)?;
    let attached = Instant::now();
    let mut guard = Guard {
        budget: None,
        stats: None,
        cpus: session.cpus().len().max(1) as f64,
        last: None,
    };
    guard.set_budget(args.max_overhead)?;
    let mut exporter = exporter::Exporter::new(
        session.model().recorded_name(),
        session.model().is_synthetic(),
        exporter::Limits {
            max_series: usize::try_from(args.max_series).unwrap_or(usize::MAX),
            ttl: Duration::from_secs(args.series_ttl_s),
        },
    );
    // The first ON span starts with the probes `prepared.start` attached.
    let mut sampler = args.duty_cycle.map(|cycle| {
        exporter.start_sampling(cycle.period);
        Sampler::new(cycle, attached)
    });
    let (publish, snapshots) = watch::channel(http::Snapshot::starting(&exporter));
    let mut server = tokio::spawn(http::serve(listener, snapshots));
    eprintln!(
        "topdown: serving http://{}/metrics with model {} ({} counters x {} CPUs), refreshing every {} ms",
        args.listen,
        session.model().name(),
        session.plan().counters.len(),
        session.cpus().len(),
        args.refresh_ms
    );
    if let Some(cycle) = args.duty_cycle {
        eprintln!(
            "topdown: function probes attached {:?} of every {:?} (--duty-cycle); function series are estimates",
            cycle.on, cycle.period
        );
    }

    let mut previous: Option<(Snapshot, Instant)> = None;
    let mut ticker = refresh_ticker(args.refresh_ms);
    let mut hotplug = tokio::time::interval(Duration::from_secs(1));
    hotplug.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next_switch = sampler.as_ref().map(|sampler| sampler.next_switch());
        tokio::select! {
            _ = hotplug.tick() => session.check_cpus(),
            _ = until(next_switch) => {
                if let Some(sampler) = &mut sampler {
                    let switched = match sampler.next_switch().1 {
                        Switch::Attach => begin_on_span(&mut session, sampler, &mut exporter),
                        Switch::Detach => end_on_span(&mut session, sampler, &mut exporter, &mut previous),
                    };
                    if let Err(err) = switched {
                        log::warn!("--duty-cycle: {err:#}");
                    }
                    match exporter.encode() {
                        Ok(text) => publish.send_modify(|snapshot| snapshot.metrics = Arc::new(text)),
                        Err(err) => log::warn!("encoding metrics: {err}"),
                    }
                }
            }
            _ = ticker.tick() => {
                let started = Instant::now();
                match refresh(&mut session, &mut exporter, &mut previous, sampler.as_mut()) {
                    Ok(aggregate) => {
                        if let Some(probes) = &mut session.probes {
                            if let Err(err) = keep_probes(&mut session.bpf, probes, &mut guard, &aggregate, &mut exporter) {
                                log::warn!("function probes: {err:#}");
                            }
                            exporter.reattachments = probes.reattachments;
                            exporter.detached_functions = probes
                                .detached()
                                .map(|(target, symbol)| (symbol.clone(), target.clone()))
                                .collect();
                        } else if let Some(percent) = guard.measure(&session.bpf) {
                            exporter.overhead_percent = Some(percent);
                        }
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
                if let Some(path) = args.config.clone() {
                    let mut live = Live {
                        session: &mut session,
                        exporter: &mut exporter,
                        guard: &mut guard,
                        ticker: &mut ticker,
                        sampler: sampler.as_mut(),
                        previous: &mut previous,
                    };
                    match reload(&path, &mut args, &mut live) {
                        Ok(()) => exporter.config_reloads.applied += 1,
                        Err(err) => {
                            exporter.config_reloads.failed += 1;
                            eprintln!("topdown: SIGHUP: {} not applied, the running configuration stays: {err:#}", path.display());
                        }
                    }
                    continue;
                }
                match &mut session.probes {
                    Some(probes) => {
                        if let Err(err) = probes.reattach(&mut session.bpf, "SIGHUP") {
                            log::warn!("re-attaching on SIGHUP: {err:#}");
                        }
                    }
                    None => eprintln!("topdown: SIGHUP: no function probes to re-resolve; other options need a restart"),
                }
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
    drop(guard);
    drop(session);
    eprintln!("topdown: stopped; every probe and BPF program is detached");
    Ok(0)
}

/// The overhead guard's measurements.
struct Guard {
    budget: Option<f64>,
    /// Kernel BPF run-time statistics, on while this fd is open (the guard's input).
    stats: Option<std::os::fd::OwnedFd>,
    cpus: f64,
    /// The programs' total run time and the instant it was read.
    last: Option<(Duration, Instant)>,
}

impl Guard {
    /// Sets the budget, turning the kernel's BPF run-time statistics on or off with it.
    fn set_budget(&mut self, budget: Option<f64>) -> Result<()> {
        if budget.is_some() && self.stats.is_none() {
            self.stats = Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|err| {
                    fail(
                        Failure::BpfUnavailable,
                        format!("--max-overhead needs BPF run-time statistics: {err}"),
                    )
                })?,
            );
            self.last = None;
        }
        if budget.is_none() {
            self.stats = None;
        }
        self.budget = budget;
        Ok(())
    }

    /// topdown's BPF run time since the last measurement, in percent of all CPUs.
    fn measure(&mut self, session: &crate::session::bpf::Session) -> Option<f64> {
        self.budget?;
        let (run_time, _) = session.program_run_time().ok()?;
        let now = Instant::now();
        let percent = self.last.map(|(before, at)| {
            let wall = now.duration_since(at).as_secs_f64() * self.cpus;
            100.0 * run_time.saturating_sub(before).as_secs_f64() / wall.max(1e-9)
        });
        self.last = Some((run_time, now));
        percent
    }
}

/// Re-attaches probes whose binary was replaced, and applies the overhead budget: above it,
/// the function with the most calls this refresh is detached.
fn keep_probes(
    session: &mut crate::session::bpf::Session,
    probes: &mut Probes,
    guard: &mut Guard,
    counted: &Aggregate,
    exporter: &mut exporter::Exporter,
) -> Result<()> {
    // Paused by the duty cycle: its next attach resolves the specs anew anyway.
    let replaced = if probes.is_paused() {
        Vec::new()
    } else {
        probes.replaced_targets()
    };
    if !replaced.is_empty() {
        let names = crate::ui::path_list(&replaced);
        probes.reattach(session, &format!("replaced on disk: {names}"))?;
    }
    let overhead = guard.measure(session);
    // A measurement restarted after a detach has no value yet: keep exporting the last one
    // rather than dropping the series for a refresh.
    if overhead.is_some() {
        exporter.overhead_percent = overhead;
    }
    let (Some(percent), Some(budget)) = (overhead, guard.budget) else {
        return Ok(());
    };
    if percent <= budget {
        return Ok(());
    }
    let attached: Vec<u32> = probes.attached_ids().collect();
    // Calls per function id this refresh (summed over callers and processes).
    let mut calls: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for call in &counted.calls {
        *calls.entry(call.key.function).or_default() += call.calls;
    }
    let busiest = calls
        .into_iter()
        .filter(|(id, _)| attached.contains(id))
        .max_by_key(|(_, calls)| *calls)
        .map(|(id, calls)| {
            let symbol = probes
                .functions()
                .get(id as usize)
                .map_or_else(|| format!("function #{id}"), |(_, symbol)| symbol.clone());
            (id, calls, symbol)
        });
    match busiest {
        Some((id, calls, symbol)) => {
            eprintln!(
                "topdown: overhead {percent:.3}% > --max-overhead {budget}%: detaching {symbol} ({calls} calls in the last refresh)"
            );
            probes.detach_function(session, id)?;
            // The detach itself perturbs the next measurement: start it afresh.
            guard.last = None;
        }
        None => log::warn!(
            "overhead {percent:.3}% > --max-overhead {budget}% with no probed function left to detach"
        ),
    }
    Ok(())
}

/// Reads the maps, turns the deltas since the last refresh into series, and forgets exited
/// tasks and removed cgroups so a daemon's memory stays bounded. Returns the refresh's counts.
/// With `--duty-cycle` (`sampler`), function counts wait in the sampler for their window to
/// close.
fn refresh(
    session: &mut CountingSession,
    exporter: &mut exporter::Exporter,
    previous: &mut Option<(Snapshot, Instant)>,
    sampler: Option<&mut Sampler>,
) -> Result<Aggregate> {
    let mut snapshot = session.snapshot(false)?;
    let now = Instant::now();
    let mut aggregate =
        Aggregate::since(&snapshot, previous.as_ref().map(|(snapshot, _)| snapshot));
    let cgroup_paths = session.cgroup_paths(&aggregate);
    // The series show function figures without the probes' own cost, as reports do; the
    // overhead guard gets the raw counts, which are what the probes cost.
    let (compensated, _) = session.compensate(&aggregate);
    let raw_calls = compensated.map(|shown| {
        aggregate.histograms = shown.histograms;
        std::mem::replace(&mut aggregate.calls, shown.calls)
    });
    // With a duty cycle, function figures are held until their window closes.
    let held = sampler.map(|sampler| {
        sampler.hold(&aggregate.calls);
        std::mem::take(&mut aggregate.calls)
    });
    exporter.update(&aggregate, &session.naming(&cgroup_paths), now);
    if let Some(spans) = &session.spans {
        exporter.add_spans(
            &aggregate,
            &session.naming(&cgroup_paths),
            &spans.naming,
            now,
        );
    }
    if let Some(calls) = raw_calls {
        aggregate.calls = calls;
    } else if let Some(calls) = held {
        aggregate.calls = calls;
    }
    exporter.map_entries = [
        ("tasks", snapshot.live.len()),
        ("cgroups", snapshot.cgroups.len()),
    ];
    // Removed cgroups: their last counts are in this refresh.
    session.forget_removed_cgroups(&mut snapshot)?;
    session.bpf.forget_exited();
    snapshot.exited.clear();
    *previous = Some((snapshot, now));
    Ok(aggregate)
}

/// Sleeps until the duty cycle's next switch; forever without `--duty-cycle`.
async fn until(next: Option<(Instant, Switch)>) {
    match next {
        Some((at, _)) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Begins a period of the duty cycle: attaches the function probes for its ON span.
fn begin_on_span(
    session: &mut CountingSession,
    sampler: &mut Sampler,
    exporter: &mut exporter::Exporter,
) -> Result<()> {
    sampler.begin_period(Instant::now());
    let Some(probes) = &mut session.probes else {
        return Ok(());
    };
    probes
        .resume(&mut session.bpf)
        .context("attaching the function probes failed; the next period tries again")?;
    sampler.attached_at(Instant::now());
    exporter.set_attached(true);
    Ok(())
}

/// Ends the ON span now: detaches the function probes, reads what they counted up to the
/// detach, and hands the closed window to the exporter.
fn end_on_span(
    session: &mut CountingSession,
    sampler: &mut Sampler,
    exporter: &mut exporter::Exporter,
    previous: &mut Option<(Snapshot, Instant)>,
) -> Result<()> {
    let end = Instant::now();
    let detached = match &mut session.probes {
        Some(probes) => probes.pause(&mut session.bpf),
        None => Ok(()),
    };
    sampler.detached_at(end);
    exporter.set_attached(false);
    detached.context("detaching the function probes")?;
    // A failed read leaves the window open: the next detach closes it with both ON spans.
    refresh(session, exporter, previous, Some(&mut *sampler))?;
    if let Some(window) = sampler.close_window(end) {
        let no_paths = HashMap::new();
        exporter.add_window(window, &session.naming(&no_paths), Instant::now());
    }
    Ok(())
}

fn refresh_ticker(refresh_ms: u64) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(Duration::from_millis(refresh_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}

/// What a configuration reload may change in the running exporter.
struct Live<'a> {
    session: &'a mut CountingSession,
    exporter: &'a mut exporter::Exporter,
    guard: &'a mut Guard,
    ticker: &'a mut tokio::time::Interval,
    sampler: Option<&'a mut Sampler>,
    previous: &'a mut Option<(Snapshot, Instant)>,
}

/// Re-reads `--config FILE` on SIGHUP and applies its live options; `running` tracks what is
/// in effect. Everything is validated (the file parses, every `-u` resolves) before anything
/// changes, so a bad edit leaves the exporter as it was.
fn reload(path: &std::path::Path, running: &mut ServeArgs, live: &mut Live<'_>) -> Result<()> {
    let new = config::read(path)?;
    let mut changes: Vec<String> = Vec::new();
    // Probes first: they are what a bad edit breaks (a spec that no longer resolves), and
    // they fail before detaching anything. Each option is recorded as running once applied,
    // so a later failure leaves `running` true to what is in effect.
    if new.counting.uprobes != running.counting.uprobes {
        let specs = parse_probe_specs(&new.counting.uprobes)?;
        // Under --duty-cycle every function of a window must have been attached for all of its
        // ON span: the span ends here, and the next period attaches the new set.
        if let Some(sampler) = live.sampler.as_deref_mut()
            && sampler.is_attached()
        {
            end_on_span(live.session, sampler, live.exporter, live.previous)?;
        }
        let session = &mut *live.session;
        match &mut session.probes {
            Some(probes) => probes.replace_specs(&mut session.bpf, specs)?,
            None => {
                session.probes = Some(Probes::attach(
                    &mut session.bpf,
                    ProbeRequest {
                        specs,
                        processes: Vec::new(),
                        returns: running.counting.return_mode(),
                        image: crate::functions::unwinding::Image::Everything,
                        verbose: false,
                    },
                )?)
            }
        }
        if !new.counting.uprobes.is_empty() {
            session.show_functions();
        }
        changes.push(format!("-u {}", new.counting.uprobes.join(" -u ")));
        running.counting.uprobes = new.counting.uprobes.clone();
    }
    if new.max_overhead != running.max_overhead {
        live.guard.set_budget(new.max_overhead)?;
        if new.max_overhead.is_none() {
            live.exporter.overhead_percent = None;
        }
        changes.push(format!(
            "--max-overhead {} -> {}",
            percent_text(running.max_overhead),
            percent_text(new.max_overhead)
        ));
        running.max_overhead = new.max_overhead;
    }
    if new.max_series != running.max_series || new.series_ttl_s != running.series_ttl_s {
        live.exporter.set_limits(exporter::Limits {
            max_series: usize::try_from(new.max_series).unwrap_or(usize::MAX),
            ttl: Duration::from_secs(new.series_ttl_s),
        });
        changes.push(format!(
            "--max-series {} --series-ttl {}",
            new.max_series, new.series_ttl_s
        ));
        running.max_series = new.max_series;
        running.series_ttl_s = new.series_ttl_s;
    }
    if new.refresh_ms != running.refresh_ms {
        *live.ticker = refresh_ticker(new.refresh_ms);
        changes.push(format!("--refresh-ms {}", new.refresh_ms));
        running.refresh_ms = new.refresh_ms;
    }
    if config::needs_restart(running, &new) {
        eprintln!(
            "topdown: SIGHUP: {} changes options other than {}: those need a restart and keep their running values",
            path.display(),
            config::LIVE_OPTIONS
        );
    }
    eprintln!(
        "topdown: SIGHUP: reloaded {}: {}",
        path.display(),
        if changes.is_empty() {
            "no live option changed".to_owned()
        } else {
            changes.join(", ")
        }
    );
    Ok(())
}

fn percent_text(percent: Option<f64>) -> String {
    percent.map_or_else(|| "off".to_owned(), |percent| format!("{percent}%"))
}
