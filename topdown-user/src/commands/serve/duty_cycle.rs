//! `serve --duty-cycle ON/PERIOD`: function probes attached ON of every PERIOD, so a hot
//! function costs its probes only that share of the time. This module parses the option and
//! keeps the schedule and its measurements; `serve` attaches and detaches, and the exporter
//! scales each closed window's function counts by the fraction measured here.
//!
//! A window runs from the end of the previous ON span (the first: the first attach) to the end
//! of its own ON span, so it holds one OFF span and one ON span and every function count of it
//! was made in its ON span. Its sampled fraction is the measured attached time over the
//! measured elapsed time, never the nominal ON/PERIOD: attaching and detaching take time, and
//! the event loop wakes late under load. The probes count as attached from the end of the
//! attach call to the start of the detach call. Attaching resolves the symbols first and
//! creates the entry links (which start every count) last, so counting starts at its end;
//! detaching removes the entry links first, and the kernel unregisters a link's uprobes
//! before it waits for handlers still running (`bpf_uprobe_unregister` in
//! kernel/trace/bpf_trace.c: `uprobe_unregister_nosync` for each uprobe, then one
//! `uprobe_unregister_sync`, an SRCU grace period that took up to hundreds of milliseconds on
//! this project's test VM), so counting stops at its start.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use topdown_common::CallKey;

use crate::session::aggregate::CallCounts;

/// The shortest ON span: attaching alone takes milliseconds, and the exporter refreshes at
/// most every 100 ms (`--refresh-ms`).
const MIN_ON: Duration = Duration::from_millis(100);
/// The longest PERIOD: one sample a day is not a rate any more.
const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);

/// What `--duty-cycle` takes, for its error messages.
const FORM: &str = "give ON/PERIOD with 100ms <= ON < PERIOD <= 24h, e.g. 5s/60s \
                    (units ms, s, m, h; a bare number is seconds, as -d takes)";

/// `--duty-cycle ON/PERIOD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DutyCycle {
    pub on: Duration,
    pub period: Duration,
}

impl DutyCycle {
    /// Parses `ON/PERIOD`; the error is one line saying what is wrong and the expected form
    /// (clap's line around it names the option and the value).
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((on_text, period_text)) = text.split_once('/') else {
            return Err(format!("no '/' between ON and PERIOD: {FORM}"));
        };
        let duration = |part: &str, what: &str| {
            parse_duration(part).ok_or_else(|| format!("{what} '{part}' is not a duration: {FORM}"))
        };
        let on = duration(on_text, "ON")?;
        let period = duration(period_text, "PERIOD")?;
        let problem = if period.is_zero() {
            Some("PERIOD must be above 0")
        } else if on.is_zero() {
            Some("ON must be above 0 (no probes at all: leave -u out)")
        } else if on > period {
            Some("ON is longer than PERIOD")
        } else if on == period {
            Some("ON equal to PERIOD never detaches (leave --duty-cycle out)")
        } else if on < MIN_ON {
            Some("ON is shorter than 100ms")
        } else if period > MAX_PERIOD {
            Some("PERIOD is longer than 24h")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(format!("{problem}: {FORM}")),
            None => Ok(Self { on, period }),
        }
    }
}

impl std::fmt::Display for DutyCycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}/{:?}", self.on, self.period)
    }
}

/// `5s`, `500ms`, `1.5m`, `1h`, or a bare number of seconds (what `-d` takes).
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    // Negative, NaN and out-of-range values are refused here.
    Duration::try_from_secs_f64(seconds).ok()
}

/// What the schedule does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    Attach,
    Detach,
}

/// A closed window: its function counts and what was measured of it.
#[derive(Debug)]
pub struct Window {
    /// Time the probes were attached in it.
    pub attached: Duration,
    /// Its length.
    pub elapsed: Duration,
    /// Its function counts by call edge (all made while attached).
    pub calls: Vec<CallCounts>,
}

impl Window {
    /// The sampled fraction: measured attached time over elapsed time.
    pub fn ratio(&self) -> f64 {
        self.attached.as_secs_f64() / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// The running schedule, the open window's measurements and its function counts.
pub struct Sampler {
    cycle: DutyCycle,
    /// The scheduled start of the current period: periods follow each other from it without
    /// drifting by the time each attach takes.
    period_start: Instant,
    /// While attached: the instant the probes count as attached from.
    attached_since: Option<Instant>,
    /// Where the open window began.
    window_start: Instant,
    /// Attached time of the open window's closed ON spans.
    attached: Duration,
    /// The open window's function counts, merged by call edge so memory stays bounded by the
    /// edges however many refreshes a window spans.
    pending: HashMap<CallKey, CallCounts>,
}

impl Sampler {
    /// The schedule of probes attached at `since` (the first ON span starts with the
    /// exporter).
    pub fn new(cycle: DutyCycle, since: Instant) -> Self {
        Self {
            cycle,
            period_start: since,
            attached_since: Some(since),
            window_start: since,
            attached: Duration::ZERO,
            pending: HashMap::new(),
        }
    }

    pub fn cycle(&self) -> DutyCycle {
        self.cycle
    }

    pub fn is_attached(&self) -> bool {
        self.attached_since.is_some()
    }

    /// When the next switch is due, and which it is. An ON span lasts ON from the end of its
    /// attach call (which may take a while: it can resolve symbols, on a loaded machine), but
    /// ends by the next period's start at the latest.
    pub fn next_switch(&self) -> (Instant, Switch) {
        let next_period = self.period_start + self.cycle.period;
        match self.attached_since {
            Some(since) => ((since + self.cycle.on).min(next_period), Switch::Detach),
            None => (next_period, Switch::Attach),
        }
    }

    /// A new period begins at `now` (its attach is due): from the scheduled start, or from
    /// `now` where whole periods were missed (a suspended machine, a stalled loop).
    pub fn begin_period(&mut self, now: Instant) {
        let next = self.period_start + self.cycle.period;
        self.period_start = if now >= next + self.cycle.period {
            now
        } else {
            next
        };
    }

    /// The attach call returned at `at`.
    pub fn attached_at(&mut self, at: Instant) {
        self.attached_since = Some(at);
    }

    /// The detach call began at `at`; the open window ends there, once the counts made up to
    /// the detach are `hold`-ed.
    pub fn detached_at(&mut self, at: Instant) {
        if let Some(since) = self.attached_since.take() {
            self.attached += at.saturating_duration_since(since);
        }
    }

    /// Adds one refresh's function counts to the open window.
    pub fn hold(&mut self, calls: &[CallCounts]) {
        for call in calls {
            self.pending
                .entry(call.key)
                .and_modify(|held| {
                    held.calls += call.calls;
                    held.unwound += call.unwound;
                    held.callee_calls += call.callee_calls;
                    held.inclusive += call.inclusive;
                    held.exclusive += call.exclusive;
                })
                .or_insert(*call);
        }
    }

    /// Closes the open window at `end` and opens the next. A window in which the probes were
    /// never attached (every attach failed) is not closed: it has no fraction to scale by, so
    /// it runs on into the next one.
    pub fn close_window(&mut self, end: Instant) -> Option<Window> {
        if self.attached.is_zero() {
            return None;
        }
        let window = Window {
            attached: std::mem::take(&mut self.attached),
            elapsed: end.saturating_duration_since(self.window_start),
            calls: self.pending.drain().map(|(_, calls)| calls).collect(),
        };
        self.window_start = end;
        Some(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::aggregate::SlotCounts;

    fn cycle(on_ms: u64, period_ms: u64) -> DutyCycle {
        DutyCycle {
            on: Duration::from_millis(on_ms),
            period: Duration::from_millis(period_ms),
        }
    }

    #[test]
    fn durations_take_units_and_bare_seconds() {
        for (text, expected) in [
            ("5s/60s", cycle(5000, 60_000)),
            ("5/60", cycle(5000, 60_000)),
            ("500ms/2s", cycle(500, 2000)),
            ("1.5m/1h", cycle(90_000, 3_600_000)),
            (" 1s / 3s ", cycle(1000, 3000)),
            ("100ms/24h", cycle(100, 86_400_000)),
        ] {
            assert_eq!(DutyCycle::parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn bad_values_are_one_line_saying_what_is_wrong_and_the_form() {
        for (text, problem) in [
            ("0s/60s", "ON must be above 0"),
            ("70s/60s", "ON is longer than PERIOD"),
            ("60s/60s", "ON equal to PERIOD never detaches"),
            ("5s/0s", "PERIOD must be above 0"),
            ("0/0", "PERIOD must be above 0"),
            ("50ms/1s", "ON is shorter than 100ms"),
            ("1s/25h", "PERIOD is longer than 24h"),
            ("abc", "no '/' between ON and PERIOD"),
            ("5s", "no '/' between ON and PERIOD"),
            ("5x/60s", "ON '5x' is not a duration"),
            ("5s/abc", "PERIOD 'abc' is not a duration"),
            ("-1s/60s", "ON '-1s' is not a duration"),
            ("5s/inf", "PERIOD 'inf' is not a duration"),
            ("5s/60s/2", "PERIOD '60s/2' is not a duration"),
        ] {
            let message = DutyCycle::parse(text).unwrap_err();
            assert!(message.starts_with(problem), "{text}: {message}");
            assert!(message.contains("give ON/PERIOD"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }

    /// A sampler attached 1000 ms of each 4000, started `started_ms` after an instant, and the
    /// clock it runs on: `ms(n)` is n ms after that instant.
    fn one_second_in_four(started_ms: u64) -> (Sampler, impl Fn(u64) -> Instant) {
        let start = Instant::now();
        let ms = move |n: u64| start + Duration::from_millis(n);
        (Sampler::new(cycle(1000, 4000), ms(started_ms)), ms)
    }

    fn call(function: u32, calls: u64, slots: u64) -> CallCounts {
        let mut inclusive = SlotCounts::ZERO;
        inclusive.0[0] = slots;
        CallCounts {
            key: CallKey {
                function,
                parent: topdown_common::ROOT_FUNCTION,
                tgid: 0,
                _pad: 0,
            },
            calls,
            unwound: 0,
            inclusive,
            exclusive: inclusive,
            callee_calls: 0,
        }
    }

    #[test]
    fn a_window_measures_attached_time_between_the_calls_and_merges_its_counts() {
        let (mut sampler, ms) = one_second_in_four(5);
        assert_eq!(sampler.next_switch(), (ms(1005), Switch::Detach));
        sampler.hold(&[call(0, 3, 30)]);
        sampler.hold(&[call(0, 2, 20), call(1, 1, 5)]);
        // Woken 2 ms late.
        sampler.detached_at(ms(1007));
        assert_eq!(sampler.next_switch(), (ms(4005), Switch::Attach));
        let mut first = sampler.close_window(ms(1007)).unwrap();
        // The first window starts with the first attach: all of it was sampled.
        assert_eq!(first.attached, Duration::from_millis(1002));
        assert_eq!(first.elapsed, Duration::from_millis(1002));
        assert_eq!(first.ratio(), 1.0);
        first.calls.sort_by_key(|call| call.key.function);
        assert_eq!(
            first
                .calls
                .iter()
                .map(|call| (call.key.function, call.calls, call.inclusive.0[0]))
                .collect::<Vec<_>>(),
            [(0, 5, 50), (1, 1, 5)]
        );

        // The next period: the attach call returns 20 ms after its start, the detach is 1 ms
        // late.
        sampler.begin_period(ms(4005));
        sampler.attached_at(ms(4025));
        assert_eq!(sampler.next_switch(), (ms(5025), Switch::Detach));
        sampler.detached_at(ms(5026));
        let second = sampler.close_window(ms(5026)).unwrap();
        assert_eq!(second.attached, Duration::from_millis(1001));
        assert_eq!(second.elapsed, Duration::from_millis(4019));
        assert!((second.ratio() - 1.001 / 4.019).abs() < 1e-12);
        assert!(second.calls.is_empty());
    }

    #[test]
    fn periods_keep_their_schedule_and_skip_what_was_missed() {
        let (mut sampler, ms) = one_second_in_four(0);
        sampler.detached_at(ms(1000));
        // Woken late: the period still starts when scheduled.
        sampler.begin_period(ms(4030));
        sampler.attached_at(ms(4040));
        assert_eq!(sampler.next_switch(), (ms(5040), Switch::Detach));
        sampler.detached_at(ms(5040));
        assert_eq!(sampler.next_switch(), (ms(8000), Switch::Attach));
        // An attach that took most of the period: its ON span ends when the next period
        // begins.
        sampler.begin_period(ms(8000));
        sampler.attached_at(ms(11_500));
        assert_eq!(sampler.next_switch(), (ms(12_000), Switch::Detach));
        sampler.detached_at(ms(12_000));
        // Woken more than a period late: the schedule restarts from now.
        sampler.begin_period(ms(20_000));
        sampler.attached_at(ms(20_000));
        assert_eq!(sampler.next_switch(), (ms(21_000), Switch::Detach));
    }

    #[test]
    fn a_window_without_attached_time_runs_on_into_the_next() {
        let (mut sampler, ms) = one_second_in_four(0);
        sampler.detached_at(ms(1000));
        let first = sampler.close_window(ms(1000)).unwrap();
        assert_eq!(first.ratio(), 1.0);
        // The next attach fails: no detach, and nothing to close at the period after.
        sampler.begin_period(ms(4000));
        assert!(sampler.close_window(ms(5000)).is_none());
        sampler.begin_period(ms(8000));
        sampler.attached_at(ms(8000));
        sampler.detached_at(ms(9000));
        let window = sampler.close_window(ms(9000)).unwrap();
        // One second attached over the eight since the last window closed.
        assert_eq!(window.elapsed, Duration::from_secs(8));
        assert_eq!(window.ratio(), 0.125);
    }
}
