//! `topdown top`: a live terminal view of what is running. Counts like `stat` (same scopes
//! and options), and every refresh draws that refresh's deltas (like `serve`) as one row per
//! process, thread, cgroup or function with a stacked bar of its TopDown categories.

pub mod select;
pub mod view;

use std::{
    collections::HashMap,
    io::IsTerminal as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::{Terminal, backend::CrosstermBackend};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use crate::{
    cli::TopArgs,
    error::{Failure, fail},
    report::{By, Report},
    session::{
        aggregate::{Aggregate, Naming},
        bpf::Snapshot,
        counting::{self, CalibrateAt, CountingSession, Traced, trace_scope},
        event_loop::{first_exit, register, sleep_until},
        target::{ProcessWatch, Scope, reap},
    },
};

use view::{Header, Sort, Ui, View};

/// Runs `topdown top` until `q`, Ctrl-C, SIGTERM or `-d`; returns the exit status.
pub async fn run(args: TopArgs, verbose: bool) -> Result<u8> {
    // Before anything is loaded: a screen needs a terminal, and a pipe wants `stat -I`.
    if !std::io::stdout().is_terminal() {
        return Err(fail(
            Failure::Usage,
            "topdown top draws on a terminal and stdout is not one: for reports to a file or pipe use `topdown stat -I MS`",
        ));
    }
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let scope = args.scope.scope();
    let prepared = counting::prepare(&args.counting, &args.by)?;

    // Function probes and USDT sites of a command go to its processes only, as in `stat`.
    let Traced {
        targets,
        watched_pids,
        pending,
        follower,
    } = trace_scope(&scope, args.counting.probes_processes(), false)?;
    // If the session cannot start, dropping `pending` closes its pipe and the held command
    // exits without ever running untraced.
    let mut session = prepared.start(&args.counting, targets, verbose, CalibrateAt::Start)?;
    // The baseline before the command runs, so its first refresh holds all it did.
    let baseline = session.snapshot(false)?;
    let mut previous = (baseline.clone(), Instant::now());
    // Exited tasks are forgotten after each refresh only system-wide, where they are
    // unbounded; a command's or pids' are kept for the whole-run view when they end.
    let forget = matches!(scope, Scope::SystemWide);
    let baseline_at = previous.1;
    let mut command_pid = match pending {
        Some(pending) => Some(pending.release()?),
        None => None,
    };
    let mut watches = Vec::new();
    for pid in watched_pids {
        if let Some(watch) = ProcessWatch::new(pid)? {
            watches.push(watch);
        }
    }
    // The overhead in the header: kernel BPF run-time statistics stay on while this fd is
    // open (as serve's `--max-overhead` guard measures it). Without them the header says n/a.
    let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(err) => {
            log::info!("no BPF run-time statistics, overhead not shown: {err}");
            None
        }
    };
    let mut run_time = stats
        .as_ref()
        .and_then(|_| session.bpf.program_run_time().ok())
        .map(|(time, _)| (time, Instant::now()));

    let mut header = Header {
        cpus: session.cpus().len(),
        refresh_ms: args.refresh_ms,
        overhead_percent: None,
        counted_level: args.counting.level,
    };
    let mut ui = Ui::new(args.counting.level);
    let mut shown = Counted {
        aggregate: Aggregate::since(&previous.0, Some(&previous.0)),
        duration_s: 0.0,
    };

    let mut screen = Screen::enter()?;
    let keys = KeyReader::start();
    let mut keys_rx = keys.events;
    let started = Instant::now();
    let deadline = args
        .scope
        .duration
        .map(|seconds| tokio::time::Instant::from_std(started) + Duration::from_secs_f64(seconds));
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_millis(args.refresh_ms),
        Duration::from_millis(args.refresh_ms),
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hotplug = tokio::time::interval(Duration::from_secs(1));
    hotplug.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exits = register(session.bpf.exits_fd()).context("polling the exit ring buffer")?;
    let mut command_status = None;

    let mut report = shown.report(&mut session, &ui, screen.rows()?);
    screen.draw(&report, &header, &ui)?;
    loop {
        let mut redraw = false;
        tokio::select! {
            _ = hotplug.tick() => session.check_cpus(),
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = sleep_until(deadline) => break,
            guard = exits.readable() => {
                let mut guard = guard.context("waiting for exit records")?;
                session.bpf.drain_exits();
                guard.clear_ready();
            }
            gone = first_exit(&watches), if !watches.is_empty() => {
                let index = gone?;
                watches.swap_remove(index);
                if watches.is_empty() {
                    // The targets' whole run stays on screen: a last refresh alone could
                    // hold only the few milliseconds since the tick before.
                    let last = session.snapshot(false)?;
                    let whole = baseline_at.elapsed();
                    shown = Counted {
                        aggregate: Aggregate::since(&last, Some(&baseline)),
                        duration_s: whole.as_secs_f64(),
                    };
                    previous = (last, Instant::now());
                    if let Some(pid) = command_pid.take() {
                        command_status = wait_command(pid).await;
                    }
                    ui.paused = true;
                    ui.message = Some(match command_status {
                        Some(status) => format!("the command exited (status {status}): its whole run stays on screen; q to quit"),
                        None => "every traced process has exited: their whole run stays on screen; q to quit".to_owned(),
                    });
                    // The command wrote on the same terminal: repaint everything.
                    screen.terminal.clear().context("clearing the terminal")?;
                    redraw = true;
                }
            }
            _ = ticker.tick() => {
                let fresh = refresh(&mut session, &mut previous, forget)?;
                if stats.is_some() {
                    header.overhead_percent = overhead(&session, &mut run_time, header.cpus);
                }
                if !ui.paused {
                    shown = fresh;
                    redraw = true;
                }
            }
            key = keys_rx.recv() => {
                match key {
                    Some(Input::Key(key)) => {
                        if handle_key(key, &mut ui, &report, &header) == Action::Quit {
                            break;
                        }
                    }
                    Some(Input::Resize) => {}
                    Some(Input::Failed(err)) => return Err(anyhow::anyhow!("reading the terminal: {err}")),
                    None => break,
                }
                redraw = true;
            }
        }
        if redraw {
            // Rebuilt on keys too: the sort, filter and view pick the rows to name.
            report = shown.report(&mut session, &ui, screen.rows()?);
            screen.draw(&report, &header, &ui)?;
        }
    }
    keys.stop.store(true, Ordering::Relaxed);
    drop(screen);
    drop(stats);
    if let Some(pid) = command_pid {
        // Quitting the view ends the traced command too (as Ctrl-C in a shell would).
        crate::session::target::signal(pid, libc::SIGTERM);
        for watch in &watches {
            if watch.pid() == pid {
                let _ = tokio::time::timeout(Duration::from_secs(5), watch.exited()).await;
            }
        }
        let _ = reap(pid);
    }
    drop(session);
    // Nothing of the probes stays on the command's processes.
    if let Some((follower, links)) = &follower {
        links.clear();
        follower.report();
    }
    Ok(0)
}

/// topdown's BPF run time since the last call, in percent of all CPUs (as serve's overhead
/// guard measures it); `last` keeps the total and when it was read.
fn overhead(
    session: &CountingSession,
    last: &mut Option<(Duration, Instant)>,
    cpus: usize,
) -> Option<f64> {
    let (run_time, _) = session.bpf.program_run_time().ok()?;
    let now = Instant::now();
    let percent = last.map(|(before, at)| {
        let wall = now.duration_since(at).as_secs_f64() * cpus.max(1) as f64;
        100.0 * run_time.saturating_sub(before).as_secs_f64() / wall.max(1e-9)
    });
    *last = Some((run_time, now));
    percent
}

/// What the screen shows: one refresh's counts (or the targets' whole run), typed. Only the
/// rows the screen can hold are named and evaluated, each time it is drawn.
pub struct Counted {
    pub aggregate: Aggregate,
    pub duration_s: f64,
}

impl Counted {
    /// The report of what `ui` shows on `capacity` rows: totals, cgroups and functions whole,
    /// threads and processes cut to the rows on screen (`select::visible`), no call-tree edges.
    pub fn report(&self, session: &mut CountingSession, ui: &Ui, capacity: usize) -> Report {
        let kept = {
            let no_paths = HashMap::new();
            let naming = session.naming(&no_paths);
            self.visible(&naming, ui, capacity)
        };
        session.screen_report_of(&kept, self.duration_s)
    }

    /// The aggregate cut to what `ui` shows on `capacity` rows, for a report named by `naming`.
    pub fn visible(&self, naming: &Naming<'_>, ui: &Ui, capacity: usize) -> Aggregate {
        let categories = match ui.sort {
            view::Sort::Category(_) => {
                let totals = naming
                    .evaluator
                    .evaluate(&self.aggregate.totals.0, naming.level)
                    .metrics;
                view::categories_of(naming.level, totals.keys(), ui.level)
            }
            _ => Vec::new(),
        };
        select::visible(
            &self.aggregate,
            ui,
            &select::Shown {
                naming,
                categories: &categories,
                capacity,
            },
        )
    }
}

/// Reads the maps and aggregates the deltas since the last refresh; forgets exited tasks and
/// removed cgroups when `forget` (as serve does) so a long view's memory stays bounded.
fn refresh(
    session: &mut CountingSession,
    previous: &mut (Snapshot, Instant),
    forget: bool,
) -> Result<Counted> {
    let mut snapshot = session.snapshot(false)?;
    let now = Instant::now();
    let duration_s = now.duration_since(previous.1).as_secs_f64();
    let aggregate = Aggregate::since(&snapshot, Some(&previous.0));
    if forget {
        session.forget_removed_cgroups(&mut snapshot)?;
        session.bpf.forget_exited();
        snapshot.exited.clear();
    }
    *previous = (snapshot, now);
    Ok(Counted {
        aggregate,
        duration_s,
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Action {
    Continue,
    Quit,
}

/// Applies one key press to the view state.
fn handle_key(key: KeyEvent, ui: &mut Ui, report: &Report, header: &Header) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::Continue;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Action::Quit;
    }
    if let Some(text) = &mut ui.editing {
        match key.code {
            KeyCode::Enter => ui.filter = ui.editing.take().unwrap_or_default(),
            KeyCode::Esc => {
                ui.editing = None;
                ui.filter.clear();
            }
            KeyCode::Backspace => {
                text.pop();
            }
            KeyCode::Char(c) => text.push(c),
            _ => {}
        }
        return Action::Continue;
    }
    ui.message = None;
    let show = |view: View, by: By, ui: &mut Ui| {
        if ui.view != view {
            // Rows of another view: the selection starts again from the top.
            ui.selected = 0;
        }
        ui.view = view;
        let counted = match by {
            By::Task => !report.tasks.is_empty() || report.processes.is_empty(),
            By::Cgroup => !report.cgroups.is_empty(),
            By::Function => !report.functions.is_empty(),
            By::Span => !report.spans.is_empty(),
            By::Process => true,
        };
        if !counted {
            ui.message = Some(match by {
                By::Cgroup => {
                    "no cgroups counted this refresh (counted with --by ...,cgroup)".to_owned()
                }
                By::Function => {
                    "no functions counted this refresh (probe some with -u TARGET:FUNC)".to_owned()
                }
                By::Span => {
                    "no spans ended this refresh (count some with --span or --postgres)".to_owned()
                }
                _ => "nothing counted this refresh".to_owned(),
            });
        }
    };
    match key.code {
        KeyCode::Char('q') => return Action::Quit,
        KeyCode::Char('p') => show(View::Processes, By::Process, ui),
        KeyCode::Char('t') => show(View::Threads, By::Task, ui),
        KeyCode::Char('c') => show(View::Cgroups, By::Cgroup, ui),
        KeyCode::Char('f') => show(View::Functions, By::Function, ui),
        KeyCode::Char('r') => show(View::Spans, By::Span, ui),
        KeyCode::Char('s') => {
            ui.sort = ui.next_sort(view::categories(report, ui.level).len());
        }
        KeyCode::Char('/') => ui.editing = Some(String::new()),
        KeyCode::Esc => ui.filter.clear(),
        KeyCode::Char('l') => {
            if header.counted_level >= 2 {
                ui.level = if ui.level == 1 { 2 } else { 1 };
                ui.sort = Sort::Weight;
            } else {
                ui.message =
                    Some("level 2 needs its counters: start topdown top with -l 2".to_owned());
            }
        }
        KeyCode::Char(' ') => ui.paused = !ui.paused,
        KeyCode::Up => ui.selected = ui.selected.saturating_sub(1),
        KeyCode::Down => {
            let rows = match ui.view {
                View::Spans => report.spans.len(),
                _ => report.functions.len(),
            };
            ui.selected = (ui.selected + 1).min(rows.saturating_sub(1));
        }
        KeyCode::Char('d') => {
            if ui.view.selects() {
                ui.distribution = !ui.distribution;
            } else {
                ui.message = Some(
                    "d shows the selected function's or span's distribution: switch to functions with f or spans with r"
                        .to_owned(),
                );
            }
        }
        _ => {}
    }
    Action::Continue
}

/// The terminal in raw mode on the alternate screen; dropping it restores the terminal, on
/// every way out (quit, error, signal, panic unwinding).
struct Screen {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl Screen {
    fn enter() -> Result<Self> {
        crossterm::terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        // From here on a failure must restore what is already changed.
        let restore = Restore;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )
        .context("switching to the alternate screen")?;
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))
            .context("setting up the terminal")?;
        std::mem::forget(restore);
        Ok(Self { terminal })
    }

    /// The screen's height: more rows than the table can show.
    fn rows(&self) -> Result<usize> {
        let size = self
            .terminal
            .size()
            .context("reading the terminal's size")?;
        Ok(usize::from(size.height))
    }

    fn draw(&mut self, report: &Report, header: &Header, ui: &Ui) -> Result<()> {
        self.terminal
            .draw(|frame| {
                let area = frame.area();
                view::draw(frame.buffer_mut(), area, report, header, ui);
            })
            .context("drawing on the terminal")?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        drop(Restore);
    }
}

/// Undoes raw mode and the alternate screen when dropped.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

enum Input {
    Key(KeyEvent),
    Resize,
    Failed(std::io::Error),
}

/// Terminal input read on its own thread (crossterm's reads block) and handed to the loop.
struct KeyReader {
    events: mpsc::UnboundedReceiver<Input>,
    stop: Arc<AtomicBool>,
}

impl KeyReader {
    fn start() -> Self {
        let (send, events) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            // Polling with a timeout lets the thread notice `stop` and end.
            while !stopping.load(Ordering::Relaxed) {
                let input = match crossterm::event::poll(Duration::from_millis(100)) {
                    Ok(false) => continue,
                    Ok(true) => match crossterm::event::read() {
                        Ok(Event::Key(key)) => Input::Key(key),
                        Ok(Event::Resize(..)) => Input::Resize,
                        Ok(_) => continue,
                        Err(err) => Input::Failed(err),
                    },
                    Err(err) => Input::Failed(err),
                };
                let failed = matches!(input, Input::Failed(_));
                if send.send(input).is_err() || failed {
                    break;
                }
            }
        });
        Self { events, stop }
    }
}

async fn wait_command(pid: u32) -> Option<i32> {
    for _ in 0..500 {
        if let Some(status) = reap(pid) {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn header_of(counted_level: u8) -> Header {
        Header {
            cpus: 2,
            refresh_ms: 1000,
            overhead_percent: None,
            counted_level,
        }
    }

    #[test]
    fn keys_filter_switch_and_quit() {
        let report = view::tests::report();
        let mut ui = Ui::new(1);
        let header = header_of(1);
        for code in [
            KeyCode::Char('/'),
            KeyCode::Char('w'),
            KeyCode::Char('x'),
            KeyCode::Backspace,
            KeyCode::Char('o'),
        ] {
            assert_eq!(
                handle_key(press(code), &mut ui, &report, &header),
                Action::Continue
            );
        }
        assert_eq!(ui.editing.as_deref(), Some("wo"));
        // While typing, q is text, not quit.
        handle_key(press(KeyCode::Char('q')), &mut ui, &report, &header);
        assert_eq!(ui.editing.as_deref(), Some("woq"));
        handle_key(press(KeyCode::Backspace), &mut ui, &report, &header);
        handle_key(press(KeyCode::Enter), &mut ui, &report, &header);
        assert_eq!((ui.editing.clone(), ui.filter.as_str()), (None, "wo"));
        handle_key(press(KeyCode::Char('/')), &mut ui, &report, &header);
        handle_key(press(KeyCode::Esc), &mut ui, &report, &header);
        assert_eq!((ui.editing.clone(), ui.filter.as_str()), (None, ""));

        handle_key(press(KeyCode::Char('t')), &mut ui, &report, &header);
        assert_eq!(ui.view, View::Threads);
        handle_key(press(KeyCode::Char('f')), &mut ui, &report, &header);
        assert_eq!(ui.view, View::Functions);
        assert_eq!(
            ui.message.as_deref(),
            Some("no functions counted this refresh (probe some with -u TARGET:FUNC)")
        );
        handle_key(press(KeyCode::Char(' ')), &mut ui, &report, &header);
        assert!(ui.paused);
        // Level 2 was not counted: `l` says how to get it and stays at 1.
        handle_key(press(KeyCode::Char('l')), &mut ui, &report, &header);
        assert_eq!(ui.level, 1);
        assert_eq!(
            ui.message.as_deref(),
            Some("level 2 needs its counters: start topdown top with -l 2")
        );
        let mut level_two = Ui::new(2);
        handle_key(
            press(KeyCode::Char('l')),
            &mut level_two,
            &report,
            &header_of(2),
        );
        assert_eq!(level_two.level, 1);

        // s cycles weight -> each of the four categories -> name -> weight.
        let mut sorts = Vec::new();
        for _ in 0..6 {
            handle_key(press(KeyCode::Char('s')), &mut ui, &report, &header);
            sorts.push(ui.sort);
        }
        assert_eq!(
            sorts,
            [
                Sort::Category(0),
                Sort::Category(1),
                Sort::Category(2),
                Sort::Category(3),
                Sort::Name,
                Sort::Weight
            ]
        );
        assert_eq!(
            handle_key(press(KeyCode::Char('q')), &mut ui, &report, &header),
            Action::Quit
        );
        assert_eq!(
            handle_key(
                KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
                &mut Ui::new(1),
                &report,
                &header
            ),
            Action::Quit
        );
    }
}
