//! Progress on long work (attaching many probes, reading the symbols of large binaries, long
//! `-d` runs), drawn on stderr only when stderr is a terminal. Anywhere else (a pipe, a file,
//! CI logs, the integration tests) nothing at all is written: scripts parse stderr's one-line
//! messages, and a redrawn bar would be noise in a log.
//!
//! Bars clear themselves when done or dropped (an error path included), so a terminal ends
//! with exactly the lines it would have had without them.

use std::{io::IsTerminal as _, time::Duration};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// Whether progress is drawn: only on a terminal, and not on one that declares it cannot move
/// the cursor (`TERM=dumb`, Emacs' shell buffers), where each redraw would be a new line.
pub fn draws(stderr_is_terminal: bool, term: Option<&str>) -> bool {
    stderr_is_terminal && term != Some("dumb")
}

/// The decision for this process's stderr.
fn stderr_draws() -> bool {
    draws(
        std::io::stderr().is_terminal(),
        std::env::var("TERM").ok().as_deref(),
    )
}

/// One piece of long work. Dropping it clears what it drew.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// `total` units of `what` (e.g. "functions"): `topdown: LABEL [####    ] 120/500 functions`.
    pub fn counting(label: &str, total: u64, what: &'static str) -> Self {
        Self::counting_to(label, total, what, target(stderr_draws()))
    }

    fn counting_to(label: &str, total: u64, what: &'static str, to: ProgressDrawTarget) -> Self {
        let style = ProgressStyle::with_template("topdown: {prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>-");
        Self::new(Some(total), to, style, label, what)
    }

    /// A wait of `total` (a `-d` run): `topdown: LABEL [####    ] 12s/60s`, advanced with
    /// [`Progress::elapsed`].
    pub fn waiting(label: &str, total: Duration) -> Self {
        Self::waiting_to(label, total, target(stderr_draws()))
    }

    fn waiting_to(label: &str, total: Duration, to: ProgressDrawTarget) -> Self {
        let style = ProgressStyle::with_template("topdown: {prefix} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>-");
        let progress = Self::new(Some(millis(total)), to, style, label, "");
        progress.elapsed(Duration::ZERO);
        progress
    }

    fn new(
        len: Option<u64>,
        to: ProgressDrawTarget,
        style: ProgressStyle,
        label: &str,
        message: &'static str,
    ) -> Self {
        let bar = ProgressBar::with_draw_target(len, to)
            .with_style(style)
            .with_prefix(label.to_owned())
            .with_message(message)
            .with_finish(ProgressFinish::AndClear);
        Self { bar }
    }

    /// Whether anything is drawn (callers skip extra work, e.g. a redraw timer, when not).
    pub fn is_visible(&self) -> bool {
        !self.bar.is_hidden()
    }

    pub fn inc(&self, units: u64) {
        self.bar.inc(units);
    }

    /// How far a [`Progress::waiting`] is.
    pub fn elapsed(&self, elapsed: Duration) {
        let total = Duration::from_millis(self.bar.length().unwrap_or(0));
        self.bar.set_position(millis(elapsed.min(total)));
        self.bar.set_message(format!(
            "{}s/{}s",
            elapsed.min(total).as_secs(),
            total.as_secs_f64().ceil() as u64
        ));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

fn target(draws: bool) -> ProgressDrawTarget {
    if draws {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use indicatif::TermLike;

    use super::*;

    /// A terminal that records everything drawn on it.
    #[derive(Debug, Default, Clone)]
    struct Recorder(Arc<Mutex<String>>);

    impl Recorder {
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
        fn push(&self, text: &str) -> io::Result<()> {
            self.0.lock().unwrap().push_str(text);
            Ok(())
        }
    }

    impl TermLike for Recorder {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<up {n}>"))
        }
        fn move_cursor_down(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<down {n}>"))
        }
        fn move_cursor_right(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<right {n}>"))
        }
        fn move_cursor_left(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<left {n}>"))
        }
        fn write_line(&self, s: &str) -> io::Result<()> {
            self.push(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> io::Result<()> {
            self.push(s)
        }
        fn clear_line(&self) -> io::Result<()> {
            self.push("<clear>")
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `draws` decided, drawn onto a recorder (the real target would be stderr).
    fn onto(recorder: &Recorder, draws: bool) -> ProgressDrawTarget {
        if draws {
            // No rate limit: every update reaches the recorder, so the test is not timing-bound.
            ProgressDrawTarget::term_like(Box::new(recorder.clone()))
        } else {
            ProgressDrawTarget::hidden()
        }
    }

    /// Attaching 500 functions' probes, with stderr an xterm or not a terminal.
    fn attaching_500_functions(recorder: &Recorder, terminal: bool) -> Progress {
        Progress::counting_to(
            "attaching probes",
            500,
            "functions",
            onto(recorder, draws(terminal, Some("xterm"))),
        )
    }

    #[test]
    fn progress_is_drawn_only_on_a_terminal_that_can_redraw() {
        assert!(draws(true, Some("xterm-256color")));
        assert!(draws(true, None));
        assert!(!draws(true, Some("dumb")));
        assert!(!draws(false, Some("xterm-256color")));
        assert!(!draws(false, None));
    }

    #[test]
    fn nothing_is_written_when_stderr_is_not_a_terminal() {
        let recorder = Recorder::default();
        {
            let progress = attaching_500_functions(&recorder, false);
            assert!(!progress.is_visible());
            progress.inc(120);
            progress.inc(380);
            let wait = Progress::waiting_to(
                "counting",
                Duration::from_secs(60),
                onto(&recorder, draws(false, Some("xterm"))),
            );
            wait.elapsed(Duration::from_secs(12));
        }
        assert_eq!(recorder.text(), "");
    }

    #[test]
    fn a_terminal_sees_the_count_and_the_bar_is_cleared_at_the_end() {
        let recorder = Recorder::default();
        {
            let progress = attaching_500_functions(&recorder, true);
            assert!(progress.is_visible());
            progress.inc(120);
        }
        let text = recorder.text();
        assert!(
            text.contains(
                "topdown: attaching probes [#######>----------------------] 120/500 functions"
            ),
            "{text}"
        );
        // After the last drawing of the bar, its line is cleared.
        let after = text.rsplit("functions").next().unwrap_or_default();
        assert!(after.contains("<clear>"), "{text}");
    }

    #[test]
    fn a_timed_run_shows_elapsed_over_total() {
        let recorder = Recorder::default();
        {
            let wait =
                Progress::waiting_to("counting", Duration::from_secs(60), onto(&recorder, true));
            wait.elapsed(Duration::from_secs(15));
            // Past the end (the final report is being written): the bar stays full.
            wait.elapsed(Duration::from_secs(61));
        }
        let text = recorder.text();
        assert!(
            text.contains("topdown: counting [#######>----------------------] 15s/60s"),
            "{text}"
        );
        assert!(
            text.contains("topdown: counting [##############################] 60s/60s"),
            "{text}"
        );
    }
}
