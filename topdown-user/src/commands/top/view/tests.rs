use ratatui::{buffer::Buffer, layout::Rect, style::Color};

use super::*;
use crate::report::{
    ProcessEntry, TaskEntry,
    tests::{empty_report, words_of_line},
};

fn entity(weight_counter: &str, weight: u64, metrics: &[(&str, f64)]) -> Entity {
    Entity {
        counters: [(weight_counter.to_owned(), weight)].into_iter().collect(),
        metrics: metrics
            .iter()
            .map(|(name, value)| ((*name).to_owned(), Some(*value)))
            .collect(),
        estimated: Vec::new(),
        derived: Default::default(),
    }
}

fn level_one(retiring: f64, bad: f64, frontend: f64, backend: f64) -> Vec<(&'static str, f64)> {
    vec![
        ("retiring", retiring),
        ("bad_speculation", bad),
        ("frontend_bound", frontend),
        ("backend_bound", backend),
    ]
}

/// Two processes that counted (600 and 200 of 1000 slots) and one that did not.
pub fn report() -> Report {
    let process = |pid: u32, comm: &str, weight: u64, metrics: Vec<(&str, f64)>| ProcessEntry {
        pid,
        comm: comm.to_owned(),
        threads: 1,
        entity: entity("slots", weight, &metrics),
    };
    Report {
        synthetic: true,
        totals: entity("slots", 1000, &level_one(0.4, 0.2, 0.2, 0.2)),
        tasks: vec![TaskEntry {
            tid: 201,
            tgid: 200,
            comm: "idler-thread".to_owned(),
            exited: false,
            entity: entity("slots", 200, &level_one(0.25, 0.25, 0.25, 0.25)),
        }],
        processes: vec![
            process(300, "zero", 0, level_one(0.0, 0.0, 0.0, 0.0)),
            process(200, "idler", 200, level_one(0.25, 0.25, 0.25, 0.25)),
            process(100, "worker", 600, level_one(0.5, 0.125, 0.125, 0.25)),
        ],
        ..empty_report()
    }
}

fn header() -> Header {
    Header {
        cpus: 2,
        refresh_ms: 1000,
        overhead_percent: Some(0.25),
        counted_level: 1,
    }
}

fn screen(report: &Report, ui: &Ui, width: u16, height: u16) -> Buffer {
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    draw(&mut buf, area, report, &header(), ui);
    buf
}

fn text(buf: &Buffer, y: u16) -> String {
    (0..buf.area.width)
        .map(|x| buf[(x, y)].symbol())
        .collect::<String>()
        .trim_end()
        .to_owned()
}

/// The bar of row `y` as (colour, cells) runs, starting at column `x`.
fn bar(buf: &Buffer, y: u16, x: u16) -> Vec<(Color, u16)> {
    let mut runs: Vec<(Color, u16)> = Vec::new();
    for x in x..buf.area.width {
        let cell = &buf[(x, y)];
        if cell.symbol() != BAR {
            break;
        }
        match runs.last_mut() {
            Some((colour, cells)) if *colour == cell.fg => *cells += 1,
            _ => runs.push((cell.fg, 1)),
        }
    }
    runs
}

/// The level-1 categories' hues.
const RETIRING: Color = Color::Green;
const BAD_SPECULATION: Color = Color::Red;
const FRONTEND: Color = Color::Indexed(98);
const BACKEND: Color = Color::Indexed(208);

/// A 100-column screen's table: `header` on line 2, then a line per row: its figures in the
/// first 75 columns, a space, and a bar of 24 columns in these runs of colour.
fn assert_table(buf: &Buffer, header: &str, rows: &[(&str, &[(Color, u16)])]) {
    assert_eq!(text(buf, 2), header);
    for (y, (figures, runs)) in (3..).zip(rows) {
        assert_eq!(text(buf, y), format!("{figures} {}", BAR.repeat(24)));
        assert_eq!(bar(buf, y, 75), *runs);
    }
}

#[test]
fn the_screen_shows_header_legend_rows_and_proportional_bars() {
    let buf = screen(&report(), &Ui::new(1), 100, 7);
    assert_eq!(
        text(&buf, 0),
        "topdown top - model intel-icl (SYNTHETIC) | level 1 | 2 CPUs | refresh 1000 ms | overhead 0.25% | system-wide"[..100]
            .trim_end()
    );
    assert_eq!(
        text(&buf, 1),
        "█ retiring  █ bad_speculation  █ frontend_bound  █ backend_bound  [processes, sort slots]"
    );
    assert_eq!(buf[(0, 1)].fg, RETIRING);
    assert_eq!(buf[(12, 1)].fg, BAD_SPECULATION);
    // Heaviest first; the process that counted nothing is left out. 100 columns leave 24 for
    // the bar (75 for the numbers, one space).
    assert_table(
        &buf,
        "    PID COMM                  slots  share  Retire BadSpec   Front    Back",
        &[
            (
                "    100 worker                  600  60.0%   50.0%   12.5%   12.5%   25.0%",
                &[
                    (RETIRING, 12),
                    (BAD_SPECULATION, 3),
                    (FRONTEND, 3),
                    (BACKEND, 6),
                ],
            ),
            (
                "    200 idler                   200  20.0%   25.0%   25.0%   25.0%   25.0%",
                &[
                    (RETIRING, 6),
                    (BAD_SPECULATION, 6),
                    (FRONTEND, 6),
                    (BACKEND, 6),
                ],
            ),
        ],
    );
    assert_eq!(text(&buf, 5), "");
    assert_eq!(
        text(&buf, 6),
        // Cut at the buffer's 100 columns.
        "q quit  p/t/c/f processes/threads/cgroups/functions  s sort  / filter  l level  space pause  \u{2191}\u{2193} sele"
    );
}

#[test]
fn sorting_and_filtering_pick_and_order_the_rows() {
    let report = report();
    let names = |ui: &Ui| -> Vec<String> {
        rows(&report, ui, &categories(&report, 1))
            .into_iter()
            .map(|row| row.name)
            .collect()
    };
    let mut ui = Ui::new(1);
    assert_eq!(names(&ui), ["worker", "idler"]);
    // bad_speculation: idler's 25% beats worker's 12.5%.
    ui.sort = Sort::Category(1);
    assert_eq!(names(&ui), ["idler", "worker"]);
    // backend_bound ties at 25%: the heavier first.
    ui.sort = Sort::Category(3);
    assert_eq!(names(&ui), ["worker", "idler"]);
    ui.sort = Sort::Name;
    assert_eq!(names(&ui), ["idler", "worker"]);

    ui.sort = Sort::Weight;
    ui.filter = "WORK".to_owned();
    assert_eq!(names(&ui), ["worker"]);
    // The text being typed filters already.
    ui.editing = Some("idl".to_owned());
    assert_eq!(names(&ui), ["idler"]);
    ui.editing = None;
    ui.filter = "nothing".to_owned();
    assert!(names(&ui).is_empty());

    ui.filter.clear();
    ui.view = View::Threads;
    assert_eq!(names(&ui), ["idler-thread"]);

    // The state line says what is in effect.
    let mut ui = Ui::new(1);
    ui.sort = Sort::Category(1);
    ui.filter = "work".to_owned();
    ui.paused = true;
    let buf = screen(&report, &ui, 130, 6);
    assert_eq!(
        text(&buf, 1),
        "█ retiring  █ bad_speculation  █ frontend_bound  █ backend_bound  [processes, sort bad_speculation, filter 'work', PAUSED]"
    );
    assert_eq!(
        text(&buf, 3),
        format!(
            "    100 worker                  600  60.0%   50.0%   12.5%   12.5%   25.0% {}",
            BAR.repeat(54)
        )
    );
    assert_eq!(text(&buf, 4), "");
}

#[test]
fn segments_round_cumulatively_and_stop_at_the_width() {
    assert_eq!(
        segments(&[Some(0.5), Some(0.125), Some(0.125), Some(0.25)], 24),
        [12, 3, 3, 6]
    );
    // Thirds of 10: 3.33 -> 3, 6.67 -> 7, 10: within a cell each, summing to the width.
    let third = Some(1.0 / 3.0);
    assert_eq!(segments(&[third, third, third], 10), [3, 4, 3]);
    // Fractions summing past 1 (synthetic counters) are cut at the bar's end.
    assert_eq!(segments(&[Some(0.8), Some(0.8), Some(0.1)], 10), [8, 2, 0]);
    assert_eq!(segments(&[None, Some(0.5)], 10), [0, 5]);
}

#[test]
fn level_two_shows_the_eight_children_in_their_parents_hues() {
    let mut report = report();
    report.level = 2;
    let children = [
        ("light_operations", 0.25),
        ("heavy_operations", 0.25),
        ("branch_mispredicts", 0.125),
        ("machine_clears", 0.0),
        ("fetch_latency", 0.125),
        ("fetch_bandwidth", 0.0),
        ("memory_bound", 0.125),
        ("core_bound", 0.125),
    ];
    for process in &mut report.processes {
        process.entity.metrics.extend(
            children
                .iter()
                .map(|(name, value)| ((*name).to_owned(), Some(*value))),
        );
    }
    let mut ui = Ui::new(2);
    assert_eq!(ui.level, 2);
    let buf = screen(&report, &ui, 120, 6);
    assert_eq!(
        text(&buf, 2),
        "    PID COMM                  slots  share  Light  Heavy BrMisp MClear   FLat    FBW    Mem   Core"
    );
    // 43 numbers' columns + 56 for the categories leave 120 - 99 - 1 = 20 cells of bar.
    assert_eq!(
        bar(&buf, 3, 99),
        [
            (Color::Green, 5),
            (Color::LightGreen, 5),
            (Color::Red, 3),
            (Color::Indexed(98), 2),
            (Color::Indexed(208), 3),
            (Color::Indexed(214), 2)
        ]
    );
    ui.level = 1;
    let buf = screen(&report, &ui, 120, 6);
    assert!(text(&buf, 2).ends_with("Retire BadSpec   Front    Back"));
}

#[test]
fn the_software_model_draws_the_share_of_on_cpu_time() {
    let mut report = report();
    report.model = "software".to_owned();
    report.synthetic = false;
    report.level = 0;
    report.weight_counter = "cpu-clock".to_owned();
    for entity in std::iter::once(&mut report.totals)
        .chain(report.processes.iter_mut().map(|p| &mut p.entity))
    {
        let slots = entity.counters.remove("slots").unwrap_or(0);
        entity
            .counters
            .insert("cpu-clock".to_owned(), slots * 1_000_000);
        entity.metrics.clear();
    }
    let buf = screen(&report, &Ui::new(0), 100, 6);
    assert_eq!(
        text(&buf, 0),
        "topdown top - model software | on-CPU time (no TopDown) | 2 CPUs | refresh 1000 ms | overhead 0.25% | system-wide"[..100]
            .trim_end()
    );
    assert_eq!(text(&buf, 1), "[processes, sort cpu-clock]");
    assert_eq!(text(&buf, 2), "    PID COMM                 on-CPU  share");
    // No categories: 43 columns of numbers leave 56 for the bar; 60% of them is 33.6 -> 34.
    assert_eq!(
        text(&buf, 3),
        format!(
            "    100 worker              600.0ms  60.0% {}",
            BAR.repeat(34)
        )
    );
    assert_eq!(bar(&buf, 3, 43), [(Color::Cyan, 34)]);
}

#[test]
fn a_tiny_terminal_is_drawn_without_panicking() {
    for (width, height) in [(1, 1), (20, 2), (30, 3), (10, 10)] {
        let buf = screen(&report(), &Ui::new(1), width, height);
        assert!(text(&buf, 0).starts_with(&"topdown top"[..usize::from(width).min(11)]));
    }
}

#[test]
fn function_rows_name_the_symbol_and_its_binary_and_count_calls() {
    let mut report = report();
    report.functions = vec![crate::report::FunctionEntry {
        target: "/usr/lib/x86_64-linux-gnu/libc.so.6".to_owned(),
        symbol: "getppid".to_owned(),
        pid: None,
        calls: 24853,
        unwound: 0,
        return_probe: None,
        return_probe_reason: None,
        entry_single_step: false,
        inclusive: entity("slots", 500, &level_one(0.5, 0.0, 0.25, 0.25)),
        exclusive: entity("slots", 400, &level_one(0.5, 0.0, 0.25, 0.25)),
        distribution: None,
    }];
    let mut ui = Ui::new(1);
    ui.view = View::Functions;
    let buf = screen(&report, &ui, 100, 5);
    assert_table(
        &buf,
        "  CALLS FUNCTION              slots  share  Retire BadSpec   Front    Back",
        &[(
            "  24853 getppid (libc.…         500  50.0%   50.0%    0.0%   25.0%   25.0%",
            &[(RETIRING, 12), (FRONTEND, 6), (BACKEND, 6)],
        )],
    );
}

/// `r`'s view: one row per span kind and key that ended this refresh, named by its query
/// text, with its calls in the first column; the help line offers the key.
#[test]
fn the_spans_view_lists_queries_by_text() {
    use crate::spans::report::{SpanEntry, SpanKeyType};
    let mut report = report();
    let span = |key: &str, text: Option<&str>, calls: u64, weight: u64| SpanEntry {
        kind: "query".to_owned(),
        key: key.to_owned(),
        key_type: if text.is_some() {
            SpanKeyType::QueryId
        } else {
            SpanKeyType::Text
        },
        text: text.map(str::to_owned),
        calls,
        abandoned: 0,
        folded: 0,
        entity: entity("slots", weight, &level_one(0.5, 0.1, 0.2, 0.2)),
        abandoned_counters: None,
        distribution: None,
    };
    report.spans = vec![
        span("-42", Some("select $1"), 7, 300),
        span("update t set a = $1", None, 2, 500),
        span("-7", Some("select 2"), 0, 0),
    ];
    let ui = Ui {
        view: View::Spans,
        ..Ui::new(1)
    };
    let names: Vec<(String, String, u64)> = rows(&report, &ui, &[])
        .into_iter()
        .map(|row| (row.id, row.name, row.weight))
        .collect();
    assert_eq!(
        names,
        [
            ("2".to_owned(), "query update t set a = $1".to_owned(), 500),
            ("7".to_owned(), "query select $1".to_owned(), 300)
        ]
    );
    let buf = screen(&report, &Ui::new(1), 140, 7);
    assert!(text(&buf, 6).contains("p/t/c/f/r processes/threads/cgroups/functions/spans"));
}

/// `d` in the spans view: the selected span's distribution, a line per bucket with its calls
/// and why, as the functions view shows a function's.
#[test]
fn the_spans_view_shows_the_selected_spans_distribution() {
    use crate::{
        functions::distribution::{BucketCounts, Distribution},
        session::slot_counts::SlotCounts,
        spans::report::{SpanEntry, SpanKeyType},
    };
    let mut report = report();
    let bucket = |weight: u64, calls: u64| BucketCounts {
        bucket: topdown_common::histogram::bucket(weight),
        calls,
        counts: SlotCounts::ZERO,
    };
    let mut distribution = Distribution::of("slots", [bucket(10, 1000), bucket(1000, 30)], &|_| {
        Entity::default()
    });
    distribution.buckets[0].entity = entity("slots", 10_000, &level_one(1.0, 0.0, 0.0, 0.0));
    distribution.buckets[1].entity = entity("slots", 30_000, &level_one(0.0, 0.0, 0.0, 1.0));
    report.spans = vec![SpanEntry {
        kind: "request".to_owned(),
        key: "6".to_owned(),
        key_type: SpanKeyType::Integer,
        text: None,
        calls: 1030,
        abandoned: 0,
        folded: 0,
        entity: entity("slots", 40_000, &level_one(0.25, 0.0, 0.0, 0.75)),
        abandoned_counters: None,
        distribution: Some(distribution),
    }];
    let ui = Ui {
        view: View::Spans,
        distribution: true,
        ..Ui::new(1)
    };
    let buf = screen(&report, &ui, 120, 16);
    let lines = (0..16)
        .map(|y| text(&buf, y))
        .collect::<Vec<_>>()
        .join("\n");
    let line = |needle: &str| words_of_line(&lines, |line| line.contains(needle));
    assert_eq!(
        line("per span").join(" "),
        "request 6: slots per span p50 11 p90 12 p99 980"
    );
    let fast = line("[10, 12)");
    assert_eq!([&fast[2], &fast[4], &fast[5]], ["1000", "retiring", "100%"]);
    let slow = line("[896, 1024)");
    assert_eq!(
        [&slow[2], &slow[4], &slow[5]],
        ["30", "backend_bound", "100%"]
    );
}
