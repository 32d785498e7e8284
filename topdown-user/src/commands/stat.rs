//! `topdown stat`: the command. It resolves what to trace, starts a [`CountingSession`], runs
//! the event loop (signals, interval reports, exit records, the traced command) and writes the
//! final report.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    cli::StatArgs,
    error::{Failure, fail},
    report::{By, Format, IntervalInfo, render},
    session::{
        bpf::Snapshot,
        counting::{self, CalibrateAt, CountingSession, Traced, trace_scope},
        event_loop::{first_exit, readable, register, sleep_until},
        target::{ProcessWatch, wait_command},
    },
    ui::{output::Output, progress::Progress},
};

/// Why the counting stopped.
enum Stop {
    Duration,
    Signal(libc::c_int),
    TargetsGone,
}

/// Runs `topdown stat`; returns the process exit status (the command's, with `-- CMD`).
pub async fn run(args: StatArgs, verbose: bool) -> Result<u8> {
    // Without privileges (or with --no-bpf) a command is counted with inherited per-task
    // counters instead of the BPF session.
    if let Some(why) = crate::session::unprivileged::applies(&args)? {
        return crate::session::unprivileged::run(args, why).await;
    }
    // Before anything is loaded: a Ctrl-C from here on ends the run cleanly with a report,
    // never kills topdown half-way.
    let mut signals = Signals {
        interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
    };
    // Until counting starts, reading symbols and attaching can take many seconds: a signal ends
    // topdown at once there (`crate::session::interrupt`), with nothing attached.
    crate::session::interrupt::guard_setup().context("installing the set-up signal handler")?;
    let scope = args.scope.scope();
    // Fail on bad output paths before touching the kernel. FILE itself is replaced only once
    // a report is complete: a run that fails before counting leaves the last result in place.
    if args.report.format == Format::Svg {
        // Found before the command runs, not after: the picture needs a probed call tree.
        if args.counting.uprobes.is_empty()
            && args.counting.spans.is_empty()
            && args.counting.postgres.is_none()
        {
            return Err(fail(
                Failure::Usage,
                "--format svg draws the probed call tree or spans: add -u TARGET:FUNC, --span or --postgres",
            ));
        }
        if args.interval_ms.is_some() {
            return Err(fail(
                Failure::Usage,
                "--format svg draws one whole run: leave out -I",
            ));
        }
    }
    if matches!(args.report.format, Format::Pprof | Format::Folded) && args.interval_ms.is_some() {
        return Err(fail(
            Failure::Usage,
            "--format pprof and folded write one whole run: leave out -I",
        ));
    }
    let mut output = Output::open(args.report.output.as_deref())?;
    let prepared = counting::prepare(&args.counting, &args.report.by)?;

    let Traced {
        targets,
        watched_pids,
        pending,
        follower,
    } = trace_scope(
        &scope,
        args.counting.probes_processes(),
        prepared.by().contains(&By::Function) && prepared.by().contains(&By::Task),
    )?;
    // If the session cannot start, dropping `pending` closes its pipe and the held command
    // exits without ever running untraced.
    // Interval reports are compensated from the first one on; the one report at the end is
    // calibrated for after counting, so the command does not wait for it.
    let calibrate_at = if args.interval_ms.is_some() {
        CalibrateAt::Start
    } else {
        CalibrateAt::FirstReport
    };
    let mut session = prepared.start(&args.counting, targets, verbose, calibrate_at)?;
    // From here a signal ends the counting with a report (the event loop takes it).
    crate::session::interrupt::set(crate::session::interrupt::Phase::Counting);
    let command_pid = match pending {
        Some(pending) => {
            session.mark_command_start()?;
            Some(pending.release()?)
        }
        None => None,
    };
    let mut watches = Vec::new();
    let watching = !watched_pids.is_empty();
    for pid in watched_pids {
        if let Some(watch) = ProcessWatch::new(pid)? {
            watches.push(watch);
        }
    }
    // Every target exited while the session started: nothing would ever end the run.
    let all_gone = watching && watches.is_empty();
    eprintln!(
        "topdown: counting {} with model {} ({} counters x {} CPUs){}",
        scope.describe(),
        session.model().name(),
        session.plan().counters.len(),
        session.cpus().len(),
        if args.scope.duration.is_none() && command_pid.is_none() {
            "; Ctrl-C to stop"
        } else {
            ""
        }
    );

    let started = Instant::now();
    let mut interval_state = args.interval_ms.map(|ms| IntervalState {
        period: Duration::from_millis(ms),
        index: 0,
        previous: None,
        previous_end: Duration::ZERO,
    });
    let stop = if all_gone {
        eprintln!("topdown: every traced process exited before counting started");
        Stop::TargetsGone
    } else {
        event_loop(
            &mut signals,
            &mut session,
            &args,
            &mut watches,
            &mut interval_state,
            started,
            &mut output,
        )
        .await?
    };

    if let (Some(pid), Stop::Signal(signo)) = (command_pid, &stop) {
        // The command may not have seen the signal (kill to topdown alone): pass it on and let
        // it finish, so its last counts are in the report.
        crate::session::target::signal(pid, *signo);
        for watch in &watches {
            if watch.pid() == pid {
                let _ = tokio::time::timeout(Duration::from_secs(5), watch.exited()).await;
            }
        }
    }

    let snapshot = session.snapshot(true)?;
    if matches!(stop, Stop::Signal(_)) {
        session.shorten_calibration();
    }
    // Counting is over: the detach runs beside the calibration and the report, so that a
    // Ctrl-C is answered within a second with a whole libc probed.
    let closing = session.bpf.close_in_background();
    let elapsed = started.elapsed();
    match &mut interval_state {
        Some(state) => {
            // The last, partial interval, so nothing counted is left out.
            write_interval(
                state,
                &snapshot,
                elapsed,
                &mut session,
                args.report.format,
                args.report.weight,
                output.as_mut(),
            )?;
        }
        None => {
            let report = session.report(&snapshot, None, elapsed.as_secs_f64(), None);
            render(
                &report,
                args.report.format,
                session.by(),
                args.report.weight,
                output.as_mut(),
            )?;
        }
    }
    output.commit()?;
    drop(session);
    if closing.join().is_err() {
        eprintln!("topdown: detaching the BPF programs panicked; the kernel detaches them at exit");
    }
    // Nothing of the probes stays on the command's processes.
    if let Some((_, links)) = &follower {
        links.clear();
    }

    let status = match command_pid {
        Some(pid) => wait_command(pid).await,
        None => 0,
    };
    if let Some((follower, _)) = &follower {
        follower.report();
    }
    if matches!(stop, Stop::TargetsGone) && command_pid.is_none() {
        eprintln!("topdown: every traced process has exited");
    }
    Ok(status)
}

struct IntervalState {
    period: Duration,
    index: u64,
    previous: Option<Snapshot>,
    previous_end: Duration,
}

struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[allow(clippy::too_many_arguments)]
async fn event_loop(
    signals: &mut Signals,
    session: &mut CountingSession,
    args: &StatArgs,
    watches: &mut Vec<ProcessWatch>,
    interval_state: &mut Option<IntervalState>,
    started: Instant,
    output: &mut Output,
) -> Result<Stop> {
    let deadline = args
        .scope
        .duration
        .map(|seconds| tokio::time::Instant::from_std(started) + Duration::from_secs_f64(seconds));
    let exits = register(session.bpf.exits_fd()).context("polling the exit ring buffer")?;
    let logs = match session.bpf.log_fd() {
        Some(fd) => Some(register(fd).context("polling BPF logs")?),
        None => None,
    };
    let mut ticker = interval_state.as_ref().map(|state| {
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::from_std(started) + state.period,
            state.period,
        );
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    // `-d`: elapsed over total on a terminal's stderr, redrawn each second; cleared when the
    // loop ends, before the report is written.
    let waiting = args
        .scope
        .duration
        .map(|seconds| Progress::waiting("counting", Duration::from_secs_f64(seconds)))
        .filter(Progress::is_visible);
    let mut redraw = waiting.as_ref().map(|_| {
        let mut redraw = tokio::time::interval(Duration::from_secs(1));
        redraw.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        redraw
    });
    let tracking_targets = !watches.is_empty();
    let mut hotplug = tokio::time::interval(Duration::from_secs(1));
    hotplug.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            _ = hotplug.tick() => session.check_cpus(),
            _ = tick(redraw.as_mut()) => {
                if let Some(waiting) = &waiting {
                    waiting.elapsed(started.elapsed());
                }
            }
            _ = signals.interrupt.recv() => return Ok(Stop::Signal(libc::SIGINT)),
            _ = signals.terminate.recv() => return Ok(Stop::Signal(libc::SIGTERM)),
            _ = sleep_until(deadline) => return Ok(Stop::Duration),
            gone = first_exit(watches), if tracking_targets => {
                let index = gone?;
                watches.swap_remove(index);
                if watches.is_empty() {
                    return Ok(Stop::TargetsGone);
                }
            }
            guard = exits.readable() => {
                let mut guard = guard.context("waiting for exit records")?;
                session.bpf.drain_exits();
                guard.clear_ready();
            }
            guard = readable(logs.as_ref()) => {
                let mut guard = guard.context("waiting for BPF logs")?;
                session.bpf.flush_logs();
                guard.clear_ready();
            }
            _ = tick(ticker.as_mut()) => {
                if let Some(state) = interval_state.as_mut() {
                    let snapshot = session.snapshot(false)?;
                    write_interval(state, &snapshot, started.elapsed(), session, args.report.format, args.report.weight, output)?;
                    // Each complete interval goes out at once (`tail -f FILE` follows it).
                    output.commit()?;
                }
            }
        }
    }
}

fn write_interval(
    state: &mut IntervalState,
    snapshot: &Snapshot,
    now: Duration,
    session: &mut CountingSession,
    format: crate::report::Format,
    weight: crate::report::Weight,
    output: &mut dyn Write,
) -> Result<()> {
    state.index += 1;
    let interval = IntervalInfo {
        index: state.index,
        end_s: now.as_secs_f64(),
    };
    let duration_s = now.saturating_sub(state.previous_end).as_secs_f64();
    let report = session.report(
        snapshot,
        state.previous.as_ref(),
        duration_s,
        Some(interval),
    );
    render(&report, format, session.by(), weight, output)?;
    state.previous = Some(snapshot.clone());
    state.previous_end = now;
    Ok(())
}

async fn tick(ticker: Option<&mut tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}
